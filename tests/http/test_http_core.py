"""The shared HTTP rules (goblin_claim._http), as plain values: no Redis, no server, no framework."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from goblin_claim import InvalidArgumentError, InvalidArgumentTypeError, _http
from goblin_claim._http import (
    Answer,
    abandoned_payload,
    claim_token,
    documented,
    failures,
    holder_fp,
    idempotency_key,
    key_of,
    key_rule,
    make_options,
    marked_rule,
    owner_of,
    parse_key,
    problem,
    replay,
    request_fingerprint,
    stored_payload,
    unstored_payload,
)


@pytest.fixture(autouse=True)
def _fresh_log_once() -> Iterator[None]:
    """Each test starts with no failing function logged yet (the log is once per process and cause)."""
    failures._logged.clear()
    yield
    failures._logged.clear()


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b"abc-123", "abc-123"),  # Stripe's bare token
        (b'"abc-123"', "abc-123"),  # the draft's sf-string
        (b'"a\\"b\\\\c"', 'a"b\\c'),  # its two escapes
        (b'"k";v=1', "k"),  # parameters are ignored
        (b'"k";a;b=?1;c="x;y";d=tok;e=1.5', "k"),
        (b'  "k"  ', "k"),  # surrounding whitespace
    ],
)
def test_the_key_header_is_parsed_as_the_draft_defines_it(raw: bytes, key: str) -> None:
    """A bare token or an RFC 8941 sf-string (escapes unescaped, parameters ignored) gives the key."""
    assert parse_key("Idempotency-Key", [raw]) == key


@pytest.mark.parametrize(
    "raw", [b'"a"b"', b'"abc', b'"a\\qb"', b'"k";V=1', b'"k";=1', b'"k" x', b'""', b'"\x01"', b"", b"x" * 256]
)
def test_a_malformed_key_header_is_answered_400(raw: bytes) -> None:
    """A malformed sf-string, bad parameters, an empty or over-long key, or a control byte is a 400 problem."""
    answer = parse_key("Idempotency-Key", [raw])
    assert isinstance(answer, Answer)
    assert answer.status == 400
    assert (b"content-type", b"application/problem+json") in answer.headers


def test_two_key_headers_are_answered_400() -> None:
    """Two Idempotency-Key headers are refused rather than one picked."""
    answer = parse_key("Idempotency-Key", [b"a", b"b"])
    assert isinstance(answer, Answer)
    assert answer.status == 400


def test_owners_are_str_int_or_uuid_and_none_fails_closed() -> None:
    """The scope's answer: str as is, int and UUID tagged apart from strings, None or "" a 403 unless shared."""
    known = uuid.uuid4()
    options = make_options(scope=lambda request: request)
    assert owner_of(options, "alice") == "alice"
    assert owner_of(options, 7) == "int:7"
    assert owner_of(options, known) == f"uuid:{known}"
    for nobody in (None, ""):
        answer = owner_of(options, nobody)
        assert isinstance(answer, Answer)
        assert answer.status == 403
    assert owner_of(make_options(scope=lambda request: None, shared_scope=True), None) is None
    assert owner_of(make_options(), "ignored without a scope function") is None
    refused = owner_of(options, True)  # a bool is no owner: answered 500, naming what it returned
    assert isinstance(refused, Answer)
    assert (refused.status, refused.code) == (500, "scope-failed")
    assert "returned bool" in json.loads(refused.body)["detail"]


@pytest.mark.parametrize("status", [204, 304])
def test_a_replayed_204_or_304_carries_no_content_length(status: int) -> None:
    """RFC 9110 section 8.6: a replayed 204 or 304 has no Content-Length; a 200 has its length."""
    payload = stored_payload("fp", status, [(b"etag", b'"v1"')], lambda name: True, b"")
    answer = replay(payload, "fp")
    assert answer.status == status
    assert all(name != b"content-length" for name, _ in answer.headers)
    assert (b"etag", b'"v1"') in answer.headers
    ok = replay(stored_payload("fp", 200, [], lambda name: True, b"abc"), "fp")
    assert (b"content-length", b"3") in ok.headers


def test_replay_answers_each_envelope_kind() -> None:
    """Stored: replayed with Idempotent-Replayed; other fingerprint 422; abandoned 422; unstored 422; junk 500."""
    stored = stored_payload("fp", 201, [(b"content-type", b"application/json")], lambda name: True, b"{}")
    first = replay(stored, "fp")
    assert (first.status, first.body) == (201, b"{}")
    assert (b"idempotent-replayed", b"true") in first.headers
    assert replay(stored, "other").status == 422
    assert replay(abandoned_payload("fp", "gone"), "fp").status == 422
    assert replay(unstored_payload("fp", 200, "too large"), "fp").status == 422
    junk = replay(b'{"secret": "do not echo me"}', "fp")
    assert junk.status == 500
    assert b"do not echo me" not in junk.body  # the stored bytes never leak into the answer
    assert json.loads(junk.body)["status"] == 500


