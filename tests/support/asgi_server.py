"""A real uvicorn serving an ASGI app, from a thread or as its own process, on a loopback port the kernel picks.

The listening socket is bound here (port 0) and handed to uvicorn, so no other
process can take the port between choosing and binding it. ``serve`` stops the
server on exit (a graceful shutdown, lifespan included) and joins its thread;
``serve_process`` runs ``python -m uvicorn`` the way a user deploys an app, and
``serve_gunicorn`` runs ``python -m gunicorn`` (a WSGI app); both stop that
process (by its PID) on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests.support.servers import HOST, stop_by_pid


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


ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last):"
ASKED_FAILURE = "tests.support.apps.answers.Failed: asked to fail"  # the end of /answer?raise=1's traceback


@contextlib.contextmanager
def serve_client(app: Any, *, timeout: float = 30.0) -> Iterator[httpx.Client]:
    """Serve ``app`` as ``serve`` does; yield an HTTP client for it (its base URL the server's)."""
    with serve(app) as url, httpx.Client(base_url=url, timeout=timeout) as http:
        yield http


@contextlib.contextmanager
def serve_process(
    target: str, *, env: Mapping[str, str], factory: bool = False, lifespan: str = "on", start_timeout: float = 30.0
) -> Iterator[str]:
    """Run ``python -m uvicorn target`` (h11, asyncio) in its own process; yield its base URL.

    Ready once ``GET /health`` answers 200. On exit the process gets SIGTERM (a
    graceful shutdown), then SIGKILL if it lingers; its stderr is shown on failure.
    """
    with _listening() as sock:
        command = [
            sys.executable, "-m", "uvicorn", target, "--fd", str(sock.fileno()), "--http", "h11", "--loop", "asyncio",
            "--lifespan", lifespan, "--log-level", "warning", "--no-access-log", "--timeout-graceful-shutdown", "5",
        ]  # fmt: skip
        if factory:
            command.append("--factory")
        with _serving(command, sock, env, start_timeout) as (url, output):
            yield url
    if _unexpected_traceback(output[0]):
        raise RuntimeError(f"uvicorn {target} logged an error:\n{output[0]}")


@contextlib.contextmanager
def serve_gunicorn(
    target: str, *, env: Mapping[str, str], worker: str = "sync", workers: int = 1, threads: int = 1,
    timeout: int = 30, start_timeout: float = 30.0,
) -> Iterator[str]:  # fmt: skip
    """Run ``python -m gunicorn target`` (a WSGI app) in its own process; yield its base URL.

    The socket is bound here and passed as ``fd://``; ready once ``GET /health``
    answers 200. On exit the arbiter gets SIGTERM (by its PID), then SIGKILL.
    """
    with _listening() as sock:
        command = [
            sys.executable, "-m", "gunicorn", target, "--bind", f"fd://{sock.fileno()}", "--worker-class", worker,
            "--workers", str(workers), "--threads", str(threads), "--timeout", str(timeout), "--graceful-timeout", "5",
            "--log-level", "warning",
        ]  # fmt: skip
        with _serving(command, sock, env, start_timeout) as (url, output):
            yield url
    if _unexpected_traceback(output[0]) and "SystemExit" not in output[0]:
        raise RuntimeError(f"gunicorn {target} logged an error:\n{output[0]}")


def _unexpected_traceback(output: str) -> bool:
    """Whether the server logged a traceback other than the one a test asked for (``/answer?raise=1``)."""
    return any(ASKED_FAILURE not in logged for logged in output.split(TRACEBACK)[1:])


@contextlib.contextmanager
def _listening() -> Iterator[socket.socket]:
    """A listening loopback socket on a port the kernel picks, closed on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))
        sock.listen(128)
        yield sock
    finally:
        sock.close()


@contextlib.contextmanager
def _serving(
    command: list[str], sock: socket.socket, env: Mapping[str, str], start_timeout: float
) -> Iterator[tuple[str, list[str]]]:
    """Run ``command`` (a server taking ``sock``); yield its URL and a list that holds its output once it stopped.

    On exit the process gets SIGTERM (by its PID), then SIGKILL if it lingers.
    """
    output: list[str] = [""]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env}, pass_fds=(sock.fileno(),), stdout=log, stderr=log
        )
        try:
            yield _ready(process, f"http://{HOST}:{sock.getsockname()[1]}", log, start_timeout), output
        finally:
            stop_by_pid(process, grace=15)
            output[0] = _read(log)


def _ready(process: subprocess.Popen[bytes], url: str, log: Any, timeout: float) -> str:
    """``url`` once ``GET /health`` answers 200 there."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url
        time.sleep(0.05)
    raise RuntimeError(f"the server did not start:\n{_read(log)}")


def _read(log: Any) -> str:
    log.seek(0)
    return str(log.read().decode("utf-8", "replace"))
