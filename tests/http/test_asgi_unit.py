"""IdempotencyMiddleware driven as plain ASGI (no framework, no server) over fakeredis: the fast tier.

Each test builds a bare ASGI app, wraps it, and calls it with hand-made
``receive`` and ``send`` on its own event loop, on fakeredis with scripts and
with the native commands.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

import goblin_claim._drivers.http_aio
import goblin_claim.asgi
from goblin_claim import (
    AsyncClaim,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ServerError,
    _http,
)
from goblin_claim.asgi import DEFAULT_REPLAY_HEADERS, IdempotencyMiddleware, Message, Scope
from goblin_claim.testing import fake_async_redis
from tests.conftest import record as done_record

NS = "unit-http"


@dataclass
class Reply:
    """What the middleware sent for one request."""

    messages: list[Message]

    @property
    def status(self) -> int:
        """The response's status."""
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The response's headers, as sent."""
        return [(bytes(n), bytes(v)) for n, v in self.messages[0].get("headers", ())]

    def header(self, name: bytes) -> bytes | None:
        """One header's value, or ``None``."""
        return next((v for n, v in self.headers if n == name), None)

    @property
    def body(self) -> bytes:
        """The body, all chunks joined."""
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def problem(self, status: int) -> dict[str, Any]:
        """The RFC 9457 problem sent, checked for status and shape."""
        assert self.status == status, self.body
        assert self.header(b"content-type") == b"application/problem+json"
        data: dict[str, Any] = json.loads(self.body)
        assert set(data) == {"type", "title", "status", "detail"}
        assert data["status"] == status
        return data