def test_the_core_imports_no_web_framework() -> None:
    """Importing goblin_claim._http loads no web framework: the doors import theirs."""
    code = (
        "import sys, goblin_claim._http; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'redis', 'django', 'flask', 'starlette', 'werkzeug'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    # goblin_claim's package import pulls in its drivers (redis); no framework may come with it.
    assert all(name.split(".")[0] == "redis" for name in json.loads(result.stdout.replace("'", '"')))


def test_every_header_but_the_deny_list_is_kept_by_default() -> None:
    """By default a custom header is kept; Set-Cookie, Date, Server, hop-by-hop and trace ids are not."""
    options = make_options()
    for name in (b"x-order-id", b"content-type", b"etag", b"location", b"vary"):
        assert options.keeps_header(name), name
    for name in (b"set-cookie", b"date", b"server", b"content-length", b"transfer-encoding", b"traceparent"):
        assert not options.keeps_header(name), name


def test_the_deny_list_and_the_allow_list_are_configurable() -> None:
    """never_replayed adds to what is dropped (Set-Cookie stays dropped); replay_headers= makes an allow-list."""
    dropping = make_options(never_replayed=("x-internal",))
    assert not dropping.keeps_header(b"x-internal")
    assert dropping.keeps_header(b"date")  # no longer in the deny-list
    assert not dropping.keeps_header(b"set-cookie")  # always
    allowing = make_options(replay_headers=("content-type",))
    assert allowing.keeps_header(b"content-type")
    assert not allowing.keeps_header(b"x-order-id")


def test_problem_answers_link_their_documentation_when_asked() -> None:
    """With problem_docs, a problem's type is <docs>#<code>; without it, about:blank; a bad URL is refused."""
    answer = parse_key("Idempotency-Key", [b'"a"b"'])
    assert isinstance(answer, Answer)
    assert json.loads(answer.body)["type"] == "about:blank"
    linked = documented(answer, "https://docs.example.com/idempotency")
    body = json.loads(linked.body)
    assert body["type"] == "https://docs.example.com/idempotency#key-invalid"
    assert body["detail"] == json.loads(answer.body)["detail"]
    assert (b"content-length", str(len(linked.body)).encode()) in linked.headers
    in_flight = documented(problem(409, "busy", retry=True), "https://d.example/x")
    assert json.loads(in_flight.body)["type"] == "https://d.example/x#in-flight"
    assert (b"retry-after", b"1") in in_flight.headers
    replayed = replay(stored_payload("fp", 200, [], lambda name: True, b"ok"), "fp")
    assert documented(replayed, "https://d.example/x") is replayed  # a replay is never touched
    for bad in ("docs.example.com", "https://d.example/x#frag", 7):
        with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)):
            make_options(problem_docs=bad)


def _fp(content_type: str | None, body: bytes, **options: Any) -> str:
    kind = None if content_type is None else content_type.encode()
    return request_fingerprint(make_options(**options), None, kind, b"", body)


def _multipart(boundary: str, content: bytes, filename: str = "a.csv") -> tuple[str, bytes]:
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            f"Content-Type: text/csv\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return f"multipart/form-data; boundary={boundary}", body


def test_multipart_fingerprints_ignore_the_boundary_but_not_the_parts() -> None:
    """Two boundaries around the same parts fingerprint alike; another file content or filename does not."""
    kind_a, body_a = _multipart("aaaa1111", b"1,2,3")
    kind_b, body_b = _multipart("bbbb2222", b"1,2,3")
    assert body_a != body_b
    assert _fp(kind_a, body_a) == _fp(kind_b, body_b)
    assert _fp(*_multipart("c", b"1,2,4")) != _fp(kind_a, body_a)
    assert _fp(*_multipart("c", b"1,2,3", filename="b.csv")) != _fp(kind_a, body_a)
    assert _fp(kind_a, body_a, fingerprint="bytes") != _fp(kind_b, body_b, fingerprint="bytes")


