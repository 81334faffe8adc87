"""A Django project on one client setting: the middleware, a webhook's ``@idempotent`` and ``problem_response``.

``DJANGO_SETTINGS_MODULE=tests.http.django_project``: settings, views and URLs in one
module; ``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix, ``GOBLIN_TEST_DELAY`` how long the webhook's work takes. ``GOBLIN_CLAIM_CLIENT``
is a dotted factory that records, in Redis, the process that called it: the middleware
has no client of its own, and the webhook's ``@idempotent`` takes
``goblin_claim.django.client``. Served by gunicorn through
``tests.http.django_project_wsgi``; ``python -m tests.http.django_project`` runs the
cases below through Django's test clients and prints what each saw, as one JSON object.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from pydantic import BaseModel

SECRET_KEY = "goblin-claim tests only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.http.django_project"
INSTALLED_APPS = ["goblin_claim.django.GoblinClaimConfig"]
MIDDLEWARE = ["goblin_claim.django.IdempotencyMiddleware"]
DATABASES: dict[str, Any] = {}
USE_TZ = True
LOGGING_CONFIG = None
PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
NS = os.environ["GOBLIN_TEST_NAMESPACE"]
DOCS = "https://docs.example/problems"
DELAY = float(os.environ.get("GOBLIN_TEST_DELAY", "0"))
GOBLIN_CLAIM_CLIENT = "tests.http.django_project.make_client"
GOBLIN_CLAIM_IDEMPOTENCY = {"namespace": NS, "problem_docs": DOCS}
MADE = f"{NS}-made"  # the processes that called make_client, in order
RUNS = f"{NS}-runs"


def make_client() -> redis.Redis:
    """The project's client factory: each call is recorded with its process id."""
    made = redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5, socket_connect_timeout=5)
    made.rpush(MADE, os.getpid())
    return made


def unreachable_client() -> redis.Redis:
    """A client of a port nobody listens on (GOBLIN_TEST_UNREACHABLE)."""
    port = int(os.environ["GOBLIN_TEST_UNREACHABLE"])
    return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, retry=None)


_counters: list[redis.Redis] = []


def counters() -> redis.Redis:
    """A client of the tests' own, for counting runs (never the project's)."""
    if not _counters:
        _counters.append(redis.Redis(host="127.0.0.1", port=PORT))
    return _counters[0]


class Receipt(BaseModel):
    """What recording an event returns (and a duplicate gets back)."""

    event_id: str
    run: int
    pid: int


def _record(event_id: str, payload: dict[str, Any]) -> Receipt:
    run = counters().incr(f"{RUNS}:event")
    time.sleep(DELAY)
    counters().incr(f"{RUNS}:event:finished")
    return Receipt(event_id=event_id, run=run, pid=os.getpid())


# --------------------------------------------------------------------------- views


def health(request: HttpRequest) -> HttpResponse:
    """Answer GET: the server is up."""
    return HttpResponse("ok")


def order(request: HttpRequest) -> JsonResponse:
    """A view the middleware claims (a keyed POST), through the project's client."""
    run = counters().incr(f"{RUNS}:order")
    return JsonResponse({"order": run, "pid": os.getpid()}, status=201)


async def order_async(request: HttpRequest) -> JsonResponse:
    """The async twin of ``order`` (under ASGI the middleware takes the project's asyncio client)."""
    run = await asyncio.to_thread(counters().incr, f"{RUNS}:order_async")
    return JsonResponse({"order": run}, status=201)


def _webhook(record: Callable[[str, dict[str, Any]], Receipt]) -> Callable[[HttpRequest], HttpResponse]:
    from goblin_claim import GoblinClaimError
    from goblin_claim.django import problem_response

    def webhook(request: HttpRequest) -> HttpResponse:
        """A webhook: no Idempotency-Key, the event's id is the key; goblin-claim's errors answered as the door does."""
        event = json.loads(request.body)
        try:
            receipt = record(event["id"], event)
        except GoblinClaimError as exc:
            return problem_response(exc)
        return JsonResponse(receipt.model_dump())

    return webhook


def problem(request: HttpRequest) -> HttpResponse:
    """``problem_response`` for the error the query string names."""
    from goblin_claim.django import problem_response

    return problem_response(ERRORS[request.GET["error"]]())


