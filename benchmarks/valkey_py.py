"""valkey-py against redis-py on the same server: the duplicate path, interleaved in one run.

The duplicate path is ``Claim(client, key).acquire()`` on a key whose work is
completed (a retried request answered from its stored result): one round trip,
the call a busy service makes most. Sides, each on its own client of one server:

- ``redis-py``: ``redis.Redis`` / ``redis.asyncio.Redis`` (the direct round trip);
- ``valkey-py``: ``valkey.Valkey`` / ``valkey.asyncio.Valkey`` (the direct round trip too);
- ``valkey-py-exec``: valkey-py through its own ``execute_command`` (a subclass
  overriding it, which the SDK never sends around), to show what the direct
  round trip saves there.

Sync runs on one connection, asyncio with 50 concurrent tasks. Chunks of each side
are interleaved (the order rotating) for several rounds; the script prints each
side's median ops/s and the medians of the per-round ratios to redis-py. Machines
here are noisy (about 10%): read ratios, not absolute numbers. Uses the server in
REDIS_URL, else starts a redis-server on a free port and stops it afterwards.

    python benchmarks/valkey_py.py [--rounds 9] [--chunk 2000]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import valkey
import valkey.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.overhead import rounds_and_chunk, server_url
from goblin_claim import AsyncClaim, Claim, Claimed
from goblin_claim._clients.transport import state_of

TASKS = 50
KEYS = 64  # completed keys, read in turn
SIDES = ("redis-py", "valkey-py", "valkey-py-exec")


class _ExecValkey(valkey.Valkey):
    """valkey.Valkey whose commands all go through its execute_command."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """valkey-py's own, unchanged: an override the SDK does not send around."""
        return super().execute_command(*args, **options)


class _AsyncExecValkey(valkey.asyncio.Valkey):
    """The asyncio twin of ``_ExecValkey``."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """valkey-py's own, unchanged."""
        return await super().execute_command(*args, **options)


def _completed(client: Any, namespace: str) -> list[str]:
    keys = [f"done-{i}" for i in range(KEYS)]
    for key in keys:
        claim = Claim(client, key, namespace=namespace, lease=60, ttl=3600)
        if isinstance(claim.acquire(), Claimed):
            claim.complete(b"stored result")
    return keys


def sync_side(client: Any, keys: list[str], namespace: str, chunk: int) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        for i in range(chunk):
            Claim(client, keys[i % KEYS], namespace=namespace).acquire()
        return chunk / (time.perf_counter() - started)

    return run


def async_side(client: Any, keys: list[str], namespace: str, chunk: int) -> Callable[[], Awaitable[float]]:
    per_task = max(1, chunk // TASKS)

    async def task(offset: int) -> None:
        for i in range(per_task):
            await AsyncClaim(client, keys[(offset + i) % KEYS], namespace=namespace).acquire()

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(task(n) for n in range(TASKS)))
        return per_task * TASKS / (time.perf_counter() - started)

    return run


def report(title: str, rates: dict[str, list[float]]) -> dict[str, float]:
    print(title)
    ratios: dict[str, float] = {}
    for side in SIDES:
        per_round = [s / r for s, r in zip(rates[side], rates["redis-py"], strict=True)]
        ratios[side] = statistics.median(per_round)
        shown = ", ".join(f"{x:.2f}" for x in per_round)
        print(
            f"  {side:<15} median {statistics.median(rates[side]):>9,.0f} ops/s"
            f"  /redis-py {ratios[side]:.3f}  (per round: {shown})"
        )
    return ratios


def _rotated(round_: int) -> tuple[str, ...]:
    shift = round_ % len(SIDES)
    return SIDES[shift:] + SIDES[:shift]


def bench_sync(url: str, rounds: int, chunk: int) -> dict[str, float]:
    namespace = "bench-valkey-py"
    clients = {
        "redis-py": redis.Redis.from_url(url),
        "valkey-py": valkey.Valkey.from_url(url),
        "valkey-py-exec": _ExecValkey.from_url(url),
    }
    try:
        keys = _completed(clients["redis-py"], namespace)
        fns = {side: sync_side(client, keys, namespace, chunk) for side, client in clients.items()}
        for fn in fns.values():  # probe, SCRIPT LOAD and warm-up, outside the timing
            fn()
        assert state_of(clients["valkey-py"]).direct is not None
        assert state_of(clients["valkey-py-exec"]).direct is None
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_ in range(rounds):
            for side in _rotated(round_):
                rates[side].append(fns[side]())
        return report(f"sync, one connection each, {rounds} rounds x {chunk} duplicate acquires per side", rates)
    finally:
        for client in clients.values():
            client.close()


async def bench_async(url: str, rounds: int, chunk: int) -> dict[str, float]:
    namespace = "bench-valkey-py"
    redis_pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
    clients = {
        "redis-py": redis.asyncio.Redis.from_pool(redis_pool),
        "valkey-py": valkey.asyncio.Valkey.from_pool(
            valkey.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
        ),
        "valkey-py-exec": _AsyncExecValkey.from_pool(
            valkey.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
        ),
    }
    sync_client = redis.Redis.from_url(url)
    try:
        keys = _completed(sync_client, namespace)
        fns = {side: async_side(client, keys, namespace, chunk) for side, client in clients.items()}
        for fn in fns.values():
            await fn()
        assert state_of(clients["valkey-py"]).direct is not None
        rates: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_ in range(rounds):
            for side in _rotated(round_):
                rates[side].append(await fns[side]())
        return report(f"asyncio, {TASKS} tasks each, {rounds} rounds x {chunk} duplicate acquires per side", rates)
    finally:
        sync_client.close()
        for client in clients.values():
            await client.aclose()


def main() -> None:
    args = rounds_and_chunk(__doc__)
    with server_url() as url:
        print(f"redis-py {redis.__version__}, valkey-py {valkey.__version__}, Python {sys.version.split()[0]}")
        sync = bench_sync(url, args.rounds, args.chunk)
        asynchronous = asyncio.run(bench_async(url, args.rounds, args.chunk))
    print(
        f"\nvalkey-py / redis-py on the duplicate path: sync {sync['valkey-py']:.3f}, "
        f"asyncio {asynchronous['valkey-py']:.3f}"
    )


if __name__ == "__main__":
    main()
