"""One client setting for a Django project: the middleware, a webhook's ``@idempotent`` and ``problem_response``.

The project is ``tests/http/django_project.py`` (``GOBLIN_CLAIM_CLIENT`` a dotted factory
that records the process calling it, the middleware without a client of its own, a
webhook keyed by its event's id through ``@idempotent(goblin_claim.django.client)``),
on the session's redis-server. Django's test clients run it in a child process (its
settings are configured once per process); gunicorn serves it with two sync workers
under ``--preload``, as a service deploys it, for what only a fork shows.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import IN_CI, unique
from tests.http.test_django_paths import case
from tests.support import servers
from tests.support.asgi_server import ROOT, serve_gunicorn

for _needed in ("django", "gunicorn"):
    if IN_CI:  # with CI set, a missing framework fails the tests instead of skipping them
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

DOCS = "https://docs.example/problems"


@pytest.fixture(scope="module")
def found(redis_standalone: servers.RedisProcess) -> dict[str, Any]:
    """Every case's findings, from one child process running the project through Django's test clients."""
    env = {
        "GOBLIN_TEST_REDIS_PORT": str(redis_standalone.port),
        "GOBLIN_TEST_NAMESPACE": unique("django-project"),
        "GOBLIN_TEST_UNREACHABLE": str(servers.free_port()),
    }
    result = subprocess.run(
        [sys.executable, "-m", "tests.http.django_project"], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    findings: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return findings


def code(seen: dict[str, Any]) -> str:
    """The problem's code: its type's anchor."""
    kind: str = seen["problem"]["type"]
    return kind.removeprefix(DOCS + "#")


# --------------------------------------------------------------------------- one client


def test_the_middleware_and_a_webhooks_decorator_take_one_client_made_once(found: dict[str, Any]) -> None:
    """No client in the settings dict: the door, the webhook's @idempotent and the view's own use share one."""
    got = case(found, "door_and_helper")
    first, again = got["order"]
    assert (first["status"], again["status"], again["idempotent-replayed"]) == (201, 201, "true")
    assert got["made_here"] == [got["pid"]]  # the factory called once in this process, by whichever came first


def test_a_webhook_keyed_by_its_events_id_runs_once_and_refuses_a_changed_event(found: dict[str, Any]) -> None:
    """Three deliveries of one event: one run, three equal answers; the same id with another payload is 422."""
    got = case(found, "door_and_helper")
    bodies = [(answer["status"], answer["body"]) for answer in got["webhook"]]
    assert bodies == [bodies[0]] * 3
    assert bodies[0][0] == 200
    assert json.loads(bodies[0][1])["run"] == 1
    reused = got["webhook_reused"]
    assert (reused["status"], code(reused)) == (422, "key-reused")


def test_problem_response_answers_an_event_in_flight_as_the_door_answers_a_request_in_flight(
    found: dict[str, Any],
) -> None:
    """A key held elsewhere: the webhook's 409 and the door's are one answer, Retry-After and body alike."""
    got = case(found, "door_and_helper")
    door, helper = got["door_in_flight"], got["webhook_in_flight"]
    assert (door["status"], door["retry-after"], door["content-type"]) == (409, "1", "application/problem+json")
    assert (code(door), door["problem"]["detail"].startswith("a request with this idempotency key is still")) == (
        "in-flight",
        True,
    )
    assert helper == door


def test_problem_response_answers_an_unreachable_store_as_the_door_does(found: dict[str, Any]) -> None:
    """Nothing listening where the client points: the webhook's 503 and the door's are one answer."""
    got = case(found, "door_and_helper")
    door, helper = got["door_down"], got["webhook_down"]
    assert (door["status"], door["retry-after"], code(door)) == (503, "1", "store-unavailable")
    assert helper == door


def test_problem_response_for_each_error_is_the_doors_answer(found: dict[str, Any]) -> None:
    """Each error's status, problem code and Retry-After, as the doors answer them; the holder stays hidden."""
    got = case(found, "each_error")
    expected = {
        "in_flight": (409, "in-flight", "1"),
        "interrupted": (409, "interrupted", None),
        "mismatch": (422, "key-reused", None),
        "claim_lost": (503, "claim-lost", "1"),
        "result_lost": (500, "result-lost", None),
        "unreadable": (500, "result-unreadable", None),
        "connection": (503, "store-unavailable", "1"),
        "unavailable": (503, "store-unavailable", "1"),
        "not_replicated": (503, "store-unavailable", "1"),
    }
    for name, (status, kind, retry) in expected.items():
        answer = got[name]
        assert (answer["status"], code(answer), answer.get("retry-after")) == (status, kind, retry), name
        assert answer["content-type"] == "application/problem+json", name
        assert "holder" not in answer["problem"], name  # expose_holder is off in the settings
    interrupted = got["interrupted"]["problem"]
    assert (interrupted["title"], interrupted["claimed_at"]) == ("Interrupted request", "2026-12-04T09:30:00.123+00:00")
    assert got["in_flight"]["problem"]["detail"] == (
        "a request with this idempotency key is still being processed; retry after it finishes"
    )


