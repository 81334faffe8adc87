"""The exchange's pure functions, fast: a request's parts in, a key or an answer out; an answer in, an action.

tests/http/test_exchange_doors.py runs the same tables through every door under a real server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from goblin_claim import InvalidArgumentError, InvalidArgumentTypeError, _http
from goblin_claim._http import GIVE_BACK, STORE, Answer, Identity, Verdict

LIMIT = 1024 * 1024  # the default max_response_bytes


def options(**given: Any) -> _http.Options:
    """A door's options, checked."""
    return _http.make_options(**given)


def code(answer: object) -> tuple[int, str]:
    """An answer's status and problem kind."""
    assert isinstance(answer, Answer)
    return answer.status, answer.code


@pytest.mark.parametrize(
    ("method", "covered"), [("POST", True), ("PATCH", True), ("PUT", False), ("GET", False), ("DELETE", False)]
)
def test_only_the_methods_given_are_intercepted(method: str, covered: bool) -> None:
    """POST and PATCH by default; any other method passes to the app untouched."""
    assert _http.covers(options(), method) is covered


ADMIT = [
    # (options, marked, header values, path) -> (rule, key or (status, code) or None)
    ({}, None, [], "/orders", ("accept", None)),
    ({}, None, [b"k-1"], "/orders", ("accept", "k-1")),
    ({}, None, [b'"k-1";v=2'], "/orders", ("accept", "k-1")),
    ({"required": True}, None, [], "/orders", ("require", (400, "key-missing"))),
    ({}, None, [b'"a"b"'], "/orders", ("accept", (400, "key-invalid"))),
    ({}, None, [b"a", b"b"], "/orders", ("accept", (400, "key-invalid"))),
    ({}, None, [b"x" * 256], "/orders", ("accept", (400, "key-invalid"))),
    ({"required": True}, "ignore", [b"k-1"], "/orders", ("ignore", None)),
    ({"routes": {"/hooks/*": "ignore"}}, None, [b"k-1"], "/hooks/stripe", ("ignore", None)),
    ({"routes": {"/hooks/*": "require"}}, None, [], "/hooks/stripe", ("require", (400, "key-missing"))),
    ({"routes": lambda request: request["missing"]}, None, [b"k-1"], "/orders", (None, (500, "routes-failed"))),
]


@pytest.mark.parametrize(("given", "marked", "values", "path", "expected"), ADMIT)
def test_the_intake_gives_a_rule_and_a_key_an_answer_or_nothing(
    given: dict[str, Any], marked: _http.KeyRule | None, values: list[bytes], path: str, expected: tuple[Any, Any]
) -> None:
    """The route's rule (its mark, else routes=, else required=), then the key under it."""
    rule, key = _http.admit(options(**given), {}, path, marked, values, "asgi")
    assert (rule, code(key) if isinstance(key, Answer) else key) == expected


@pytest.mark.parametrize(
    ("declared", "size", "refused"),
    [(None, None, False), (10, None, False), (LIMIT + 1, None, True), (None, 10, False), (None, LIMIT + 1, True),
     (None, -1, True), (LIMIT, LIMIT, False)],
)  # fmt: skip
def test_a_body_over_max_body_bytes_is_413(declared: int | None, size: int | None, refused: bool) -> None:
    """Declared or read, a body over the limit is refused before anything runs; -1 is a body cut at the limit."""
    answer = _http.body_refused(options(max_body_bytes=LIMIT), declared, size)
    assert (answer is not None and code(answer) == (413, "body-too-large")) is refused