def _errors() -> dict[str, Callable[[], Any]]:
    from goblin_claim import (
        ClaimLostError,
        ConnectionFailedError,
        InterruptedWorkError,
        InvalidArgumentError,
        NotReplicatedError,
        PayloadMismatchError,
        ResultLostError,
        ServerUnavailableError,
        StillInFlightError,
        UnreadableResultError,
    )

    began = datetime.datetime(2026, 12, 4, 9, 30, 0, 123000, tzinfo=datetime.timezone.utc)
    return {
        "in_flight": lambda: StillInFlightError("in flight", key="k", retry_after=12.5, holder="tok-1"),
        "interrupted": lambda: InterruptedWorkError("gone", key="k", holder="tok-2", claimed_at=began),
        "mismatch": lambda: PayloadMismatchError("other arguments", key="k"),
        "claim_lost": lambda: ClaimLostError("lost", key="k", result={"id": 1}),
        "result_lost": lambda: ResultLostError("gone", key="k"),
        "unreadable": lambda: UnreadableResultError("not ours", key="k"),
        "connection": lambda: ConnectionFailedError("refused", key="k"),
        "unavailable": lambda: ServerUnavailableError("READONLY", key="k"),
        "not_replicated": lambda: NotReplicatedError("0 of 1", key="k", acknowledged=0, replicas=1),
        "bad_argument": lambda: InvalidArgumentError("lease must be positive", key="k"),
        "not_ours": lambda: ValueError("a plain error"),
    }


def _lapsing(request: HttpRequest) -> HttpResponse:
    """A view whose claim is gone before it answers: the door logs the lost claim."""
    for name in counters().scan_iter(f"{NS}-lapsing:*"):
        counters().delete(name)
    return HttpResponse(b"made", status=201)


def _views() -> list[Any]:
    import goblin_claim.django
    from goblin_claim import idempotent
    from goblin_claim.django import idempotent_view

    record = idempotent(goblin_claim.django.client, key=lambda event_id, payload: event_id, wait=0, namespace=NS)(
        _record
    )
    record_down = idempotent(unreachable_client, key=lambda event_id, payload: event_id, wait=0, namespace=NS)(_record)
    lapsing = idempotent_view(namespace=f"{NS}-lapsing")(_lapsing)
    return [
        path("health", health), path("orders", order), path("orders-async", order_async),
        path("events", _webhook(record)), path("events-down", _webhook(record_down)), path("problem", problem),
        path("lapsing", lapsing),
    ]  # fmt: skip


ERRORS: dict[str, Callable[[], Any]] = {}
if os.environ.get("DJANGO_SETTINGS_MODULE") == __name__:
    ERRORS = _errors()
    urlpatterns = _views()


# --------------------------------------------------------------------------- what a client saw


def seen(response: Any) -> dict[str, Any]:
    """Status, the headers the tests read, the body, and a problem's members."""
    headers = {name.lower(): value for name, value in response.items()}
    got: dict[str, Any] = {"status": response.status_code, "body": response.content.decode()}
    for name in ("content-type", "retry-after", "idempotent-replayed"):
        if name in headers:
            got[name] = headers[name]
    if headers.get("content-type") == "application/problem+json":
        got["problem"] = json.loads(response.content)
    return got


KEY = {"Idempotency-Key": "k-1"}


def case_door_and_helper() -> dict[str, Any]:
    """The door's answers beside problem_response's for the same situation; the webhook's own answers."""
    from django.test import Client, override_settings

    from goblin_claim import Claim
    from goblin_claim._http import claim_name
    from goblin_claim.django import client

    http = Client()
    found: dict[str, Any] = {"order": [seen(http.post("/orders", b"{}", "application/json", headers=KEY))]}
    found["order"].append(seen(http.post("/orders", b"{}", "application/json", headers=KEY)))
    # A request holding the key (as a first one still running): the door's 409, then the helper's.
    held = Claim(client(), claim_name("POST", "/orders", None, "k-held"), namespace=NS)
    held.acquire()
    held_key = {"Idempotency-Key": "k-held"}
    found["door_in_flight"] = seen(http.post("/orders", b"{}", "application/json", headers=held_key))
    Claim(client(), "evt-held", namespace=NS).acquire()  # the webhook's event, in flight elsewhere
    found["webhook_in_flight"] = seen(http.post("/events", b'{"id": "evt-held"}', "application/json"))
    found["webhook"] = [seen(http.post("/events", b'{"id": "evt-1", "n": 1}', "application/json")) for _ in range(3)]
    found["webhook_reused"] = seen(http.post("/events", b'{"id": "evt-1", "n": 2}', "application/json"))
    found["webhook_down"] = seen(http.post("/events-down", b'{"id": "evt-2"}', "application/json"))
    setting = {**GOBLIN_CLAIM_IDEMPOTENCY, "client": "tests.http.django_project.unreachable_client"}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
        found["door_down"] = seen(Client().post("/orders", b"{}", "application/json", headers=KEY))
    found["made_here"] = [int(pid) for pid in counters().lrange(MADE, 0, -1)]
    found["pid"] = os.getpid()
    return found


