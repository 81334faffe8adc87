"""The doors' at-most-once answers in process, over fakeredis: the options, the 409s' problem details, ASGI and WSGI.

An interrupted key (an at-most-once attempt whose lease ended without a response)
is answered 409 ``interrupted`` with no ``Retry-After`` and when the attempt claimed
it; the holder's token only with ``expose_holder``, in that answer and in the
in-flight 409. The real servers, with a worker SIGKILLed mid-request, are
``tests/http/test_at_most_once_doors.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import fakeredis
import pytest

from goblin_claim import AsyncClaim, Claim, Claimed, InvalidArgumentTypeError, _http
from goblin_claim.asgi import IdempotencyMiddleware as AsgiMiddleware
from goblin_claim.testing import fake_async_redis, fake_redis
from goblin_claim.wsgi import IdempotencyMiddleware as WsgiMiddleware
from tests.http import test_asgi_unit as asgi_unit
from tests.http import test_wsgi_unit as wsgi_unit

DOCS = "https://docs.example.com/idempotency"


def _interrupt(client: Any, namespace: str, token: str = "worker-7") -> datetime.datetime:
    """Leave the door's key for ``POST /orders`` with ``k-1`` as a killed at-most-once request leaves it."""
    before = datetime.datetime.now(datetime.timezone.utc)
    name = _http.claim_name("POST", "/orders", None, "k-1")
    assert isinstance(
        Claim(client, name, namespace=namespace, lease=1, at_most_once=True, token=token).acquire(), Claimed
    )
    time.sleep(1.1)
    return before


# --------------------------------------------------------------------------- the options and answers


@pytest.mark.parametrize("option", ["at_most_once", "expose_holder"])
def test_the_options_are_bools_and_off_by_default(option: str) -> None:
    """Both default to False on every door; anything but a bool is refused when the door is made."""
    assert getattr(_http.make_options(), option) is False
    assert getattr(_http.make_options(**{option: True}), option) is True
    with pytest.raises(InvalidArgumentTypeError, match=f"{option} must be True or False"):
        _http.make_options(**{option: "yes"})


def test_the_interrupted_answer_is_a_409_of_its_own_without_retry_after() -> None:
    """409, code interrupted, claimed_at always, holder only when exposed; documented: its own type and title."""
    hidden = _http.interrupted(_http.make_options(), "worker-7", "2026-12-04T03:05:37.000+00:00")
    assert hidden.status == 409
    assert hidden.code == "interrupted"
    assert all(name != b"retry-after" for name, _ in hidden.headers)
    body = json.loads(hidden.body)
    assert body == {
        "type": "about:blank", "title": "Conflict", "status": 409, "detail": _http.INTERRUPTED,
        "claimed_at": "2026-12-04T03:05:37.000+00:00",
    }  # fmt: skip
    shown = _http.interrupted(_http.make_options(expose_holder=True), "worker-7", "2026-12-04T03:05:37.000+00:00")
    documented = json.loads(_http.documented(shown, DOCS).body)
    assert documented["type"] == f"{DOCS}#interrupted"
    assert documented["title"] == "Interrupted request"
    assert documented["holder"] == "worker-7"
    assert documented["claimed_at"] == "2026-12-04T03:05:37.000+00:00"  # extension members survive documenting


def test_the_in_flight_409_names_the_holder_only_when_exposed() -> None:
    """The in-flight 409 keeps its Retry-After; with expose_holder its holder member is the token, fingerprint cut."""
    token = _http.claim_token("ab" * 16)
    quiet = _http.in_flight(_http.make_options(), token, "ab" * 16)
    assert quiet is not None
    assert "holder" not in json.loads(quiet.body)
    told = _http.in_flight(_http.make_options(expose_holder=True), token.encode(), "ab" * 16)
    assert told is not None
    assert (told.status, told.code) == (409, "in-flight")
    assert (b"retry-after", b"1") in told.headers
    assert json.loads(told.body)["holder"] == token.split(".")[0]
    waited = json.loads(_http.still_in_flight(_http.make_options(expose_holder=True, wait=2), "worker-1").body)
    assert waited["holder"] == "worker-1"
    documented = json.loads(_http.documented(told, DOCS).body)
    assert (documented["type"], documented["title"]) == (f"{DOCS}#in-flight", "Conflict")


# --------------------------------------------------------------------------- WSGI


@pytest.mark.parametrize("expose", [False, True])
def test_wsgi_answers_an_interrupted_key_409_and_never_runs_the_app(expose: bool) -> None:
    """Every request with an interrupted key gets 409 interrupted (any door claimed it); the app never runs."""
    client = fake_redis(False, server=fakeredis.FakeServer())
    app = wsgi_unit.App()
    middleware = WsgiMiddleware(app, client=client, namespace=wsgi_unit.NS, at_most_once=True, expose_holder=expose)
    before = _interrupt(client, wsgi_unit.NS)
    for _ in range(2):
        reply = wsgi_unit.call(middleware)
        assert reply.status == 409
        assert "retry-after" not in reply.headers
        body = json.loads(reply.body)
        assert ("holder" in body) is expose
        assert abs(datetime.datetime.fromisoformat(body["claimed_at"]) - before) < datetime.timedelta(seconds=2)
    assert app.runs == 0


def test_wsgi_at_most_once_still_gives_the_key_back_when_the_app_raises() -> None:
    """An exception from the app releases its at-most-once attempt (the key is not interrupted): the retry runs."""
    client = fake_redis(False, server=fakeredis.FakeServer())
    app = wsgi_unit.App(stop=RuntimeError("database down"))
    middleware = WsgiMiddleware(app, client=client, namespace=wsgi_unit.NS, at_most_once=True)
    with pytest.raises(RuntimeError):
        wsgi_unit.call(middleware)
    app.stop = None
    assert wsgi_unit.call(middleware).status == 201
    assert wsgi_unit.call(middleware).headers["idempotent-replayed"] == "true"
    assert app.runs == 2


# --------------------------------------------------------------------------- ASGI


def test_asgi_answers_in_flight_then_interrupted_naming_the_holder() -> None:
    """A duplicate of a running at-most-once request is 409 in flight; its holder stops renewing: 409 interrupted."""

    async def scenario() -> None:
        client = fake_async_redis(False, server=fakeredis.FakeServer())
        app = asgi_unit.App()
        middleware = AsgiMiddleware(
            app, client=client, namespace=asgi_unit.NS, at_most_once=True, expose_holder=True, problem_docs=DOCS
        )
        name = _http.claim_name("POST", "/orders", None, "k-1")
        holder = AsyncClaim(client, name, namespace=asgi_unit.NS, lease=1, at_most_once=True, token="pod-3")
        assert isinstance(await holder.acquire(), Claimed)
        running = await asgi_unit.call(middleware, asgi_unit.http_scope(), b"{}")
        assert running.status == 409
        assert running.header(b"retry-after") == b"1"
        assert json.loads(running.body)["holder"] == "pod-3"
        assert json.loads(running.body)["type"] == f"{DOCS}#in-flight"
        await asyncio.sleep(1.1)
        stopped = await asgi_unit.call(middleware, asgi_unit.http_scope(), b"{}")
        assert stopped.status == 409
        assert stopped.header(b"retry-after") is None
        body = json.loads(stopped.body)
        assert (body["type"], body["title"], body["holder"]) == (f"{DOCS}#interrupted", "Interrupted request", "pod-3")
        assert app.runs == 0
        await client.aclose()

    asyncio.run(scenario())