@dataclass
class App:
    """A bare ASGI app: answers with ``status``, ``headers`` and ``chunks``, counting its runs."""

    status: int = 201
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: [(b"content-type", b"application/json")])
    chunks: list[bytes] = field(default_factory=lambda: [b'{"ok":true}'])
    runs: int = 0
    bodies: list[bytes] = field(default_factory=list)
    before: Callable[[], Awaitable[None]] | None = None
    raw: Callable[[Callable[[Message], Awaitable[None]]], Awaitable[None]] | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Read the whole body, then answer."""
        self.runs += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        if self.before is not None:
            await self.before()
        if self.raw is not None:
            await self.raw(send)
            return
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for index, chunk in enumerate(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": index < len(self.chunks) - 1})


def http_scope(
    method: str = "POST", path: str = "/orders", key: str | bytes | None = "k-1", query: bytes = b"", **headers: str
) -> Scope:
    """An HTTP scope with an Idempotency-Key (unless ``key`` is None) and extra headers."""
    pairs = [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    if key is not None:
        pairs.append((b"idempotency-key", key if isinstance(key, bytes) else key.encode()))
    return {"type": "http", "method": method, "path": path, "query_string": query, "headers": pairs}


async def call(
    middleware: Any,
    scope: Scope,
    *chunks: bytes,
    disconnect: bool = False,
    then_disconnect: bool = False,
    fail_send_after: int | None = None,
) -> Reply:
    """Call ``middleware`` once with ``chunks`` as the request body; return what it sent.

    ``disconnect``: the client leaves before its body; ``then_disconnect``: right
    after it; ``fail_send_after``: sends past that many raise OSError (the client left).
    """
    pending: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks or (b"",))
    ]
    if disconnect:
        pending = [{"type": "http.disconnect"}]
    elif then_disconnect:
        pending.append({"type": "http.disconnect"})
    sent: list[Message] = []

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # after the body: nothing until the client leaves
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if fail_send_after is not None and len(sent) >= fail_send_after:
            raise OSError("the client is gone")
        sent.append(message)

    await middleware(scope, receive, send)
    return Reply(sent)


@pytest.fixture(params=[False, True], ids=["fake", "fake-native"])
def native(request: pytest.FixtureRequest) -> bool:
    """On fakeredis with scripts, then with the native GOBLIN commands."""
    return bool(request.param)


def run(scenario: Callable[[Any], Coroutine[Any, Any, None]], native: bool = False, **client_options: Any) -> None:
    """Run ``scenario(client)`` on a fresh loop with a fresh fakeredis asyncio client, closed afterwards."""

    async def main() -> None:
        client = fake_async_redis(native, server=fakeredis.FakeServer(), **client_options)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def wrap(app: Any, client: Any, **options: Any) -> IdempotencyMiddleware:
    """``app`` behind the middleware, in the test namespace."""
    return IdempotencyMiddleware(app, client=client, namespace=NS, **options)


async def twice(app: Any, client: Any, body: bytes = b"{}", **options: Any) -> tuple[Reply, Reply]:
    """``app`` behind the middleware: what a first request and its duplicate (same key and body) each got."""
    middleware = wrap(app, client, **options)
    first = await call(middleware, http_scope(), body)
    return first, await call(middleware, http_scope(), body)


async def the_record(client: Any) -> tuple[bytes, bytes, bytes]:
    """The one key of the test namespace's only request, with its completed record's token and stored envelope."""
    (name,) = await client.keys(f"{NS}:*")
    held = await client.get(name)
    assert held.startswith(b"done "), held
    _, token, envelope = held.split(b" ", 2)
    return name, token, envelope


# --------------------------------------------------------------------------- the module


def test_the_middleware_imports_no_web_framework() -> None:
    """Importing goblin_claim.asgi loads no framework, server or HTTP client: only redis, pydantic and stdlib."""
    code = (
        "import sys, goblin_claim.asgi; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'starlette', 'fastapi', 'uvicorn', 'httpx', 'anyio', 'h11', 'litestar', 'quart'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_all_is_sorted_and_real() -> None:
    """goblin_claim.asgi.__all__ is sorted (constants first, as ruff sorts) and names what it exports."""
    names = goblin_claim.asgi.__all__
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))
    assert all(hasattr(goblin_claim.asgi, name) for name in names)
    assert {"IdempotencyMiddleware", "DEFAULT_REPLAY_HEADERS"} <= set(names)


# --------------------------------------------------------------------------- options


class _Sync:
    """Stands in for the sync client a caller might pass by mistake."""


BAD_OPTIONS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"methods": ("POST", "GET")}, InvalidArgumentError),
    ({"methods": ()}, InvalidArgumentError),
    ({"methods": "POST"}, InvalidArgumentTypeError),
    ({"methods": ("PO ST",)}, InvalidArgumentTypeError),
    ({"lease": 0}, InvalidArgumentError),
    ({"ttl": 1.5}, InvalidArgumentTypeError),
    ({"wait": -1}, InvalidArgumentError),
    ({"required": "yes"}, InvalidArgumentTypeError),
    ({"header": "Idempotency Key"}, InvalidArgumentError),
    ({"scope": "user"}, InvalidArgumentTypeError),
    ({"max_body_bytes": 0}, InvalidArgumentError),
    ({"max_response_bytes": True}, InvalidArgumentTypeError),
    ({"replay_headers": "etag"}, InvalidArgumentTypeError),
    ({"replay_headers": ("etag", "Set-Cookie")}, InvalidArgumentError),
    ({"replay_headers": ("transfer-encoding",)}, InvalidArgumentError),
    ({"replay_headers": ("content-length",)}, InvalidArgumentError),
    ({"namespace": "a{b}"}, InvalidArgumentError),
    ({"server_errors": "keep"}, InvalidArgumentError),
    ({"server_errors": True}, InvalidArgumentTypeError),
]


@pytest.mark.parametrize(("options", "error"), BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_bad_options_are_refused_when_wrapping(options: dict[str, Any], error: type[Exception]) -> None:
    """Every bad option raises a GoblinClaimError subclass before any request is served."""
    with pytest.raises(error):
        IdempotencyMiddleware(App(), client=fakeredis.FakeAsyncRedis(), **options)


def test_a_sync_client_is_refused() -> None:
    """A sync redis client is refused with a message naming what is needed."""
    sync = redis.Redis()
    try:
        with pytest.raises(InvalidArgumentTypeError, match="asyncio client"):
            IdempotencyMiddleware(App(), client=sync)
    finally:
        sync.close()


def test_a_client_factory_is_called_once_on_the_first_intercepted_request() -> None:
    """A zero-argument factory is not called for pass-through traffic, and once for intercepted requests."""

    async def scenario(client: Any) -> None:
        calls: list[int] = []

        def factory() -> Any:
            calls.append(1)
            return client

        app = App()
        middleware = wrap(app, factory)
        await call(middleware, http_scope("GET"))
        assert calls == []
        await call(middleware, http_scope(), b"{}")
        await call(middleware, http_scope(key="k-2"), b"{}")
        assert calls == [1]
        assert app.runs == 3

    run(scenario)


def test_a_factory_returning_a_sync_client_fails_loudly() -> None:
    """A factory that returns a sync client raises on the first intercepted request instead of running unguarded."""
    sync = redis.Redis()
    try:
        app = App()
        with pytest.raises(InvalidArgumentTypeError, match="asyncio client"):
            asyncio.run(call(wrap(app, lambda: sync), http_scope(), b"{}"))
        assert app.runs == 0
    finally:
        sync.close()


def test_defaults() -> None:
    """The defaults: POST and PATCH, not required, lease 30 s, ttl one day, no waiting, 1 MiB limits."""
    middleware = IdempotencyMiddleware(App(), client=fakeredis.FakeAsyncRedis())
    assert middleware.methods == frozenset({"POST", "PATCH"})
    assert (middleware.required, middleware.lease, middleware.ttl, middleware.wait) == (False, 30, 86400, 0.0)
    assert middleware.max_body_bytes == middleware.max_response_bytes == 1024 * 1024
    assert middleware.replay_headers is None  # every header but the deny-list
    assert "set-cookie" in middleware.never_replayed
    assert middleware.namespace == "goblin-http"
    assert middleware.header == "Idempotency-Key"


# --------------------------------------------------------------------------- pass-through


@pytest.mark.parametrize("kind", ["lifespan", "websocket"])
def test_non_http_scopes_pass_through_untouched(kind: str) -> None:
    """Lifespan and websocket scopes reach the app with the same receive and send, and Redis is never asked."""
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    def factory() -> Any:
        raise AssertionError("the client was resolved")

    async def receive() -> Message:
        return {"type": f"{kind}.connect"}

    async def send(message: Message) -> None:
        pass

    scope: Scope = {"type": kind, "headers": [(b"idempotency-key", b"k")], "method": "POST", "path": "/"}
    asyncio.run(IdempotencyMiddleware(app, client=factory)(scope, receive, send))
    assert seen == [(scope, receive, send)]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
def test_other_methods_pass_through_with_their_key(method: str) -> None:
    """Safe methods, and methods not listed, run every time even with a key and required=True."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, required=True)
        replies = [await call(middleware, http_scope(method)) for _ in range(2)]
        assert app.runs == 2
        assert all(r.status == 201 and r.header(b"idempotent-replayed") is None for r in replies)

    run(scenario)


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    "bad",
    [b"", b"x" * 256, "caf\u00e9".encode(), b"a\tb", b'""'],
    ids=["empty", "256 characters", "not ASCII", "a control character", "an empty sf-string"],
)
def test_malformed_keys_are_400(bad: bytes) -> None:
    """A key that is empty, longer than 255 characters, or not printable ASCII is 400, and nothing runs."""

    async def scenario(client: Any) -> None:
        app = App()
        assert "printable ASCII" in (await call(wrap(app, client), http_scope(key=bad), b"{}")).problem(400)["detail"]
        assert app.runs == 0

    run(scenario)


def test_two_key_headers_are_400() -> None:
    """Two Idempotency-Key headers on one request are ambiguous: 400."""

    async def scenario(client: Any) -> None:
        scope = http_scope(key="a")
        scope["headers"].append((b"idempotency-key", b"b"))
        assert "not 2" in (await call(wrap(App(), client), scope, b"{}")).problem(400)["detail"]

    run(scenario)


