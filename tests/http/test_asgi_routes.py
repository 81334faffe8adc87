"""Per-route key rules and a failing ``scope=`` under a real uvicorn, on Starlette, FastAPI and Litestar apps.

Each test serves a real app (tests/support/asgi_server.py ``serve``) over the session's
redis-server and counts its handlers' runs: which routes require the key,
accept it or ignore it (``required=``, ``routes=``, an endpoint's
``idempotency_key()`` mark, a Litestar handler's ``opt``), and what a scope
function that fails answers. The manual's FastAPI and Litestar samples run here
as written (read from docs/guides/http/asgi.md), the FastAPI one also without its
authentication line.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import types
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from goblin_claim import _http
from goblin_claim._http import failures
from goblin_claim.asgi import IdempotencyMiddleware, Message, Receive, Scope, Send, idempotency_key
from tests.conftest import IN_CI, unique
from tests.support import servers
from tests.support.asgi_server import serve_client

for _needed in ("starlette", "fastapi", "litestar"):
    if IN_CI:  # with CI set, a missing framework fails the tests instead of skipping them
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

from fastapi import APIRouter, FastAPI  # noqa: E402 -- after the import check above
from litestar import Litestar, Router, post  # noqa: E402
from litestar.connection import ASGIConnection  # noqa: E402
from litestar.middleware import (  # noqa: E402
    AbstractAuthenticationMiddleware,
    AuthenticationResult,
    DefineMiddleware,
)
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Mount, Route  # noqa: E402

FRAMEWORKS = ("starlette", "fastapi", "litestar")
ASGI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "http" / "asgi.md"  # the manual's ASGI page
BODY = {"items": ["tea"]}


def key() -> dict[str, str]:
    """A fresh Idempotency-Key header."""
    return {"Idempotency-Key": uuid.uuid4().hex}


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """The RFC 9457 problem in ``response``, checked for its status and shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"]
    return body


def stored_keys(port: int, namespace: str, needle: str) -> list[bytes]:
    """The Redis keys of ``namespace`` naming ``needle`` (a request's key or path)."""
    client = redis.Redis(host=servers.HOST, port=port)
    try:
        return [name for name in client.scan_iter(f"{namespace}:*") if needle.encode() in name]
    finally:
        client.close()


@pytest.fixture
def fresh_log() -> Iterator[None]:
    """No failing scope function logged yet: the log is once per process and cause."""
    failures._logged.clear()
    yield
    failures._logged.clear()


# --------------------------------------------------------------------------- one service on three frameworks


class Service:
    """The endpoints every framework's app serves, counting their runs, and the client their door claims through."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.namespace = unique("routes")
        self.runs: Counter[str] = Counter()
        self.client: Any = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """The asyncio client, made in the server's loop and closed with it."""
        self.client = redis.asyncio.Redis(host=servers.HOST, port=self.port, socket_timeout=5)
        try:
            yield
        finally:
            await self.client.aclose()

    def resolve(self) -> Any:
        """The door's client factory: the client the lifespan made."""
        return self.client

    def run(self, name: str) -> dict[str, int]:
        """Count a run of ``name``."""
        self.runs[name] += 1
        return {"run": self.runs[name]}

    def door(self, **options: Any) -> dict[str, Any]:
        """The middleware's options in this service's namespace."""
        return {"client": self.resolve, "namespace": self.namespace, **options}


