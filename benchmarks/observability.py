"""What observability costs: off (nothing enabled) against the hooks compiled out, and instrument() on.

Measured side by side in one interleaved run, on the duplicate path (a completed
key read again, one round trip), which is what a busy service mostly does:

- ``Claim(client, key).acquire()`` against ``Claim.acquire.__wrapped__`` (the
  method without its event hook: the pre-change call);
- ``AsyncClaim(...).acquire()`` with 50 concurrent tasks, the same way (the
  ASGI middleware's replay goes through this call);
- an ``@idempotent`` duplicate against the same flow without its hook
  (``_idempotent_sync.call`` swapped for the flow alone);
- then each path with ``goblin_claim.otel.instrument()`` on the real SDK (a
  batch span processor whose exporter drops the spans, an in-memory metric
  reader), giving the cost per operation in microseconds.

Chunks alternate which side goes first; the script prints medians and the
median of the per-round ratios (off / compiled out: 1.000 means no cost). The
machine is noisy (several percent between chunks): read the median ratio, and
the hook's own cost measured without I/O, printed last.

    python benchmarks/observability.py [--rounds 61] [--chunk 300]
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import goblin_claim.otel
from benchmarks.overhead import rounds_and_chunk, server_url, tasks_timed
from goblin_claim import AsyncClaim, Claim, Completed, _events, idempotent
from goblin_claim._decorator import sync as _idempotent_sync
from goblin_claim._decorator.sync import _flow

TASKS = 50
_ids = itertools.count()


def call_without_hooks(spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_idempotent_sync.call`` as it was before events: the flow alone."""
    call = spec.prepare(args, kwargs)
    claim = spec.handle(Claim, call)
    return _flow(spec, args, kwargs, call, claim, None)


HOOKED_CALL = _idempotent_sync.call


def sdk_on() -> Callable[[], None]:
    """instrument() into real SDK providers; returns the function that turns it off again."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    goblin_claim.otel.instrument(tracer_provider, meter_provider)

    def off() -> None:
        goblin_claim.otel.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return off


def listening() -> Callable[[], None]:
    """Register a listener that does nothing; returns the function that removes it."""

    def listener(event: _events.Event) -> None:
        return None

    goblin_claim.add_listener(listener)
    return lambda: goblin_claim.remove_listener(listener)


def sync_sides(client: redis.Redis, key: str, chunk: int) -> dict[str, Callable[[], float]]:
    unwrapped = Claim.acquire.__wrapped__  # type: ignore[attr-defined]

    @idempotent(client, key="item", namespace="bench-obs")
    def work(item: str) -> str:
        return item

    work("dup")  # completed once: every call below is a duplicate

    def hooked() -> float:
        started = time.perf_counter()
        for _ in range(chunk):
            Claim(client, key, namespace="bench-obs").acquire()
        return chunk / (time.perf_counter() - started)

    def bare() -> float:
        started = time.perf_counter()
        for _ in range(chunk):
            unwrapped(Claim(client, key, namespace="bench-obs"))
        return chunk / (time.perf_counter() - started)

    def deco() -> float:
        started = time.perf_counter()
        for _ in range(chunk):
            work("dup")
        return chunk / (time.perf_counter() - started)

    def deco_bare() -> float:
        _idempotent_sync.call = call_without_hooks  # type: ignore[assignment]
        try:
            started = time.perf_counter()
            for _ in range(chunk):
                work("dup")
            return chunk / (time.perf_counter() - started)
        finally:
            _idempotent_sync.call = HOOKED_CALL  # type: ignore[assignment]

    return {"acquire": hooked, "acquire_bare": bare, "call": deco, "call_bare": deco_bare}


def async_sides(client: redis.asyncio.Redis, key: str, chunk: int) -> dict[str, Callable[[], Awaitable[float]]]:
    per_task = max(1, chunk // TASKS)
    unwrapped = AsyncClaim.acquire.__wrapped__  # type: ignore[attr-defined]

    async def hooked_task() -> None:
        for _ in range(per_task):
            await AsyncClaim(client, key, namespace="bench-obs").acquire()

    async def bare_task() -> None:
        for _ in range(per_task):
            await unwrapped(AsyncClaim(client, key, namespace="bench-obs"))

    return {
        "async_acquire": tasks_timed(hooked_task, per_task, TASKS),
        "async_acquire_bare": tasks_timed(bare_task, per_task, TASKS),
    }


def interleave(
    sides: dict[str, Callable[[], float]], pairs: list[tuple[str, str]], rounds: int
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()  # warm up
    for round_ in range(rounds):
        for a, b in pairs:
            for name in (a, b) if round_ % 2 == 0 else (b, a):
                rates[name].append(sides[name]())
    return rates


async def interleave_async(
    sides: dict[str, Callable[[], Awaitable[float]]], pairs: list[tuple[str, str]], rounds: int
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        await fn()
    for round_ in range(rounds):
        for a, b in pairs:
            for name in (a, b) if round_ % 2 == 0 else (b, a):
                rates[name].append(await sides[name]())
    return rates


def ratio_line(title: str, rates: dict[str, list[float]], a: str, b: str) -> float:
    ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
    ratio = statistics.median(ratios)
    print(
        f"  {title:<34} {statistics.median(rates[a]):>8,.0f} vs {statistics.median(rates[b]):>8,.0f} ops/s"
        f"   ratio {ratio:.3f}  (rounds {min(ratios):.3f}..{max(ratios):.3f})"
    )
    return ratio


def hook_cost_ns() -> tuple[float, float]:
    """The unobserved hook's own cost, without I/O: a decorated no-op method against the bare one."""

    class Probe:
        key = "k"

        def bare(self) -> None:
            return None

        hooked = _events.observe("release")(bare)

    probe, n = Probe(), 200_000
    best = []
    for fn in (probe.hooked, probe.bare):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - started) / n)
        best.append(min(runs))
    active_ns = min(
        timeit_once(lambda: _events.active(_events.CALL_LOG)) for _ in range(5)
    )  # the decorated call's check
    return (best[0] - best[1]) * 1e9, active_ns