def test_a_quoted_key_names_the_same_operation_as_the_bare_key() -> None:
    """The IETF draft's sf-string form ("k-1") and Stripe's bare form (k-1) are one key; 255 characters is fine."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        await call(middleware, http_scope(key='"k-1"'), b"{}")
        again = await call(middleware, http_scope(key="k-1"), b"{}")
        assert again.header(b"idempotent-replayed") == b"true"
        assert app.runs == 1
        assert (await call(middleware, http_scope(key="x" * 255), b"{}")).status == 201

    run(scenario)


def test_missing_key_when_required_is_400() -> None:
    """required=True: no key, 400 naming the header; nothing runs."""

    async def scenario(client: Any) -> None:
        app = App()
        reply = await call(wrap(app, client, required=True, header="Request-Key"), http_scope(key=None), b"{}")
        assert "Request-Key" in reply.problem(400)["detail"]
        assert app.runs == 0

    run(scenario)


def test_scope_function_separates_keys_and_accepts_str_int_and_uuid() -> None:
    """The scope function puts each user's keys apart (str, int and UUID owners); any other type is answered 500."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, scope=lambda scope: scope.get("user"))
        owner = uuid.uuid4()
        for user in ("alice", "bob", 7, "7", owner, "alice", 7, owner):
            reply = await call(middleware, {**http_scope(), "user": user}, b"{}")
            assert reply.status == 201
        assert app.runs == 5  # the int 7 and the string "7" are two owners
        refused = await call(middleware, {**http_scope(), "user": 7.5}, b"{}")
        assert "returned float" in refused.problem(500)["detail"]
        assert app.runs == 5

    run(scenario)


def test_a_scope_function_finding_no_owner_fails_closed_without_running_the_app() -> None:
    """None or "" from the scope function is answered 403 without running the app, unless shared_scope=True."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, scope=lambda scope: scope.get("user"))
        for user in (None, ""):
            reply = await call(middleware, {**http_scope(), "user": user}, b"{}")
            assert reply.status == 403
            assert reply.header(b"content-type") == b"application/problem+json"
            assert "after authentication" in json.loads(reply.body)["detail"]
        assert app.runs == 0
        shared = wrap(app, client, scope=lambda scope: scope.get("user"), shared_scope=True)
        for _ in range(2):
            reply = await call(shared, {**http_scope(), "user": None}, b"{}")
            assert reply.status == 201
        assert app.runs == 1  # one shared space: the second is a replay

    run(scenario)


@pytest.mark.usefixtures("fresh_log")
def test_a_raising_scope_is_answered_500_runs_nothing_stores_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """scope["user"] with no authentication before the door: 500 scope-failed with the fix; logged once; no key."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, scope=lambda scope: scope["user"].display_name)
        with caplog.at_level(logging.ERROR, logger="goblin_claim"):
            replies = [await call(middleware, http_scope(key=f"k-{n}"), b"{}") for n in range(3)]
        for reply in replies:
            detail = reply.problem(500)["detail"]
            assert "raised KeyError('user')" in detail
            assert "scope['user'] is set by an authentication middleware" in detail
        assert app.runs == 0
        assert await client.keys(f"{NS}:*") == []
        assert len([r for r in caplog.records if r.name == "goblin_claim.asgi"]) == 1

    run(scenario)


def test_an_http_exception_from_the_scope_function_goes_to_the_framework() -> None:
    """An exception carrying a status_code (Litestar's NotAuthorizedException...) propagates for the framework."""

    class NotAuthorized(Exception):
        status_code = 401

    def scope(scope: Scope) -> str:
        raise NotAuthorized

    async def scenario(client: Any) -> None:
        app = App()
        with pytest.raises(NotAuthorized):
            await call(wrap(app, client, scope=scope), http_scope(), b"{}")
        assert app.runs == 0

    run(scenario)


# --------------------------------------------------------------------------- which routes take a key


def test_routes_patterns_ignore_a_webhook_under_required() -> None:
    """required=True, routes={"/webhook": "ignore"}: the webhook runs keyless and keyed, unclaimed; /orders is 400."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, required=True, routes={"/webhook": "ignore"})
        assert (await call(middleware, http_scope(key=None), b"{}")).status == 400
        assert app.runs == 0
        for key in (None, "k-1", "k-1", b""):  # even a malformed key is not read there
            assert (await call(middleware, http_scope(path="/webhook", key=key), b"{}")).status == 201
        assert app.runs == 4
        assert await client.keys(f"{NS}:*") == []

    run(scenario)


def test_a_routes_function_gets_the_scope() -> None:
    """routes=function decides from the ASGI scope; None leaves the request to required=."""

    async def scenario(client: Any) -> None:
        app = App()
        rule = lambda scope: "require" if scope["path"].startswith("/charges") else None  # noqa: E731
        middleware = wrap(app, client, routes=rule)
        assert (await call(middleware, http_scope(path="/charges/1", key=None), b"{}")).status == 400
        assert (await call(middleware, http_scope(key=None), b"{}")).status == 201
        assert app.runs == 1

    run(scenario)


@pytest.mark.usefixtures("fresh_log")
def test_a_raising_routes_function_is_answered_500_and_runs_nothing() -> None:
    """A routes function that raises is 500 routes-failed, before any key is read."""

    def rule(scope: Scope) -> None:
        raise LookupError("no such route table")

    async def scenario(client: Any) -> None:
        app = App()
        reply = await call(wrap(app, client, routes=rule), http_scope(), b"{}")
        assert "routes function raised LookupError" in reply.problem(500)["detail"]
        assert app.runs == 0

    run(scenario)


@dataclass
class Handler:
    """What Litestar puts in scope["route_handler"] before its middleware run: opt, and the handler's function."""

    opt: dict[str, Any] = field(default_factory=dict)
    fn: Any = None


def test_a_litestar_handlers_opt_or_marked_function_decides() -> None:
    """scope["route_handler"].opt["idempotency_key"], else its fn's mark, rules the route; a bad opt is refused."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client, required=True)
        marked = goblin_claim.asgi.idempotency_key("ignore")(lambda: None)
        for handler in (Handler(opt={"idempotency_key": "ignore"}), Handler(fn=marked)):
            assert (await call(middleware, {**http_scope(key=None), "route_handler": handler}, b"{}")).status == 201
        assert (await call(middleware, {**http_scope(key=None), "route_handler": Handler()}, b"{}")).status == 400
        assert app.runs == 2
        with pytest.raises(InvalidArgumentError, match="'require', 'accept' or 'ignore'"):
            await call(middleware, {**http_scope(), "route_handler": Handler(opt={"idempotency_key": "no"})}, b"{}")

    run(scenario)


@dataclass
class FakeRoute:
    """A route as Starlette's router asks it: matches(scope) -> (Match, child scope)."""

    path: str
    endpoint: Any
    routes: list[Any] = field(default_factory=list)

    def matches(self, scope: Scope) -> tuple[Any, Scope]:
        """FULL (value 2) when the path matches, or begins with a mount's path."""
        hit = scope["path"] == self.path or (self.routes and scope["path"].startswith(self.path + "/"))
        scope["touched"] = True  # a router may write its scope: the middleware's lookup hands it a copy
        return (FULL, {"endpoint": self.endpoint}) if hit else (NONE, {})