def test_json_and_form_fingerprints_are_canonical() -> None:
    """JSON key order and spacing, and the order of distinct form fields, do not change the fingerprint."""
    assert _fp("application/json", b'{"a": 1, "b": [1, 2]}') == _fp(
        "application/json; charset=utf-8", b'{"b":[1,2],"a":1}'
    )
    assert _fp("application/json", b'{"a": 1}') != _fp("application/json", b'{"a": 2}')
    assert _fp("application/merge-patch+json", b'{"a":1, "b":2}') == _fp(
        "application/merge-patch+json", b'{"b":2,"a":1}'
    )
    form = "application/x-www-form-urlencoded"
    assert _fp(form, b"a=1&b=2") == _fp(form, b"b=2&a=1")
    assert _fp(form, b"a=1&a=2") != _fp(form, b"a=2&a=1")  # one field's values keep their order
    assert _fp("text/plain", b'{"a":1,"b":2}') != _fp("text/plain", b'{"b":2,"a":1}')  # bytes, by type
    assert _fp("application/json", b"{not json") == _fp(None, b"{not json")  # unparsable: bytes


def test_a_fingerprint_function_decides_and_a_bad_strategy_is_refused() -> None:
    """fingerprint=callable hashes what it returns from the request; an unknown strategy name is an error."""
    by_amount = {"fingerprint": lambda request: "amount=5"}
    assert _fp("application/json", b'{"amount": 5, "note": "x"}', **by_amount) == _fp(None, b"other", **by_amount)
    with pytest.raises(InvalidArgumentError, match="fingerprint must be one of"):
        make_options(fingerprint="xml")


def test_the_holders_fingerprint_is_read_from_a_token_in_flight_and_a_records_token() -> None:
    """holder_fp finds the fingerprint after a token's last dot (in flight, or a record's token); else None."""
    fp = "0123456789abcdef0123456789abcdef"
    tokens = [claim_token(fp) for _ in range(200)]
    assert len(set(tokens)) == 200
    for token in tokens:  # URL-safe random characters never hold a dot: the fingerprint is what follows it
        assert holder_fp(token) == fp
        assert holder_fp(token.encode()) == fp
    assert holder_fp(b"done " + tokens[0].encode()) == fp  # a from_keys claim key's done marker
    assert holder_fp(b"a-raw-writer") is None  # no fingerprint: the duplicate waits, then compares the envelope
    assert holder_fp(None) is None


# --------------------------------------------------------------------------- which routes take a key


def test_a_route_rule_comes_from_its_mark_then_routes_then_required() -> None:
    """The route's own mark wins; then the first routes= pattern that matches; then required= for the rest."""
    options = make_options(required=True, routes={"/webhooks/*": "ignore", "/webhooks/strict": "require"})
    assert key_rule(options, None, "/webhooks/stripe", None) == "ignore"
    assert key_rule(options, None, "/webhooks/strict", None) == "ignore"  # the first pattern that matches
    assert key_rule(options, None, "/webhooks/a/b", None) == "ignore"  # '*' also matches '/'
    assert key_rule(options, None, "/webhooks", None) == "require"
    assert key_rule(options, None, "/orders", None) == "require"
    assert key_rule(options, None, "/webhooks/stripe", "accept") == "accept"
    assert key_rule(make_options(), None, "/orders", None) == "accept"


def test_a_routes_function_decides_and_none_leaves_it_to_required() -> None:
    """routes=function gets the request; its rule is applied, and None falls back to required=."""
    options = make_options(required=True, routes=lambda request: "ignore" if request == "hook" else None)
    assert key_rule(options, "hook", "/any", None) == "ignore"
    assert key_rule(options, "order", "/any", None) == "require"


@pytest.mark.parametrize("returned", ["ignored", 1, True])
def test_a_routes_function_returning_something_else_is_answered_500(returned: object) -> None:
    """A routes function returning anything but a rule or None is answered 500 routes-failed, naming its type."""
    answer = key_rule(make_options(routes=lambda request: returned), None, "/orders", None)
    assert isinstance(answer, Answer)
    assert (answer.status, answer.code) == (500, "routes-failed")
    assert f"returned {type(returned).__name__}" in json.loads(answer.body)["detail"]


def test_a_key_is_required_accepted_or_ignored_by_its_rule() -> None:
    """require: no key is 400; accept: no key passes; ignore: even a malformed key passes unparsed."""
    options = make_options()
    missing = key_of(options, "require", [])
    assert isinstance(missing, Answer)
    assert (missing.status, missing.code) == (400, "key-missing")
    assert key_of(options, "accept", []) is None
    assert key_of(options, "ignore", [b"", b"two"]) is None
    assert key_of(options, "accept", [b"k-1"]) == key_of(options, "require", [b"k-1"]) == "k-1"
    malformed = key_of(options, "accept", [b""])
    assert isinstance(malformed, Answer)
    assert malformed.status == 400


