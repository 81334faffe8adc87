"""Apps streaming an unstored response for longer than two leases, behind each door (lease=1), for real servers.

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix (runs counted under ``<namespace>:runs``). ``POST /stream`` answers
NDJSON for ``STREAM_SECONDS`` (past two one-second leases), a line every 0.1 s.
The Django door's settings, views and URLs are ``tests.http.lease_django``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
import redis.asyncio

from goblin_claim.asgi import IdempotencyMiddleware as AsgiMiddleware
from goblin_claim.asgi import Receive, Scope, Send

LEASE = 1
STREAM_SECONDS = 3.5
PORT = int(os.environ.get("GOBLIN_TEST_REDIS_PORT", "6379"))
NAMESPACE = os.environ.get("GOBLIN_TEST_NAMESPACE", "lease-apps")
_counters = redis.Redis(host="127.0.0.1", port=PORT)


def count_run() -> int:
    """Count a run of the streaming endpoint."""
    return int(_counters.incr(f"{NAMESPACE}:runs:stream"))


def lines(run: int) -> Iterator[bytes]:
    """The stream: a line every 0.1 s for ``STREAM_SECONDS``."""
    for _ in range(int(STREAM_SECONDS / 0.1)):
        yield f'{{"run": {run}}}\n'.encode()
        time.sleep(0.1)


def _sync_client() -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5)


def create_wsgi() -> Any:
    """A bare WSGI app behind the WSGI middleware."""
    from goblin_claim.wsgi import IdempotencyMiddleware

    def bare(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/stream":
            environ["wsgi.input"].read()
            run = count_run()
            start_response("200 OK", [("Content-Type", "application/x-ndjson")])
            return lines(run)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    return IdempotencyMiddleware(bare, client=_sync_client, namespace=NAMESPACE, lease=LEASE)


def create_flask() -> Any:
    """A Flask app behind the Flask door."""
    from flask import Flask, Response

    from goblin_claim.flask import Idempotency

    app = Flask(__name__)
    Idempotency(app, client=_sync_client, namespace=NAMESPACE, lease=LEASE)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/stream")
    def stream() -> Response:
        return Response(lines(count_run()), mimetype="application/x-ndjson")

    return app


async def _bare_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["method"] == "POST" and scope["path"] == "/stream":
        while (await receive()).get("more_body", False):
            pass
        run = await asyncio.to_thread(count_run)
        ndjson = [(b"content-type", b"application/x-ndjson")]
        await send({"type": "http.response.start", "status": 200, "headers": ndjson})
        for _ in range(int(STREAM_SECONDS / 0.1)):
            await send({"type": "http.response.body", "body": f'{{"run": {run}}}\n'.encode(), "more_body": True})
            await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _async_client() -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=PORT, socket_timeout=5)


def create_asgi() -> Any:
    """A bare ASGI app behind the ASGI middleware (a uvicorn factory)."""
    return AsgiMiddleware(_bare_asgi, client=_async_client, namespace=NAMESPACE, lease=LEASE)
