"""``@idempotent(fail_open=True)``: the work runs when the server cannot be reached, and only then.

The server out of reach is a redis-server of the test's own that was stopped, a
port nobody listens on, or a server that answers but cannot take the claim (a
replica: ``READONLY``). Each fail-open run returns to the caller, stores nothing,
and is told three ways: a ``failed_open`` event, a WARNING on
``goblin_claim.idempotent`` and (tests/observability/test_otel.py) a counter.
Without the option the caller gets ``ConnectionFailedError`` and nothing runs. A
server that answers always decides, ``fail_open`` or not: a stored result or
error is replayed, a mismatch refused, work in flight waited for, a refusal
raised; a wait that loses the server after ``InFlight`` raises.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import goblin_claim
from goblin_claim import (
    Claim,
    ConnectionFailedError,
    PayloadMismatchError,
    ReplayedError,
    ServerError,
    ServerUnavailableError,
    StillInFlightError,
    WrongTypeError,
    idempotent,
)
from goblin_claim._events import Event, key_digest
from tests.conftest import Deco, Runner, unique, until
from tests.support import servers

BACKENDS = ("fake", "fake-native", "standalone")
OUT_OF_REACH = {"retry": None, "socket_connect_timeout": 0.5, "socket_timeout": 0.5}


@pytest.fixture
def calls() -> Iterator[list[Event]]:
    """The ``call`` events emitted while the test runs."""
    seen: list[Event] = []

    def listener(event: Event) -> None:
        if event.operation == "call":
            seen.append(event)

    goblin_claim.add_listener(listener)
    yield seen
    goblin_claim.remove_listener(listener)


class Flavour:
    """``@idempotent`` on a ``def`` or an ``async def``, its client at ``port``, called from sync code."""

    def __init__(self, kind: str, port: int, **client_options: Any) -> None:
        self.kind = kind
        self.run = Runner() if kind == "async" else None
        options = {"host": servers.HOST, "port": port, **OUT_OF_REACH, **client_options}
        self.client: Any = redis.asyncio.Redis(**options) if self.run else redis.Redis(**options)

    def __call__(self, body: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        """``body`` decorated for this flavour, callable from the test."""
        if self.run is None:
            return idempotent(self.client, **options)(body)

        async def as_async(order: str) -> str:
            result: str = body(order)
            return result

        decorated = idempotent(self.client, **options)(as_async)
        run = self.run
        return lambda *args: run(decorated(*args))

    def close(self) -> None:
        """Close the client (and the loop)."""
        if self.run is None:
            self.client.close()
            return
        self.run(self.client.aclose())
        self.run.close()


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Callable[..., Flavour]]:
    """Make a flavour on a port (with the client's options); each made is closed after the test."""
    made: list[Flavour] = []

    def make(port: int, **client_options: Any) -> Flavour:
        made.append(Flavour(request.param, port, **client_options))
        return made[-1]

    yield make
    for one in made:
        one.close()


def counted() -> tuple[Callable[[str], str], list[str]]:
    """A function that counts its runs, and the count."""
    runs: list[str] = []

    def charge(order: str) -> str:
        runs.append(order)
        return f"charged {order}"

    return charge, runs


# --------------------------------------------------------------------------- the server out of reach


def test_fail_open_runs_the_work_on_a_stopped_server_and_says_so(
    own_server: Callable[..., servers.RedisProcess],
    flavour: Callable[..., Flavour],
    calls: list[Event],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server stopped: each call runs the function and returns; nothing is stored; an event and a WARNING each."""
    server = own_server()
    decorate = flavour(server.port)
    charge, runs = counted()
    namespace = unique("ns")
    charged = decorate(charge, key="order", namespace=namespace, fail_open=True)
    assert charged("o-1") == "charged o-1"  # the server up: claimed and stored
    server.stop()
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        assert charged("o-1") == "charged o-1"  # its stored answer is out of reach: run again
        assert charged("o-2") == "charged o-2"
        assert charged("o-2") == "charged o-2"  # not stored: there was no claim to store it under
    assert runs == ["o-1", "o-1", "o-2", "o-2"]
    failed = [event for event in calls if event.outcome == "failed_open"]
    assert [(e.key, e.namespace) for e in failed] == [("o-1", namespace), ("o-2", namespace), ("o-2", namespace)]
    assert all(isinstance(e.error, ConnectionFailedError) for e in failed)
    lines = [r for r in caplog.records if r.name == "goblin_claim.idempotent" and r.levelno == logging.WARNING]
    assert len(lines) == 3
    assert all("fail_open runs the work without" in r.getMessage() for r in lines)
    assert [r.outcome for r in lines] == ["failed_open"] * 3  # type: ignore[attr-defined]
    assert lines[0].key_digest == key_digest("o-1")  # type: ignore[attr-defined]
    assert all("o-1" not in r.getMessage() for r in lines)  # the key as its digest only


def test_without_fail_open_an_unreachable_server_is_an_error_and_nothing_runs(
    flavour: Callable[..., Flavour], calls: list[Event]
) -> None:
    """The default: ConnectionFailedError, the function never runs, no failed_open event."""
    decorate = flavour(servers.free_port())  # nobody listens there
    charge, runs = counted()
    charged = decorate(charge, key="order", namespace=unique("ns"))
    for _ in range(2):
        with pytest.raises(ConnectionFailedError):
            charged("o-1")
    assert runs == []
    assert [event.outcome for event in calls] == ["unavailable", "unavailable"]


def test_a_port_nobody_listens_on_fails_open_unobserved(
    flavour: Callable[..., Flavour], caplog: pytest.LogCaptureFixture
) -> None:
    """No listener, no instrument(): the work runs, and the WARNING comes without any setup."""
    decorate = flavour(servers.free_port())
    charge, runs = counted()
    charged = decorate(charge, key="order", namespace=unique("ns"), fail_open=True)
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        assert charged("o-1") == "charged o-1"
    assert runs == ["o-1"]
    (line,) = [r for r in caplog.records if r.name == "goblin_claim.idempotent"]
    assert line.levelno == logging.WARNING
    assert line.error_type == "ConnectionFailedError"  # type: ignore[attr-defined]


def test_a_server_that_cannot_take_the_claim_fails_open_too(
    own_server: Callable[..., servers.RedisProcess], flavour: Callable[..., Flavour], calls: list[Event]
) -> None:
    """A replica answers READONLY (ServerUnavailableError): as a dropped connection, it runs with fail_open only."""
    server = own_server()
    server.client().replicaof(servers.HOST, servers.free_port())  # a replica of a primary that is gone
    decorate = flavour(server.port)
    charge, runs = counted()
    refused = decorate(charge, key="order", namespace=unique("ns"))
    with pytest.raises(ServerUnavailableError):
        refused("o-1")
    assert runs == []
    opened = decorate(charge, key="order", namespace=unique("ns"), fail_open=True)
    assert opened("o-1") == "charged o-1"
    assert runs == ["o-1"]
    assert isinstance(calls[-1].error, ServerUnavailableError)
    assert calls[-1].outcome == "failed_open"


def test_an_error_of_the_function_run_open_is_its_callers_and_the_event_stays_failed_open(
    flavour: Callable[..., Flavour], calls: list[Event]
) -> None:
    """The function raises while run open: its error reaches the caller; the event says failed_open, why it ran."""
    decorate = flavour(servers.free_port())

    def declined(order: str) -> str:
        raise LookupError("card declined")

    charged = decorate(declined, key="order", namespace=unique("ns"), fail_open=True, replay_errors=(LookupError,))
    with pytest.raises(LookupError, match="card declined"):
        charged("o-1")
    (event,) = calls
    assert event.outcome == "failed_open"
    assert isinstance(event.error, ConnectionFailedError)


# --------------------------------------------------------------------------- a server that answers decides


def test_a_reachable_servers_stored_answer_always_wins(deco: Deco) -> None:
    """fail_open=True: a completed key is replayed, a stored error raised, another payload refused; one run each."""
    charge, runs = counted()
    charged = deco(charge, key="order", fail_open=True)
    assert charged("o-1") == charged("o-1") == "charged o-1"
    assert runs == ["o-1"]

    def declined(order: str, amount: int) -> str:
        runs.append(order)
        raise LookupError("card declined")

    refusing = deco(declined, key="order", fail_open=True, replay_errors=(LookupError,), namespace=unique("ns"))
    with pytest.raises(LookupError):
        refusing("o-2", 5)
    with pytest.raises(ReplayedError):
        refusing("o-2", 5)
    with pytest.raises(PayloadMismatchError):
        refusing("o-2", 6)
    assert runs == ["o-1", "o-2"]


def test_in_flight_work_is_never_run_beside_with_fail_open(deco: Deco) -> None:
    """A key another caller holds: wait=0 is told StillInFlightError at once; the function does not run."""
    charge, runs = counted()
    charged = deco(charge, key="order", fail_open=True, wait=0)
    order = unique("order")
    assert isinstance(Claim(deco.raw, order, namespace=deco.namespace, lease=30).acquire(), goblin_claim.Claimed)
    with pytest.raises(StillInFlightError):
        charged(order)
    assert runs == []


def test_a_refusal_of_a_reachable_server_is_raised_with_fail_open(deco: Deco) -> None:
    """WRONGTYPE: the server answered, so fail_open changes nothing; nothing runs."""
    charge, runs = counted()
    charged = deco(charge, key="order", fail_open=True)
    order = unique("order")
    deco.raw.hset(Claim(deco.raw, order, namespace=deco.namespace).claim_key, "f", "v")
    with pytest.raises(WrongTypeError):
        charged(order)
    assert runs == []


def test_a_user_the_acl_refuses_is_refused_with_fail_open(
    redis_standalone: servers.RedisProcess, flavour: Callable[..., Flavour]
) -> None:
    """NOPERM (a user without the namespace's keys): the server answered; ServerError, nothing runs."""
    admin = redis_standalone.client()
    user = unique("user")
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["other:*"], commands=["+@all"])
    try:
        decorate = flavour(redis_standalone.port, username=user, password="pw")
        charge, runs = counted()
        charged = decorate(charge, key="order", namespace=unique("ns"), fail_open=True)
        with pytest.raises(ServerError, match="no permissions") as caught:
            charged("o-1")
        assert not isinstance(caught.value, ConnectionFailedError)
        assert runs == []
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_a_wait_that_loses_the_server_does_not_fail_open(
    own_server: Callable[..., servers.RedisProcess], flavour: Callable[..., Flavour]
) -> None:
    """InFlight, then the server stops while the duplicate waits: ConnectionFailedError at the deadline; no run."""
    server = own_server()
    decorate = flavour(server.port)
    charge, runs = counted()
    namespace, order = unique("ns"), unique("order")
    charged = decorate(charge, key="order", namespace=namespace, fail_open=True, wait=3)
    admin = server.client()
    holder = Claim(admin, order, namespace=namespace, lease=30)
    assert isinstance(holder.acquire(), goblin_claim.Claimed)
    raised: list[BaseException] = []

    def duplicate() -> None:
        try:
            charged(order)
        except BaseException as exc:  # what the waiting duplicate was told, for the test to read
            raised.append(exc)

    thread = threading.Thread(target=duplicate)
    thread.start()
    assert until(lambda: admin.pubsub_numsub(holder.claim_key)[0][1] >= 1, timeout=10), "the duplicate never waited"
    server.stop()
    thread.join(20)
    assert not thread.is_alive()
    assert len(raised) == 1
    assert isinstance(raised[0], ConnectionFailedError)
    assert runs == []


def test_fail_open_is_checked_at_decoration() -> None:
    """A fail_open that is not a bool is refused when decorating, before any I/O."""
    charge, _ = counted()
    for bad in (1, "yes", None):
        with pytest.raises(goblin_claim.InvalidArgumentTypeError, match="fail_open must be True or False"):
            idempotent(redis.Redis(port=servers.free_port()), key="order", namespace="ns", fail_open=bad)(charge)  # type: ignore[arg-type]


def test_fail_open_and_at_most_once_together_are_refused_before_any_io() -> None:
    """fail_open runs work unclaimed, at_most_once never twice: the decorator and every door refuse both at once."""
    from goblin_claim import asgi, wsgi

    charge, runs = counted()
    client = redis.Redis(port=servers.free_port())
    with pytest.raises(goblin_claim.InvalidArgumentError, match="fail_open and at_most_once contradict"):
        idempotent(client, key="order", namespace="ns", fail_open=True, at_most_once=True)(charge)
    for door in (asgi.IdempotencyMiddleware, wsgi.IdempotencyMiddleware):
        with pytest.raises(goblin_claim.InvalidArgumentError, match="fail_open and at_most_once contradict"):
            door(lambda *_: None, client=client, fail_open=True, at_most_once=True)  # type: ignore[arg-type]
    assert runs == []
    # Each alone is accepted.
    idempotent(client, key="order", namespace="ns", fail_open=True)(charge)
    idempotent(client, key="order", namespace="ns", at_most_once=True)(charge)


def test_fail_open_holds_for_async_callers_on_one_loop() -> None:
    """Two asyncio callers at once, the server out of reach: each runs (at-least-once), neither is stored."""
    runs: list[str] = []

    async def main() -> list[str]:
        client = redis.asyncio.Redis(host=servers.HOST, port=servers.free_port(), **OUT_OF_REACH)

        @idempotent(client, key="order", namespace=unique("ns"), fail_open=True)
        async def charge(order: str) -> str:
            runs.append(order)
            await asyncio.sleep(0.01)
            return f"charged {order}"

        try:
            return list(await asyncio.gather(charge("o-1"), charge("o-1")))
        finally:
            await client.aclose()

    assert asyncio.run(main()) == ["charged o-1", "charged o-1"]
    assert runs == ["o-1", "o-1"]