@pytest.mark.parametrize(
    "routes",
    [{"webhook": "ignore"}, {"/webhook": "skip"}, {"/webhook": None}, ["/webhook"], "/webhook", {7: "ignore"}],
    ids=["no leading slash", "an unknown rule", "no rule", "a list", "a string", "not a string"],
)
def test_bad_routes_are_refused(routes: object) -> None:
    """routes= must map '/'-patterns to one of the three rules, or be a function: anything else raises at once."""
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)):
        make_options(routes=routes)


def test_the_mark_returns_the_endpoint_and_names_its_rule() -> None:
    """idempotency_key() marks the endpoint itself (or a class-based view's class) and refuses an unknown rule."""

    def webhook() -> None:
        """An endpoint."""

    assert idempotency_key("ignore")(webhook) is webhook
    assert marked_rule(webhook) == "ignore"
    assert _http.any_marked()

    @idempotency_key("require")
    class View:
        """A class-based view, as Django's and Flask's as_view() expose it."""

    def as_view() -> None:
        """The view function as_view builds."""

    as_view.view_class = View  # type: ignore[attr-defined]
    assert marked_rule(as_view) == "require"
    assert marked_rule(lambda: None) is None
    with pytest.raises(InvalidArgumentError, match="'require', 'accept' or 'ignore'"):
        idempotency_key("skip")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a scope function that fails


def _user_of(request: Any) -> object:
    """A scope function reading an ASGI scope's user, as the README's does."""
    return request["user"]


def test_a_raising_scope_is_answered_500_naming_the_cause_and_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    """scope["user"] without authentication: 500 scope-failed naming KeyError('user') and the middleware order."""
    options = make_options(scope=_user_of)
    with caplog.at_level(logging.ERROR, logger="goblin_claim"):
        answers = [owner_of(options, {}, "asgi") for _ in range(3)]
    for answer in answers:
        assert isinstance(answer, Answer)
        assert (answer.status, answer.code) == (500, "scope-failed")
        assert (b"content-type", b"application/problem+json") in answer.headers
    detail = json.loads(answers[0].body)["detail"]
    assert "raised KeyError('user')" in detail
    assert "nothing was stored" in detail
    assert "add the authentication middleware after this one" in detail
    records = [r for r in caplog.records if r.name == "goblin_claim.asgi"]
    assert len(records) == 1  # once per process for this function and cause, not once per request
    assert "_user_of raised KeyError: 'user' at " in records[0].getMessage()
    assert "test_http_core.py:" in records[0].getMessage()  # where it was raised


def test_each_door_explains_a_failing_scope_in_its_own_words() -> None:
    """The fix names where the door goes: WSGI inside the auth, Django after it in MIDDLEWARE, Flask after its hook."""
    options = make_options(scope=lambda request: request.user.pk)
    words = {
        "wsgi": "auth(IdempotencyMiddleware(app, ...))",
        "django": "after the authentication middleware in MIDDLEWARE",
        "flask": "before Idempotency(app)",
    }
    for door, fix in words.items():
        answer = owner_of(options, object(), door)
        assert isinstance(answer, Answer)
        detail = json.loads(answer.body)["detail"]
        assert "raised AttributeError (no attribute 'user')" in detail
        assert fix in detail


def test_a_failing_scope_never_shows_its_message_to_the_client(caplog: pytest.LogCaptureFixture) -> None:
    """An exception's message stays in the server log; the answer names only its type."""

    def scope(request: Any) -> str:
        raise RuntimeError("could not reach the user database at 10.0.0.3")

    with caplog.at_level(logging.ERROR, logger="goblin_claim"):
        answer = owner_of(make_options(scope=scope), None, "wsgi")
    assert isinstance(answer, Answer)
    assert b"10.0.0.3" not in answer.body
    assert "raised RuntimeError" in json.loads(answer.body)["detail"]
    assert "10.0.0.3" in caplog.text  # the message, for the operator


def test_an_unusable_owner_is_answered_500_naming_its_type() -> None:
    """A scope function returning the user object (not its id) is answered 500, telling to return the id."""

    class User:
        """A user object."""

    answer = owner_of(make_options(scope=lambda request: User()), None, "django")
    assert isinstance(answer, Answer)
    detail = json.loads(answer.body)["detail"]
    assert "returned User" in detail
    assert "user.id, not the user object" in detail


def test_an_exception_the_framework_answers_passes_through() -> None:
    """An exception the door's framework answers itself (abort(401), PermissionDenied) is raised, not explained."""

    class Unauthorized(Exception):
        """The framework's own HTTP exception."""

    def scope(request: Any) -> str:
        raise Unauthorized

    with pytest.raises(Unauthorized):
        owner_of(make_options(scope=scope), None, "flask", lambda error: isinstance(error, Unauthorized))
    assert isinstance(owner_of(make_options(scope=scope), None, "flask", lambda error: False), Answer)
