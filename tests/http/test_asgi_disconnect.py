"""A client that disconnects while the view runs, then retries: the view runs once, under a real uvicorn process.

Django (``get_asgi_application()``, a sync and an async view), Starlette and
FastAPI (an async endpoint, a sync one and a streamed response), each wrapped in
IdempotencyMiddleware and served by ``python -m uvicorn`` on a kernel-chosen
port, as users deploy them. The views count their runs in Redis; the test reads
the counters from its own process.

On a disconnect Django cancels the view task and returns without a response (a
sync view finishes in its thread all the same), and Starlette cancels a streamed
response: "no response" must not give the key back. uvicorn lets a plain
Starlette or FastAPI endpoint finish, so its answer is stored and replayed.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from goblin_claim.asgi import IdempotencyMiddleware
from tests.conftest import unique
from tests.support import servers
from tests.support.asgi_server import serve_process

pytest.importorskip("django")

BODY = b'{"items": ["tea"]}'  # the same bytes on every try: the body is fingerprinted
DELAY = 1.5  # how long each view works; the client leaves 0.2 s into it
# (framework, view, what a retry gets, how many runs reach their end)
CASES = [
    ("django", "sync", 422, 1),  # the thread finishes the first run; its answer is lost with the client
    ("django", "async", 422, 0),  # Django cancels the view
    ("starlette", "async", 201, 1),  # uvicorn lets it finish: stored, replayed
    ("starlette", "sync", 201, 1),
    ("starlette", "stream", 422, 0),  # Starlette cancels the stream when the client leaves
    ("fastapi", "async", 201, 1),
    ("fastapi", "sync", 201, 1),
    ("fastapi", "stream", 422, 0),
]
SERVED = {  # uvicorn target, --factory, --lifespan
    "django": ("tests.support.apps.django_app.asgi:application", False, "off"),  # Django's handler refuses lifespan
    "starlette": ("tests.http.test_asgi_disconnect:starlette_application", True, "on"),
    "fastapi": ("tests.http.test_asgi_disconnect:fastapi_application", True, "on"),
}


# --------------------------------------------------------------------------- the Starlette and FastAPI services


class Counters:
    """Each run of a view counted in Redis, from the server's process (``GOBLIN_TEST_*`` in its environment)."""

    def __init__(self) -> None:
        import os

        self.port = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
        self.prefix = f"{os.environ['GOBLIN_TEST_NAMESPACE']}:runs"
        self.sync = redis.Redis(host=servers.HOST, port=self.port)
        self._async: Any = None

    async def count(self, name: str) -> int:
        """Count one more ``name`` (from the event loop)."""
        if self._async is None:
            self._async = redis.asyncio.Redis(host=servers.HOST, port=self.port)
        return int(await self._async.incr(f"{self.prefix}:{name}"))

    def work_sync(self) -> int:
        """The sync endpoints' work, in a worker thread: count, work, count the end."""
        run = int(self.sync.incr(f"{self.prefix}:sync"))
        time.sleep(DELAY)
        self.sync.incr(f"{self.prefix}:sync:finished")
        return run

    async def work_async(self) -> int:
        """The async endpoints' work: count, work, count the end."""
        run = await self.count("async")
        await asyncio.sleep(DELAY)
        await self.count("async:finished")
        return run

    async def stream(self) -> StreamingResponse:
        """A response streamed over DELAY seconds, counted when it starts and when it ends."""
        run = await self.count("stream")

        async def chunks() -> Any:
            for _ in range(int(DELAY / 0.1)):
                yield f"run {run}\n".encode()
                await asyncio.sleep(0.1)
            await self.count("stream:finished")

        return StreamingResponse(chunks(), media_type="text/plain")

    def middleware_client(self) -> Any:
        """The middleware's client, made on the first intercepted request in the server's loop."""
        pool = redis.asyncio.BlockingConnectionPool(host=servers.HOST, port=self.port, max_connections=32)
        return redis.asyncio.Redis.from_pool(pool)


