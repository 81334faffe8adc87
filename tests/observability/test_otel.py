"""OpenTelemetry: spans, metrics and context, read back through the SDK's in-memory exporters on real servers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
import redis
import redis.asyncio
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import goblin_claim.otel
from goblin_claim import AsyncClaim, Claim, Claimed, Completed, ConnectionFailedError, _events, idempotent
from tests.claim.test_wakeup import SlowPollingClaim
from tests.conftest import unique, until, until_async, wait_past_subscription
from tests.observability.conftest import Telemetry, start_telemetry
from tests.support.servers import HOST, RedisProcess, free_port


def _renewals_under_this_span(otel: Telemetry) -> int:
    """How many renewal spans have finished under the span current here (a decorated call's own).

    A test waits on these rather than sleeping a window: a loaded machine makes
    renewals late, and a call that ends before its first renewal has none.
    """
    here = trace.get_current_span().get_span_context().span_id
    return sum(1 for r in otel.finished("goblin_claim.renew") if r.parent is not None and r.parent.span_id == here)


@pytest.fixture
def client(redis_standalone: RedisProcess) -> Iterator[redis.Redis]:
    """A sync client on the session's standalone server."""
    made = redis_standalone.client()
    yield made
    made.close()


def test_operations_make_internal_spans_with_constant_names_and_no_keys(client: redis.Redis, otel: Telemetry) -> None:
    """Each operation is one INTERNAL span named goblin_claim.<operation>, without db.*, key or token attributes."""
    key = f"user-data-{unique()}"
    claim = Claim(client, key, token="tok-secret")
    claim.acquire()
    claim.complete(b"v")
    Claim(client, key).acquire()
    spans = otel.finished()
    assert [s.name for s in spans] == ["goblin_claim.acquire", "goblin_claim.complete", "goblin_claim.acquire"]
    assert [s.attributes["goblin_claim.outcome"] for s in spans] == ["claimed", "completed", "completed"]
    for span in spans:
        assert span.kind is SpanKind.INTERNAL
        attributes = dict(span.attributes or {})
        assert not any(name.startswith("db.") for name in attributes)
        assert key not in repr(attributes)
        assert "tok-secret" not in repr(attributes)
        assert attributes["goblin_claim.namespace"] == "goblin"
    # Redis 7: claims take its SET ... NX GET, the store the script (no SET IFEQ).
    assert [dict(s.attributes or {})["goblin_claim.path"] for s in spans] == ["command", "script", "command"]


def test_record_keys_adds_the_key_to_spans_only(client: redis.Redis) -> None:
    """instrument(record_keys=True) puts goblin_claim.key on spans, never on metric points."""
    telemetry, meter_provider = start_telemetry(record_keys=True)
    try:
        key = unique()
        Claim(client, key).acquire()
        (span,) = telemetry.finished()
        assert span.attributes is not None
        assert span.attributes["goblin_claim.key"] == key
        for point in telemetry.points("goblin_claim.operation.duration"):
            assert "goblin_claim.key" not in point.attributes
    finally:
        goblin_claim.otel.uninstrument()
        telemetry.tracer_provider.shutdown()
        meter_provider.shutdown()


def test_duration_histogram_by_operation_outcome_path_namespace_error(client: redis.Redis, otel: Telemetry) -> None:
    """The duration histogram counts each operation under its attributes, error.type included on failures."""
    key = unique()
    claim = Claim(client, key)
    claim.acquire()
    claim.complete(b"v")
    for _ in range(3):
        Claim(client, key).acquire()
    claim.release()
    with pytest.raises(goblin_claim.ClaimLostError):
        claim.extend()
    counts = {
        tuple(sorted(p.attributes.items())): p.count for p in otel.points("goblin_claim.operation.duration")
    }  # fmt: skip
    base = (("goblin_claim.namespace", "goblin"),)

    def attrs(operation: str, outcome: str, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        path = ("goblin_claim.path", "command" if operation == "acquire" else "script")  # SET ... NX GET on Redis 7
        items = (*base, path, ("goblin_claim.operation", operation), ("goblin_claim.outcome", outcome), *extra)
        return tuple(sorted(items))

    assert counts[attrs("acquire", "completed")] == 3
    assert counts[attrs("acquire", "claimed")] == 1
    assert counts[attrs("release", "not_held")] == 1
    assert counts[attrs("extend", "claim_lost", ("error.type", "goblin_claim.ClaimLostError"))] == 1
    (failed,) = otel.finished("goblin_claim.extend")
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert key not in (failed.status.description or "")  # the type only, never the message


def test_decorated_call_span_parents_its_operations_and_renewals(client: redis.Redis, otel: Telemetry) -> None:
    """A decorated call is one goblin_claim.call span; its renewals on the renewer thread are its children."""
    runs = []

    @idempotent(client, key="item", namespace=unique("ns"), lease=3)
    def slow(item: str) -> str:
        runs.append(item)
        assert until(lambda: _renewals_under_this_span(otel) >= 2, 30)  # one a second
        return item

    assert slow("a") == "a"
    assert slow("a") == "a"
    assert runs == ["a"]
    calls = otel.finished("goblin_claim.call")
    assert [c.attributes["goblin_claim.outcome"] for c in calls] == ["claimed", "completed"]  # type: ignore[index]
    renewals = otel.finished("goblin_claim.renew")
    assert len(renewals) >= 2
    first = calls[0]
    for renewal in renewals:
        assert renewal.parent is not None
        assert renewal.parent.span_id == first.context.span_id
        assert renewal.context.trace_id == first.context.trace_id
        assert renewal.kind is SpanKind.INTERNAL
    renewed = {p.attributes["goblin_claim.outcome"]: p.value for p in otel.points("goblin_claim.renewals")}
    assert renewed["claimed"] == len(renewals)


def test_renewals_of_two_calls_join_their_own_calls(client: redis.Redis, otel: Telemetry) -> None:
    """Two concurrent decorated calls: each renewal span has its own call's span as parent, never the other's."""

    @idempotent(client, key="item", namespace=unique("ns"), lease=3)
    def slow(item: str) -> str:
        assert until(lambda: _renewals_under_this_span(otel) >= 1, 30)
        return item

    threads = [threading.Thread(target=slow, args=(item,)) for item in ("p", "q")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls = {c.context.span_id: c for c in otel.finished("goblin_claim.call")}
    renewals = otel.finished("goblin_claim.renew")
    assert len(calls) == 2
    assert renewals
    by_parent: dict[int, int] = {}
    for renewal in renewals:
        assert renewal.parent is not None
        assert renewal.parent.span_id in calls
        by_parent[renewal.parent.span_id] = by_parent.get(renewal.parent.span_id, 0) + 1
    assert len(by_parent) == 2  # each call got its own renewals


def _pushed(otel: Telemetry) -> bool:
    """Whether a wait's span has a wake-up by push (not a poll)."""
    woken = [e for s in otel.finished("goblin_claim.wait") for e in s.events if e.name == "woken"]
    return any(e.attributes["goblin_claim.wake"] == "push" for e in woken)  # type: ignore[index]


def test_span_events_for_takeover_wakeup_reload_and_lost_lease(client: redis.Redis, otel: Telemetry) -> None:
    """Span events mark a takeover, a push wake-up, a script reload and a lost lease."""
    lapsed, woken = unique(), unique()
    Claim(client, lapsed, lease=1).acquire()
    assert isinstance(Claim(client, lapsed).wait(timeout=10), Claimed)

    # The waiter polls every 5 s, so only the announcement wakes it soon; should the store land
    # before its first look (its thread scheduled late), it never sleeps: up to three waits, one pushed.
    for attempt in range(3):
        key = f"{woken}-{attempt}"
        owner = Claim(client, key)
        owner.acquire()
        waiter = SlowPollingClaim(client, key)
        assert isinstance(wait_past_subscription(client, waiter, partial(owner.complete, b"v")), Completed)
        if _pushed(otel):
            break

    client.script_flush()
    Claim(client, unique(), native="never").acquire()

    claim = Claim(client, unique(), lease=3)
    claim.acquire()
    with claim.keep_alive(interval=0.1) as keeper:
        client.set(claim.claim_key, "someone-else")
        deadline = time.monotonic() + 10
        while not keeper.lost and time.monotonic() < deadline:
            time.sleep(0.02)
    names = [event.name for span in otel.finished() for event in span.events]
    assert "taken over" in names
    assert "woken" in names
    assert "script reloaded" in names
    assert "lease lost" in names
    assert _pushed(otel)
    reloads = otel.points("goblin_claim.script_reloads")
    # The claim's script after the flush, and the keep-alive's first renewal (extend.lua, flushed too).
    assert sum(p.value for p in reloads) == 2


def test_gauges_count_live_keep_alives_and_waiters(client: redis.Redis, otel: Telemetry) -> None:
    """The observable gauges read the keep-alives renewing and the callers waiting, and fall back to zero."""
    held, waited = Claim(client, unique(), lease=30), unique()
    held.acquire()
    owner = Claim(client, waited)
    owner.acquire()
    waiter = threading.Thread(target=lambda: Claim(client, waited).wait(timeout=10))
    with held.keep_alive():
        waiter.start()
        deadline = time.monotonic() + 10  # until the waiter's thread is inside wait()
        while [p.value for p in otel.points("goblin_claim.waiters")] != [1] and time.monotonic() < deadline:
            time.sleep(0.02)
        keepers = [p.value for p in otel.points("goblin_claim.keep_alives")]
        waiters = [p.value for p in otel.points("goblin_claim.waiters")]
        owner.complete(b"v")
        waiter.join(10)
    assert keepers == [1]
    assert waiters == [1]
    assert [p.value for p in otel.points("goblin_claim.keep_alives")] == [0]
    assert [p.value for p in otel.points("goblin_claim.waiters")] == [0]


def test_redis_instrumentation_sees_every_command_under_our_span(
    redis_standalone: RedisProcess, otel: Telemetry
) -> None:
    """With redis-py instrumented by opentelemetry-instrumentation-redis, each SDK command is a child span."""
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    instrumentor = RedisInstrumentor()
    instrumentor.instrument(tracer_provider=otel.tracer_provider)
    try:
        client = redis.Redis(host=HOST, port=redis_standalone.port)  # made after: it takes execute_command
        Claim(client, unique()).acquire()  # the probe and SCRIPT LOADs are one pipeline
        otel.spans.clear()
        claim = Claim(client, unique())
        claim.acquire()
        claim.complete(b"v")
        client.close()
    finally:
        instrumentor.uninstrument()
    ours = {s.context.span_id: s.name for s in otel.finished() if s.name.startswith("goblin_claim.")}
    commands = [s for s in otel.finished() if not s.name.startswith("goblin_claim.")]
    assert sorted(ours.values()) == ["goblin_claim.acquire", "goblin_claim.complete"]
    assert len(commands) == 2  # one EVALSHA each
    assert sorted(ours[c.parent.span_id] for c in commands if c.parent) == sorted(ours.values())


def test_async_operations_and_renewals_keep_their_context(redis_standalone: RedisProcess, otel: Telemetry) -> None:
    """An async decorated call is one span; its renewal batches run as tasks and report under it."""
    runs = []

    async def main() -> None:
        client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port)
        try:

            @idempotent(client, key="item", namespace=unique("ns"), lease=3)
            async def slow(item: str) -> str:
                runs.append(item)
                assert await until_async(lambda: _renewals_under_this_span(otel) >= 1, 30)
                return item

            other = AsyncClaim(client, unique())
            await asyncio.gather(slow("z"), other.acquire())
            assert await slow("z") == "z"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert runs == ["z"]
    calls = otel.finished("goblin_claim.call")
    assert [c.attributes["goblin_claim.outcome"] for c in calls] == ["claimed", "completed"]  # type: ignore[index]
    renewals = otel.finished("goblin_claim.renew")
    assert renewals
    assert all(r.parent is not None and r.parent.span_id == calls[0].context.span_id for r in renewals)
    (acquire,) = otel.finished("goblin_claim.acquire")
    assert acquire.parent is None  # the concurrent task's span is no child of the call


def test_uninstrument_turns_everything_off(client: redis.Redis, otel: Telemetry) -> None:
    """After uninstrument() no span is made and the flag is off again."""
    goblin_claim.otel.uninstrument()
    Claim(client, unique()).acquire()
    assert otel.finished() == []
    assert _events.enabled is False


def test_a_fail_open_run_is_counted_with_its_namespace_and_marked_on_its_span(
    client: redis.Redis, otel: Telemetry
) -> None:
    """Each fail-open run adds one to goblin_claim.fail_open_runs (operation, namespace, error type); its span too."""
    unreachable = redis.Redis(host=HOST, port=free_port(), retry=None, socket_connect_timeout=0.5)
    namespace = unique("ns")
    runs: list[str] = []

    @idempotent(unreachable, key="order", namespace=namespace, fail_open=True)
    def charge(order: str) -> str:
        runs.append(order)
        return "charged"

    @idempotent(unreachable, key="order", namespace=unique("ns"))
    def closed(order: str) -> str:
        runs.append(order)
        return "charged"

    @idempotent(client, key="order", namespace=namespace, fail_open=True)
    def reachable(order: str) -> str:
        return "charged"

    assert [charge("o-1"), charge("o-1"), charge("o-2")] == ["charged"] * 3
    with pytest.raises(ConnectionFailedError):
        closed("o-3")  # refused: not a fail-open run
    assert reachable("o-4") == reachable("o-4") == "charged"  # a reachable server: nothing counted
    unreachable.close()
    assert runs == ["o-1", "o-1", "o-2"]
    (point,) = otel.points("goblin_claim.fail_open_runs")
    assert point.value == 3
    assert dict(point.attributes) == {
        "goblin_claim.operation": "call",
        "goblin_claim.namespace": namespace,
        "error.type": "goblin_claim.ConnectionFailedError",
    }
    spans = [s for s in otel.finished("goblin_claim.call") if s.attributes["goblin_claim.outcome"] == "failed_open"]
    assert len(spans) == 3
    assert all([event.name for event in span.events] == ["failed open"] for span in spans)