def starlette_app(service: Service, **options: Any) -> Starlette:
    """The service on Starlette: marks on endpoints, one inside a Mount."""

    async def orders(request: Request) -> Response:
        return JSONResponse(service.run("orders"), status_code=201)

    @idempotency_key("ignore")
    async def webhook(request: Request) -> Response:
        return JSONResponse(service.run("webhook"), status_code=201)

    @idempotency_key("require")
    async def payments(request: Request) -> Response:
        return JSONResponse(service.run("payments"), status_code=201)

    async def internal(request: Request) -> Response:
        return JSONResponse(service.run("internal"), status_code=201)

    @idempotency_key("ignore")
    async def hook(request: Request) -> Response:
        return JSONResponse(service.run("hook"), status_code=201)

    app = Starlette(
        routes=[
            Route("/orders", orders, methods=["POST"]),
            Route("/webhook", webhook, methods=["POST"]),
            Route("/payments", payments, methods=["POST"]),
            Route("/internal/jobs", internal, methods=["POST"]),
            Mount("/api", routes=[Mount("/v1", routes=[Route("/hook", hook, methods=["POST"])])]),
        ],
        lifespan=service.lifespan,
    )
    app.add_middleware(IdempotencyMiddleware, **service.door(**options))
    return app


def fastapi_app(service: Service, **options: Any) -> FastAPI:
    """The service on FastAPI: marks above and below the route decorator, one inside nested included routers."""
    app = FastAPI(lifespan=service.lifespan)

    @app.post("/orders", status_code=201)
    async def orders() -> dict[str, int]:
        return service.run("orders")

    @app.post("/webhook", status_code=201)
    @idempotency_key("ignore")
    async def webhook() -> dict[str, int]:
        return service.run("webhook")

    @idempotency_key("require")
    @app.post("/payments", status_code=201)
    async def payments() -> dict[str, int]:
        return service.run("payments")

    @app.post("/internal/jobs", status_code=201)
    async def internal() -> dict[str, int]:
        return service.run("internal")

    api, v1 = APIRouter(), APIRouter()

    @v1.post("/hook", status_code=201)
    @idempotency_key("ignore")
    async def hook() -> dict[str, int]:
        return service.run("hook")

    api.include_router(v1, prefix="/v1")
    app.include_router(api, prefix="/api")
    app.add_middleware(IdempotencyMiddleware, **service.door(**options))
    return app


def litestar_app(service: Service, *, auth: bool = False, **options: Any) -> Litestar:
    """The service on Litestar: a handler's opt, a mark under @post, a Router's opt; the door in middleware=[...]."""

    @post("/orders")
    async def orders() -> dict[str, int]:
        return service.run("orders")

    @post("/webhook", idempotency_key="ignore")
    async def webhook() -> dict[str, int]:
        return service.run("webhook")

    @post("/payments")
    @idempotency_key("require")
    async def payments() -> dict[str, int]:
        return service.run("payments")

    @post("/internal/jobs")
    async def internal() -> dict[str, int]:
        return service.run("internal")

    @post("/hook")
    async def hook() -> dict[str, int]:
        return service.run("hook")

    api = Router("/api", route_handlers=[Router("/v1", route_handlers=[hook])], opt={"idempotency_key": "ignore"})
    middleware = [DefineMiddleware(HeaderUser)] if auth else []
    middleware.append(DefineMiddleware(IdempotencyMiddleware, **service.door(**options)))
    return Litestar(
        [orders, webhook, payments, internal, api],
        middleware=middleware,
        lifespan=[service.lifespan],
        logging_config=None,  # leave this process's logging as it is
    )


class HeaderUser(AbstractAuthenticationMiddleware):
    """Litestar authentication standing in for a real one: ``X-User`` names the caller (None when absent)."""

    async def authenticate_request(self, connection: ASGIConnection[Any, Any, Any, Any]) -> AuthenticationResult:
        """The caller named by X-User."""
        return AuthenticationResult(user=connection.headers.get("x-user"), auth=None)


APPS: dict[str, Callable[..., Any]] = {"starlette": starlette_app, "fastapi": fastapi_app, "litestar": litestar_app}


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    """Each framework in turn."""
    return str(request.param)


@pytest.fixture
def service(redis_standalone: servers.RedisProcess) -> Service:
    """A fresh service (its own namespace) on the session's redis-server."""
    return Service(redis_standalone.port)


