"""@idempotent when the claim cannot be trusted or the function fails: what runs, what is stored, what is told.

A claim not acknowledged by replicas, a failure without keep-alive, a replayable
error whose claim was lost meanwhile; and the outcomes an observed asyncio call
reports (a waited duplicate, the function's own error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import goblin_claim
from goblin_claim import AsyncClaim, NotReplicatedError, ReplayedError, idempotent
from goblin_claim._events import Event
from goblin_claim.testing import fake_async_redis
from tests.conftest import Deco, unique

BACKENDS = ("fake", "fake-native", "standalone")


@pytest.mark.parametrize("backend", ["standalone"], indirect=True)
def test_a_claim_no_replica_acknowledged_is_given_back_and_the_function_never_runs(deco: Deco) -> None:
    """replicas=1 on a server without replicas: NotReplicatedError, nothing ran, the key is free again."""
    runs: list[str] = []

    def charge(order: str) -> str:
        runs.append(order)
        return "charged"

    charged = deco(charge, key="order", replicas=1, replica_timeout_ms=50, lease=30)
    order = unique("order")
    with pytest.raises(NotReplicatedError) as caught:
        charged(order)
    assert caught.value.key == order
    assert runs == []
    claim_key = goblin_claim.Claim(deco.raw, order, namespace=deco.namespace).claim_key
    assert deco.raw.get(claim_key) is None  # given back: a retry need not wait for the lease


def test_a_failure_without_keep_alive_gives_the_claim_back_and_a_retry_runs(deco: Deco) -> None:
    """keep_alive=False and the function raises: the claim is released at once and the retry runs it."""
    runs: list[int] = []

    def flaky(order: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("gateway timeout")
        return "charged"

    charged = deco(flaky, key="order", keep_alive=False, lease=30)
    order = unique("order")
    with pytest.raises(RuntimeError, match="gateway timeout"):
        charged(order)
    claim_key = goblin_claim.Claim(deco.raw, order, namespace=deco.namespace).claim_key
    assert deco.raw.get(claim_key) is None
    assert charged(order) == "charged"
    assert charged(order) == "charged"  # now replayed
    assert len(runs) == 2


def test_a_replayable_error_whose_claim_was_lost_is_raised_but_not_stored(deco: Deco) -> None:
    """The claim was forgotten while the function ran: its replayable error is raised, unstored; the next call runs."""
    runs: list[int] = []

    def declined(order: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            deco.raw.delete(goblin_claim.Claim(deco.raw, order, namespace=deco.namespace).claim_key)  # an operator
            raise ValueError("card declined")
        return "charged"

    charged = deco(declined, key="order", replay_errors=(ValueError,), lease=30)
    order = unique("order")
    with pytest.raises(ValueError, match="card declined"):
        charged(order)
    claim_key = goblin_claim.Claim(deco.raw, order, namespace=deco.namespace).claim_key
    assert deco.raw.get(claim_key) is None  # no outcome was written under a claim nobody held
    assert charged(order) == "charged"
    assert len(runs) == 2


# --------------------------------------------------------------------------- observed asyncio calls


@pytest.fixture
def call_events() -> Iterator[list[Event]]:
    """The ``call`` events emitted while the test runs."""
    seen: list[Event] = []

    def listener(event: Event) -> None:
        if event.operation == "call":
            seen.append(event)

    goblin_claim.add_listener(listener)
    yield seen
    goblin_claim.remove_listener(listener)


def test_an_observed_async_duplicate_that_waits_reports_waited_completed(call_events: list[Event]) -> None:
    """A duplicate arriving while the first call runs waits for it: claimed and waited_completed, one run."""
    runs: list[str] = []
    namespace = unique("ns")

    async def main() -> list[str]:
        client = fake_async_redis(native=False)
        started = asyncio.Event()

        @idempotent(client, key="order", namespace=namespace, wait=20, lease=30)
        async def slow(order: str) -> str:
            runs.append(order)
            started.set()
            await asyncio.sleep(0.5)
            return "ok"

        first = asyncio.ensure_future(slow("x"))
        await started.wait()
        duplicate = await slow("x")
        results = [await first, duplicate]
        await client.aclose()
        return results

    assert asyncio.run(main()) == ["ok", "ok"]
    assert runs == ["x"]
    assert sorted(e.outcome for e in call_events if e.key == "x") == ["claimed", "waited_completed"]


def test_an_observed_async_failure_reports_released_or_its_stored_error(call_events: list[Event]) -> None:
    """A plain error gives the claim back (released); a replayable one is the outcome (claimed), then replayed."""
    namespace = unique("ns")
    runs: list[str] = []

    async def main() -> bool:
        client = fake_async_redis(native=False)

        @idempotent(client, key="order", namespace=namespace, replay_errors=(ValueError,), lease=30)
        async def charge(order: str) -> str:
            runs.append(order)
            raise (ValueError if order == "declined" else RuntimeError)(order)

        with pytest.raises(ValueError, match="declined"):
            await charge("declined")
        with pytest.raises(RuntimeError, match="broken"):
            await charge("broken")
        with pytest.raises(ReplayedError, match="declined"):
            await charge("declined")  # the stored error, replayed without running
        held = await client.get(AsyncClaim(client, "broken", namespace=namespace).claim_key)
        await client.aclose()
        return held is None

    assert asyncio.run(main())
    assert runs == ["declined", "broken"]  # the declined card ran once, then was replayed
    outcomes = [(e.key, e.outcome) for e in call_events]
    assert outcomes[:2] == [("declined", "claimed"), ("broken", "released")]
    assert len(outcomes) == 3
    assert isinstance(call_events[1].error, RuntimeError)
