"""The WSGI, Django, Flask and aiohttp doors over real HTTP: gunicorn and uvicorn processes, a real Redis.

Each door serves the same small service (``tests/support/apps/flask_app``, ``tests/support/apps/django_app``)
the way users deploy it: the bare WSGI app behind ``goblin_claim.wsgi`` and the
Flask app behind ``goblin_claim.flask`` under gunicorn, the Django project behind
``goblin_claim.django`` under gunicorn and under uvicorn, the aiohttp app behind
``goblin_claim.aiohttp`` under gunicorn's aiohttp worker (``tests/support/apps/aiohttp_app.py``). The views count their
runs in Redis; the tests read the counters from their own process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import IN_CI, unique
from tests.support import servers
from tests.support.asgi_server import ROOT, serve_gunicorn, serve_process

for _needed in ("django", "flask", "gunicorn"):
    if IN_CI:  # with CI set, a missing server or framework fails the tests instead of skipping them
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

BODY = b'{"items": ["tea"]}'
# door: (server, target); gunicorn targets may call a factory
DOORS = {
    "wsgi": ("gunicorn", "tests.support.apps.flask_app:create_wsgi()"),
    "flask": ("gunicorn", "tests.support.apps.flask_app:create_app()"),
    "django-wsgi": ("gunicorn", "tests.support.apps.django_app.door_wsgi:application"),
    "django-asgi": ("uvicorn", "tests.support.apps.django_app.door_asgi:application"),
    "aiohttp": ("gunicorn-aiohttp", "tests.support.apps.aiohttp_app:application"),
}
FRAMEWORK_DOORS = ("flask", "django-wsgi", "django-asgi")  # with routing, auth and per-view options


@dataclass
class Service:
    """A served door: its URL, its namespace and a client for the run counters."""

    url: str
    namespace: str
    redis: redis.Redis

    def runs(self, view: str) -> int:
        """How many times ``view`` began."""
        return int(self.redis.get(f"{self.namespace}:runs:{view}") or 0)

    def finished(self, view: str) -> int:
        """How many runs of ``view`` reached their end."""
        return int(self.redis.get(f"{self.namespace}:runs:{view}:finished") or 0)

    def post(self, path: str, key: str | None, *, user: str | None = "alice", body: bytes = BODY) -> httpx.Response:
        """POST ``body`` with the key (and ``X-User``), as a client sends it."""
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        if user is not None:
            headers["X-User"] = user
        return httpx.post(f"{self.url}{path}", content=body, headers=headers, timeout=60)


def env_for(redis_server: servers.RedisProcess, namespace: str, **extra: str) -> dict[str, str]:
    """The services' environment."""
    return {
        "GOBLIN_TEST_REDIS_PORT": str(redis_server.port),
        "GOBLIN_TEST_NAMESPACE": namespace,
        "DJANGO_SETTINGS_MODULE": "tests.support.apps.django_app.door_settings",
        **extra,
    }


@contextlib.contextmanager
def serve(door: str, env: dict[str, str], doors: dict[str, tuple[str, str]] = DOORS, **gunicorn: Any) -> Iterator[str]:
    """Serve ``door`` (one of ``doors``) under its server; yield the base URL."""
    server, target = doors[door]
    if server == "gunicorn-aiohttp":  # an aiohttp app under gunicorn's aiohttp worker
        with serve_gunicorn(target, env=env, worker="aiohttp.GunicornWebWorker", **gunicorn) as url:
            yield url
    elif server == "gunicorn":
        options = {"worker": "gthread", "workers": 2, "threads": 32, **gunicorn}
        with serve_gunicorn(target, env=env, **options) as url:
            yield url
    else:
        with serve_process(target, env=env, lifespan="off") as url:
            yield url


@pytest.fixture(scope="module", params=list(DOORS))
def service(request: pytest.FixtureRequest, redis_standalone: servers.RedisProcess) -> Iterator[Service]:
    """One door served for the module's tests (duplicates wait up to 20 s for a first request)."""
    namespace = unique(f"door-{request.param}")
    client = redis_standalone.client()
    env = env_for(redis_standalone, namespace, GOBLIN_TEST_DELAY="1.0", GOBLIN_TEST_WAIT="20")
    try:
        with serve(request.param, env) as url:
            yield Service(url, namespace, client)
    finally:
        client.close()


