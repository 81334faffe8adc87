"""``at_most_once=True`` on every HTTP door, over real HTTP: a worker SIGKILLed mid-request is never run again.

Each door serves its test service (``tests/support/apps``) as users deploy it: the
bare WSGI app, Flask and Django under gunicorn (one gthread worker, so a duplicate
is answered while the first request runs), the aiohttp app under gunicorn's aiohttp
worker, the bare ASGI app and Django under uvicorn, each with ``at_most_once``,
``expose_holder`` and a 2 s lease. The view records its process and works 30 s;
the test kills that process with SIGKILL (under uvicorn the server itself, then
serves the app again). A duplicate while the first
runs is answered 409 in flight, with ``Retry-After`` and the holder; once the dead
worker's lease ends, 409 interrupted, without ``Retry-After``, naming the same
holder and when it claimed; the view ran once and never finished.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI, unique
from tests.support import servers
from tests.support.asgi_server import serve_gunicorn, serve_process

for _needed in ("django", "flask", "gunicorn", "uvicorn", "aiohttp"):
    if IN_CI:
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

BODY = b'{"items": ["tea"]}'
# door: (server, target)
DOORS = {
    "asgi": ("uvicorn", "tests.support.apps.asgi_app:application"),
    "wsgi": ("gunicorn", "tests.support.apps.flask_app:create_wsgi()"),
    "flask": ("gunicorn", "tests.support.apps.flask_app:create_app()"),
    "django-wsgi": ("gunicorn", "tests.support.apps.django_app.door_wsgi:application"),
    "django-asgi": ("uvicorn", "tests.support.apps.django_app.door_asgi:application"),
    "aiohttp": ("gunicorn-aiohttp", "tests.support.apps.aiohttp_app:application"),
}


@contextlib.contextmanager
def serve(door: str, env: dict[str, str]) -> Iterator[str]:
    """Serve ``door`` under its server; yield the base URL."""
    server, target = DOORS[door]
    if server == "gunicorn":
        with serve_gunicorn(target, env=env, worker="gthread", workers=1, threads=8) as url:
            yield url
    elif server == "gunicorn-aiohttp":  # one asyncio worker serves the duplicate while the first runs
        with serve_gunicorn(target, env=env, worker="aiohttp.GunicornWebWorker", workers=1) as url:
            yield url
    else:
        with serve_process(target, env=env, lifespan="off") as url:
            yield url


def post(url: str, key: str, timeout: float = 10) -> httpx.Response:
    """POST the order with the key, as the user ``alice``."""
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, "X-User": "alice"}
    return httpx.post(f"{url}/orders/sync", content=BODY, headers=headers, timeout=timeout)


def interrupted(url: str, key: str) -> httpx.Response:
    """Retry as a client does until the answer is no longer "in flight" (a 409 with Retry-After)."""
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.TransportError):
            response = post(url, key)
            if response.status_code != 409 or "retry-after" not in response.headers:
                return response
        assert time.monotonic() < deadline, "the key never read as interrupted"
        time.sleep(0.2)


@pytest.mark.parametrize("door", list(DOORS))
def test_a_worker_killed_mid_request_is_never_run_again(door: str, redis_standalone: servers.RedisProcess) -> None:
    """SIGKILL mid-view, at most once: 409 in flight (holder named) while it runs, then 409 interrupted; one run."""
    namespace = unique(f"amo-{door}")
    counters = redis_standalone.client()
    env = {
        "GOBLIN_TEST_REDIS_PORT": str(redis_standalone.port),
        "GOBLIN_TEST_NAMESPACE": namespace,
        "DJANGO_SETTINGS_MODULE": "tests.support.apps.django_app.door_settings",
        "GOBLIN_TEST_DELAY": "30",
        "GOBLIN_TEST_LEASE": "2",
        "GOBLIN_TEST_AT_MOST_ONCE": "1",
        "GOBLIN_TEST_EXPOSE_HOLDER": "1",
    }
    key = uuid.uuid4().hex
    pids = f"{namespace}:runs:sync:pids"
    first: list[Any] = []
    try:
        with serve(door, env) as url:
            sender = threading.Thread(target=lambda: first.append(_quietly(url, key)), daemon=True)
            sent_at = datetime.datetime.now(datetime.timezone.utc)
            sender.start()
            deadline = time.monotonic() + 30
            while not counters.llen(pids):
                assert time.monotonic() < deadline, "the view never began"
                time.sleep(0.05)
            duplicate = post(url, key)
            assert duplicate.status_code == 409, duplicate.text
            assert duplicate.headers["retry-after"] == "1"
            holder = duplicate.json()["holder"]
            assert holder
            assert "." not in holder  # the token, without the request's fingerprint
            os.kill(int(counters.lindex(pids, 0)), signal.SIGKILL)  # type: ignore[arg-type]
            if DOORS[door][0].startswith("gunicorn"):  # the arbiter starts a new worker
                answers = [interrupted(url, key), post(url, key)]
        if DOORS[door][0] == "uvicorn":  # the server died with its only process: serve the app again
            with serve(door, env) as url:
                answers = [interrupted(url, key), post(url, key)]
        sender.join(10)
        assert first == [None]  # the first request's connection died with its worker
        for answer in answers:
            assert answer.status_code == 409, answer.text
            assert answer.headers["content-type"] == "application/problem+json"
            assert "retry-after" not in answer.headers  # retrying will not help
            problem = answer.json()
            assert problem["type"] == "about:blank"
            assert "ended without a response" in problem["detail"]
            assert problem["holder"] == holder
            claimed = datetime.datetime.fromisoformat(problem["claimed_at"])
            assert abs(claimed - sent_at) < datetime.timedelta(seconds=10)
        runs = (
            int(counters.get(f"{namespace}:runs:sync") or 0),
            int(counters.get(f"{namespace}:runs:sync:finished") or 0),
        )
        assert runs == (1, 0)  # began once, never finished, never run again
    finally:
        counters.close()


def _quietly(url: str, key: str) -> httpx.Response | None:
    """The first request: ``None`` when its connection dies with the worker (as it should)."""
    try:
        return post(url, key, timeout=60)
    except httpx.TransportError:
        return None
