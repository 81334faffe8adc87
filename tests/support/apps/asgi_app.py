"""A bare ASGI app behind the ASGI middleware, for uvicorn: the service of tests/support/apps/flask_app, in ASGI.

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix (runs counted under ``<namespace>:runs``), ``GOBLIN_TEST_DELAY`` how long a view
works, ``GOBLIN_TEST_WAIT`` how long a duplicate waits; ``GOBLIN_TEST_AT_MOST_ONCE=1``
and ``GOBLIN_TEST_EXPOSE_HOLDER=1`` turn those options on, ``GOBLIN_TEST_LEASE`` sets the
lease. ``POST /orders/sync`` pushes its process id to ``<namespace>:runs:sync:pids``,
counts, works, counts its end and answers 201; ``GET /health`` answers 200.
"""

from __future__ import annotations

import asyncio
import json
import os

import redis.asyncio

from goblin_claim.asgi import IdempotencyMiddleware, Receive, Scope, Send
from tests.support.apps import answers

PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
NAMESPACE = os.environ["GOBLIN_TEST_NAMESPACE"]
COUNTERS = f"{NAMESPACE}:runs"
DELAY = float(os.environ.get("GOBLIN_TEST_DELAY", "1.5"))
answers.log_to_file()


async def _orders(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] in ("/answer", "/answer/ignored"):
        await _answer(scope, receive, send)
        return
    if scope["method"] == "POST" and scope["path"] == "/orders/sync":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        counters = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
        await counters.rpush(f"{COUNTERS}:sync:pids", os.getpid())
        run = await counters.incr(f"{COUNTERS}:sync")
        await asyncio.sleep(DELAY)
        await counters.incr(f"{COUNTERS}:sync:finished")
        await counters.aclose()
        answer = json.dumps({"order": f"ord_{run}", "items": json.loads(body)["items"]}).encode()
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})
        return
    found = scope["path"] == "/health"
    await send({"type": "http.response.start", "status": 200 if found else 404, "headers": []})
    await send({"type": "http.response.body", "body": b"ok" if found else b"not found"})


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    """``/answer`` (tests/support/apps/answers.py) in ASGI: a body in three messages when asked for a stream."""
    while (await receive()).get("more_body", False):
        pass
    asked = answers.asked(scope["query_string"].decode())
    counters = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    await counters.incr(answers.counter(NAMESPACE, asked.tag))
    await counters.aclose()
    asked.fail_if_asked()
    headers = [(name.lower().encode(), value.encode()) for name, value in asked.headers]
    await send({"type": "http.response.start", "status": asked.status, "headers": headers})
    pieces = list(asked.chunks()) if asked.stream else [asked.body]
    for index, piece in enumerate(pieces):
        await send({"type": "http.response.body", "body": piece, "more_body": index < len(pieces) - 1})


application = IdempotencyMiddleware(
    _orders,
    client=lambda: redis.asyncio.Redis(host="127.0.0.1", port=PORT, socket_timeout=5),
    namespace=NAMESPACE,
    routes={"/answer/ignored": "ignore"},
    wait=float(os.environ.get("GOBLIN_TEST_WAIT", "0")),
    lease=int(os.environ.get("GOBLIN_TEST_LEASE", "30")),
    at_most_once=os.environ.get("GOBLIN_TEST_AT_MOST_ONCE") == "1",
    expose_holder=os.environ.get("GOBLIN_TEST_EXPOSE_HOLDER") == "1",
    server_errors=answers.SERVER_ERRORS,
)