def observed_op_us() -> float:
    """One observed operation's own cost without I/O: the event made, handed out and (on) recorded."""
    claim = Claim(redis.Redis(), "k")  # never sends anything
    replay = Completed(key="k", value=b"v")

    def once() -> None:
        with _events.Op("acquire", claim) as op:
            op.note(replay)

    return min(timeit_once(once, 50_000) for _ in range(5)) / 1000


def request_hook_ns() -> float:
    """The middleware's hook unobserved: ``with _events.observing("request", claim):`` around nothing."""
    claim = Claim(redis.Redis(), "k")  # never sends anything

    def once() -> None:
        with _events.observing("request", claim):
            pass

    return min(timeit_once(once) for _ in range(5)) - min(timeit_once(lambda: None) for _ in range(5))


def async_hook_cost_ns() -> float:
    """The unobserved hook's own cost on an ``async def`` method, without I/O."""

    class Probe:
        key = "k"

        async def bare(self) -> None:
            return None

        hooked = _events.observe("release")(bare)

    async def loop(fn: Callable[[], Awaitable[None]], n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            await fn()
        return (time.perf_counter() - started) / n

    probe, n = Probe(), 100_000
    hooked = min(asyncio.run(loop(probe.hooked, n)) for _ in range(5))
    bare = min(asyncio.run(loop(probe.bare, n)) for _ in range(5))
    return (hooked - bare) * 1e9


def timeit_once(fn: Callable[[], object], n: int = 200_000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e9


def main() -> None:
    args = rounds_and_chunk(__doc__, rounds=61, chunk=300)
    assert not _events.enabled, "nothing may be enabled for the off measurements"
    with server_url() as url:
        client = redis.Redis.from_url(url)
        key = f"dup-{time.time_ns()}"
        owner = Claim(client, key, namespace="bench-obs")
        owner.acquire()
        owner.complete(b"stored result")
        sides = sync_sides(client, key, args.chunk)
        print(f"redis-py {redis.__version__}, Python {sys.version.split()[0]}, {args.rounds} rounds x {args.chunk}")
        print("off (nothing enabled) vs the hooks compiled out, duplicate path:")
        pairs = [("acquire", "acquire_bare"), ("call", "call_bare")]
        off = interleave(sides, pairs, args.rounds)
        ratio_line("Claim.acquire (sync)", off, "acquire", "acquire_bare")
        ratio_line("@idempotent duplicate (sync)", off, "call", "call_bare")

        async def run_async() -> dict[str, list[float]]:
            pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
            aclient = redis.asyncio.Redis.from_pool(pool)
            try:
                await AsyncClaim(aclient, key, namespace="bench-obs").acquire()
                sides_async = async_sides(aclient, key, args.chunk)
                return await interleave_async(sides_async, [("async_acquire", "async_acquire_bare")], args.rounds)
            finally:
                await aclient.aclose()

        off_async = asyncio.run(run_async())
        ratio_line(f"AsyncClaim.acquire ({TASKS} tasks)", off_async, "async_acquire", "async_acquire_bare")

        for label, turn_on in (
            ("a no-op listener (events alone)", listening),
            ("instrument() on the real SDK", sdk_on),
        ):
            print(f"{label} vs off, interleaved (wall-clock cost per operation, paired per round):")
            turn_off = turn_on()
            bridge, listeners = _events._otel, _events._listeners

            def switched(fn: Callable[[], float], state: tuple[Any, Any]) -> Callable[[], float]:
                def run() -> float:
                    _events._otel, _events._listeners = state
                    _events._refresh()
                    return fn()

                return run

            try:
                toggled = {
                    f"{name}{suffix}": switched(sides[name], (bridge, listeners) if suffix else (None, ()))
                    for name in ("acquire", "call")
                    for suffix in ("", "_on")
                }
                rates = interleave(toggled, [("acquire_on", "acquire"), ("call_on", "call")], args.rounds)
            finally:
                _events._otel, _events._listeners = bridge, listeners
                turn_off()
            for name, title in (("acquire", "Claim.acquire (sync)"), ("call", "@idempotent duplicate (sync)")):
                costs = [(1 / on - 1 / off) * 1e6 for on, off in zip(rates[f"{name}_on"], rates[name], strict=True)]
                print(
                    f"  {title:<34} {statistics.median(rates[f'{name}_on']):>8,.0f} vs "
                    f"{statistics.median(rates[name]):>8,.0f} ops/s   {statistics.median(costs):+.1f} µs per operation"
                )
        client.close()
    hook_ns, active_ns = hook_cost_ns()
    async_ns = async_hook_cost_ns()
    per_op_us = 1e6 / statistics.median(off["acquire"])
    per_async_us = 1e6 / statistics.median(off_async["async_acquire"])
    print("the unobserved hook alone, without I/O (the noise-free figure):")
    share = hook_ns / 10 / per_op_us
    print(f"  sync decorator         {hook_ns:>5.0f} ns: {share:.2f}% of a {per_op_us:.0f} µs duplicate")
    print(f"  decorated call's check {active_ns:>5.0f} ns: {active_ns / 10 / per_op_us:.2f}% of it")
    print(f"  the middleware's hook  {request_hook_ns():>5.0f} ns per request (replays take hundreds of µs)")
    print(
        f"  async decorator        {async_ns:>5.0f} ns: {async_ns / 10 / per_async_us:.2f}% of a "
        f"{per_async_us:.0f} µs async duplicate (50 tasks: the time per call at that throughput)"
    )
    print("an observed operation's own cost, without I/O (the noise-free figure):")
    for label, turn_on in (("a no-op listener", listening), ("instrument() on the real SDK", sdk_on)):
        turn_off = turn_on()
        try:
            print(f"  {label:<30} {observed_op_us():>6.1f} µs per operation")
        finally:
            turn_off()


if __name__ == "__main__":
    main()