@dataclass(frozen=True)
class MatchValue:
    """Starlette's Match enum: its value is what the lookup reads."""

    value: int


FULL, NONE = MatchValue(2), MatchValue(0)


@dataclass
class Routed:
    """An app exposing its routes as Starlette's does (``scope["app"].routes``)."""

    routes: list[Any]


def test_a_marked_endpoint_is_found_through_the_apps_routes_before_routing() -> None:
    """The first full match among scope["app"].routes (mounts followed) gives the mark; the scope is not touched."""

    async def scenario(client: Any) -> None:
        webhook = goblin_claim.asgi.idempotency_key("ignore")(lambda: None)
        deep = goblin_claim.asgi.idempotency_key("accept")(lambda: None)
        routed = Routed([FakeRoute("/orders", lambda: None), FakeRoute("/webhook", webhook),
                         FakeRoute("/mount", None, routes=[FakeRoute("/mount/deep", deep)])])  # fmt: skip
        app = App()
        middleware = wrap(app, client, required=True)
        for path, status in (("/orders", 400), ("/webhook", 201), ("/mount/deep", 201), ("/nowhere", 400)):
            scope = {**http_scope(path=path, key=None), "app": routed}
            assert (await call(middleware, scope, b"{}")).status == status, path
            assert "touched" not in scope
        assert app.runs == 2

    run(scenario)


