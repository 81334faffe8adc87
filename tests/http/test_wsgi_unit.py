"""The WSGI middleware called as a WSGI server calls it (environ, start_response, iterate, close), over fakeredis."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest

from goblin_claim import InvalidArgumentTypeError, _http
from goblin_claim.testing import fake_async_redis, fake_redis
from goblin_claim.wsgi import IdempotencyMiddleware

NS = "unit-wsgi"


@dataclass
class App:
    """A WSGI app that counts its runs and answers ``status`` with ``chunks``; ``stop`` raises mid-run."""

    status: str = "201 Created"
    chunks: list[bytes] = field(default_factory=lambda: [b'{"ok":true}'])
    headers: list[tuple[str, str]] = field(default_factory=lambda: [("Content-Type", "application/json")])
    stop: BaseException | None = None
    runs: int = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Count the run, read the body, answer (or raise ``stop``)."""
        self.runs += 1
        environ["wsgi.input"].read()
        if self.stop is not None:
            raise self.stop
        start_response(self.status, self.headers)
        return iter(self.chunks)


@dataclass
class Reply:
    """What the middleware answered."""

    status: int
    headers: dict[str, str]
    body: bytes


def call(
    middleware: Any, body: bytes = b"{}", key: str | None = "k-1", *, read_all: bool = True, path: str = "/orders"
) -> Reply:
    """Call ``middleware`` as a WSGI server does: iterate the body (all of it, or one chunk), then close it."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
        "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(body),
    }  # fmt: skip
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        seen["status"], seen["headers"] = status, headers
        return lambda data: None

    result = middleware(environ, start_response)
    iterator: Iterator[bytes] = iter(result)
    try:
        chunks = list(iterator) if read_all else [next(iterator)]
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return Reply(int(seen["status"].split()[0]), {n.lower(): v for n, v in seen["headers"]}, b"".join(chunks))


@pytest.fixture(params=[False, True], ids=["scripts", "native"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh fakeredis sync client, on the script path and on the native one."""
    made = fake_redis(request.param, server=fakeredis.FakeServer())
    yield made
    made.close()


def test_a_duplicate_is_replayed_byte_for_byte_without_running(client: Any) -> None:
    """The first request runs; a duplicate gets the same status and body, marked Idempotent-Replayed."""
    app = App()
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS)
    first, again = call(middleware), call(middleware)
    assert (first.status, again.status, again.body) == (201, 201, first.body)
    assert again.headers["idempotent-replayed"] == "true"
    assert app.runs == 1


def test_an_app_raising_gives_the_key_back(client: Any) -> None:
    """An exception from the app before any byte was sent releases the key: the retry runs."""
    app = App(stop=RuntimeError("database down"))
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS)
    with pytest.raises(RuntimeError):
        call(middleware)
    app.stop = None
    assert call(middleware).status == 201
    assert app.runs == 2


def test_an_app_raising_keeps_a_500_when_server_errors_are_stored(client: Any) -> None:
    """server_errors="store": the exception reaches the server; the retry gets the kept 500, unrun."""
    app = App(stop=RuntimeError("the ledger row is written, then this"))
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, server_errors="store")
    with pytest.raises(RuntimeError):
        call(middleware)
    app.stop = None
    again = call(middleware)
    assert (again.status, again.headers["idempotent-replayed"]) == (500, "true")
    assert json.loads(again.body)["detail"] == _http.SERVER_ERROR
    assert app.runs == 1


def test_a_500_is_replayed_when_server_errors_are_stored(client: Any) -> None:
    """server_errors="store": a 500 the app answered is stored before it is sent, and replayed; one run."""
    app = App(status="500 Internal Server Error", chunks=[b"ledger ", b"failed"])
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, server_errors="store")
    first, again = call(middleware), call(middleware)
    assert (first.status, again.status, again.body) == (500, 500, b"ledger failed")
    assert again.headers["idempotent-replayed"] == "true"
    assert app.runs == 1


def test_a_worker_stopped_mid_request_keeps_the_key_closed(client: Any) -> None:
    """SystemExit in the app (gunicorn's timeout abort) keeps the key closed: duplicates get 422, no rerun."""
    app = App(stop=SystemExit(1))
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS)
    with pytest.raises(SystemExit):
        call(middleware)
    app.stop = None
    again = call(middleware)
    assert again.status == 422
    assert "ended without a whole response" in json.loads(again.body)["detail"]
    assert app.runs == 1