def case_each_error() -> dict[str, Any]:
    """problem_response for each error; the caller's own raised; no problem_docs in the settings, about:blank."""
    from django.test import Client, override_settings

    from goblin_claim.django import problem_response

    http = Client(raise_request_exception=True)
    found: dict[str, Any] = {}
    for name in ERRORS:
        try:
            found[name] = seen(http.get("/problem", {"error": name}))
        except Exception as exc:  # the caller's own: raised again
            found[name] = {"raised": type(exc).__name__, "message": str(exc)}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={"namespace": NS}):
        found["undocumented"] = seen(http.get("/problem", {"error": "in_flight"}))
    found["own_docs"] = seen(problem_response(ERRORS["in_flight"](), problem_docs="https://api.example/errors"))
    return found


def case_settings() -> dict[str, Any]:
    """The setting's forms: a URL (timeouts from its query, else the default), ASGI, missing; the system check."""
    from django.core.exceptions import ImproperlyConfigured
    from django.test import AsyncClient, Client, override_settings

    from goblin_claim.django import async_client, check_middleware_order, client

    found: dict[str, Any] = {}
    url = f"redis://127.0.0.1:{PORT}/0"
    with override_settings(GOBLIN_CLAIM_CLIENT=url + "?socket_timeout=3"):
        kwargs = client().connection_pool.connection_kwargs
        found["url_query"] = [kwargs["socket_timeout"], kwargs["socket_connect_timeout"]]

        async def twice() -> list[Any]:
            http = AsyncClient()
            answers = [seen(await http.post("/orders-async", b"{}", "application/json", headers=KEY)) for _ in "ab"]
            return [*answers, async_client() is async_client(), type(async_client()).__module__]

        found["asgi"] = asyncio.run(twice())
    with override_settings(GOBLIN_CLAIM_CLIENT=url):
        kwargs = client().connection_pool.connection_kwargs
        found["url_default"] = [kwargs["socket_timeout"], kwargs["socket_connect_timeout"]]
    kwargs = client().connection_pool.connection_kwargs  # the factory's client again, once the override ended
    found["back"] = [kwargs["socket_timeout"], kwargs["socket_connect_timeout"]]
    with override_settings(GOBLIN_CLAIM_CLIENT=None):
        try:
            client()
            found["unset"] = "made"
        except ImproperlyConfigured as exc:
            found["unset"] = str(exc)
        with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={"namespace": NS}):
            found["check_unset"] = [[m.id, m.msg, m.hint] for m in check_middleware_order()]
            try:
                Client().post("/orders", b"{}", "application/json", headers=KEY)
                found["middleware_unset"] = "served"
            except ImproperlyConfigured as exc:
                found["middleware_unset"] = str(exc)
    with override_settings(GOBLIN_CLAIM_CLIENT="tests.http.django_project.no_such_factory"):
        try:
            client()
        except ImproperlyConfigured as exc:
            found["missing_factory"] = str(exc)

    async def wrong_kind() -> str:
        try:
            async_client()  # the factory makes a sync client
        except ImproperlyConfigured as exc:
            return str(exc)
        return "made"

    found["wrong_kind"] = asyncio.run(wrong_kind())
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=None):
        found["no_dict"] = seen(Client().post("/orders", b"{}", "application/json", headers={"Idempotency-Key": "k-2"}))
    return found


def main() -> None:
    """Run every case; print one JSON object of their findings (or their errors)."""
    import django

    django.setup()
    cases: dict[str, Callable[[], Any]] = {
        "door_and_helper": case_door_and_helper,
        "each_error": case_each_error,
        "settings": case_settings,
    }
    found: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            found[name] = case()
        except BaseException:  # reported to the test, which fails naming it
            found[name] = {"error": traceback.format_exc()}
    print(json.dumps(found))


if __name__ == "__main__":
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.http.django_project"
    from tests.http import django_project  # the settings module's copy, with its views

    django_project.main()
