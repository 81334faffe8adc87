"""Every door warns when a duplicate is answered 500 (its stored value unreadable): Django sync and asyncio, Flask.

The ASGI and WSGI doors are tested beside their other unit tests
(``test_asgi_unit.py``, ``test_wsgi_unit.py``). Django runs in a child process
(its settings are configured once per process), on fakeredis, through Django's
test clients: ``Client`` takes the sync path, ``AsyncClient`` the asyncio one.
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
import textwrap
from typing import Any

import fakeredis
import pytest

from goblin_claim._events import key_digest
from goblin_claim._http import claim_name
from tests.conftest import IN_CI
from tests.support.asgi_server import ROOT

WARNED = "a duplicate was answered 500"
NS = "warn-door"


def _framework(name: str) -> Any:
    # With CI set, a missing framework fails the test instead of skipping it.
    return importlib.import_module(name) if IN_CI else pytest.importorskip(name)


def spoil(client: Any, namespace: str) -> None:
    """Replace the one done record under ``namespace`` by one whose value is no envelope (another writer's)."""
    (name,) = client.keys(f"{namespace}:*")
    _, token, _ = client.get(name).split(b" ", 2)
    client.set(name, b"done " + token + b" not an envelope")


def test_the_flask_door_warns_of_a_duplicate_answered_500(caplog: pytest.LogCaptureFixture) -> None:
    """Flask's door, like the WSGI one, warns on its own logger when a duplicate gets the 500 of an unreadable value."""
    flask = _framework("flask")
    from goblin_claim.flask import Idempotency

    client = fakeredis.FakeRedis()
    app = flask.Flask(__name__)
    runs: list[int] = []

    @app.post("/charges")
    def charge() -> tuple[str, int]:
        runs.append(1)
        return "charged", 201

    Idempotency(app, client=client, namespace=NS)
    http = app.test_client()
    headers = {"Idempotency-Key": "k-1", "Content-Type": "application/json"}
    assert http.post("/charges", data=b"{}", headers=headers).status_code == 201
    spoil(client, NS)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        assert http.post("/charges", data=b"{}", headers=headers).status_code == 500
    (warned,) = [r.getMessage() for r in caplog.records if r.name == "goblin_claim.flask" and WARNED in r.getMessage()]
    # The key named by the one digest every log uses: 16 hex digits of the claim's key.
    assert warned.startswith(f"key {key_digest(claim_name('POST', '/charges', None, 'k-1'))}: ")
    assert len(runs) == 1


DJANGO = textwrap.dedent(
    """
    import asyncio, json, logging, sys

    import django
    import fakeredis
    from django.conf import settings
    from django.http import HttpResponse
    from django.urls import path

    server = fakeredis.FakeServer()
    sync_client = fakeredis.FakeRedis(server=server)
    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, MIDDLEWARE=[], SECRET_KEY="x" * 50,
        GOBLIN_CLAIM_IDEMPOTENCY={"client": sync_client, "namespace": sys.argv[1]},
    )
    django.setup()
    from django.test import AsyncClient, Client

    from goblin_claim.django import idempotent_view

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append([record.name, record.getMessage()])
    logging.getLogger("goblin_claim").addHandler(handler)
    logging.getLogger("goblin_claim").setLevel(logging.WARNING)
    runs = []

    @idempotent_view()
    def sync_view(request):
        runs.append("sync")
        return HttpResponse(b"charged", status=201)

    @idempotent_view(client=lambda: fakeredis.FakeAsyncRedis(server=server))
    async def async_view(request):
        runs.append("async")
        return HttpResponse(b"charged", status=201)

    @idempotent_view(client=lambda: fakeredis.FakeAsyncRedis(server=server))
    def wrong_kind(request):
        runs.append("wrong")
        return HttpResponse(b"charged", status=201)

    urlpatterns = [path("sync", sync_view), path("async", async_view), path("wrong", wrong_kind)]

    def spoil():
        for name in sync_client.keys(sys.argv[1] + ":*"):
            value = sync_client.get(name)
            if value.startswith(b"done ") and b"goblin" in value:
                sync_client.set(name, b"done " + value.split(b" ", 2)[1] + b" not an envelope")

    headers = {"headers": {"Idempotency-Key": "k-1"}}
    statuses = [Client().post("/sync", b"{}", "application/json", **headers).status_code]
    spoil()
    statuses.append(Client().post("/sync", b"{}", "application/json", **headers).status_code)

    async def twice():
        first = await AsyncClient().post("/async", b"{}", "application/json", **headers)
        spoil()
        second = await AsyncClient().post("/async", b"{}", "application/json", **headers)
        return [first.status_code, second.status_code]

    statuses += asyncio.run(twice())
    try:
        Client().post("/wrong", b"{}", "application/json", **headers)
        refused = None
    except Exception as exc:
        refused = [type(exc).__name__, str(exc)]
    print(json.dumps({"statuses": statuses, "records": records, "runs": runs, "refused": refused}))
    """
)


def test_the_django_door_warns_of_a_duplicate_answered_500_on_both_paths() -> None:
    """Django, under WSGI and ASGI, logs what the other doors log, on its own logger; a wrong-kind client is refused."""
    _framework("django")
    result = subprocess.run(
        [sys.executable, "-c", DJANGO, NS], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["statuses"] == [201, 500, 201, 500]
    assert seen["runs"] == ["sync", "async"]  # and the view given an asyncio client under WSGI never ran
    kind, message = seen["refused"]
    assert kind == "ImproperlyConfigured"  # Django's configuration error, as before
    assert message.startswith("GOBLIN_CLAIM_IDEMPOTENCY['client'] under WSGI needs a sync client (redis.Redis, ")
    assert "(or a redis:// or valkey:// URL, which serves both), not fakeredis." in message
    assert message.endswith(
        "; Django runs this middleware under WSGI here: give a client of that kind, or a URL for both"
    )
    warned = [(name, message) for name, message in seen["records"] if WARNED in message]
    assert [name for name, _ in warned] == ["goblin_claim.django"] * 2, seen["records"]
    for (_, message), path in zip(warned, ("/sync", "/async"), strict=True):
        assert message.startswith(f"key {key_digest(claim_name('POST', path, None, 'k-1'))}: ")
