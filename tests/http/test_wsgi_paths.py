"""The WSGI middleware's less travelled paths, as a WSGI server drives it: bodies, odd apps, Redis failing.

Each test calls the middleware with an environ and ``start_response``, iterates
what it returns and closes it, as gunicorn does, over fakeredis (or a
redis-server of the test's own where Redis must refuse or vanish).
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis

from goblin_claim.wsgi import IdempotencyMiddleware
from tests.support import servers

NS = "wsgi-paths"
DOCS = "https://docs.example/problems"


@dataclass
class Reply:
    """What a client got."""

    status: str
    headers: dict[str, str]
    body: bytes

    @property
    def code(self) -> int:
        """The status code."""
        return int(self.status.split(" ", 1)[0])

    @property
    def problem(self) -> str:
        """The problem's documented code (its ``type`` anchor)."""
        assert self.headers["content-type"] == "application/problem+json"
        kind: str = json.loads(self.body)["type"]
        return kind.removeprefix(DOCS + "#")


def environ(
    body: bytes = b"{}", key: str | None = "k-1", *, method: str = "POST", length: str | None = "auto"
) -> dict[str, Any]:
    """A WSGI environ for ``method /orders`` with ``body`` (``length=None``: no Content-Length)."""
    made: dict[str, Any] = {
        "REQUEST_METHOD": method, "PATH_INFO": "/orders", "SCRIPT_NAME": "", "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(body),
    }  # fmt: skip
    if length == "auto":
        made["CONTENT_LENGTH"] = str(len(body))
    elif length is not None:
        made["CONTENT_LENGTH"] = length
    if key is not None:
        made["HTTP_IDEMPOTENCY_KEY"] = key
    return made


