"""The doors' shared rules seen through the WSGI middleware: options refused, compressed replays, body fingerprints.

Each rule is the shared core's, so one door shows it for all; the WSGI door is
called in-process, as a server calls it, over fakeredis.
"""

from __future__ import annotations

import gzip
import io
import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import fakeredis
import pytest

from goblin_claim import InvalidArgumentError, InvalidArgumentTypeError
from goblin_claim.asgi import idempotency_key
from goblin_claim.wsgi import IdempotencyMiddleware

NS = "rules-paths"
DOCS = "https://docs.example/problems"


def serve(middleware: Any, body: bytes = b"{}", *, kind: str = "application/json", **headers: str) -> Any:
    """POST /orders with ``body`` and the key (and ``headers``, as ``HTTP_*``): ``(status, headers, body)``."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "SCRIPT_NAME": "", "QUERY_STRING": "",
        "CONTENT_TYPE": kind, "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
        "HTTP_IDEMPOTENCY_KEY": "k-1", **{f"HTTP_{name.upper()}": value for name, value in headers.items()},
    }  # fmt: skip
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        seen["status"], seen["headers"] = int(status.split()[0]), {n.lower(): v for n, v in headers}
        return lambda data: None

    result = middleware(environ, start_response)
    content = b"".join(result)
    getattr(result, "close", lambda: None)()
    return seen["status"], seen["headers"], content


def counting(body: bytes = b"made", headers: list[tuple[str, str]] | None = None) -> Any:
    """A WSGI app answering 201 with ``body``; its ``runs`` counts the runs."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        app.runs += 1  # type: ignore[attr-defined]
        environ["wsgi.input"].read()
        start_response("201 Created", headers or [("Content-Type", "text/plain")])
        return [body]

    app.runs = 0  # type: ignore[attr-defined]
    return app


def door(app: Any, **options: Any) -> IdempotencyMiddleware:
    """The middleware around ``app`` over a fresh fakeredis."""
    return IdempotencyMiddleware(
        app, client=fakeredis.FakeRedis(server=fakeredis.FakeServer()), namespace=NS, **options
    )


# --------------------------------------------------------------------------- options refused at once


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"replay_headers": "content-type"}, InvalidArgumentTypeError, "replay_headers must be a tuple"),
        ({"replay_headers": ("content type",)}, InvalidArgumentTypeError, "replay_headers must hold header names"),
        ({"replay_headers": ("Content-Length",)}, InvalidArgumentError, "which is recomputed on replay"),
        ({"replay_headers": ("set-cookie",)}, InvalidArgumentError, "which is never replayed"),
        ({"never_replayed": "x-secret"}, InvalidArgumentTypeError, "never_replayed must be a collection"),
        ({"never_replayed": ("x secret",)}, InvalidArgumentTypeError, "never_replayed must hold header names"),
        ({"stream_types": "text/csv"}, InvalidArgumentTypeError, "stream_types must be a collection"),
        ({"stream_types": ("csv",)}, InvalidArgumentTypeError, "stream_types must hold content types"),
        ({"problem_docs": "ftp://docs.example"}, InvalidArgumentError, "problem_docs must be an http(s) URL"),
        ({"problem_docs": "https://docs.example#x"}, InvalidArgumentError, "without a fragment"),
        ({"release_statuses": "404"}, InvalidArgumentTypeError, "release_statuses must be a set of status codes"),
        ({"fingerprint": "xml"}, InvalidArgumentError, "fingerprint must be one of auto, bytes"),
    ],
)
def test_bad_options_are_refused_when_wrapping(options: dict[str, Any], error: type[Exception], says: str) -> None:
    """Each option is checked when the middleware is made, with a message naming it."""
    with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)")):
        door(counting(), **options)


def test_replay_headers_are_kept_once_each_in_lower_case() -> None:
    """``replay_headers`` names repeated in another case: only those headers come back on a replay."""
    app = counting(headers=[("Content-Type", "text/plain"), ("ETag", '"v1"'), ("X-Trace", "abc")])
    middleware = door(app, replay_headers=("ETag", "etag", "content-type"))
    serve(middleware)
    _, headers, _ = serve(middleware)
    assert headers["etag"] == '"v1"'
    assert "x-trace" not in headers
    assert app.runs == 1


def test_a_mark_on_something_that_takes_no_attribute_is_refused() -> None:
    """``idempotency_key("ignore")`` on an object without attributes (an int) says what it marks."""
    with pytest.raises(InvalidArgumentTypeError, match="marks a function or a class, not int"):
        idempotency_key("ignore")(7)  # type: ignore[type-var]


def test_a_fingerprint_function_returning_neither_str_nor_bytes_fails_the_request() -> None:
    """A fingerprint function's bad return reaches the server as the error it is; the app does not run."""
    app = counting()
    with pytest.raises(InvalidArgumentTypeError, match="the fingerprint function must return str or bytes, not"):
        serve(door(app, fingerprint=lambda environ: 42))
    assert app.runs == 0


