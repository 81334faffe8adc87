"""IdempotencyMiddleware under a real uvicorn, over real HTTP (httpx), against a real redis-server.

Every test runs twice: on a Starlette app and on a FastAPI app (a pydantic body
model, so FastAPI parses the body the middleware read and handed back). Each
test starts its own server on a kernel-chosen loopback port and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis.asyncio
from fastapi import FastAPI
from pydantic import BaseModel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from goblin_claim.asgi import IdempotencyMiddleware
from tests.conftest import unique
from tests.support import servers
from tests.support.asgi_server import serve_client

FRAMEWORKS = ("starlette", "fastapi")
BODY = {"items": ["tea"]}


class Order(BaseModel):
    """The FastAPI endpoints' body."""

    items: list[str]


@dataclass
class Service:
    """What the test apps do, shared by both frameworks, and what the tests read back."""

    redis_port: int
    namespace: str = field(default_factory=lambda: unique("http"))
    runs: Counter[str] = field(default_factory=Counter)
    client_options: dict[str, Any] = field(default_factory=dict)
    redis: Any = None
    taken_over: asyncio.Event | None = None
    dropped: bool = False  # the first /lapse run has dropped its claim
    on_run: Any = None  # a callable run (in a thread) inside /orders, for fault injection

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Make the asyncio client in the server's loop; close it at shutdown."""
        options: dict[str, Any] = {
            "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), 3),
            "socket_timeout": 5,
            **self.client_options,
        }
        pool = redis.asyncio.BlockingConnectionPool(
            host=servers.HOST, port=self.redis_port, max_connections=64, timeout=30, **options
        )
        self.redis = redis.asyncio.Redis.from_pool(pool)
        self.taken_over = asyncio.Event()
        try:
            yield
        finally:
            await self.redis.aclose()

    def client(self) -> Any:
        """The middleware's client factory: the client the lifespan made."""
        return self.redis

    # -- the endpoints, framework-free: (status, JSON body, headers)

    async def order(self, path: str, items: list[str], delay: float) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Create an order: a new number per run, headers worth replaying and some that are not."""
        self.runs[path] += 1
        n = self.runs[path]
        if self.on_run is not None:
            await asyncio.to_thread(self.on_run)
        await asyncio.sleep(delay)
        headers = {
            "etag": f'"v{n}"',
            "location": f"{path}/ord_{n}",
            "set-cookie": f"session=s{n}",
            "x-request-id": uuid.uuid4().hex,
        }
        return 201, {"order": f"ord_{n}", "items": items, "path": path}, headers

    async def flaky(self) -> tuple[int, dict[str, Any]]:
        """Fail with 503 on the first run, succeed after."""
        self.runs["/flaky"] += 1
        if self.runs["/flaky"] == 1:
            return 503, {"error": "the upstream is down"}
        return 201, {"run": self.runs["/flaky"]}

    async def boom(self) -> dict[str, Any]:
        """Raise on the first run, succeed after."""
        self.runs["/boom"] += 1
        if self.runs["/boom"] == 1:
            raise RuntimeError("the handler crashed")
        return {"run": self.runs["/boom"]}

    async def lapse(self, how: str) -> dict[str, Any]:
        """Lose this request's claim mid-request (as a lapsed lease would); "takeover" also waits for a rival."""
        self.runs["/lapse"] += 1
        run = self.runs["/lapse"]
        assert self.taken_over is not None
        if run == 1:
            # One key per request: a token while in flight (this one), a record once done.
            async for key in self.redis.scan_iter(f"{self.namespace}:*"):
                held = await self.redis.get(key)
                if held is not None and not held.startswith(b"done "):
                    await self.redis.delete(key)
            self.dropped = True
            if how == "takeover":
                await asyncio.wait_for(self.taken_over.wait(), 20)
        else:
            self.taken_over.set()
        return {"run": run}

    def stream(self) -> StreamingResponse:
        """Four chunks of 1 KiB, streamed."""
        self.runs["/stream"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            for index in range(4):
                yield bytes([65 + index]) * 1024

        return StreamingResponse(chunks(), media_type="application/octet-stream")


def starlette_app(service: Service, **options: Any) -> Starlette:
    """The service as a Starlette app, behind the middleware."""

    async def order(request: Request) -> Response:
        payload = await request.json()
        delay = float(request.headers.get("x-delay", "0"))
        status, body, headers = await service.order(request.url.path, payload["items"], delay)
        return JSONResponse(body, status_code=status, headers=headers)

    async def listing(request: Request) -> Response:
        service.runs["GET /orders"] += 1
        return JSONResponse({"runs": service.runs["GET /orders"]})

    async def flaky(request: Request) -> Response:
        status, body = await service.flaky()
        return JSONResponse(body, status_code=status)

    async def boom(request: Request) -> Response:
        return JSONResponse(await service.boom())

    async def lapse(request: Request) -> Response:
        return JSONResponse(await service.lapse(request.headers["x-lapse"]), status_code=201)

    async def stream(request: Request) -> Response:
        return service.stream()

    app = Starlette(
        routes=[
            Route("/orders", order, methods=["POST", "PUT"]),
            Route("/orders", listing, methods=["GET"]),
            Route("/payments", order, methods=["POST"]),
            Route("/flaky", flaky, methods=["POST"]),
            Route("/boom", boom, methods=["POST"]),
            Route("/lapse", lapse, methods=["POST"]),
            Route("/stream", stream, methods=["POST"]),
        ],
        lifespan=service.lifespan,
    )
    app.add_middleware(IdempotencyMiddleware, client=service.client, namespace=service.namespace, **options)
    return app


def fastapi_app(service: Service, **options: Any) -> FastAPI:
    """The same service as a FastAPI app: bodies parsed into a pydantic model."""
    app = FastAPI(lifespan=service.lifespan)

    async def order(request: Request, body: Order) -> Response:
        delay = float(request.headers.get("x-delay", "0"))
        status, payload, headers = await service.order(request.url.path, body.items, delay)
        return JSONResponse(payload, status_code=status, headers=headers)

    app.post("/orders")(order)
    app.put("/orders")(order)
    app.post("/payments")(order)

    @app.get("/orders")
    async def listing() -> dict[str, int]:
        service.runs["GET /orders"] += 1
        return {"runs": service.runs["GET /orders"]}

    @app.post("/flaky")
    async def flaky() -> Response:
        status, body = await service.flaky()
        return JSONResponse(body, status_code=status)

    @app.post("/boom")
    async def boom() -> dict[str, Any]:
        return await service.boom()

    @app.post("/lapse", status_code=201)
    async def lapse(request: Request) -> dict[str, Any]:
        return await service.lapse(request.headers["x-lapse"])

    @app.post("/stream")
    async def stream() -> StreamingResponse:
        return service.stream()

    app.add_middleware(IdempotencyMiddleware, client=service.client, namespace=service.namespace, **options)
    return app


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
    """Serve the service's app with uvicorn; yield an HTTP client for it."""
    app = starlette_app(service, **options) if framework == "starlette" else fastapi_app(service, **options)
    with serve_client(app) as http:
        yield http


def key() -> dict[str, str]:
    """A fresh Idempotency-Key header."""
    return {"Idempotency-Key": uuid.uuid4().hex}


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """The RFC 9457 problem in ``response``, checked for its status and shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] == "about:blank"
    assert body["title"]
    assert body["detail"]
    return body


REPLAYED = ("content-type", "etag", "location")


async def running_handler(service: Service, path: str) -> None:
    """Return once the server thread has started the handler of ``path``."""
    for _ in range(3000):
        if service.runs[path]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never ran")


# --------------------------------------------------------------------------- replay


def test_duplicate_replays_status_body_and_headers(framework: str, service: Service) -> None:
    """A duplicate gets the first status, body bytes and allow-listed headers, and Idempotent-Replayed; no cookie."""
    with running(framework, service) as http:
        headers = key()
        first = http.post("/orders", json=BODY, headers=headers)
        again = http.post("/orders", json=BODY, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert json.loads(first.content)["order"] == "ord_1"
    for name in REPLAYED:
        assert again.headers[name] == first.headers[name], name
    assert again.headers["content-length"] == str(len(first.content))
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert "set-cookie" in first.headers
    assert "set-cookie" not in again.headers
    assert "x-request-id" in first.headers
    assert "x-request-id" not in again.headers
    assert service.runs["/orders"] == 1


def test_key_reused_with_another_body_is_422(framework: str, service: Service) -> None:
    """The same key with a different body is answered 422 and the handler does not run again."""
    with running(framework, service) as http:
        headers = key()
        assert http.post("/orders", json=BODY, headers=headers).status_code == 201
        other = http.post("/orders", json={"items": ["coffee"]}, headers=headers)
    assert "different request body" in problem(other, 422)["detail"]
    assert service.runs["/orders"] == 1


def test_duplicate_while_in_flight_is_409_then_replayed(framework: str, service: Service) -> None:
    """A duplicate arriving while the first runs is answered 409 with Retry-After; once done, it is replayed."""
    with running(framework, service) as http:
        headers = key()

        async def race() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as client:
                first = asyncio.create_task(client.post("/orders", json=BODY, headers={**headers, "x-delay": "1"}))
                await running_handler(service, "/orders")
                duplicate = await client.post("/orders", json=BODY, headers=headers)
                return await first, duplicate

        first, duplicate = asyncio.run(race())
        after = http.post("/orders", json=BODY, headers=headers)
    assert first.status_code == 201
    assert "still being processed" in problem(duplicate, 409)["detail"]
    assert duplicate.headers["retry-after"] == "1"
    assert after.status_code == 201
    assert after.content == first.content
    assert service.runs["/orders"] == 1


def test_in_flight_duplicate_with_another_body_is_422(framework: str, service: Service) -> None:
    """While the first request runs, the same key with another body is 422 (fingerprints compared from the holder)."""
    with running(framework, service) as http:
        headers = key()

        async def race() -> httpx.Response:
            async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as client:
                first = asyncio.create_task(client.post("/orders", json=BODY, headers={**headers, "x-delay": "1"}))
                await running_handler(service, "/orders")
                other = await client.post("/orders", json={"items": ["coffee"]}, headers=headers)
                assert (await first).status_code == 201
                return other

        problem(asyncio.run(race()), 422)
    assert service.runs["/orders"] == 1


def test_fifty_concurrent_copies_run_once_with_identical_answers(framework: str, service: Service) -> None:
    """50 concurrent copies of one request (wait=10) run the handler once; all 50 get the same answer."""
    with running(framework, service, wait=10.0) as http:
        headers = {**key(), "x-delay": "0.3"}

        async def fire() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=60)
            async with httpx.AsyncClient(base_url=str(http.base_url), timeout=60, limits=limits) as client:
                return await asyncio.gather(*(client.post("/orders", json=BODY, headers=headers) for _ in range(50)))

        responses = asyncio.run(fire())
    assert service.runs["/orders"] == 1
    assert {r.status_code for r in responses} == {201}
    assert len({r.content for r in responses}) == 1
    for name in REPLAYED:
        assert len({r.headers[name] for r in responses}) == 1, name
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 49


# --------------------------------------------------------------------------- what is intercepted


def test_missing_key_is_400_when_required(framework: str, service: Service) -> None:
    """With required=True, an intercepted request without Idempotency-Key is 400 and does not run."""
    with running(framework, service, required=True) as http:
        missing = http.post("/orders", json=BODY)
    assert "Idempotency-Key" in problem(missing, 400)["detail"]
    assert service.runs["/orders"] == 0


def test_missing_key_passes_through_when_not_required(framework: str, service: Service) -> None:
    """With required=False (the default), a request without a key runs each time, unguarded."""
    with running(framework, service) as http:
        statuses = [http.post("/orders", json=BODY).status_code for _ in range(2)]
    assert statuses == [201, 201]
    assert service.runs["/orders"] == 2


def test_safe_methods_and_unlisted_methods_pass_through(framework: str, service: Service) -> None:
    """GET (safe) and PUT (not in methods) with a key run every time and are never replayed, even when required."""
    with running(framework, service, required=True) as http:
        headers = key()
        gets = [http.get("/orders", headers=headers) for _ in range(2)]
        puts = [http.put("/orders", json=BODY, headers=headers) for _ in range(2)]
    assert [r.json()["runs"] for r in gets] == [1, 2]
    assert [r.status_code for r in puts] == [201, 201]
    assert service.runs["/orders"] == 2
    assert not any("idempotent-replayed" in r.headers for r in gets + puts)


def test_same_key_on_two_paths_names_two_operations(framework: str, service: Service) -> None:
    """One key sent to /orders and /payments runs both, and each replays its own response."""
    with running(framework, service) as http:
        headers = key()
        orders = http.post("/orders", json=BODY, headers=headers)
        payments = http.post("/payments", json=BODY, headers=headers)
        orders_again = http.post("/orders", json=BODY, headers=headers)
        payments_again = http.post("/payments", json=BODY, headers=headers)
    assert service.runs["/orders"] == service.runs["/payments"] == 1
    assert orders.json()["path"] == "/orders"
    assert payments.json()["path"] == "/payments"
    assert orders_again.content == orders.content
    assert payments_again.content == payments.content


# --------------------------------------------------------------------------- what is not stored


def test_5xx_is_not_stored_so_a_retry_runs(framework: str, service: Service) -> None:
    """A 503 from the handler gives the key back: the retry runs and its 201 is what replays."""
    with running(framework, service) as http:
        headers = key()
        failed = http.post("/flaky", json=BODY, headers=headers)
        retried = http.post("/flaky", json=BODY, headers=headers)
        replayed = http.post("/flaky", json=BODY, headers=headers)
    assert failed.status_code == 503
    assert "idempotent-replayed" not in failed.headers
    assert retried.status_code == 201
    assert retried.json() == {"run": 2}
    assert replayed.content == retried.content
    assert replayed.headers["idempotent-replayed"] == "true"
    assert service.runs["/flaky"] == 2


def test_raising_handler_gives_the_key_back(framework: str, service: Service) -> None:
    """A handler that raises is answered 500 by the framework, and the key is free at once for a retry."""
    with running(framework, service) as http:
        headers = key()
        # uvicorn closes a connection whose app raised: each request on its own connection.
        crashed = http.post("/boom", json=BODY, headers={**headers, "connection": "close"})
        retried = http.post("/boom", json=BODY, headers=headers)
    assert crashed.status_code == 500
    assert retried.status_code == 200
    assert retried.json() == {"run": 2}


def test_streamed_response_over_the_limit_is_passed_whole_and_not_rerun(framework: str, service: Service) -> None:
    """A 4 KiB stream over max_response_bytes=2048 arrives whole, marked unstored; a duplicate is 422, not a rerun."""
    with running(framework, service, max_response_bytes=2048) as http:
        headers = key()
        first = http.post("/stream", json=BODY, headers=headers)
        duplicate = http.post("/stream", json=BODY, headers=headers)
    assert first.status_code == 200
    assert first.content == b"A" * 1024 + b"B" * 1024 + b"C" * 1024 + b"D" * 1024
    assert first.headers["idempotent-stored"] == "false"
    assert "was not kept" in problem(duplicate, 422)["detail"]
    assert service.runs["/stream"] == 1


# --------------------------------------------------------------------------- failure modes


def test_redis_down_is_503_with_retry_after_and_nothing_runs(framework: str) -> None:
    """With Redis unreachable, an intercepted request is 503 with Retry-After; the handler never runs unguarded."""
    service = Service(servers.free_port())  # nothing listens there
    service.client_options = {"retry": Retry(NoBackoff(), 0), "socket_connect_timeout": 1}
    with running(framework, service) as http:
        down = http.post("/orders", json=BODY, headers=key())
        unkeyed = http.get("/orders")
    assert "unavailable" in problem(down, 503)["detail"]
    assert down.headers["retry-after"] == "1"
    assert service.runs["/orders"] == 0
    assert unkeyed.status_code == 200  # safe methods never touch Redis


def test_lease_lapsed_and_taken_over_mid_request_is_503(framework: str, service: Service) -> None:
    """The first run's claim lapses and a retry takes it over: the late first run is 503, the retry's answer replays."""
    with running(framework, service) as http:
        headers = {**key(), "x-lapse": "takeover"}

        async def race() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as client:
                first = asyncio.create_task(client.post("/lapse", json=BODY, headers=headers))
                for _ in range(3000):  # until the first run has dropped its claim
                    if service.dropped:
                        break
                    await asyncio.sleep(0.01)
                takeover = await client.post("/lapse", json=BODY, headers=headers)
                return await first, takeover

        late, takeover = asyncio.run(race())
        later = http.post("/lapse", json=BODY, headers=headers)
    assert "lapsed" in problem(late, 503)["detail"]
    assert late.headers["retry-after"] == "1"
    assert takeover.status_code == 201
    assert takeover.json() == {"run": 2}
    assert later.content == takeover.content
    assert later.headers["idempotent-replayed"] == "true"


def test_lease_lapsed_uncontested_is_503_and_the_key_reopens(framework: str, service: Service) -> None:
    """A claim lost mid-request, even with nobody claiming since, is 503: nothing proves the key uncontested."""
    with running(framework, service) as http:
        headers = {**key(), "x-lapse": "alone"}
        first = http.post("/lapse", json=BODY, headers=headers)
        again = http.post("/lapse", json=BODY, headers=headers)
        replay = http.post("/lapse", json=BODY, headers=headers)
    # The lapsed run's answer is not given out (a rival could have run and released
    # meanwhile); its key is free, so the retry runs and its answer is the one kept.
    assert "lapsed" in problem(first, 503)["detail"]
    assert again.status_code == 201
    assert again.json() == {"run": 2}
    assert replay.content == again.content
    assert replay.headers["idempotent-replayed"] == "true"


def test_redis_lost_mid_request_still_answers_marked_unstored(framework: str, redis_server_binary: str) -> None:
    """Redis dies while the handler runs: the handler's answer is still sent, marked Idempotent-Stored: false."""
    own = servers.start_server(redis_server_binary)
    try:
        service = Service(own.port, on_run=own.stop)
        service.client_options = {"retry": Retry(NoBackoff(), 1), "socket_connect_timeout": 0.5}
        with running(framework, service, lease=2) as http:
            answer = http.post("/orders", json=BODY, headers=key())
    finally:
        own.stop()
    assert answer.status_code == 201
    assert answer.json()["order"] == "ord_1"
    assert answer.headers["idempotent-stored"] == "false"


def test_scope_function_keeps_users_apart(framework: str, service: Service) -> None:
    """With a scope function, one key sent by two users runs twice; each user gets their own replay."""
    with running(framework, service, scope=lambda scope: _header(scope, b"x-user")) as http:
        headers = key()
        alice = http.post("/orders", json=BODY, headers={**headers, "x-user": "alice"})
        bob = http.post("/orders", json=BODY, headers={**headers, "x-user": "bob"})
        alice_again = http.post("/orders", json=BODY, headers={**headers, "x-user": "alice"})
    assert service.runs["/orders"] == 2
    assert alice.json()["order"] == "ord_1"
    assert bob.json()["order"] == "ord_2"
    assert alice_again.content == alice.content


def _header(scope: Any, name: bytes) -> str | None:
    for header, value in scope["headers"]:
        if header == name:
            return str(value.decode("latin-1"))
    return None


def test_gzip_inside_the_middleware_is_negotiated_on_replay(service: Service) -> None:
    """Starlette's GZipMiddleware inside it: a duplicate sending Accept-Encoding: identity gets the plain body."""
    from starlette.middleware.gzip import GZipMiddleware

    async def order(request: Request) -> Response:
        service.runs["/orders"] += 1
        return JSONResponse({"order": "ord_1", "lines": ["tea"] * 200}, status_code=201)

    app = Starlette(routes=[Route("/orders", order, methods=["POST"])], lifespan=service.lifespan)
    app.add_middleware(GZipMiddleware, minimum_size=100)  # added first: it runs inside
    app.add_middleware(IdempotencyMiddleware, client=service.client, namespace=service.namespace)
    headers = key()
    with serve_client(app) as http:
        first = http.post("/orders", json=BODY, headers={**headers, "Accept-Encoding": "gzip"})
        plain = http.post("/orders", json=BODY, headers={**headers, "Accept-Encoding": "identity"})
        zipped = http.post("/orders", json=BODY, headers={**headers, "Accept-Encoding": "gzip"})
    assert first.headers["content-encoding"] == zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert plain.headers["idempotent-replayed"] == zipped.headers["idempotent-replayed"] == "true"
    assert plain.json() == zipped.json() == first.json()  # httpx decodes gzip: one answer, two encodings
    assert int(plain.headers["content-length"]) == len(plain.content)
    assert service.runs["/orders"] == 1
