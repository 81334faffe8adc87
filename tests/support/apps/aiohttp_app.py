"""An aiohttp service behind the aiohttp door, for gunicorn's aiohttp worker: the Flask service's, in aiohttp.

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix, ``GOBLIN_TEST_DELAY`` how long ``POST /orders/sync`` works, ``GOBLIN_TEST_WAIT``
how long a duplicate waits; the caller is the ``X-User`` header (the door's ``scope``).
``POST /webhook`` ignores the key; ``/answer`` is tests/support/apps/answers.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

import redis.asyncio
from aiohttp import web

from goblin_claim.aiohttp import IdempotencyMiddleware, idempotency_key
from tests.support.apps import answers

PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
NAMESPACE = os.environ["GOBLIN_TEST_NAMESPACE"]
COUNTERS = f"{NAMESPACE}:runs"
DELAY = float(os.environ.get("GOBLIN_TEST_DELAY", "1.5"))
answers.log_to_file()


async def health(request: web.Request) -> web.Response:
    """The server is up (GET passes the door untouched)."""
    return web.Response(text="ok")


async def order_sync(request: web.Request) -> web.Response:
    """Count a run (and its process), work DELAY seconds, count its end; answer 201."""
    items = json.loads(await request.read())["items"]
    counters = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    await counters.rpush(f"{COUNTERS}:sync:pids", os.getpid())
    run = await counters.incr(f"{COUNTERS}:sync")
    await asyncio.sleep(DELAY)
    await counters.incr(f"{COUNTERS}:sync:finished")
    await counters.aclose()
    return web.json_response({"order": f"ord_{run}", "items": items}, status=201)


@idempotency_key("ignore")
async def webhook(request: web.Request) -> web.Response:
    """A webhook its sender signs: never claimed, key or not."""
    counters = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    run = await counters.incr(f"{COUNTERS}:webhook")
    await counters.aclose()
    return web.json_response({"run": run}, status=201)


async def answer(request: web.Request) -> web.Response:
    """``/answer`` (tests/support/apps/answers.py) in aiohttp: a body from an async generator when asked to stream."""
    await request.read()
    asked = answers.asked(request.rel_url.raw_query_string)
    counters = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    await counters.incr(answers.counter(NAMESPACE, asked.tag))
    await counters.aclose()
    asked.fail_if_asked()

    async def pieces() -> AsyncIterator[bytes]:
        for piece in asked.chunks():
            yield piece

    body = pieces() if asked.stream else asked.body
    return web.Response(body=body, status=asked.status, headers=dict(asked.headers))


@idempotency_key("ignore")
async def answer_ignored(request: web.Request) -> web.Response:
    """``/answer`` on a route that ignores the key."""
    return await answer(request)


application = web.Application(
    middlewares=[
        IdempotencyMiddleware(
            client=lambda: redis.asyncio.Redis(host="127.0.0.1", port=PORT, socket_timeout=5),
            namespace=NAMESPACE,
            scope=lambda request: request.headers.get("X-User"),
            wait=float(os.environ.get("GOBLIN_TEST_WAIT", "0")),
            lease=int(os.environ.get("GOBLIN_TEST_LEASE", "30")),
            at_most_once=os.environ.get("GOBLIN_TEST_AT_MOST_ONCE") == "1",
            expose_holder=os.environ.get("GOBLIN_TEST_EXPOSE_HOLDER") == "1",
            server_errors=answers.SERVER_ERRORS,
        )
    ]
)
application.router.add_get("/health", health)
application.router.add_post("/orders/sync", order_sync)
application.router.add_post("/webhook", webhook)
for method in ("POST", "PUT"):
    application.router.add_route(method, "/answer", answer)
    application.router.add_route(method, "/answer/ignored", answer_ignored)
