"""A FastAPI service whose POST endpoints honour the Idempotency-Key header, through goblin_claim.asgi.

The answers follow the IETF Idempotency-Key draft: a missing key is 400, a key
reused with a different body is 422, a retry while the first request is still
running is 409, and a retry after it finished replays the first response (with
``Idempotent-Replayed: true``). Keys are scoped per user, so one user's key never
replays another's answer. Runs on an embedded fakeredis, or on the server in REDIS_URL.

The demo starts the service on a free loopback port, sends a few requests,
prints what came back, and stops:

    python examples/fastapi_service.py
    REDIS_URL=redis://localhost:6379/0 python examples/fastapi_service.py

To serve it for real: ``uvicorn examples.fastapi_service:app`` (from the repository root).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import redis.asyncio
import uvicorn
from fastapi import FastAPI, Header
from pydantic import BaseModel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from goblin_claim.asgi import IdempotencyMiddleware, Scope

NAMESPACE = "examples.fastapi"


def connect() -> redis.asyncio.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        # Many concurrent requests: a blocking pool waits for a free connection. A pool
        # made by hand has no retries: give it some, so a lost reply is sent again. A
        # socket timeout turns a hung Redis into a 503 instead of a hung request.
        retry = Retry(ExponentialWithJitterBackoff(base=0.01, cap=1), retries=3)
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=32, retry=retry, socket_timeout=2, socket_connect_timeout=2
        )
        return redis.asyncio.Redis.from_pool(pool)
    from goblin_claim.testing import fake_async_redis

    return fake_async_redis(native=True)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The client is made in the server's event loop, and closed with it.
    app.state.redis = connect()
    try:
        yield
    finally:
        await app.state.redis.aclose()


def user_of(scope: Scope) -> str | None:
    # Whose keys these are. A real service reads its authenticated user here
    # (set by an authentication middleware added after this one, so it runs first).
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1").removeprefix("Bearer "))
    return None


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    client=lambda: app.state.redis,  # resolved on the first request, after the lifespan made it
    required=True,
    scope=user_of,
    namespace=NAMESPACE,
)


class OrderIn(BaseModel):
    items: list[str]


class OrderOut(BaseModel):
    order_id: str
    items: list[str]
    user: str


created: list[str] = []


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, authorization: Annotated[str, Header()] = "") -> OrderOut:
    created.append(order.items[0])
    await asyncio.sleep(0.3)  # the database is slow
    return OrderOut(order_id=f"ord_{len(created)}", items=order.items, user=authorization.removeprefix("Bearer "))


@app.get("/orders")
async def list_orders() -> dict[str, int]:
    return {"created": len(created)}


# --------------------------------------------------------------------------- the demo


def show(label: str, response: httpx.Response) -> None:
    replayed = response.headers.get("idempotent-replayed", "-")
    body: Any = response.json()
    detail = body.get("detail", body) if response.headers["content-type"] == "application/problem+json" else body
    print(f"{label:<24} -> status={response.status_code} replayed={replayed} {detail}")


async def main() -> None:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            raise SystemExit(f"the service did not start: {serving.exception()!r}")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"Serving on http://127.0.0.1:{port} with", os.environ.get("REDIS_URL") or "an embedded fakeredis")
    async for key in app.state.redis.scan_iter(f"{NAMESPACE}:*"):  # a fresh story, also on a reused server
        await app.state.redis.delete(key)

    alice = {"Idempotency-Key": "k-1", "Authorization": "Bearer alice"}
    tea, coffee = {"items": ["tea"]}, {"items": ["coffee"]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        first = asyncio.create_task(http.post("/orders", json=tea, headers=alice))
        await asyncio.sleep(0.1)
        show("retry while running", await http.post("/orders", json=tea, headers=alice))
        show("first request", await first)
        show("retry after it ended", await http.post("/orders", json=tea, headers=alice))
        show("same key, new body", await http.post("/orders", json=coffee, headers=alice))
        show("no key", await http.post("/orders", json=tea, headers={"Authorization": "Bearer alice"}))
        bob = {**alice, "Authorization": "Bearer bob"}
        show("same key, other user", await http.post("/orders", json=coffee, headers=bob))
        show("GET passes through", await http.get("/orders", headers=alice))
    server.should_exit = True
    await serving
    print(f"orders created: {created}")
    assert created == ["tea", "coffee"]  # once for alice, once for bob


if __name__ == "__main__":
    asyncio.run(main())