def test_the_callers_own_errors_are_raised_not_answered(found: dict[str, Any]) -> None:
    """A bad argument is the view's bug: raised again as it is; anything but a goblin-claim error is refused."""
    got = case(found, "each_error")
    assert got["bad_argument"] == {"raised": "InvalidArgumentError", "message": "lease must be positive"}
    assert got["not_ours"] == {
        "raised": "InvalidArgumentTypeError",
        "message": "problem_response() answers a GoblinClaimError, not ValueError",
    }


def test_problem_docs_come_from_the_settings_or_the_call(found: dict[str, Any]) -> None:
    """Without problem_docs in the settings the type is about:blank; problem_docs= links a call's own."""
    got = case(found, "each_error")
    assert (got["undocumented"]["problem"]["type"], got["undocumented"]["problem"]["title"]) == (
        "about:blank",
        "Conflict",
    )
    assert got["own_docs"]["problem"]["type"] == "https://api.example/errors#in-flight"


# --------------------------------------------------------------------------- the setting's forms


def test_a_url_setting_takes_its_querys_timeouts_or_two_seconds(found: dict[str, Any]) -> None:
    """A URL's clients: socket_timeout from its query (3), else 2 s, the connect timeout 2 s; then the factory's."""
    got = case(found, "settings")
    assert got["url_query"] == [3.0, 2.0]
    assert got["url_default"] == [2.0, 2.0]
    assert got["back"] == [5, 5]  # override_settings ended: the factory's client, made anew


def test_under_asgi_the_middleware_takes_the_projects_asyncio_client(found: dict[str, Any]) -> None:
    """AsyncClient with a URL setting: the middleware replays through redis.asyncio, one client per loop."""
    first, again, same, module = case(found, "settings")["asgi"]
    assert (first["status"], again["status"], again["idempotent-replayed"]) == (201, 201, "true")
    assert (same, module) == (True, "redis.asyncio.client")


def test_without_any_client_setting_the_check_and_the_door_say_what_to_set(found: dict[str, Any]) -> None:
    """Neither GOBLIN_CLAIM_CLIENT nor a 'client': client() and the middleware are refused, and E002 says so."""
    got = case(found, "settings")
    assert got["unset"] == (
        "settings.GOBLIN_CLAIM_CLIENT is not set: give a redis:// or valkey:// URL, a client or a dotted path"
    )
    needs = "GOBLIN_CLAIM_IDEMPOTENCY needs a 'client', or settings.GOBLIN_CLAIM_CLIENT"
    assert got["middleware_unset"].startswith(needs)
    ((check, message, hint),) = got["check_unset"]
    assert (check, message.startswith(needs)) == ("goblin_claim.E002", True)
    assert hint == (
        "Fix settings.GOBLIN_CLAIM_IDEMPOTENCY (or GOBLIN_CLAIM_CLIENT): "
        "the middleware refuses to start with this error."
    )
    assert got["missing_factory"].startswith(
        "GOBLIN_CLAIM_CLIENT: cannot import 'tests.http.django_project.no_such_factory'"
    )


def test_a_factory_of_sync_clients_asked_for_an_asyncio_one_says_which_asked(found: dict[str, Any]) -> None:
    """async_client() over a factory of sync clients: ImproperlyConfigured, naming the setting and who asked."""
    told = case(found, "settings")["wrong_kind"]
    assert told.startswith("GOBLIN_CLAIM_CLIENT for async_client() needs an asyncio client (redis.asyncio.Redis, ")
    assert told.endswith(
        "not redis.client.Redis; async_client() serves the middleware under ASGI and the functions given it"
    )


