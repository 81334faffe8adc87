"""``acquire_many`` observed: one event per key (with its fence or its error), one span for the batch.

On fakeredis (the scripts' path) and on an unreachable server, sync and asyncio, with
listeners and with OpenTelemetry's in-memory exporters.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from opentelemetry.trace import StatusCode

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ConnectionFailedError,
    InvalidArgumentError,
    NativeUnavailableError,
    WrongTypeError,
)
from goblin_claim._events import Event
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import unique
from tests.observability.conftest import Telemetry
from tests.support import servers


def _unreachable() -> redis.Redis:
    return redis.Redis(host=servers.HOST, port=servers.free_port(), socket_connect_timeout=1, retry=None)


def test_a_batch_reports_each_keys_outcome_fence_and_error(events: list[Event], otel: Telemetry) -> None:
    """Each key is one acquire_many event (a fence on a claim, the error of a key of the wrong type); one span."""
    client = fake_redis(native=False)
    ns = unique("batch")
    client.hset(f"{ns}:{{odd}}", "f", "v")
    outcomes = Claim.acquire_many(client, ["a", "odd", "b"], namespace=ns, fencing=True)
    assert isinstance(outcomes[0][1], Claimed)
    assert isinstance(outcomes[1][1], WrongTypeError)
    batch = [event for event in events if event.operation == "acquire_many"]
    assert [(e.key, e.outcome, e.namespace) for e in batch] == [
        ("a", "claimed", ns),
        ("odd", "error", ns),
        ("b", "claimed", ns),
    ]
    fences = [outcome.fence for _, outcome in outcomes if isinstance(outcome, Claimed)]
    assert all(isinstance(fence, int) for fence in fences)
    assert [e.fence for e in batch] == [fences[0], None, fences[1]]
    assert isinstance(batch[1].error, WrongTypeError)
    (span,) = otel.finished("goblin_claim.acquire_many")
    assert span.attributes is not None
    assert span.attributes["goblin_claim.batch_size"] == 3
    assert span.attributes["goblin_claim.operation"] == "acquire_many"
    assert span.status.status_code is StatusCode.UNSET
    points = otel.points("goblin_claim.operation.duration")
    assert sum(p.count for p in points if p.attributes["goblin_claim.operation"] == "acquire_many") == 3


def test_a_batch_that_cannot_reach_redis_reports_every_key_unavailable(events: list[Event], otel: Telemetry) -> None:
    """Redis unreachable: acquire_many raises; every key's event is "unavailable" and the span is an error."""
    client = _unreachable()
    with pytest.raises(ConnectionFailedError):
        Claim.acquire_many(client, ["a", "b"], namespace="batch")
    client.close()
    batch = [event for event in events if event.operation == "acquire_many"]
    assert [(e.key, e.outcome) for e in batch] == [("a", "unavailable"), ("b", "unavailable")]
    (span,) = otel.finished("goblin_claim.acquire_many")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "goblin_claim.ConnectionFailedError"


def test_a_batch_with_bad_options_reports_no_keys(events: list[Event], otel: Telemetry) -> None:
    """Options no handle takes: InvalidArgumentError, an error span, and no per-key event (there is no claim)."""
    with pytest.raises(InvalidArgumentError):
        Claim.acquire_many(fake_redis(native=False), ["a"], lease=0)
    assert [event for event in events if event.operation == "acquire_many"] == []
    (span,) = otel.finished("goblin_claim.acquire_many")
    assert span.status.status_code is StatusCode.ERROR


def test_an_async_batch_is_observed_as_the_sync_one(events: list[Event], otel: Telemetry) -> None:
    """AsyncClaim.acquire_many: the same per-key events and one span; failures too."""

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        await AsyncClaim.acquire_many(client, ["a", "b"], namespace="abatch")
        await client.aclose()
        gone = redis.asyncio.Redis(host=servers.HOST, port=servers.free_port(), socket_connect_timeout=1, retry=None)
        with pytest.raises(ConnectionFailedError):
            await AsyncClaim.acquire_many(gone, ["c"], namespace="abatch")
        await gone.aclose()

    asyncio.run(scenario())
    batch = [(e.key, e.outcome) for e in events if e.operation == "acquire_many"]
    assert batch == [("a", "claimed"), ("b", "claimed"), ("c", "unavailable")]
    spans = otel.finished("goblin_claim.acquire_many")
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.ERROR]


def test_native_always_on_a_server_without_it_reports_no_path(events: list[Event]) -> None:
    """``native="always"`` where the commands are missing: NativeUnavailableError, and the event's path is None."""
    with pytest.raises(NativeUnavailableError):
        Claim(fake_redis(native=False), unique("k"), native="always").acquire()
    (event,) = [e for e in events if e.operation == "acquire"]
    assert (event.outcome, event.path) == ("error", None)
    assert isinstance(event.error, NativeUnavailableError)