def test_a_mark_the_lookup_could_not_see_is_reported_once_after_routing(caplog: pytest.LogCaptureFixture) -> None:
    """A router hiding its routes: the door applies its own rule, then logs once that the routed endpoint said else."""

    @goblin_claim.asgi.idempotency_key("ignore")
    async def hidden(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def router(scope: Scope, receive: Any, send: Any) -> None:
        scope["endpoint"] = hidden  # as Starlette's router records the endpoint it chose
        await hidden(scope, receive, send)

    async def scenario(client: Any) -> None:
        middleware = wrap(router, client)
        opaque = Routed([FakeRoute("/webhook", None, routes=[])])  # a full match that names no endpoint
        with caplog.at_level(logging.ERROR, logger="goblin_claim.asgi"):
            for n in range(3):
                reply = await call(middleware, {**http_scope(path="/webhook", key=f"k-{n}"), "app": opaque}, b"{}")
                assert reply.status == 201
        assert len(await client.keys(f"{NS}:*")) == 3  # claimed: the door could not know
        (record,) = [r for r in caplog.records if "did not find its route" in r.getMessage()]
        assert "marked idempotency_key('ignore')" in record.getMessage()
        assert "routes={'<its path>': 'ignore'}" in record.getMessage()

    run(scenario)


# --------------------------------------------------------------------------- bodies and fingerprints


def test_declared_body_over_the_limit_is_413_unread() -> None:
    """A Content-Length above max_body_bytes is 413 before anything is read or claimed."""

    async def scenario(client: Any) -> None:
        app = App()
        reply = await call(wrap(app, client, max_body_bytes=10), http_scope(content_length="11"), b"x" * 11)
        assert "10 bytes" in reply.problem(413)["detail"]
        assert app.runs == 0
        assert await client.keys("*") == []

    run(scenario)


def test_streamed_body_over_the_limit_is_413() -> None:
    """A chunked body that grows past max_body_bytes is 413, and nothing runs or is claimed."""

    async def scenario(client: Any) -> None:
        app = App()
        reply = await call(wrap(app, client, max_body_bytes=10), http_scope(), b"x" * 6, b"y" * 6)
        reply.problem(413)
        assert app.runs == 0
        assert await client.keys("*") == []

    run(scenario)


def test_a_chunked_body_reaches_the_app_whole_and_fingerprints_as_one() -> None:
    """The app reads the same bytes the client sent in chunks; the same body in one chunk is a duplicate."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        await call(middleware, http_scope(), b'{"a":', b"1", b"}")
        again = await call(middleware, http_scope(), b'{"a":1}')
        assert app.bodies == [b'{"a":1}']
        assert again.header(b"idempotent-replayed") == b"true"

    run(scenario)


def test_the_query_string_counts_in_the_fingerprint() -> None:
    """The same key, path and body with another query string is 422."""

    async def scenario(client: Any) -> None:
        middleware = wrap(App(), client)
        await call(middleware, http_scope(query=b"dry_run=0"), b"{}")
        assert (
            "different request body"
            in (await call(middleware, http_scope(query=b"dry_run=1"), b"{}")).problem(422)["detail"]
        )

    run(scenario)


def test_a_client_gone_before_its_body_runs_nothing() -> None:
    """A disconnect while the body is read ends the request: no claim, no run, nothing sent."""

    async def scenario(client: Any) -> None:
        app = App()
        reply = await call(wrap(app, client), http_scope(), disconnect=True)
        assert reply.messages == []
        assert app.runs == 0
        assert await client.keys("*") == []

    run(scenario)


# --------------------------------------------------------------------------- what is stored, and how


@pytest.mark.parametrize("kind", ["application/x-ndjson", "application/x-custom-feed"])
def test_a_stream_type_passes_each_chunk_through_at_once_and_is_never_rerun(kind: str) -> None:
    """An NDJSON (or listed) response reaches the client chunk by chunk while the app runs; a duplicate gets 422."""
    seen_before_end: list[int] = []

    async def scenario(client: Any) -> None:
        forwarded: list[Message] = []

        async def app(scope: Scope, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind.encode())]})
            for line in (b'{"n":1}\n', b'{"n":2}\n'):
                await send({"type": "http.response.body", "body": line, "more_body": True})
                seen_before_end.append(len(forwarded))  # what the client has had by now
            await send({"type": "http.response.body", "body": b""})

        types = ("application/x-custom-feed",) if kind.endswith("feed") else _http.DEFAULT_STREAM_TYPES
        middleware = wrap(app, client, stream_types=types)

        async def send(message: Message) -> None:
            forwarded.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        await middleware(http_scope(), receive, send)
        assert seen_before_end == [2, 3]  # start + first line, then the second line: nothing held back
        duplicate = await call(middleware, http_scope(), b"{}")
        assert "was not kept" in duplicate.problem(422)["detail"]

    run(scenario)


def test_headers_the_app_set_are_replayed_but_not_the_exchanges_own(native: bool) -> None:
    """By default a custom header (X-Order-Id) is replayed; Set-Cookie, Date, Server and trace ids are not."""
    headers = [
        (b"content-type", b"application/json"),
        (b"x-order-id", b"ord_1"),
        (b"set-cookie", b"s=1"),
        (b"date", b"Tue, 01 Dec 2026 10:00:00 GMT"),
        (b"server", b"uvicorn"),
        (b"traceparent", b"00-abc-def-01"),
    ]

    async def scenario(client: Any) -> None:
        app = App(headers=headers)
        _, again = await twice(app, client)
        assert again.header(b"x-order-id") == b"ord_1"
        for name in (b"set-cookie", b"date", b"server", b"traceparent"):
            assert again.header(name) is None, name
        assert app.runs == 1

    run(scenario, native)


def test_a_body_compressed_inside_the_middleware_is_negotiated_on_replay() -> None:
    """A gzip body stored from inside is replayed gzip to a client accepting it, plain to one sending identity."""
    plain = b'{"order": "ord_1"}' * 20
    headers = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip"), (b"vary", b"Accept-Encoding")]

    async def scenario(client: Any) -> None:
        app = App(headers=headers, chunks=[gzip.compress(plain)])
        middleware = wrap(app, client)
        await call(middleware, http_scope(accept_encoding="gzip"), b"{}")
        zipped = await call(middleware, http_scope(accept_encoding="gzip, br"), b"{}")
        assert zipped.header(b"content-encoding") == b"gzip"
        assert gzip.decompress(zipped.body) == plain
        for refusing in ("identity", "br;q=1, gzip;q=0"):
            unzipped = await call(middleware, http_scope(accept_encoding=refusing), b"{}")
            assert unzipped.header(b"content-encoding") is None, refusing
            assert unzipped.body == plain
            assert unzipped.header(b"content-length") == str(len(plain)).encode()
            assert unzipped.header(b"vary") == b"Accept-Encoding"
        assert app.runs == 1

    run(scenario)


def test_replay_is_byte_for_byte_with_allow_listed_headers_in_order(native: bool) -> None:
    """Binary bodies, repeated and latin-1 headers replay exactly; unlisted headers and cookies do not."""
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"link", b"</a>; rel=next"),
        (b"set-cookie", b"s=1"),
        (b"x-order-id", b"ord_\xe9"),
        (b"link", b"</b>; rel=prev"),
        (b"x-trace", b"t-1"),
    ]

    async def scenario(client: Any) -> None:
        app = App(status=202, headers=headers, chunks=[bytes(range(256)), b"\x00tail"])
        first, again = await twice(app, client, b"\xff\xfe", replay_headers=(*DEFAULT_REPLAY_HEADERS, "X-Order-Id"))
        assert first.status == again.status == 202
        assert again.body == first.body == bytes(range(256)) + b"\x00tail"
        assert again.headers == [
            (b"content-type", b"application/octet-stream"),
            (b"link", b"</a>; rel=next"),
            (b"x-order-id", b"ord_\xe9"),
            (b"link", b"</b>; rel=prev"),
            (b"content-length", b"261"),
            (b"idempotent-replayed", b"true"),
        ]
        assert first.headers == headers  # the first response itself is untouched
        assert app.runs == 1

    run(scenario, native)


def test_the_stored_response_is_a_small_versioned_json_envelope() -> None:
    """Redis holds {"goblin":1,"kind":"http_response",fp,status,headers,body (base64)}, kept for the ttl."""

    async def scenario(client: Any) -> None:
        await call(wrap(App(chunks=[b"\x00\x01"]), client, ttl=600), http_scope(), b"{}")
        name, token, envelope = await the_record(client)
        stored = json.loads(envelope)
        assert stored == {
            "goblin": 1,
            "kind": "http_response",
            "fp": stored["fp"],
            "status": 201,
            "headers": [["content-type", "application/json"]],
            "body": "AAE=",
        }
        assert len(stored["fp"]) == 32
        assert token.endswith(b"." + stored["fp"].encode())  # the record's token carries it too
        assert 590 < await client.ttl(name) <= 600
        assert b'["POST","/orders",null,"k-1"]' in name

    run(scenario)


def test_a_client_decoding_responses_replays_the_same_bytes() -> None:
    """With decode_responses=True the stored envelope comes back as str and still replays exactly."""

    async def scenario(client: Any) -> None:
        middleware = wrap(App(chunks=[b"\xc3\x28 not utf-8"]), client)
        first = await call(middleware, http_scope(), b"{}")
        again = await call(middleware, http_scope(), b"{}")
        assert again.body == first.body == b"\xc3\x28 not utf-8"

    run(scenario, decode_responses=True)


@pytest.mark.parametrize("status", [400, 409, 422, 301])
def test_client_errors_and_redirects_are_stored(status: int) -> None:
    """A 4xx the endpoint answered (not a retry, auth or routing status) or a 3xx is stored and replayed."""

    async def scenario(client: Any) -> None:
        app = App(status=status)
        _, again = await twice(app, client)
        assert again.status == status
        assert again.header(b"idempotent-replayed") == b"true"
        assert app.runs == 1

    run(scenario)


@pytest.mark.parametrize("status", [401, 403, 404, 405])
def test_routing_and_auth_answers_are_not_kept_by_default(status: int) -> None:
    """A 401, 403, 404 or 405 (no endpoint ran, or it refused the caller) is sent, not kept: the fixed retry runs."""

    async def scenario(client: Any) -> None:
        app = App(status=status)
        first, again = await twice(app, client)
        assert first.status == again.status == status
        assert again.header(b"idempotent-replayed") is None
        assert app.runs == 2

    run(scenario)


def test_release_statuses_chooses_what_is_kept() -> None:
    """release_statuses=() keeps a 404 (replayed); release_statuses={409} gives a 409 back (run again)."""

    async def scenario(client: Any) -> None:
        app = App(status=404)
        keep_all = wrap(app, client, release_statuses=())
        for _ in range(2):
            await call(keep_all, http_scope(key="k-404"), b"{}")
        assert app.runs == 1
        conflict = App(status=409)
        release = wrap(conflict, client, release_statuses={409})
        for _ in range(2):
            reply = await call(release, http_scope(key="k-409"), b"{}")
            assert reply.header(b"idempotent-replayed") is None
        assert conflict.runs == 2
        with pytest.raises(InvalidArgumentTypeError, match="status codes"):
            wrap(app, client, release_statuses=[404, "500"])

    run(scenario)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 425, 429])
def test_server_errors_and_retry_statuses_give_the_key_back(status: int, native: bool) -> None:
    """5xx, 408, 425 and 429 are passed through as they come and not stored: the retry runs."""

    async def scenario(client: Any) -> None:
        app = App(status=status)
        middleware = wrap(app, client)
        first = await call(middleware, http_scope(), b"{}")
        app.status = 201
        retry = await call(middleware, http_scope(), b"{}")
        assert (first.status, retry.status, app.runs) == (status, 201, 2)
        assert retry.header(b"idempotent-replayed") is None

    run(scenario, native)


# --------------------------------------------------------------------------- the app failing


def test_an_app_that_raises_gives_the_key_back(native: bool) -> None:
    """The app's exception propagates, nothing was sent, and the retry runs at once."""

    async def scenario(client: Any) -> None:
        async def crash() -> None:
            raise RuntimeError("boom")

        app = App(before=crash)
        middleware = wrap(app, client)
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope(), b"{}")
        app.before = None
        assert (await call(middleware, http_scope(), b"{}")).status == 201
        assert app.runs == 2

    run(scenario, native)