def test_identify_gives_the_owner_and_a_fingerprint_blind_to_json_key_order() -> None:
    """An int owner is its own space; JSON key order and spacing do not change the fingerprint, the query does."""
    by_user = options(scope=lambda request: request["user"])
    one = _http.identify(by_user, {"user": 7}, b"application/json", b"a=1", b'{"x": 1, "y": 2}', "asgi")
    two = _http.identify(by_user, {"user": 7}, b"application/json", b"a=1", b'{"y":2,"x":1}', "asgi")
    assert isinstance(one, Identity)
    assert (one.owner, one) == ("int:7", two)
    other = _http.identify(by_user, {"user": 7}, b"application/json", b"a=2", b'{"x": 1, "y": 2}', "asgi")
    assert isinstance(other, Identity)
    assert other.fp != one.fp
    assert _http.identify(options(), {}, None, b"", b"", "asgi") == Identity(None, _http.fingerprint(b"", b""))


@pytest.mark.parametrize(
    ("scope", "expected"),
    [(lambda request: None, (403, "no-owner")), (lambda request: request["user"], (500, "scope-failed")),
     (lambda request: 1.5, (500, "scope-failed"))],
)  # fmt: skip
def test_identify_refuses_a_request_without_a_usable_owner(scope: Any, expected: tuple[int, str]) -> None:
    """No owner fails closed (403); a scope function that raises or returns another type is 500."""
    assert code(_http.identify(options(scope=scope), {}, None, b"", b"", "asgi")) == expected


def test_an_exception_the_framework_answers_goes_to_it() -> None:
    """An exception ``passes`` lets through is raised, for the framework to answer."""

    def scope(request: object) -> str:
        raise PermissionError("the framework's own 403")

    with pytest.raises(PermissionError):
        _http.identify(options(scope=scope), {}, None, b"", b"", "flask", lambda error: True)


JSON = [(b"content-type", b"application/json")]
VERDICTS = [
    # (options, status, headers, unbuffered, trailers, size) -> verdict
    ({}, 201, JSON, None, False, 10, STORE),
    ({}, 201, JSON, None, False, None, STORE),  # the body not read yet: nothing against it so far
    ({}, 409, JSON, None, False, 10, STORE),  # a 4xx the endpoint decided is its answer
    ({}, 201, [*JSON, (b"set-cookie", b"s=1")], None, False, 10, STORE),  # kept; the cookie is never replayed
    ({}, 404, JSON, None, False, 10, GIVE_BACK),
    ({}, 429, JSON, None, False, 10, GIVE_BACK),
    ({}, 500, JSON, None, False, 10, GIVE_BACK),
    ({}, 503, [(b"content-type", b"text/event-stream")], "it is a streamed response", True, LIMIT + 1, GIVE_BACK),
    ({"release_statuses": ()}, 404, JSON, None, False, 10, STORE),
    # server_errors="store": a 5xx is the endpoint's answer, kept like a 2xx; 503 and release_statuses still given back
    ({"server_errors": "store"}, 500, JSON, None, False, 10, STORE),
    ({"server_errors": "store"}, 504, JSON, None, False, None, STORE),
    ({"server_errors": "store"}, 503, JSON, None, False, 10, GIVE_BACK),
    ({"server_errors": "store"}, 429, JSON, None, False, 10, GIVE_BACK),
    ({"server_errors": "store", "release_statuses": ()}, 503, JSON, None, False, 10, STORE),
    ({"server_errors": "store", "release_statuses": {500}}, 500, JSON, None, False, 10, GIVE_BACK),
    ({"server_errors": "store"}, 500, JSON, "it is a streamed response", False, None,
     Verdict("pass", "it is a streamed response")),  # not kept whole: marked, never run again
    ({"server_errors": "store"}, 500, JSON, None, False, LIMIT + 1,
     Verdict("pass", f"its body is larger than max_response_bytes={LIMIT}")),
    ({}, 201, [(b"content-type", b"application/x-ndjson")], None, False, 10,
     Verdict("pass", "it is a application/x-ndjson stream")),
    ({}, 200, [(b"Content-Type", b"text/event-stream; charset=utf-8")], None, False, None,
     Verdict("pass", "it is an event stream")),
    ({}, 201, JSON, "it is a streamed response", False, None, Verdict("pass", "it is a streamed response")),
    ({}, 201, JSON, None, True, None, Verdict("pass", "it has trailers")),
    ({}, 201, [(b"content-length", str(LIMIT + 1).encode())], None, False, None,
     Verdict("pass", f"its Content-Length {LIMIT + 1} is larger than max_response_bytes={LIMIT}")),
    ({}, 201, JSON, None, False, LIMIT + 1, Verdict("pass", f"its body is larger than max_response_bytes={LIMIT}")),
    ({}, 201, JSON, None, False, LIMIT, STORE),
]  # fmt: skip