def test_a_fingerprint_function_decides_what_a_duplicate_is() -> None:
    """A function of the environ (here: one header) names the request: other bodies are the same operation."""
    app = counting()
    middleware = door(app, fingerprint=lambda environ: environ.get("HTTP_X_ORDER", "").encode())
    serve(middleware, b'{"a": 1}', x_order="o-1")
    status, headers, _ = serve(middleware, b'{"a": 2}', x_order="o-1")
    assert (status, headers["idempotent-replayed"]) == (201, "true")
    assert serve(middleware, b'{"a": 1}', x_order="o-2")[0] == 422
    assert app.runs == 1


# --------------------------------------------------------------------------- compressed replays


def raw_deflate(data: bytes) -> bytes:
    """A raw deflate stream (no zlib header), as some servers send for Content-Encoding: deflate."""
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("coding", "packed"),
    [
        ("gzip", gzip.compress(b"the order")),
        ("deflate", zlib.compress(b"the order")),
        ("deflate", raw_deflate(b"the order")),
    ],
    ids=["gzip", "zlib-deflate", "raw-deflate"],
)
def test_a_compressed_answer_is_unpacked_for_a_duplicate_refusing_its_coding(coding: str, packed: bytes) -> None:
    """Stored compressed: a duplicate refusing the coding gets it decompressed; one accepting it, as stored."""
    app = counting(packed, [("Content-Type", "text/plain"), ("Content-Encoding", coding)])
    middleware = door(app)
    serve(middleware, accept_encoding=coding)
    _, plain_headers, plain = serve(middleware, accept_encoding=f"identity, {coding};q=0")
    assert plain == b"the order"
    assert "content-encoding" not in plain_headers
    assert plain_headers["content-length"] == str(len(b"the order"))
    _, packed_headers, as_stored = serve(middleware, accept_encoding=f"{coding};q=0.5, ,br")
    assert (as_stored, packed_headers["content-encoding"]) == (packed, coding)
    assert serve(middleware)[2] == packed  # no Accept-Encoding admits any coding (RFC 9110)
    assert app.runs == 1


def test_an_unreadable_weight_refuses_the_coding_and_an_undecodable_body_is_replayed_as_stored() -> None:
    """``q=abc`` counts as 0 (refused); a body that does not decode as its coding is replayed as it was."""
    app = counting(b"not gzip at all", [("Content-Type", "text/plain"), ("Content-Encoding", "gzip")])
    middleware = door(app)
    serve(middleware)
    _, headers, body = serve(middleware, accept_encoding="gzip;q=abc")
    assert (body, headers["content-encoding"]) == (b"not gzip at all", "gzip")
    assert app.runs == 1


# --------------------------------------------------------------------------- body fingerprints