def test_a_large_response_passes_through_unstored_and_is_never_rerun(client: Any) -> None:
    """A body over max_response_bytes is passed through marked Idempotent-Stored: false; a duplicate gets 422."""
    app = App(chunks=[b"x" * 40, b"y" * 40])
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, max_response_bytes=50)
    first = call(middleware)
    assert (first.status, first.body, first.headers["idempotent-stored"]) == (201, b"x" * 40 + b"y" * 40, "false")
    assert call(middleware).status == 422
    assert app.runs == 1


def test_a_client_gone_mid_passed_response_keeps_the_key_closed(client: Any) -> None:
    """The server closes a passed-through response before its end (client gone): duplicates get 422."""
    app = App(chunks=[b"x" * 40, b"y" * 40, b"z" * 40])
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, max_response_bytes=50)
    call(middleware, read_all=False)
    assert call(middleware).status == 422
    assert app.runs == 1


def test_logs_name_neither_the_key_nor_the_response(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Warnings carry a digest of the key, never the key, the path, the owner or the response's bytes."""
    app = App(chunks=[b"secret-body-" * 10])
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, max_response_bytes=50)
    with caplog.at_level(logging.DEBUG, logger="goblin_claim"):
        call(middleware, key="customer-key-42")
        call(middleware, key="customer-key-42")
    assert caplog.records  # the unstored response is warned about
    for record in caplog.records:
        text = record.getMessage()
        for secret in ("customer-key-42", "/orders", "secret-body"):
            assert secret not in text


def test_routes_patterns_require_or_ignore_the_key_per_path(client: Any) -> None:
    """required=True with routes={'/hooks/*': 'ignore'}: a hook runs keyless, and keyed twice runs twice unclaimed."""
    app = App()
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, required=True, routes={"/hooks/*": "ignore"})
    assert call(middleware, key=None).status == 400
    assert app.runs == 0
    assert [call(middleware, key=key, path="/hooks/stripe").status for key in (None, "k-1", "k-1")] == [201] * 3
    assert app.runs == 3
    assert client.keys(f"{NS}:*") == []  # never claimed


@pytest.mark.usefixtures("fresh_log")
def test_a_raising_scope_is_answered_500_and_nothing_runs_or_is_stored(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A scope function reading an environ key no auth set is 500 scope-failed, naming it and the fix; logged once."""
    app = App()
    scope = lambda environ: environ["REMOTE_USER"]  # noqa: E731 -- the one-liner users write
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS, scope=scope)
    with caplog.at_level(logging.ERROR, logger="goblin_claim"):
        replies = [call(middleware) for _ in range(3)]
    assert {reply.status for reply in replies} == {500}
    problem = json.loads(replies[0].body)
    assert replies[0].headers["content-type"] == "application/problem+json"
    assert "raised KeyError('REMOTE_USER')" in problem["detail"]
    assert "auth(IdempotencyMiddleware(app, ...))" in problem["detail"]
    assert app.runs == 0
    assert client.keys(f"{NS}:*") == []
    assert len([r for r in caplog.records if r.name == "goblin_claim.wsgi"]) == 1


def test_an_asyncio_client_is_refused() -> None:
    """The WSGI middleware needs a sync client: an asyncio one is a TypeError at construction."""
    with pytest.raises(InvalidArgumentTypeError, match="sync client"):
        IdempotencyMiddleware(App(), client=fake_async_redis(False))


def test_the_wsgi_middleware_imports_no_web_framework() -> None:
    """Importing goblin_claim.wsgi loads no web framework (Flask, Werkzeug, Django, Starlette)."""
    code = (
        "import sys, goblin_claim.wsgi; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'flask', 'werkzeug', 'django', 'starlette'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"


def test_a_duplicate_answered_500_is_warned_about(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A duplicate whose stored value cannot be read is answered 500, and the door says so (as the ASGI one does)."""
    app = App()
    middleware = IdempotencyMiddleware(app, client=client, namespace=NS)
    call(middleware)
    (name,) = client.keys(f"{NS}:*")
    _, token, _ = client.get(name).split(b" ", 2)
    client.set(name, b"done " + token + b" not an envelope")
    with caplog.at_level(logging.WARNING, logger="goblin_claim.wsgi"):
        assert call(middleware).status == 500
    assert any(
        "a duplicate was answered 500" in r.getMessage() for r in caplog.records if r.name == "goblin_claim.wsgi"
    )
    assert app.runs == 1