def test_the_client_setting_alone_serves_the_middleware_with_its_defaults(found: dict[str, Any]) -> None:
    """No GOBLIN_CLAIM_IDEMPOTENCY at all: the middleware runs on its defaults through the project's client."""
    assert case(found, "settings")["no_dict"]["status"] == 201


# --------------------------------------------------------------------------- under gunicorn


@dataclass
class Served:
    """The project under gunicorn: its URL, namespace, log file and a client for the counters."""

    url: str
    namespace: str
    log: Path
    redis: redis.Redis

    def post(self, path: str, body: bytes, key: str | None = None) -> httpx.Response:
        """POST ``body`` as JSON (with an Idempotency-Key when given)."""
        headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
        return httpx.post(f"{self.url}{path}", content=body, headers=headers, timeout=30)

    def made(self) -> list[int]:
        """The processes that called the project's client factory, in order."""
        return [int(pid) for pid in self.redis.lrange(f"{self.namespace}-made", 0, -1)]

    def runs(self, name: str) -> int:
        """How many runs of ``name`` began."""
        return int(self.redis.get(f"{self.namespace}-runs:{name}") or 0)


@pytest.fixture(scope="module")
def served(redis_standalone: servers.RedisProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The project under gunicorn: two sync workers, --preload (its master uses the client before forking)."""
    namespace = unique("django-gunicorn")
    log = tmp_path_factory.mktemp("django-project") / "goblin.log"
    env = {
        "GOBLIN_TEST_REDIS_PORT": str(redis_standalone.port),
        "GOBLIN_TEST_NAMESPACE": namespace,
        "GOBLIN_TEST_UNREACHABLE": str(servers.free_port()),
        "GOBLIN_TEST_DELAY": "1.0",
        "GOBLIN_TEST_LOG": str(log),
        "GUNICORN_CMD_ARGS": "--preload",
    }
    client = redis_standalone.client()
    try:
        with serve_gunicorn("tests.http.django_project_wsgi:application", env=env, worker="sync", workers=2) as url:
            yield Served(url, namespace, log, client)
    finally:
        client.close()


def test_each_gunicorn_worker_makes_its_own_client_after_the_fork(served: Served) -> None:
    """The master made one before forking; each worker that serves makes its own, once, for door and webhook."""
    pids = set()
    for index in range(4):
        pids.add(served.post("/orders", b"{}", key=f"k-fork-{index}").json()["pid"])
        pids.add(served.post("/events", json.dumps({"id": f"evt-fork-{index}"}).encode()).json()["pid"])
    master, *workers = served.made()
    assert master not in pids  # made at import, in the master: never the workers'
    assert sorted(workers) == sorted(pids)  # once per worker that served, door and decorator alike


def test_a_duplicate_event_while_the_first_runs_gets_the_doors_409_then_its_answer(served: Served) -> None:
    """The first delivery runs (1 s); a duplicate then gets 409 in-flight with Retry-After; later ones its answer."""
    body = json.dumps({"id": f"evt-{uuid.uuid4().hex}"}).encode()
    before = served.runs("event")
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(served.post("/events", body)))
    worker.start()
    deadline = time.monotonic() + 10
    while served.runs("event") == before and time.monotonic() < deadline:
        time.sleep(0.01)  # until the first delivery's run has begun
    duplicate = served.post("/events", body)
    worker.join(30)
    later = served.post("/events", body)
    assert (duplicate.status_code, duplicate.headers["retry-after"]) == (409, "1")
    assert duplicate.headers["content-type"] == "application/problem+json"
    assert duplicate.json()["type"] == f"{DOCS}#in-flight"
    assert (first[0].status_code, later.status_code, later.json()) == (200, 200, first[0].json())
    assert served.runs("event") - before == 1


def test_under_gunicorn_the_django_door_logs_on_goblin_claim_django(served: Served) -> None:
    """A claim lost while the view ran: 503, the warning on goblin_claim.django; no line on the WSGI or ASGI logger."""
    answer = served.post("/lapsing", b"{}", key=f"k-{uuid.uuid4().hex}")
    assert (answer.status_code, answer.json()["type"]) == (503, f"{DOCS}#claim-lost")
    lines = served.log.read_text().splitlines()
    assert any(
        line.startswith("goblin_claim.django WARNING key ") and "the claim was lost while the app ran" in line
        for line in lines
    )
    assert any(line.startswith("goblin_claim.django DEBUG request ") for line in lines)  # its request events
    assert not [line for line in lines if line.startswith(("goblin_claim.wsgi ", "goblin_claim.asgi "))]