def test_an_app_raising_after_its_response_started_streaming_gives_the_key_back() -> None:
    """An app that fails mid-stream of a passed-through response releases the key."""

    async def scenario(client: Any) -> None:
        async def half(send: Any) -> None:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise RuntimeError("mid-stream")

        app = App(raw=half)
        middleware = wrap(app, client)
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope(), b"{}")
        app.raw = None
        assert (await call(middleware, http_scope(), b"{}")).status == 201

    run(scenario)


@pytest.mark.parametrize("status", [500, 502, 504])
def test_server_errors_stored_are_replayed_and_never_run_again(status: int, native: bool) -> None:
    """server_errors="store": the 5xx is kept whole and replayed, marked; the app ran once."""

    async def scenario(client: Any) -> None:
        app = App(status=status, chunks=[b'{"error":', b'"ledger"}'])
        first, again = await twice(app, client, server_errors="store")
        assert (first.status, again.status, again.body) == (status, status, b'{"error":"ledger"}')
        assert again.header(b"idempotent-replayed") == b"true"
        assert app.runs == 1

    run(scenario, native)


def test_a_503_and_release_statuses_are_given_back_even_when_server_errors_are_stored() -> None:
    """server_errors="store" keeps a 5xx, but a 503 (in release_statuses) still asks for the retry that runs."""

    async def scenario(client: Any) -> None:
        for status in (503, 429):
            app = App(status=status)
            middleware = wrap(app, client, server_errors="store")
            first = await call(middleware, http_scope(key=f"k-{status}"), b"{}")
            app.status = 201
            retry = await call(middleware, http_scope(key=f"k-{status}"), b"{}")
            assert (first.status, retry.status, app.runs) == (status, 201, 2)

    run(scenario)


def test_an_app_that_raises_keeps_a_500_when_server_errors_are_stored(native: bool) -> None:
    """server_errors="store": the exception goes on, a 500 server-error problem is kept; the retry is not run."""

    async def scenario(client: Any) -> None:
        async def crash() -> None:
            raise RuntimeError("the ledger row is written, then this")

        app = App(before=crash)
        middleware = wrap(app, client, server_errors="store", problem_docs="https://docs.example/problems")
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope(), b"{}")
        app.before = None
        again = await call(middleware, http_scope(), b"{}")
        assert again.status == 500
        assert again.header(b"idempotent-replayed") == b"true"
        assert json.loads(again.body)["type"] == "https://docs.example/problems#server-error"
        assert app.runs == 1

    run(scenario, native)


def test_an_app_raising_mid_response_keeps_a_500_when_server_errors_are_stored() -> None:
    """A 500 begun, then an exception: nothing was sent, the kept 500 problem answers the retry; one run."""

    async def scenario(client: Any) -> None:
        async def half(send: Any) -> None:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise RuntimeError("mid-response")

        app = App(raw=half)
        middleware = wrap(app, client, server_errors="store")
        with pytest.raises(RuntimeError):
            await call(middleware, http_scope(), b"{}")
        app.raw = None
        again = await call(middleware, http_scope(), b"{}")
        assert again.problem(500)["detail"] == _http.SERVER_ERROR
        assert app.runs == 1

    run(scenario)


