"""What the SDK costs on top of raw EVALSHA, measured side by side in one run.

Compares, on the same client and connection(s):

- sync:  ``Claim(client, key).acquire()`` (a new handle per call, as a service
  makes one per request) against ``client.evalsha`` of the same script;
- async: ``AsyncClaim(client, key).acquire()`` against ``await client.evalsha``,
  each with 50 concurrent tasks.

The two are interleaved in chunks (alternating which goes first) for several
rounds; the script prints each side's median ops/s and the median of the
per-round ratios. Machines here are noisy (about 10%), so read ratios, not
absolute numbers. Uses the server in REDIS_URL, else starts a redis-server on a
free port and stops it afterwards.

    python benchmarks/overhead.py [--rounds 9] [--chunk 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from goblin_claim import AsyncClaim, Claim
from goblin_claim._protocol.scripts import CLAIM
from tests.support import servers

LEASE = 60  # every claim below expires on its own a minute later
TASKS = 50
_ids = itertools.count()


@contextlib.contextmanager
def server_url(*server_args: str) -> Iterator[str]:
    """REDIS_URL, else a redis-server of our own on a free port (the benchmarks share this)."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    binary = servers.redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server not found: run `make test` once, or set REDIS_URL")
    with servers.standalone(binary, *server_args) as server:
        yield f"redis://{servers.HOST}:{server.port}/0"


def fresh_key() -> str:
    return f"{os.getpid()}-{next(_ids)}"


def sync_chunks(client: redis.Redis, chunk: int) -> dict[str, Callable[[], float]]:
    def sdk() -> float:
        started = time.perf_counter()
        for _ in range(chunk):
            Claim(client, fresh_key(), lease=LEASE, namespace="bench").acquire()
        return chunk / (time.perf_counter() - started)

    def raw() -> float:
        sha = CLAIM.sha
        started = time.perf_counter()
        for _ in range(chunk):
            key = fresh_key()
            client.evalsha(sha, 2, f"bench:{{{key}}}:claim", f"bench:{{{key}}}:result", "token", LEASE)
        return chunk / (time.perf_counter() - started)

    return {"sdk": sdk, "raw": raw}


def async_chunks(client: redis.asyncio.Redis, chunk: int) -> dict[str, Callable[[], Awaitable[float]]]:
    per_task = max(1, chunk // TASKS)

    async def sdk_task() -> None:
        for _ in range(per_task):
            await AsyncClaim(client, fresh_key(), lease=LEASE, namespace="bench").acquire()

    async def raw_task() -> None:
        sha = CLAIM.sha
        for _ in range(per_task):
            key = fresh_key()
            await client.evalsha(sha, 2, f"bench:{{{key}}}:claim", f"bench:{{{key}}}:result", "token", LEASE)

    return {"sdk": tasks_timed(sdk_task, per_task), "raw": tasks_timed(raw_task, per_task)}


def tasks_timed(
    task: Callable[[], Awaitable[None]], per_task: int, tasks: int = TASKS
) -> Callable[[], Awaitable[float]]:
    """Calls per second of ``tasks`` copies of ``task`` (``per_task`` calls each) run at once."""

    async def run() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(task() for _ in range(tasks)))
        return per_task * tasks / (time.perf_counter() - started)

    return run


def report(title: str, rates: dict[str, list[float]]) -> float:
    ratios = [s / r for s, r in zip(rates["sdk"], rates["raw"], strict=True)]
    ratio = statistics.median(ratios)
    print(f"{title}")
    print(f"  sdk  median {statistics.median(rates['sdk']):>9,.0f} ops/s")
    print(f"  raw  median {statistics.median(rates['raw']):>9,.0f} ops/s")
    print(f"  ratio sdk/raw: median {ratio:.3f}  (per round: {', '.join(f'{x:.2f}' for x in ratios)})")
    return ratio


def bench_sync(url: str, rounds: int, chunk: int) -> float:
    client = redis.Redis.from_url(url)
    try:
        fns = sync_chunks(client, chunk)
        Claim(client, fresh_key(), namespace="bench").acquire()  # probe + SCRIPT LOAD, outside the timing
        for fn in fns.values():  # warm up both paths
            fn()
        rates: dict[str, list[float]] = {"sdk": [], "raw": []}
        for round_ in range(rounds):
            order = ("sdk", "raw") if round_ % 2 == 0 else ("raw", "sdk")
            for name in order:
                rates[name].append(fns[name]())
        return report(f"sync, one connection, {rounds} rounds x {chunk} calls each side", rates)
    finally:
        client.close()


async def bench_async(url: str, rounds: int, chunk: int) -> float:
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
    client = redis.asyncio.Redis.from_pool(pool)
    try:
        fns = async_chunks(client, chunk)
        await AsyncClaim(client, fresh_key(), namespace="bench").acquire()
        for fn in fns.values():
            await fn()
        rates: dict[str, list[float]] = {"sdk": [], "raw": []}
        for round_ in range(rounds):
            order = ("sdk", "raw") if round_ % 2 == 0 else ("raw", "sdk")
            for name in order:
                rates[name].append(await fns[name]())
        return report(f"async, {TASKS} tasks, {rounds} rounds x {chunk} calls each side", rates)
    finally:
        await client.aclose()


def rounds_and_chunk(doc: str, rounds: int = 9, chunk: int = 2000) -> argparse.Namespace:
    """The command line of a benchmark measured in rounds of ``chunk`` calls a side (``doc``: its docstring)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--chunk", type=int, default=chunk)
    return parser.parse_args()


def main() -> None:
    args = rounds_and_chunk(__doc__)
    with server_url() as url:
        print(f"redis-py {redis.__version__}, Python {sys.version.split()[0]}")
        sync_ratio = bench_sync(url, args.rounds, args.chunk)
        async_ratio = asyncio.run(bench_async(url, args.rounds, args.chunk))
    target = 0.9
    print(f"\ntarget: both ratios >= {target}: sync {sync_ratio:.3f}, async {async_ratio:.3f}")


if __name__ == "__main__":
    main()