@contextlib.contextmanager
def running(framework: str, service: Service, **options: Any) -> Iterator[httpx.Client]:
    """Serve the service's app on ``framework`` with uvicorn; yield an HTTP client for it."""
    with serve_client(APPS[framework](service, **options)) as http:
        yield http


# --------------------------------------------------------------------------- per-route rules


def test_required_refuses_keyless_orders_but_runs_a_marked_webhook(framework: str, service: Service) -> None:
    """required=True: a keyless order is 400 and never runs; the webhook marked 'ignore' runs keyless and keyed."""
    with running(framework, service, required=True) as http:
        refused = http.post("/orders", json=BODY)
        hooks = [http.post("/webhook", json=BODY, headers=headers) for headers in ({}, *[key()] * 2)]
        headers = key()
        orders = [http.post("/orders", json=BODY, headers=headers) for _ in range(2)]
    assert "Idempotency-Key" in problem(refused, 400)["detail"]
    assert [r.status_code for r in hooks] == [201, 201, 201]
    assert [r.json()["run"] for r in hooks] == [1, 2, 3]  # a key sent twice is not replayed there: ignored
    assert not any("idempotent-replayed" in r.headers for r in hooks)
    assert stored_keys(service.port, service.namespace, "/webhook") == []
    assert orders[1].headers["idempotent-replayed"] == "true"
    assert service.runs == Counter(webhook=3, orders=1)


def test_a_mark_inside_mounts_or_included_routers_is_found(framework: str, service: Service) -> None:
    """A mark two levels down (Starlette Mounts, FastAPI included routers, a Litestar Router's opt) rules its route."""
    with running(framework, service, required=True) as http:
        statuses = [http.post("/api/v1/hook", json=BODY).status_code for _ in range(2)]
    assert statuses == [201, 201]
    assert service.runs["hook"] == 2


def test_a_route_marked_require_and_a_pattern_refuse_what_the_rest_accepts(framework: str, service: Service) -> None:
    """required=False: the route marked 'require' and the routes= pattern answer 400 keyless; /orders runs."""
    with running(framework, service, routes={"/internal/*": "require"}) as http:
        payments = http.post("/payments", json=BODY)
        internal = http.post("/internal/jobs", json=BODY)
        orders = http.post("/orders", json=BODY)
        headers = key()
        kept = [http.post("/payments", json=BODY, headers=headers) for _ in range(2)]
    problem(payments, 400)
    problem(internal, 400)
    assert orders.status_code == 201
    assert kept[1].content == kept[0].content
    assert kept[1].headers["idempotent-replayed"] == "true"
    assert service.runs == Counter(orders=1, payments=1)


def test_a_routes_function_gets_the_scope_and_none_leaves_it_to_required(framework: str, service: Service) -> None:
    """routes=function: 'ignore' for /internal/... from the scope's path, None elsewhere (required=True decides)."""

    def rule(scope: Scope) -> _http.KeyRule | None:
        return "ignore" if scope["path"].startswith("/internal/") else None

    with running(framework, service, required=True, routes=rule) as http:
        internal = http.post("/internal/jobs", json=BODY)
        orders = http.post("/orders", json=BODY)
    assert internal.status_code == 201
    problem(orders, 400)
    assert service.runs == Counter(internal=1)


def test_a_mark_is_found_when_the_door_wraps_the_app_from_outside(service: Service) -> None:
    """Wrapped from outside (IdempotencyMiddleware(starlette_app, ...)), the door reads the wrapped app's routes."""
    inner = starlette_app(service)
    inner.user_middleware.clear()  # this test wraps it from outside instead
    app = IdempotencyMiddleware(inner, **service.door(required=True))
    with serve_client(app) as http:
        hook = http.post("/webhook", json=BODY)
        refused = http.post("/orders", json=BODY)
    assert hook.status_code == 201
    problem(refused, 400)
    assert service.runs == Counter(webhook=1)


# --------------------------------------------------------------------------- a scope function that fails


