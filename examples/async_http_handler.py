"""An HTTP-style handler honouring the Idempotency-Key header, with no web framework (asyncio).

``handle(request)`` takes a method, headers and a JSON body and returns a status
and a JSON body, the way any framework's view would. The answers follow the
IETF Idempotency-Key draft: a missing key is 400, a key reused with a different
body is 422, a retry while the first request is still running is 409, and a
retry after it finished replays the first response. Runs on an embedded
fakeredis, or on the server in REDIS_URL:

    python examples/async_http_handler.py
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from goblin_claim import PayloadMismatchError, StillInFlightError, idempotent


@dataclass
class Request:
    method: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: dict[str, Any]


def connect() -> redis.asyncio.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        # Many concurrent requests: a blocking pool waits for a free connection. A pool
        # made by hand has no retries: give it some, so a lost reply is sent again.
        retry = Retry(ExponentialWithJitterBackoff(base=0.01, cap=1), retries=3)
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=32, retry=retry)
        return redis.asyncio.Redis.from_pool(pool)
    from goblin_claim.testing import fake_async_redis

    return fake_async_redis(native=False)


client = connect()
created: list[str] = []


# The key is scoped per client (the API user) so low-entropy keys never leak
# another user's answer; wait=0 turns "still running" into a 409 at once.
@idempotent(client, key=lambda user, key, order: f"{user}/{key}", namespace="examples.http", wait=0)
async def create_order(user: str, key: str, order: dict[str, Any]) -> dict[str, Any]:
    created.append(key)
    await asyncio.sleep(0.3)  # the database is slow
    return {"order_id": f"ord_{len(created)}", "items": order["items"], "user": user}


async def handle(request: Request) -> Response:
    key = request.headers.get("Idempotency-Key")
    if not key:
        return Response(400, {"error": "Idempotency-Key header required"})
    user = request.headers.get("Authorization", "anonymous")
    try:
        order = await create_order(user, key, json.loads(request.body))
    except PayloadMismatchError:
        return Response(422, {"error": "Idempotency-Key reused with a different body"})
    except StillInFlightError:
        return Response(409, {"error": "a request with this Idempotency-Key is in progress"})
    return Response(201, order)


async def main() -> None:
    async for key in client.scan_iter("examples.http:*"):
        await client.delete(key)
    headers = {"Idempotency-Key": "k-1", "Authorization": "alice"}
    body = json.dumps({"items": ["tea"]}).encode()

    first = asyncio.create_task(handle(Request("POST", headers, body)))
    await asyncio.sleep(0.05)
    print("retry while running  ->", await handle(Request("POST", headers, body)))
    print("first request        ->", await first)
    print("retry after it ended ->", await handle(Request("POST", headers, body)))
    other = json.dumps({"items": ["coffee"]}).encode()
    print("same key, new body   ->", await handle(Request("POST", headers, other)))
    print("no key               ->", await handle(Request("POST", {}, body)))
    print("same key, other user ->", await handle(Request("POST", {**headers, "Authorization": "bob"}, body)))
    print(f"orders created: {created}")
    assert created == ["k-1", "k-1"]  # once for alice, once for bob
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