def door_of(service: Service) -> str:
    """The door a service is (from its namespace)."""
    return next(door for door in DOORS if service.namespace.startswith(f"door-{door}-"))


# --------------------------------------------------------------------------- every door


def test_fifty_concurrent_copies_run_once_and_all_get_one_answer(service: Service) -> None:
    """50 concurrent requests with one key: the view runs once; every one gets its 201, 49 marked replayed."""
    key, before = uuid.uuid4().hex, service.runs("sync")
    responses: list[httpx.Response] = []
    gate = threading.Barrier(50)

    def send() -> None:
        gate.wait()
        responses.append(service.post("/orders/sync", key))

    threads = [threading.Thread(target=send) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert service.runs("sync") - before == 1  # exactly once
    assert [r.status_code for r in responses] == [201] * 50
    assert len({r.content for r in responses}) == 1  # byte-identical
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 49


def test_the_same_key_with_another_body_is_422_and_not_run(service: Service) -> None:
    """A reused key with a different body is answered 422 problem+json; the view does not run again."""
    key = uuid.uuid4().hex
    assert service.post("/orders/sync", key).status_code == 201
    before = service.runs("sync")
    other = service.post("/orders/sync", key, body=b'{"items": ["coffee"]}')
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert service.runs("sync") == before


def test_the_key_header_is_read_as_the_draft_defines_it(service: Service) -> None:
    """An sf-string key's parameters are ignored (the same key as the bare token); a malformed one is 400, unrun."""
    key, before = uuid.uuid4().hex, service.runs("sync")
    first = service.post("/orders/sync", f'"{key}";v=1')
    again = service.post("/orders/sync", key)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["idempotent-replayed"] == "true"
    malformed = service.post("/orders/sync", '"a"b"')
    assert malformed.status_code == 400
    assert malformed.headers["content-type"] == "application/problem+json"
    assert service.runs("sync") - before == 1


def test_a_replay_carries_the_headers_the_app_set(service: Service) -> None:
    """The replay has the app's own headers (a custom one included) and the server's fresh Date, not a stored one."""
    key = uuid.uuid4().hex
    first = service.post("/orders/sync", key)
    time.sleep(1.1)  # a second later: a stored Date would show
    again = service.post("/orders/sync", key)
    assert again.headers["content-type"] == first.headers["content-type"]
    if door_of(service) == "wsgi":  # the bare app sets X-Order
        assert again.headers["x-order"] == first.headers["x-order"] == "yes"
    assert again.headers.get_list("date") != first.headers.get_list("date")
    assert len(again.headers.get_list("date")) <= 1


def test_a_router_404_is_answered_and_nothing_is_kept(service: Service) -> None:
    """A POST with a key to a path no route matches gets its 404 each time, and leaves no key in Redis."""
    key = uuid.uuid4().hex
    for _ in range(2):
        assert service.post("/no/such/path", key).status_code == 404
    assert [k for k in service.redis.scan_iter(f"{service.namespace}:*") if b"/no/such/path" in k] == []


def test_no_owner_fails_closed_without_running_the_view(service: Service) -> None:
    """With a scope function, a request whose caller is unknown (no X-User) is 403 and the view never runs."""
    if door_of(service) not in (*FRAMEWORK_DOORS, "aiohttp"):
        pytest.skip("the bare WSGI service has no scope function")
    before = service.runs("sync")
    response = service.post("/orders/sync", uuid.uuid4().hex, user=None)
    assert response.status_code == 403
    assert "after authentication" in response.json()["detail"]
    assert service.runs("sync") == before


def test_a_view_with_its_own_options_uses_them(service: Service) -> None:
    """A per-view decorator's options rule that view: a key is required there (400), and it runs once per key."""
    if door_of(service) not in FRAMEWORK_DOORS:
        pytest.skip("this door's service has no per-view options")
    assert service.post("/orders/own", None).status_code == 400
    key, before = uuid.uuid4().hex, service.runs("own")
    first, second = service.post("/orders/own", key), service.post("/orders/own", key, user="bob")
    assert (first.status_code, second.status_code) == (201, 201)
    assert second.content == first.content  # no scope on this view: bob's copy is alice's key
    assert service.runs("own") - before == 1


def test_a_route_that_ignores_the_key_is_never_claimed(service: Service) -> None:
    """A webhook ruled 'ignore' (a mark on the view, routes= on the bare door) runs each time a key is sent."""
    key, before = uuid.uuid4().hex, service.runs("webhook")
    answers = [service.post("/webhook", key) for _ in range(2)]
    assert [r.status_code for r in answers] == [201, 201]
    assert not any("idempotent-replayed" in r.headers for r in answers)
    assert service.runs("webhook") - before == 2
    assert [k for k in service.redis.scan_iter(f"{service.namespace}:*") if key.encode() in k] == []


def test_a_failing_scope_is_explained_and_the_view_never_runs(service: Service) -> None:
    """A view's scope reading what no auth set (g.tenant_id, request.user) is 500 scope-failed with the door's fix."""
    if door_of(service) not in FRAMEWORK_DOORS:
        pytest.skip("this door's service has no per-view options")
    fix = {
        "flask": ("AttributeError (no attribute 'tenant_id')", "before Idempotency(app)"),
        "django-wsgi": ("AttributeError (no attribute 'user')", "after the authentication middleware in MIDDLEWARE"),
    }
    fix["django-asgi"] = fix["django-wsgi"]
    cause, where = fix[door_of(service)]
    key = uuid.uuid4().hex
    for _ in range(2):
        answer = service.post("/orders/misconfigured", key)
        assert answer.status_code == 500
        assert answer.headers["content-type"] == "application/problem+json"
        assert f"scope function raised {cause}" in answer.json()["detail"]
        assert where in answer.json()["detail"]
    assert service.runs("misconfigured") == 0
    assert [k for k in service.redis.scan_iter(f"{service.namespace}:*") if key.encode() in k] == []


def test_a_flask_stream_reaches_the_client_as_it_is_made_and_is_never_rerun(service: Service) -> None:
    """Flask's streamed NDJSON arrives line by line while the view works; a duplicate after it ended gets 422."""
    if door_of(service) != "flask":
        pytest.skip("the streamed route is the Flask service's")
    key, before = uuid.uuid4().hex, service.runs("stream")
    headers = {"Idempotency-Key": key, "Content-Type": "application/json", "X-User": "alice"}
    started = time.monotonic()
    with httpx.stream("POST", f"{service.url}/orders/stream", content=BODY, headers=headers, timeout=30) as response:
        lines = response.iter_lines()
        first = next(lines)
        first_after = time.monotonic() - started
        rest = list(lines)
    assert first.startswith("run ")
    assert first_after < 0.8  # the view works 1.0 s: the first line came long before its end
    assert len(rest) >= 5
    assert response.headers["idempotent-stored"] == "false"
    duplicate = service.post("/orders/stream", key)
    assert duplicate.status_code == 422
    assert "was not kept" in duplicate.json()["detail"]
    assert service.runs("stream") - before == 1


def test_a_retried_multipart_upload_is_replayed_not_refused(service: Service) -> None:
    """A retried upload (httpx draws a new multipart boundary per request) is replayed, not 422."""
    if door_of(service) != "flask":
        pytest.skip("the upload route is the Flask service's")
    key, before = uuid.uuid4().hex, service.runs("upload")
    headers = {"Idempotency-Key": key, "X-User": "alice"}
    files = {"file": ("orders.csv", b"tea,1\ncoffee,2\n", "text/csv")}
    first = httpx.post(f"{service.url}/uploads", files=files, data={"note": "x"}, headers=headers, timeout=30)
    again = httpx.post(f"{service.url}/uploads", files=files, data={"note": "x"}, headers=headers, timeout=30)
    assert (first.status_code, again.status_code) == (201, 201), again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    changed = {"file": ("orders.csv", b"tea,9\n", "text/csv")}
    other = httpx.post(f"{service.url}/uploads", files=changed, data={"note": "x"}, headers=headers, timeout=30)
    assert other.status_code == 422
    assert service.runs("upload") - before == 1


# --------------------------------------------------------------------------- stopped mid-request


@pytest.mark.parametrize("door", ["wsgi", "flask", "django-wsgi"])
def test_a_worker_killed_by_gunicorns_timeout_is_never_run_twice(
    door: str, redis_standalone: servers.RedisProcess
) -> None:
    """A gunicorn --timeout aborts a worker stuck mid-view: the retry gets 422 and the view ran once."""
    namespace = unique(f"door-{door}")
    service = Service("", namespace, redis_standalone.client())
    env = env_for(redis_standalone, namespace, GOBLIN_TEST_DELAY="8")
    key = uuid.uuid4().hex
    try:
        with serve(door, env, worker="sync", workers=1, threads=1, timeout=2) as url:
            service.url = url
            # The worker dies under the request: gunicorn answers 500 on its way out, or just closes.
            with contextlib.suppress(httpx.TransportError):
                assert service.post("/orders/sync", key).status_code == 500
            retried = _retry(service, key)
        assert retried.status_code == 422, retried.text
        assert "started running but ended without a whole response" in retried.json()["detail"]
        assert (service.runs("sync"), service.finished("sync")) == (1, 0)
    finally:
        service.redis.close()


@pytest.mark.parametrize("door", ["wsgi", "flask", "django-wsgi", "django-asgi"])
def test_a_client_gone_mid_view_then_retrying_runs_the_view_once(
    door: str, redis_standalone: servers.RedisProcess
) -> None:
    """A client leaves while the view runs, then retries: one run; WSGI stores the finished answer, ASGI 422."""
    namespace = unique(f"door-{door}")
    service = Service("", namespace, redis_standalone.client())
    env = env_for(redis_standalone, namespace, GOBLIN_TEST_DELAY="1.5")
    key = uuid.uuid4().hex
    try:
        with serve(door, env) as url:
            service.url = url
            with pytest.raises(httpx.TimeoutException):
                httpx.post(
                    f"{url}/orders/sync", content=BODY, timeout=0.5,
                    headers={"Idempotency-Key": key, "Content-Type": "application/json", "X-User": "alice"},
                )  # fmt: skip
            time.sleep(2.0)  # the first run has finished (a sync view is not stopped by a disconnect)
            retried = _retry(service, key)
        assert (service.runs("sync"), service.finished("sync")) == (1, 1)
        if door == "django-asgi":  # Django's ASGIHandler cancels the request: what it did is unknown
            assert retried.status_code == 422, retried.text
        else:  # a WSGI server lets the view finish; its answer was stored before it was sent
            assert retried.status_code == 201, retried.text
            assert retried.headers["idempotent-replayed"] == "true"
    finally:
        service.redis.close()


def _retry(service: Service, key: str) -> httpx.Response:
    """Retry as a retrying client does: again while the server is gone or the answer is 409."""
    deadline = time.monotonic() + 30
    while True:
        try:
            response = service.post("/orders/sync", key)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


# --------------------------------------------------------------------------- one Redis, two worlds


def test_a_wsgi_and_an_asgi_service_over_one_redis_replay_each_others_answers(
    redis_standalone: servers.RedisProcess,
) -> None:
    """Flask under gunicorn answers first, Django under uvicorn replays it; and the other way round: one run each."""
    namespace = unique("door-shared")
    service = Service("", namespace, redis_standalone.client())
    env = env_for(redis_standalone, namespace, GOBLIN_TEST_DELAY="0.1")
    try:
        with serve("flask", env) as wsgi_url, serve("django-asgi", env) as asgi_url:
            for first, then in ((wsgi_url, asgi_url), (asgi_url, wsgi_url)):
                key = uuid.uuid4().hex
                service.url = first
                original = service.post("/orders/sync", key)
                service.url = then
                replayed = service.post("/orders/sync", key)
                assert original.status_code == replayed.status_code == 201
                assert replayed.headers["idempotent-replayed"] == "true"
                assert replayed.content == original.content
        assert service.runs("sync") == 2  # one per key, across both services
    finally:
        service.redis.close()


# --------------------------------------------------------------------------- Django's system check


@pytest.mark.parametrize(("order", "found"), [("before", "goblin_claim.E001"), ("after", None)])
def test_the_django_check_says_when_the_middleware_runs_before_authentication(order: str, found: str | None) -> None:
    """manage.py check reports goblin_claim.E001 when the middleware is listed before AuthenticationMiddleware."""
    env = {**os.environ, "GOBLIN_TEST_ORDER": order, "GOBLIN_TEST_REDIS_PORT": "1", "GOBLIN_TEST_NAMESPACE": "check"}
    result = subprocess.run(
        [sys.executable, "-m", "django", "check", "--settings", "tests.support.apps.django_app.check_settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = result.stdout + result.stderr
    if found is None:
        assert result.returncode == 0, output
        assert "goblin_claim" not in output
    else:
        assert result.returncode != 0
        assert found in output