@pytest.mark.usefixtures("fresh_log")
def test_a_scope_reading_a_user_nobody_set_is_explained_logged_once_and_never_stored(
    framework: str, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """No auth middleware, scope=scope['user']: each keyed request is 500 scope-failed with the fix; nothing runs."""
    headers = key()
    with (
        caplog.at_level(logging.ERROR, logger="goblin_claim"),
        running(framework, service, scope=lambda scope: scope["user"]) as http,
    ):
        answers = [http.post("/orders", json=BODY, headers=headers) for _ in range(3)]
        hook = http.post("/webhook", json=BODY, headers=headers)  # ignored routes never ask the scope
    for answer in answers:
        detail = problem(answer, 500)["detail"]
        assert "raised KeyError('user')" in detail
        assert "add the authentication middleware after this one" in detail
        assert "list it before this one" in detail  # Litestar's word
    assert hook.status_code == 201
    assert service.runs == Counter(webhook=1)
    assert stored_keys(service.port, service.namespace, headers["Idempotency-Key"]) == []
    logged = [r for r in caplog.records if r.name == "goblin_claim.asgi"]
    assert len(logged) == 1
    assert "raised KeyError: 'user' at " in logged[0].getMessage()


def test_litestar_scope_reads_the_user_its_auth_middleware_set(service: Service) -> None:
    """Litestar, auth listed first: one key runs once per user; an unknown caller is 403 and never runs."""
    app = litestar_app(service, auth=True, scope=lambda scope: scope["user"])
    headers = key()
    with serve_client(app) as http:
        alice = [http.post("/orders", json=BODY, headers={**headers, "x-user": "alice"}) for _ in range(2)]
        bob = http.post("/orders", json=BODY, headers={**headers, "x-user": "bob"})
        nobody = http.post("/orders", json=BODY, headers=headers)
    assert alice[1].content == alice[0].content
    assert alice[1].headers["idempotent-replayed"] == "true"
    assert bob.json()["run"] == 2
    assert "after authentication" in problem(nobody, 403)["detail"]
    assert service.runs == Counter(orders=2)


# --------------------------------------------------------------------------- the ASGI page's samples, as written


def readme_sample(introduced_by: str) -> str:
    """The ASGI page's first ``python`` block after the paragraph beginning ``introduced_by``."""
    text = ASGI_PAGE.read_text()
    start = text.index("\n" + introduced_by)
    found = re.compile(r"```python\n(.*?)```", re.DOTALL).search(text, start)
    assert found is not None
    return found.group(1)


def run_sample(code: str, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run a page's sample as the module ``name`` (in sys.modules, as frameworks expect); return its globals."""
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(code, f"asgi.md ({name})", "exec"), module.__dict__)
    return module.__dict__


def closing(app: Any, client: Any) -> Any:
    """``app``, closing the sample's client when the server shuts down (its connections live in the server's loop)."""

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await client.aclose()
            return message

        await app(scope, receiving, send)

    return served


@contextlib.contextmanager
def serving_fastapi_sample(
    port: int, monkeypatch: pytest.MonkeyPatch, *, authentication: bool
) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """Serve the ASGI page's FastAPI sample (without its authentication line if asked); yield a client, its globals."""
    code = readme_sample("FastAPI with Starlette's authentication")
    line = "app.add_middleware(AuthenticationMiddleware, backend=BearerNames())  # added last: runs first\n"
    assert line in code
    if not authentication:
        code = code.replace(line, "")
    monkeypatch.setenv("REDIS_URL", f"redis://{servers.HOST}:{port}/0")
    sample = run_sample(code, "readme_fastapi", monkeypatch)
    app = sample["app"]
    (door,) = [m for m in app.user_middleware if m.cls is IdempotencyMiddleware]
    with serve_client(closing(app, door.kwargs["client"])) as http:
        yield http, sample


def test_the_readme_fastapi_sample_with_authentication(
    redis_standalone: servers.RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As written: a user's key runs once and replays to them only; no user 403; no key 400; ignored routes run."""
    headers = key()
    with serving_fastapi_sample(redis_standalone.port, monkeypatch, authentication=True) as (http, sample):
        alice = [http.post("/orders", headers={**headers, "Authorization": "Bearer alice"}) for _ in range(2)]
        bob = http.post("/orders", headers={**headers, "Authorization": "Bearer bob"})
        nobody = http.post("/orders", headers=headers)
        keyless = http.post("/orders", headers={"Authorization": "Bearer alice"})
        hooks = [http.post("/webhook", content=b"evt", headers=h) for h in ({}, headers, headers)]
        signed = {**headers, "Authorization": "Bearer alice"}
        reindex = [http.post("/internal/reindex", headers=h) for h in ({}, signed, signed)]
    assert [r.status_code for r in alice] == [201, 201]
    assert alice[1].content == alice[0].content
    assert alice[1].headers["idempotent-replayed"] == "true"
    assert bob.json() == {"order": "ord_2"}
    problem(nobody, 403)
    problem(keyless, 400)
    assert sample["orders"] == ["alice", "bob"]
    assert [r.json() for r in hooks] == [{"events": 1}, {"events": 2}, {"events": 3}]
    assert [r.status_code for r in reindex] == [200, 200, 200]
    assert reindex[2].headers["idempotent-replayed"] == "true"  # accepted there: a key is honoured
    assert sample["events"] == [b"evt", b"evt", b"evt", b"reindex", b"reindex"]


@pytest.mark.usefixtures("fresh_log")
def test_the_readme_fastapi_sample_without_authentication(
    redis_standalone: servers.RedisProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without its auth line: keyed requests are 500 scope-failed naming KeyError('user') and the fix; logged once."""
    headers = {**key(), "Authorization": "Bearer alice"}
    with (
        caplog.at_level(logging.ERROR, logger="goblin_claim"),
        serving_fastapi_sample(redis_standalone.port, monkeypatch, authentication=False) as (http, sample),
    ):
        failed = [http.post("/orders", headers=headers) for _ in range(3)]
        hook = http.post("/webhook", content=b"evt", headers=headers)
    for answer in failed:
        body = problem(answer, 500)
        assert body["type"] == "about:blank"
        assert "raised KeyError('user')" in body["detail"]
        assert "nothing was stored" in body["detail"]
        assert "scope['user'] is set by an authentication middleware" in body["detail"]
    assert sample["orders"] == []
    assert hook.json() == {"events": 1}
    assert stored_keys(redis_standalone.port, "goblin-http", headers["Idempotency-Key"]) == []
    logged = [r for r in caplog.records if r.name == "goblin_claim.asgi"]
    assert len(logged) == 1
    assert "readme_fastapi.user_id raised KeyError: 'user' at asgi.md (readme_fastapi):" in logged[0].getMessage()


def test_the_readme_litestar_sample(redis_standalone: servers.RedisProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """As written: required=True refuses a keyless order, runs a keyed one once, and runs the webhook every time."""
    monkeypatch.setenv("REDIS_URL", f"redis://{servers.HOST}:{redis_standalone.port}/0")
    sample = run_sample(readme_sample("Litestar (the door's"), "readme_litestar", monkeypatch)
    headers = key()
    item = {"item": "tea"}
    with serve_client(closing(sample["app"], sample["client"])) as http:
        keyless = http.post("/orders", json=item)
        orders = [http.post("/orders", json=item, headers=headers) for _ in range(2)]
        hooks = [http.post("/webhook", json=item, headers=h) for h in ({}, headers, headers)]
    problem(keyless, 400)
    assert orders[1].headers["idempotent-replayed"] == "true"
    assert [r.json() for r in hooks] == [{"seen": 2}, {"seen": 3}, {"seen": 4}]
    assert sample["orders"] == ["tea", "webhook", "webhook", "webhook"]