def starlette_application() -> Starlette:
    """The Starlette service, behind the middleware (a ``--factory`` for uvicorn)."""
    counters = Counters()

    async def order_async(request: Request) -> Response:
        items = (await request.json())["items"]
        return JSONResponse({"order": f"ord_{await counters.work_async()}", "items": items}, status_code=201)

    async def order_sync(request: Request) -> Response:
        items = (await request.json())["items"]
        run = await run_in_threadpool(counters.work_sync)
        return JSONResponse({"order": f"ord_{run}", "items": items}, status_code=201)

    async def order_stream(request: Request) -> Response:
        await request.json()
        return await counters.stream()

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/orders/async", order_async, methods=["POST"]),
            Route("/orders/sync", order_sync, methods=["POST"]),
            Route("/orders/stream", order_stream, methods=["POST"]),
        ]
    )
    app.add_middleware(IdempotencyMiddleware, client=counters.middleware_client, namespace=counters.prefix)
    return app


class Order(BaseModel):
    """The FastAPI endpoints' body."""

    items: list[str]


def fastapi_application() -> FastAPI:
    """The FastAPI service (a sync endpoint runs in FastAPI's thread pool), behind the middleware."""
    counters = Counters()
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    @app.post("/orders/async", status_code=201)
    async def order_async(order: Order) -> dict[str, Any]:
        return {"order": f"ord_{await counters.work_async()}", "items": order.items}

    @app.post("/orders/sync", status_code=201)
    def order_sync(order: Order) -> dict[str, Any]:
        return {"order": f"ord_{counters.work_sync()}", "items": order.items}

    @app.post("/orders/stream")
    async def order_stream(order: Order) -> StreamingResponse:
        return await counters.stream()

    app.add_middleware(IdempotencyMiddleware, client=counters.middleware_client, namespace=counters.prefix)
    return app


# --------------------------------------------------------------------------- the client


def send_and_leave(url: str, path: str, key: str, started: Any) -> None:
    """Send the request on a raw socket, wait until the view ``started()``, then disconnect mid-view."""
    parts = urlsplit(url)
    body = BODY
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        deadline = time.monotonic() + 20
        while not started():
            assert time.monotonic() < deadline, "the view never started"
            time.sleep(0.01)
        time.sleep(0.2)  # well inside the view's DELAY


def retry(url: str, path: str, key: str) -> httpx.Response:
    """The client's retry, as a retrying client sends it: again while the answer is 409 (in flight)."""
    deadline = time.monotonic() + 30
    while True:
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        response = httpx.post(f"{url}{path}", content=BODY, headers=headers, timeout=30)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


@pytest.mark.parametrize(("framework", "view", "answer", "finished"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_client_gone_mid_view_then_retrying_runs_the_view_once(
    framework: str, view: str, answer: int, finished: int, redis_standalone: servers.RedisProcess
) -> None:
    """A client disconnects while the view runs and retries: the view ran once; the retry is replayed or 422."""
    namespace = unique("disconnect")
    counters = redis_standalone.client()
    runs = f"{namespace}:runs:{view}"
    env = {
        "GOBLIN_TEST_REDIS_PORT": str(redis_standalone.port),
        "GOBLIN_TEST_NAMESPACE": namespace,
        "GOBLIN_TEST_DELAY": str(DELAY),
        "DJANGO_SETTINGS_MODULE": "tests.support.apps.django_app.settings",
    }
    target, factory, lifespan = SERVED[framework]
    key = uuid.uuid4().hex
    path = f"/orders/{view}"
    try:
        with serve_process(target, env=env, factory=factory, lifespan=lifespan) as url:
            send_and_leave(url, path, key, lambda: counters.get(runs) is not None)
            first = retry(url, path, key)
            time.sleep(DELAY + 0.5)  # a sync view's thread has finished its first run by now
            second = retry(url, path, key)
        assert int(counters.get(runs) or 0) == 1  # exactly once, across the retries
        assert int(counters.get(f"{runs}:finished") or 0) == finished
        for response in (first, second):
            assert response.status_code == answer, response.text
            if answer == 422:
                assert response.headers["content-type"] == "application/problem+json"
                assert "started running but ended without a whole response" in response.json()["detail"]
            else:
                assert response.headers["idempotent-replayed"] == "true"
                assert response.json()["order"] == "ord_1"
    finally:
        counters.close()