def serve(middleware: Any, env: dict[str, Any], *, close_twice: bool = False) -> Reply:
    """Call ``middleware`` as a server does: start_response, iterate everything, close."""
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        seen["status"], seen["headers"] = status, headers
        return lambda data: None

    result = middleware(env, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
            if close_twice:
                close()
    return Reply(seen["status"], {n.lower(): v for n, v in seen["headers"]}, body)


class Counted:
    """A WSGI app counting its runs; ``answer(environ, start_response)`` is what each run does."""

    def __init__(self, answer: Callable[[dict[str, Any], Any], Iterable[bytes]]) -> None:
        self.answer = answer
        self.runs = 0
        self.bodies: list[bytes] = []

    def __call__(self, env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """Count the run, read the body, answer."""
        self.runs += 1
        self.bodies.append(env["wsgi.input"].read())
        return self.answer(env, start_response)


def created(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    """A 201 with a small JSON body."""
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"order":1}']


@pytest.fixture
def redis_client() -> Iterator[fakeredis.FakeRedis]:
    """A fresh fakeredis client of the test's own."""
    made = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield made
    made.close()


def door(app: Any, client: Any, **options: Any) -> IdempotencyMiddleware:
    """The middleware around ``app``, its problems linked to DOCS so their codes show."""
    return IdempotencyMiddleware(app, client=client, namespace=NS, problem_docs=DOCS, **options)


# --------------------------------------------------------------------------- what passes untouched


def test_a_get_and_a_keyless_post_pass_through_unclaimed(redis_client: Any) -> None:
    """A method not intercepted, or a POST without a key when none is required, runs every time, nothing stored."""
    app = Counted(created)
    middleware = door(app, redis_client)
    assert serve(middleware, environ(method="GET")).code == 201
    assert serve(middleware, environ(key=None)).code == 201
    assert serve(middleware, environ(key=None)).code == 201
    assert app.runs == 3
    assert redis_client.keys(f"{NS}:*") == []


def test_a_required_key_missing_is_400_and_the_app_never_runs(redis_client: Any) -> None:
    """``required=True``: a POST without the header gets the key-missing problem."""
    app = Counted(created)
    reply = serve(door(app, redis_client, required=True), environ(key=None))
    assert (reply.code, reply.problem) == (400, "key-missing")
    assert app.runs == 0


def test_a_failing_routes_function_is_500_and_nothing_runs(redis_client: Any, fresh_log: None) -> None:
    """A ``routes`` function that raises answers 500 routes-failed; the app is not run unguarded."""

    def routes(env: dict[str, Any]) -> str:
        raise LookupError("no table")

    app = Counted(created)
    reply = serve(door(app, redis_client, routes=routes), environ())
    assert (reply.code, reply.problem) == (500, "routes-failed")
    assert app.runs == 0


# --------------------------------------------------------------------------- the request body


def test_a_declared_body_over_the_limit_is_413_before_anything_is_read(redis_client: Any) -> None:
    """Content-Length above ``max_body_bytes``: refused at once, the body never read, the app never run."""
    app = Counted(created)
    env = environ(b"x" * 64)
    reply = serve(door(app, redis_client, max_body_bytes=16), env)
    assert (reply.code, reply.problem) == (413, "body-too-large")
    assert "64 bytes" in json.loads(reply.body)["detail"]
    assert env["wsgi.input"].tell() == 0
    assert app.runs == 0


def test_a_body_shorter_than_its_content_length_is_400(redis_client: Any) -> None:
    """The client left before sending its whole body: 400, nothing ran, the key is not taken."""
    app = Counted(created)
    middleware = door(app, redis_client)
    reply = serve(middleware, environ(b"{}", length="10"))
    assert reply.code == 400
    assert "ended before its Content-Length" in json.loads(reply.body)["detail"]
    assert app.runs == 0
    assert serve(middleware, environ(b"{}")).code == 201  # the whole request, same key, runs
    assert app.runs == 1


def test_a_chunked_body_the_server_terminates_is_read_and_fingerprinted(redis_client: Any) -> None:
    """No Content-Length but ``wsgi.input_terminated``: the body is read whole, the app sees it, a duplicate replays."""
    app = Counted(created)
    middleware = door(app, redis_client)
    first = environ(b'{"a": 1}', length=None)
    first["wsgi.input_terminated"] = True
    assert serve(middleware, first).code == 201
    assert app.bodies == [b'{"a": 1}']
    other = environ(b'{"a": 2}', length=None)
    other["wsgi.input_terminated"] = True
    reply = serve(middleware, other)
    assert (reply.code, reply.problem) == (422, "key-reused")  # its body was fingerprinted, not skipped
    assert app.runs == 1


def test_a_chunked_body_over_the_limit_is_413(redis_client: Any) -> None:
    """A terminated stream longer than ``max_body_bytes`` is refused without its size (it was not read whole)."""
    app = Counted(created)
    env = environ(b"x" * 64, length=None)
    env["wsgi.input_terminated"] = True
    reply = serve(door(app, redis_client, max_body_bytes=16), env)
    assert (reply.code, reply.problem) == (413, "body-too-large")
    assert json.loads(reply.body)["detail"].startswith("the body is more than the 16 bytes")
    assert app.runs == 0


def test_no_length_and_no_terminated_stream_is_an_empty_body(redis_client: Any) -> None:
    """WSGI without Content-Length or ``wsgi.input_terminated``: no body is read; the app sees an empty one."""
    app = Counted(created)
    reply = serve(door(app, redis_client), environ(b"ignored", length=None))
    assert reply.code == 201
    assert app.bodies == [b""]


# --------------------------------------------------------------------------- apps a server tolerates


def test_an_app_that_starts_its_response_lazily_is_stored_and_replayed(redis_client: Any) -> None:
    """A generator app yielding an empty chunk before start_response: its answer is kept whole, empty chunk dropped."""

    def lazy(env: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        yield b""
        start_response("201 Created", [("Content-Type", "text/plain")])
        yield b"made"
        yield b""
        yield b" once"

    app = Counted(lazy)
    middleware = door(app, redis_client)
    first, again = serve(middleware, environ()), serve(middleware, environ())
    assert (first.code, first.body) == (201, b"made once")
    assert (again.code, again.body, again.headers["idempotent-replayed"]) == (201, b"made once", "true")
    assert app.runs == 1


def test_an_app_that_never_starts_a_response_raises_and_keeps_the_key_closed(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No start_response at all: the server sees a RuntimeError; the app began, so a duplicate gets 422 abandoned."""

    def silent(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return []

    app = Counted(silent)
    middleware = door(app, redis_client)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"), pytest.raises(RuntimeError, match="start_response"):
        serve(middleware, environ())
    assert any("without calling start_response" in r.getMessage() for r in caplog.records)
    again = serve(middleware, environ())
    assert (again.code, again.problem) == (422, "abandoned")
    assert app.runs == 1


def test_an_unknown_status_is_replayed_with_a_generic_reason(redis_client: Any) -> None:
    """A status outside the registry (299) is stored; its replay's status line says ``299 Unknown``."""

    def odd(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("299 Custom", [("Content-Type", "text/plain")])
        return [b"odd"]

    app = Counted(odd)
    middleware = door(app, redis_client)
    assert serve(middleware, environ()).status == "299 Custom"
    again = serve(middleware, environ())
    assert (again.status, again.body, again.headers["idempotent-replayed"]) == ("299 Unknown", b"odd", "true")
    assert app.runs == 1


def test_a_passed_response_closed_twice_settles_its_key_once(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A server calling close() twice on a passed-through response: the key is marked once, duplicates get 422."""

    def big(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"x" * 40, b"y" * 40]

    app = Counted(big)
    middleware = door(app, redis_client, max_response_bytes=50)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        first = serve(middleware, environ(), close_twice=True)
    assert (first.code, first.body, first.headers["idempotent-stored"]) == (200, b"x" * 40 + b"y" * 40, "false")
    (name,) = redis_client.keys(f"{NS}:*")
    marked = redis_client.get(name)
    again = serve(middleware, environ())
    assert (again.code, again.problem) == (422, "not-kept")
    assert redis_client.get(name) == marked
    assert app.runs == 1


def test_a_passed_response_with_a_status_not_kept_gives_the_key_back(redis_client: Any) -> None:
    """A large 503 is passed through unmarked; once it was sent the key is free and a retry runs."""

    def busy(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"z" * 40, b"z" * 40]

    app = Counted(busy)
    middleware = door(app, redis_client, max_response_bytes=50)
    first = serve(middleware, environ())
    assert first.code == 503
    assert "idempotent-stored" not in first.headers
    assert serve(middleware, environ()).code == 503
    assert app.runs == 2
    assert redis_client.keys(f"{NS}:*") == []


# --------------------------------------------------------------------------- Redis failing


def test_a_claim_taken_over_while_the_app_ran_is_503_claim_lost(redis_client: Any) -> None:
    """The key lapsed and was gone when the app finished: its answer is not given out; 503 claim-lost."""

    def lapsing(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        redis_client.delete(*redis_client.keys(f"{NS}:*"))  # the lease lapsed
        return created(env, start_response)

    app = Counted(lapsing)
    reply = serve(door(app, redis_client), environ())
    assert (reply.code, reply.problem) == (503, "claim-lost")
    assert reply.headers["retry-after"]
    assert app.runs == 1


def test_redis_unreachable_is_503_and_the_app_never_runs(caplog: pytest.LogCaptureFixture) -> None:
    """No Redis to claim on: the request is refused 503 with Retry-After, never run unguarded."""
    client = redis.Redis(host="127.0.0.1", port=servers.free_port(), socket_connect_timeout=1)
    app = Counted(created)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        reply = serve(door(app, client), environ())
    assert (reply.code, reply.problem) == (503, "store-unavailable")
    assert reply.headers["retry-after"]
    assert any("the idempotency claim failed, answering 503" in r.getMessage() for r in caplog.records)
    assert app.runs == 0


def test_redis_unreachable_with_fail_open_runs_the_app_once_per_delivery(caplog: pytest.LogCaptureFixture) -> None:
    """fail_open=True, no Redis: each delivery runs the app once, its answer passed through unkept; logged each time."""
    client = redis.Redis(host="127.0.0.1", port=servers.free_port(), socket_connect_timeout=1, retry=None)
    app = Counted(created)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        replies = [serve(door(app, client, fail_open=True), environ()) for _ in range(2)]
        refused = serve(door(app, client), environ())
    assert [(r.code, r.body, r.headers) for r in replies] == [
        (201, b'{"order":1}', {"content-type": "application/json"})
    ] * 2
    assert (refused.code, refused.problem) == (503, "store-unavailable")
    assert app.runs == 2
    opened = [r for r in caplog.records if "fail_open runs the work" in r.getMessage()]
    told = [(r.name, r.levelno, getattr(r, "outcome", None)) for r in opened]
    assert told == [("goblin_claim.wsgi", logging.WARNING, "failed_open")] * 2


def test_a_store_redis_refuses_sends_the_answer_marked_unstored(
    own_server: Callable[..., servers.RedisProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis out of memory when the app finished: the answer is sent with Idempotent-Stored: false, and logged."""
    server = own_server()
    client = server.client()
    admin = server.client()

    def filling(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        return created(env, start_response)

    app = Counted(filling)
    try:
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            reply = serve(door(app, client, lease=5), environ())
    finally:
        admin.config_set("maxmemory", 0)
    assert (reply.code, reply.body, reply.headers["idempotent-stored"]) == (201, b'{"order":1}', "false")
    messages = [r.getMessage() for r in caplog.records]
    assert any("the response could not be stored (ServerError)" in m for m in messages), messages
    # The marker is refused too: said so; the key stays held until its lease ends, so a duplicate waits.
    assert any("could not keep the key closed (ServerError)" in m for m in messages), messages
    again = serve(door(app, client, lease=5), environ())
    assert (again.code, again.problem) == (409, "in-flight")
    assert app.runs == 1


# --------------------------------------------------------------------------- duplicates that wait, records not ours


def test_a_duplicate_waits_for_the_first_and_gets_its_answer_or_409_when_it_waited_out(redis_client: Any) -> None:
    """With ``wait``: a duplicate of a running request gets its answer once it finished, or 409 after waiting."""
    release = threading.Event()
    started = threading.Event()

    def slow(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        started.set()
        release.wait(10)
        return created(env, start_response)

    app = Counted(slow)
    replies: dict[str, Reply] = {}

    def run(name: str, wait: float) -> None:
        replies[name] = serve(door(app, redis_client, wait=wait), environ())

    first = threading.Thread(target=run, args=("first", 0))
    first.start()
    assert started.wait(10)
    run("impatient", 0.2)  # the first is still running: it waits 0.2s, then is told
    waiter = threading.Thread(target=run, args=("patient", 10))
    waiter.start()
    release.set()
    first.join(10)
    waiter.join(10)
    impatient = replies["impatient"]
    assert (impatient.code, impatient.problem) == (409, "in-flight")
    assert json.loads(impatient.body)["detail"].endswith("(waited 0.2s)")
    assert impatient.headers["retry-after"]
    assert (replies["first"].code, replies["first"].body) == (201, b'{"order":1}')
    patient = replies["patient"]
    assert (patient.code, patient.body, patient.headers["idempotent-replayed"]) == (201, b'{"order":1}', "true")
    assert app.runs == 1


def test_a_done_record_without_a_value_is_500_result_lost(redis_client: Any) -> None:
    """A key another writer left "done" without a value: the duplicate is told 500 result-lost, nothing runs."""
    app = Counted(created)
    middleware = door(app, redis_client)
    assert serve(middleware, environ()).code == 201
    (name,) = redis_client.keys(f"{NS}:*")
    redis_client.set(name, b"done another-writer")
    reply = serve(middleware, environ())
    assert (reply.code, reply.problem) == (500, "result-lost")
    assert app.runs == 1


# --------------------------------------------------------------------------- Redis gone while the app runs


def test_redis_gone_while_the_app_ran_sends_its_answer_marked_unstored(
    own_server: Callable[..., servers.RedisProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """The store is retried through the lease, then given up: the client gets the answer, Idempotent-Stored: false."""
    server = own_server()

    def stopping(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        server.stop()
        return created(env, start_response)

    app = Counted(stopping)
    client = server.client(socket_connect_timeout=0.5, socket_timeout=0.5)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        reply = serve(door(app, client, lease=3), environ())
    assert (reply.code, reply.body, reply.headers["idempotent-stored"]) == (201, b'{"order":1}', "false")
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not be stored (ConnectionFailedError)" in m for m in messages), messages
    assert not any("could not keep the key closed" in m for m in messages)  # no marker tried on a dead connection
    assert app.runs == 1


def test_an_app_failing_after_redis_went_away_raises_its_own_error(
    own_server: Callable[..., servers.RedisProcess],
) -> None:
    """Redis gone, the key cannot be given back (it frees itself after its lease): the error reaches the server."""
    server = own_server()

    def failing(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        server.stop()
        raise LookupError("the order table is gone")

    app = Counted(failing)
    client = server.client(socket_connect_timeout=0.5, socket_timeout=0.5)
    with pytest.raises(LookupError, match="order table"):
        serve(door(app, client, lease=1), environ())
    assert app.runs == 1


def test_a_status_not_kept_gives_the_key_back_before_its_last_chunk_goes_out(redis_client: Any) -> None:
    """A client that read the whole 503 and retries at once runs again: the key is free before the last chunk goes."""

    def busy(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"busy, ", b"try again"]

    app = Counted(busy)
    middleware = door(app, redis_client)
    statuses: list[str] = []
    result = middleware(environ(), lambda status, headers, exc_info=None: statuses.append(status))
    held = [(chunk, bool(redis_client.keys(f"{NS}:*"))) for chunk in result]
    result.close()
    assert statuses == ["503 Service Unavailable"]
    assert held == [(b"busy, ", True), (b"try again", False)]
    assert serve(middleware, environ()).code == 503
    assert app.runs == 2


def test_an_unstored_response_marks_the_key_before_its_last_chunk_goes_out(redis_client: Any) -> None:
    """A client that read a whole response passed through unkept and retries at once is told 422, not 409."""

    def large(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"a" * 40, b"b" * 40]

    app = Counted(large)
    middleware = door(app, redis_client, max_response_bytes=50)
    result = middleware(environ(), lambda status, headers, exc_info=None: None)
    records = [(chunk, [redis_client.get(k) or b"" for k in redis_client.keys(f"{NS}:*")]) for chunk in result]
    result.close()
    assert [chunk for chunk, _ in records] == [b"a" * 40, b"b" * 40]
    assert not records[0][1][0].startswith(b"done ")  # still the claim while the body goes out
    assert records[1][1][0].startswith(b"done ")  # marked before the last chunk
    assert serve(middleware, environ()).code == 422
    assert app.runs == 1