def test_a_request_cancelled_while_the_app_runs_keeps_its_key_closed(native: bool) -> None:
    """Cancelled once the app began (client gone, server stopping): the key is kept closed, a retry is 422, not run."""

    async def scenario(client: Any) -> None:
        started = asyncio.Event()

        async def hang() -> None:
            started.set()
            await asyncio.sleep(60)

        app = App(before=hang)
        middleware = wrap(app, client, ttl=600)
        task = asyncio.create_task(call(middleware, http_scope(), b"{}"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        app.before = None
        retry = await call(middleware, http_scope(), b"{}")
        assert "cancelled after it began" in retry.problem(422)["detail"]
        assert app.runs == 1
        name, _, envelope = await the_record(client)
        assert json.loads(envelope)["kind"] == "http_abandoned"
        assert 590 < await client.ttl(name) <= 600  # closed for the ttl, like a stored answer

    run(scenario, native)


def test_forget_reopens_an_abandoned_key() -> None:
    """An abandoned key stays closed until forget() reopens it; then the request runs again."""

    async def scenario(client: Any) -> None:
        async def nothing(send: Any) -> None:
            pass

        app = App(raw=nothing)
        middleware = wrap(app, client)
        await call(middleware, http_scope(), b"{}")
        app.raw = None
        (await call(middleware, http_scope(), b"{}")).problem(422)
        assert await AsyncClaim(client, '["POST","/orders",null,"k-1"]', namespace=NS).forget()
        assert (await call(middleware, http_scope(), b"{}")).status == 201
        assert app.runs == 2

    run(scenario)


@pytest.mark.parametrize("sent", ["nothing", "a start only", "a start and part of the body"])
def test_an_app_that_never_finishes_its_response_keeps_the_key_closed(sent: str) -> None:
    """An app returning without a whole response (Django after a disconnect) ran: the key stays closed, 422."""

    async def scenario(client: Any) -> None:
        async def incomplete(send: Any) -> None:
            if sent != "nothing":
                await send({"type": "http.response.start", "status": 200, "headers": []})
            if sent == "a start and part of the body":
                await send({"type": "http.response.body", "body": b"part", "more_body": True})

        app = App(raw=incomplete)
        middleware = wrap(app, client)
        first = await call(middleware, http_scope(), b"{}")
        assert len(first.messages) == {"nothing": 0, "a start only": 1, "a start and part of the body": 2}[sent]
        app.raw = None
        duplicate = await call(middleware, http_scope(), b"{}")
        assert "without" in duplicate.problem(422)["detail"]
        assert duplicate.header(b"retry-after") is None
        assert app.runs == 1
        assert (await call(middleware, http_scope(), b"{other}")).problem(422)["detail"].startswith("this idem")

    run(scenario)


def test_an_app_raising_after_its_client_left_keeps_the_key_closed() -> None:
    """The client disconnected, then the app raised (as Starlette's ClientDisconnect does): not given back."""

    async def scenario(client: Any) -> None:
        async def notices(scope: Scope, receive: Any, send: Any) -> None:
            app.runs += 1
            await receive()  # the body
            if (await receive())["type"] == "http.disconnect":
                raise ConnectionResetError("the client is gone")

        app = App()
        middleware = wrap(notices, client)
        with pytest.raises(ConnectionResetError):
            await call(middleware, http_scope(), b"{}", then_disconnect=True)
        (await call(middleware, http_scope(), b"{}")).problem(422)
        assert app.runs == 1

    run(scenario)


def test_a_send_failing_after_the_client_left_keeps_the_key_closed() -> None:
    """An ASGI 2.4 server's send raising OSError mid-stream: the app ran, the key stays closed."""

    async def scenario(client: Any) -> None:
        app = App(chunks=[b"a" * 40, b"b" * 40, b"c" * 40])
        middleware = wrap(app, client, max_response_bytes=50)
        with pytest.raises(OSError, match="gone"):
            await call(middleware, http_scope(), b"{}", fail_send_after=1)
        assert "raised OSError" in (await call(middleware, http_scope(), b"{}")).problem(422)["detail"]
        assert app.runs == 1

    run(scenario)


# --------------------------------------------------------------------------- responses not kept


def test_a_response_over_the_limit_is_passed_whole_marked_and_never_rerun(caplog: pytest.LogCaptureFixture) -> None:
    """Past max_response_bytes the response still arrives whole (chunks intact), marked, logged; duplicates get 422."""

    async def scenario(client: Any) -> None:
        chunks = [b"a" * 40, b"b" * 40, b"c" * 40]
        app = App(chunks=chunks)
        middleware = wrap(app, client, max_response_bytes=50)
        with caplog.at_level(logging.WARNING, logger="goblin_claim.asgi"):
            first = await call(middleware, http_scope(), b"{}")
        assert first.body == b"".join(chunks)
        assert first.header(b"idempotent-stored") == b"false"
        assert [m.get("more_body", False) for m in first.messages[1:]] == [True, False]
        assert "max_response_bytes=50" in caplog.text
        duplicate = await call(middleware, http_scope(), b"{}")
        detail = duplicate.problem(422)["detail"]
        assert "answered 201" in detail
        assert "max_response_bytes=50" in detail
        assert app.runs == 1
        assert (await call(middleware, http_scope(), b"{other}")).status == 422

    run(scenario)


def test_a_declared_large_response_is_passed_through_at_once() -> None:
    """A Content-Length over the limit is forwarded from its start, without buffering."""

    async def scenario(client: Any) -> None:
        forwarded: list[int] = []

        async def big(send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
            forwarded.append(1)  # the start went out before the body was even produced
            await send({"type": "http.response.body", "body": b"z" * 100})

        first = await call(wrap(App(raw=big), client, max_response_bytes=50), http_scope(), b"{}")
        assert first.body == b"z" * 100
        assert first.header(b"idempotent-stored") == b"false"
        assert forwarded

    run(scenario)


@pytest.mark.parametrize("kind", ["event stream", "trailers", "pathsend"])
def test_streams_trailers_and_files_pass_through_unstored(kind: str) -> None:
    """Server-sent events, responses with trailers and http.response.pathsend are forwarded as sent, not kept."""

    async def scenario(client: Any) -> None:
        async def respond(send: Any) -> None:
            if kind == "event stream":
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
                )
                await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif kind == "trailers":
                await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
                await send({"type": "http.response.body", "body": b"body"})
                await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"1")]})
            else:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.pathsend", "path": "/etc/hostname"})

        app = App(raw=respond)
        middleware = wrap(app, client)
        first = await call(middleware, http_scope(), b"{}")
        assert (
            first.messages[-1]["type"]
            == {
                "event stream": "http.response.body",
                "trailers": "http.response.trailers",
                "pathsend": "http.response.pathsend",
            }[kind]
        )
        assert first.header(b"idempotent-stored") == b"false"
        (await call(middleware, http_scope(), b"{}")).problem(422)
        assert app.runs == 1

    run(scenario)


# --------------------------------------------------------------------------- in flight, and failures


def test_waiting_duplicates_get_the_first_answer(native: bool) -> None:
    """With wait set, a duplicate waits for the first request and replays its answer."""

    async def scenario(client: Any) -> None:
        app = App(before=lambda: asyncio.sleep(0.2))
        middleware = wrap(app, client, wait=5.0)
        first, second = await asyncio.gather(
            call(middleware, http_scope(), b"{}"), call(middleware, http_scope(), b"{}")
        )
        assert first.body == second.body
        assert app.runs == 1
        assert sorted([first.header(b"idempotent-replayed"), second.header(b"idempotent-replayed")], key=str) == [
            None,
            b"true",
        ]

    run(scenario, native)


def test_a_wait_that_runs_out_is_409() -> None:
    """A duplicate that waited its whole wait is 409 with Retry-After, naming how long it waited."""

    async def scenario(client: Any) -> None:
        app = App(before=lambda: asyncio.sleep(1.0))
        middleware = wrap(app, client, wait=0.2)
        first, second = await asyncio.gather(
            call(middleware, http_scope(), b"{}"), call(middleware, http_scope(), b"{}")
        )
        assert first.status == 201
        assert "waited 0.2s" in second.problem(409)["detail"]
        assert second.header(b"retry-after") == b"1"

    run(scenario)


