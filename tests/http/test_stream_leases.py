"""A streamed response that is not kept holds its claim until it ends: every door, past two leases, real servers.

Each door serves ``tests/http/lease_apps.py`` or ``tests/http/lease_django.py``
with ``lease=1`` and a stream of 3.5 s. A duplicate sent once two leases have
passed must find the claim still held (409, in flight), not a lapsed key it
runs again; once the stream ended, a duplicate is told it ran (422) and the
endpoint ran exactly once.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import IN_CI, unique
from tests.http.lease_apps import LEASE, STREAM_SECONDS
from tests.support import servers
from tests.support.asgi_server import serve_gunicorn, serve_process

for _needed in ("django", "flask", "gunicorn", "uvicorn"):
    if IN_CI:
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

BODY = b'{"items": ["tea"]}'
# door: (server, target, path)
DOORS = {
    "asgi": ("uvicorn", "tests.http.lease_apps:create_asgi", "/stream"),
    "wsgi": ("gunicorn", "tests.http.lease_apps:create_wsgi()", "/stream"),
    "flask": ("gunicorn", "tests.http.lease_apps:create_flask()", "/stream"),
    "django-wsgi": ("gunicorn", "tests.http.lease_django:wsgi_application()", "/stream-sync"),
    "django-asgi": ("uvicorn", "tests.http.lease_django:asgi_application", "/stream"),
    "django-asgi-sync-stream": ("uvicorn", "tests.http.lease_django:asgi_application", "/stream-sync"),
}


@contextlib.contextmanager
def serve(door: str, env: dict[str, str]) -> Iterator[str]:
    """Serve ``door`` under its server; yield the base URL."""
    server, target, _path = DOORS[door]
    if server == "gunicorn":
        with serve_gunicorn(target, env=env, worker="gthread", workers=1, threads=8) as url:
            yield url
    else:
        with serve_process(target, env=env, factory=True, lifespan="off") as url:
            yield url


@pytest.mark.parametrize("door", list(DOORS))
def test_an_unstored_stream_past_two_leases_keeps_its_claim_and_runs_once(
    door: str, redis_standalone: servers.RedisProcess
) -> None:
    """While a 3.5 s stream runs under lease=1, a duplicate gets 409; after it, 422; the view ran once."""
    namespace = unique(f"lease-{door}")
    env = {
        "GOBLIN_TEST_REDIS_PORT": str(redis_standalone.port),
        "GOBLIN_TEST_NAMESPACE": namespace,
        "DJANGO_SETTINGS_MODULE": "tests.http.lease_django",
    }
    counters = redis_standalone.client()
    path = DOORS[door][2]
    key = uuid.uuid4().hex
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}
    try:
        with serve(door, env) as url:
            received: list[str] = []
            first: dict[str, object] = {}

            def stream() -> None:
                with httpx.stream("POST", url + path, content=BODY, headers=headers, timeout=30) as response:
                    first["status"] = response.status_code
                    first["stored"] = response.headers.get("idempotent-stored")
                    received.extend(response.iter_lines())
                first["ended"] = time.monotonic()

            began = time.monotonic()
            streaming = threading.Thread(target=stream)
            streaming.start()
            time.sleep(2 * LEASE + 0.6)  # two leases and more: a lease not renewed has lapsed by now
            assert streaming.is_alive(), "the stream ended before two leases passed"
            during = httpx.post(url + path, content=BODY, headers=headers, timeout=30)
            streaming.join(timeout=30)
            after = httpx.post(url + path, content=BODY, headers=headers, timeout=30)
    finally:
        runs = int(counters.get(f"{namespace}:runs:stream") or 0)
        counters.close()
    assert first["status"] == 200
    assert first["stored"] == "false"
    assert float(first["ended"]) - began >= STREAM_SECONDS - 0.5  # type: ignore[arg-type]
    assert len(received) == int(STREAM_SECONDS / 0.1)
    assert during.status_code == 409, during.text  # in flight: the claim was still held, nothing ran again
    assert after.status_code == 422, after.text
    assert after.json()["type"].endswith("not-kept") or "not kept" in after.json()["detail"]
    assert runs == 1