def multipart(boundary: str, parts: list[tuple[str, str, bytes]], *, close: bool = True) -> bytes:
    """A multipart/form-data body of ``(name, filename, content)`` parts."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: text/plain\r\n\r\n".encode()
        out += content + b"\r\n"
    return out + (f"--{boundary}--\r\n".encode() if close else b"")


def test_multipart_bodies_drawn_with_another_boundary_are_the_same_request() -> None:
    """The same parts under a new boundary (clients draw one per request): a replay, not 422."""
    app = counting()
    middleware = door(app)
    parts = [("note", "", b"hello"), ("file", "a.txt", b"contents")]
    serve(middleware, multipart("AAA", parts), kind="multipart/form-data; boundary=AAA")
    status, headers, _ = serve(middleware, multipart("BBB", parts), kind='multipart/form-data; boundary="BBB"')
    assert (status, headers["idempotent-replayed"]) == (201, "true")
    changed = multipart("CCC", [("note", "", b"hello"), ("file", "a.txt", b"other")])
    assert serve(middleware, changed, kind="multipart/form-data; boundary=CCC")[0] == 422
    assert app.runs == 1


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (multipart("AAA", [("note", "", b"hello")]), "multipart/form-data"),  # no boundary parameter
        (multipart("AAA", [("note", "", b"hello")], close=False), "multipart/form-data; boundary=AAA"),
        (b"--AAA\r\nno header end here\r\n--AAA--\r\n", "multipart/form-data; boundary=AAA"),
        (b"a=1&&=", "application/x-www-form-urlencoded"),
    ],
    ids=["no-boundary", "unclosed", "part-without-headers", "bad-form"],
)
def test_a_body_that_does_not_parse_as_its_type_is_compared_byte_for_byte(body: bytes, kind: str) -> None:
    """A body not the multipart or form it claims: the same bytes replay, a byte more is another request."""
    app = counting()
    middleware = door(app)
    serve(middleware, body, kind=kind)
    status, headers, _ = serve(middleware, body, kind=kind)
    assert (status, headers["idempotent-replayed"]) == (201, "true")
    assert serve(middleware, body + b" ", kind=kind)[0] == 422
    assert app.runs == 1


# --------------------------------------------------------------------------- routes, keys, statuses


def test_routes_that_are_neither_a_mapping_nor_a_function_or_hold_a_bad_pattern_are_refused() -> None:
    """``routes`` must map '/' patterns to rules, or be a function: anything else is refused when wrapping."""
    with pytest.raises(InvalidArgumentTypeError, match="routes must map path patterns"):
        door(counting(), routes=["/webhooks/*"])
    with pytest.raises(InvalidArgumentError, match="routes holds path patterns beginning with '/'"):
        door(counting(), routes={"webhooks/*": "ignore"})


def test_a_routes_function_returning_no_rule_is_500(fresh_log: None) -> None:
    """A routes function answering something other than a rule or None: 500 routes-failed, nothing runs."""
    app = counting()
    status, headers, body = serve(door(app, routes=lambda environ: "maybe", problem_docs=DOCS))
    assert (status, headers["content-type"]) == (500, "application/problem+json")
    assert b"#routes-failed" in body
    assert app.runs == 0


@pytest.mark.parametrize(
    ("key", "status"),
    [('"abc', 400), ('"a\\b"', 400), ('"a\x01b"', 400), ('"a\\"b"', 201), ('"a\\\\b"', 201)],
    ids=["no-closing-quote", "bad-escape", "control-byte", "escaped-quote", "escaped-backslash"],
)
def test_quoted_keys_are_read_as_structured_field_strings(key: str, status: int) -> None:
    """A quoted key is an RFC 8941 string: escapes of a quote or a backslash are fine, anything else is 400."""
    app = counting()
    got, _, body = serve(door(app), idempotency_key=key)
    assert got == status
    if status == 400:
        assert b"not a well-formed structured-field string" in body
    assert app.runs == (1 if status == 201 else 0)


def test_a_204_is_replayed_without_a_body_length() -> None:
    """A status that never has a body (204): replayed with no Content-Length added (RFC 9110 section 8.6)."""

    def no_content(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ["wsgi.input"].read()
        start_response("204 No Content", [])
        return [b""]

    middleware = door(no_content)
    serve(middleware)
    status, headers, body = serve(middleware)
    assert (status, body, headers["idempotent-replayed"]) == (204, b"", "true")
    assert "content-length" not in headers


def test_form_bodies_with_their_fields_in_another_order_are_the_same_request() -> None:
    """Form fields compared by name (one name's values in order): reordered fields replay, a changed one is 422."""
    app = counting()
    middleware = door(app)
    form = "application/x-www-form-urlencoded"
    serve(middleware, b"a=1&b=2&b=3", kind=form)
    status, headers, _ = serve(middleware, b"b=2&a=1&b=3", kind=form)
    assert (status, headers["idempotent-replayed"]) == (201, "true")
    assert serve(middleware, b"b=3&a=1&b=2", kind=form)[0] == 422  # b's values in another order
    assert app.runs == 1


def test_multipart_part_headers_besides_disposition_and_type_do_not_matter() -> None:
    """A part's other headers (Content-Transfer-Encoding) are not compared: the same parts replay."""
    app = counting()
    middleware = door(app)
    extra = (
        b'--AAA\r\nContent-Disposition: form-data; name="note"\r\nContent-Transfer-Encoding: 8bit\r\n\r\nhello\r\n'
        b"--AAA--\r\n"
    )
    serve(middleware, extra, kind="multipart/form-data; boundary=AAA")
    status, headers, _ = serve(middleware, extra.replace(b"AAA", b"BBB"), kind="multipart/form-data; boundary=BBB")
    assert (status, headers["idempotent-replayed"]) == (201, "true")
    assert app.runs == 1


def test_a_duplicate_with_another_body_while_the_first_runs_is_422() -> None:
    """The key reused with a different body while the first request is still running: 422 at once, not 409."""
    release, started = threading.Event(), threading.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ["wsgi.input"].read()
        started.set()
        release.wait(10)
        start_response("201 Created", [])
        return [b"made"]

    middleware = door(slow, problem_docs=DOCS)
    first = threading.Thread(target=serve, args=(middleware, b'{"a": 1}'))
    first.start()
    assert started.wait(10)
    try:
        status, _, body = serve(middleware, b'{"a": 2}')
    finally:
        release.set()
        first.join(10)
    assert (status, b"#key-reused" in body) == (422, True)


def test_a_scope_function_reading_a_missing_attribute_is_500_naming_it(fresh_log: None) -> None:
    """A scope function raising AttributeError: 500 scope-failed, its detail naming the missing attribute."""
    app = counting()
    status, _, body = serve(door(app, scope=lambda environ: environ.user, problem_docs=DOCS))
    assert status == 500
    assert b"#scope-failed" in body
    assert b"AttributeError (no attribute 'user')" in body
    assert app.runs == 0
