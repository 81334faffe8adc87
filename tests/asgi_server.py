"""A real uvicorn serving an ASGI app from a thread, on a loopback port the kernel picks.

The listening socket is bound here (port 0) and handed to uvicorn, so no other
process can take the port between choosing and binding it. ``serve`` stops the
server on exit (a graceful shutdown, lifespan included) and joins its thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from tests.servers import HOST


@contextlib.contextmanager
def serve(app: Any, *, start_timeout: float = 10.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn (h11, asyncio) in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported to the test below, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=run, name=f"uvicorn :{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            if failures or not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start: {failures or 'timed out'}")
            time.sleep(0.01)
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    if thread.is_alive():
        raise RuntimeError("uvicorn did not stop within 30 s")
    if failures:
        raise RuntimeError(f"uvicorn failed: {failures[0]!r}") from failures[0]