def test_claim_lost_mid_request_is_503_and_the_rivals_answer_stands() -> None:
    """Another token holding the claim when the app finishes: 503 with Retry-After, nothing of this run stored."""

    async def scenario(client: Any) -> None:
        async def rival_takes_over() -> None:
            (name,) = await client.keys(f"{NS}:*")
            await client.set(name, "rival-token.0000")

        app = App(before=rival_takes_over)
        reply = await call(wrap(app, client), http_scope(), b"{}")
        assert "lapsed" in reply.problem(503)["detail"]
        assert reply.header(b"retry-after") == b"1"
        (name,) = await client.keys(f"{NS}:*")
        assert await client.get(name) == b"rival-token.0000"  # the rival's claim, untouched

    run(scenario)


def test_a_store_that_keeps_failing_still_sends_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """complete() failing through the store window: the app's answer is sent, marked unstored (it ran)."""
    monkeypatch.setattr(goblin_claim._drivers.http_aio, "STORE_WINDOW", 0.1)

    async def fail(self: AsyncClaim, value: bytes | str) -> None:
        raise ConnectionFailedError("connection refused", key=self.key)

    monkeypatch.setattr(AsyncClaim, "complete", fail)

    async def scenario(client: Any) -> None:
        reply = await call(wrap(App(), client), http_scope(), b"{}")
        assert reply.status == 201
        assert reply.body == b'{"ok":true}'
        assert reply.header(b"idempotent-stored") == b"false"

    run(scenario)


def test_a_store_refused_by_redis_keeps_the_key_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """complete() refused (maxmemory): the answer is sent marked unstored, a small marker closes the key, no rerun."""
    real = AsyncClaim.complete
    refused: list[bytes | str] = []

    async def refuse_the_first(self: AsyncClaim, value: bytes | str) -> None:
        if not refused:
            refused.append(value)
            raise ServerError("OOM command not allowed when used memory > 'maxmemory'", key=self.key)
        await real(self, value)

    monkeypatch.setattr(AsyncClaim, "complete", refuse_the_first)

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        first = await call(middleware, http_scope(), b"{}")
        assert (first.status, first.body) == (201, b'{"ok":true}')
        assert first.header(b"idempotent-stored") == b"false"
        assert "could not be stored: OOM" in (await call(middleware, http_scope(), b"{}")).problem(422)["detail"]
        assert app.runs == 1
        assert json.loads(refused[0])["kind"] == "http_response"

    run(scenario)


def test_redis_unreachable_is_503_and_nothing_runs() -> None:
    """A client that cannot connect: 503 with Retry-After, the app never runs."""
    from tests.support.servers import free_port

    async def scenario() -> None:
        client = redis.asyncio.Redis(port=free_port(), retry=None, socket_connect_timeout=0.5)
        app = App()
        try:
            reply = await call(wrap(app, client), http_scope(), b"{}")
        finally:
            await client.aclose()
        assert "unavailable" in reply.problem(503)["detail"]
        assert reply.header(b"retry-after") == b"1"
        assert app.runs == 0

    asyncio.run(scenario())


def test_an_evicted_record_reopens_the_key() -> None:
    """The stored response evicted takes the done record with it (one key): the key is free, a retry runs anew."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        await call(middleware, http_scope(), b"{}")
        name, _, _ = await the_record(client)
        await client.delete(name)
        again = await call(middleware, http_scope(), b"{}")
        assert (again.status, again.body, again.header(b"idempotent-replayed")) == (201, b'{"ok":true}', None)
        assert app.runs == 2
        replay = await call(middleware, http_scope(), b"{}")
        assert (replay.status, replay.header(b"idempotent-replayed")) == (201, b"true")
        assert app.runs == 2

    run(scenario)


def test_a_done_marker_without_a_response_is_500() -> None:
    """The key says done but holds no stored response (not written by this release): 500, the app is not rerun."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        await call(middleware, http_scope(), b"{}")
        name, token, _ = await the_record(client)
        await client.set(name, b"done " + token)
        reply = await call(middleware, http_scope(), b"{}")
        assert reply.problem(500)["detail"] == _http.RESULT_LOST
        assert app.runs == 1

    run(scenario)


def test_an_unreadable_stored_value_is_500_and_never_echoed(caplog: pytest.LogCaptureFixture) -> None:
    """A result key holding something else (another writer) is 500; its bytes and the key appear in no answer or log."""

    async def scenario(client: Any) -> None:
        app = App()
        middleware = wrap(app, client)
        await call(middleware, http_scope(key="customer-key-42"), b"{}")
        name, token, _ = await the_record(client)
        await client.set(name, done_record(token, b"card 4242 not an envelope"))
        with caplog.at_level(logging.DEBUG, logger="goblin_claim"):
            reply = await call(middleware, http_scope(key="customer-key-42"), b"{}")
        assert "unreadable" in reply.problem(500)["detail"]
        assert b"4242" not in reply.body
        assert caplog.records
        for record in caplog.records:
            assert "4242" not in record.getMessage()
            assert "customer-key-42" not in record.getMessage()

    run(scenario)


# --------------------------------------------------------------------------- fingerprint=


def test_fingerprint_option_is_taken_as_the_other_doors_take_it(native: bool) -> None:
    """``fingerprint=`` on the ASGI middleware: "bytes" tells reordered JSON apart, a function decides alone."""

    async def scenario(client: Any) -> None:
        json_type = {"content_type": "application/json"}
        app = App()
        by_bytes = wrap(app, client, fingerprint="bytes")
        assert (await call(by_bytes, http_scope(key="k-bytes", **json_type), b'{"a":1,"b":2}')).status == 201
        reordered = await call(by_bytes, http_scope(key="k-bytes", **json_type), b'{"b":2,"a":1}')
        reordered.problem(422)  # byte for byte: another request
        by_path = wrap(app, client, fingerprint=lambda scope: scope["path"])
        assert (await call(by_path, http_scope(key="k-fn"), b"one")).status == 201
        replayed = await call(by_path, http_scope(key="k-fn"), b"another body")
        assert replayed.status == 201
        assert replayed.header(b"idempotent-replayed") == b"true"
        assert app.runs == 2
        with pytest.raises(InvalidArgumentError):
            wrap(app, client, fingerprint="xml")

    run(scenario, native)