@pytest.mark.parametrize(("given", "status", "headers", "unbuffered", "trailers", "size", "expected"), VERDICTS)
def test_an_answer_is_stored_passed_through_or_given_back(
    given: dict[str, Any], status: int, headers: list[tuple[bytes, bytes]], unbuffered: str | None, trailers: bool,
    size: int | None, expected: Verdict,
) -> None:  # fmt: skip
    """Given back first (release_statuses, every 5xx unless stored), then what cannot be kept, else stored."""
    found = _http.verdict(options(**given), status, headers, unbuffered=unbuffered, trailers=trailers, size=size)
    assert found == expected
    assert _http.gives_back(options(**given), status) is (expected is GIVE_BACK)


def test_an_exception_gives_the_key_back_unless_server_errors_are_stored() -> None:
    """raised(): None by default (given back); with "store", the 500 server-error problem kept, documented."""
    assert _http.raised(options()) is None
    kept = _http.raised(options(server_errors="store"))
    assert kept is not None
    assert (kept.status, kept.code) == (500, "server-error")
    assert (b"content-type", b"application/problem+json") in kept.headers
    assert all(name != b"retry-after" for name, _ in kept.headers)  # retrying will not help: it is the answer
    assert json.loads(kept.body) == {
        "type": "about:blank", "title": "Internal Server Error", "status": 500, "detail": _http.SERVER_ERROR,
    }  # fmt: skip
    linked = _http.raised(options(server_errors="store", problem_docs="https://docs.example/problems"))
    assert linked is not None
    assert json.loads(linked.body)["type"] == "https://docs.example/problems#server-error"


def test_the_store_replays_the_kept_failure_as_the_500_it_is() -> None:
    """The kept problem, stored as a door stores it, replays as a 500 marked Idempotent-Replayed."""
    kept = _http.raised(options(server_errors="store"))
    assert kept is not None
    payload = _http.stored_payload("fp", kept.status, kept.headers, options().keeps_header, kept.body)
    again = _http.replay(payload, "fp")
    assert (again.status, again.body) == (500, kept.body)
    assert _http.REPLAYED_HEADER in again.headers
    assert (b"content-type", b"application/problem+json") in again.headers


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ("give_back", InvalidArgumentError, "server_errors must be 'give back' or 'store', not 'give_back'"),
        ("", InvalidArgumentError, "server_errors must be 'give back' or 'store', not ''"),
        (True, InvalidArgumentTypeError, "server_errors must be the str 'give back' or 'store', not True"),
        (None, InvalidArgumentTypeError, "server_errors must be the str 'give back' or 'store', not None"),
    ],
)
def test_server_errors_takes_give_back_or_store(given: object, error: type[Exception], says: str) -> None:
    """Give back by default; anything but the two words is a typed error naming the option."""
    assert options().server_errors == "give back"
    assert options(server_errors="store").server_errors == "store"
    with pytest.raises(error, match=f"^{says}$"):
        options(server_errors=given)


def test_a_lost_claim_is_answered_503_with_retry_after() -> None:
    """A claim lost before the store: 503, retry to get the stored response."""
    answer = _http.claim_lost()
    assert (answer.status, answer.code, json.loads(answer.body)["detail"]) == (503, "claim-lost", _http.LOST)
    assert (b"retry-after", _http.RETRY_AFTER) in answer.headers
