"""The ASGI door when its claim is lost while the app runs: the app is cancelled, the request answered 503.

A key taken over mid-request (deleted, then claimed by a retry) cancels the app at
its next await, before its side effect: the request is answered ``503 claim-lost``,
nothing is kept or given back under the new owner, and duplicates get the new
owner's answer. Once the answer is stored the keep-alive ends, so work the app does
after answering (background tasks) is never cancelled by the completed key's
renewals. On the session's standalone redis-server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio

from tests.conftest import unique
from tests.http.test_asgi_paths import NS, door, serve
from tests.support import servers
from tests.support.servers import RedisProcess

LEASE = 2  # renewals every 2/3 s


def test_an_app_whose_key_is_taken_over_is_cancelled_and_answered_claim_lost(redis_standalone: RedisProcess) -> None:
    """Mid-request the key is deleted and a retry runs: the first app is cancelled, 503 claim-lost, one side effect."""

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=redis_standalone.port)
        key = unique("lost")
        started = asyncio.Event()
        effects: list[int] = []
        seen: list[str] = []
        runs = 0

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            nonlocal runs
            runs += 1
            run = runs
            await receive()
            if run == 1:
                started.set()
                try:
                    await asyncio.sleep(30)  # the first request's long step: the loss lands here
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    raise
            effects.append(run)
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": f"made by run {run}".encode()})

        middleware = door(app, client, lease=LEASE)
        before = set(await client.keys(f"{NS}:*"))
        first = asyncio.ensure_future(serve(middleware, key=key))
        await asyncio.wait_for(started.wait(), 10)
        (name,) = set(await client.keys(f"{NS}:*")) - before
        await client.delete(name)  # the lease lapsed (or an operator reopened it)...
        retry = await serve(middleware, key=key)  # ...and a retry took the key and ran
        lost = await first
        again = await serve(middleware, key=key)
        assert (retry.status, retry.body) == (201, b"made by run 2")
        assert (lost.status, lost.problem, lost.headers["retry-after"]) == (503, "claim-lost", "1")
        assert (again.status, again.body, again.headers["idempotent-replayed"]) == (201, b"made by run 2", "true")
        assert seen == ["cancelled"]
        assert effects == [2]
        await client.aclose()

    asyncio.run(scenario())


def test_work_after_a_stored_answer_is_not_cancelled(redis_standalone: RedisProcess) -> None:
    """An app that answers, then works on past a renewal (a background task): stored, and never cancelled."""

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=redis_standalone.port)
        key = unique("after")
        finished: list[str] = []

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})
            await asyncio.sleep(LEASE)  # past two renewal intervals of the completed key
            finished.append("background")

        middleware = door(app, client, lease=LEASE)
        reply = await serve(middleware, key=key)
        again = await serve(middleware, key=key)
        assert (reply.status, reply.body) == (201, b"made")
        assert (again.body, again.headers["idempotent-replayed"]) == (b"made", "true")
        assert finished == ["background"]
        await client.aclose()

    asyncio.run(scenario())
