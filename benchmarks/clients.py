"""redis-py, valkey-py and GLIDE side by side: raw EVALSHA and the SDK's duplicate path.

One redis-server (REDIS_URL, else one started on a free port), three client
families, and for each: sync (threads) and asyncio (tasks), 1 and 50 concurrent
callers, two operations:

- raw EVALSHA of the claim script on a completed key (each family's own raw call:
  ``execute_command`` for redis-py and valkey-py, ``custom_command`` for GLIDE);
- the SDK's duplicate path, ``Claim.acquire`` / ``AsyncClaim.acquire`` on the
  same completed key (GLIDE's client passed in as it is).

Rounds interleave the families (the order rotates every round), so a machine's
drift hits all of them alike. Prints each cell's median ops/s and the median
per-round ratio to redis-py. The asyncio redis-py and valkey-py clients use a
blocking pool of 50 connections; GLIDE multiplexes one connection per client.

    python benchmarks/clients.py [--rounds 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import glide
import glide_sync
import redis
import redis.asyncio
import valkey
import valkey.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from goblin_claim import AsyncClaim, Claim
from goblin_claim._protocol.record import build_keys
from goblin_claim._protocol.scripts import CLAIM

FAMILIES = ("redis-py", "valkey-py", "GLIDE")
CALLERS = (1, 50)
NAMESPACE = "bench-clients"
KEY = "done"


def _address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 6379


def sync_clients(url: str) -> dict[str, Any]:
    host, port = _address(url)
    config = glide_sync.GlideClientConfiguration([glide_sync.NodeAddress(host, port)])
    return {
        "redis-py": redis.Redis(host=host, port=port),
        "valkey-py": valkey.Valkey(host=host, port=port),
        "GLIDE": glide_sync.GlideClient.create(config),
    }


async def async_clients(url: str) -> dict[str, Any]:
    host, port = _address(url)
    config = glide.GlideClientConfiguration([glide.NodeAddress(host, port)])
    return {
        "redis-py": redis.asyncio.Redis.from_pool(
            redis.asyncio.BlockingConnectionPool(host=host, port=port, max_connections=50, timeout=30)
        ),
        "valkey-py": valkey.asyncio.Valkey.from_pool(
            valkey.asyncio.BlockingConnectionPool(host=host, port=port, max_connections=50, timeout=30)
        ),
        "GLIDE": await glide.GlideClient.create(config),
    }


def claim_args() -> tuple[str, ...]:
    """The completed key's EVALSHA arguments, as the SDK sends them."""
    return ("EVALSHA", CLAIM.sha, "2", *build_keys(NAMESPACE, KEY), "bench-token", "30")


def sync_ops(family: str, client: Any) -> dict[str, Callable[[], object]]:
    """One call of each operation on a sync client."""
    args = claim_args()
    if family == "GLIDE":
        listed = list(args)

        def raw() -> object:
            return client.custom_command(listed)
    else:

        def raw() -> object:
            return client.execute_command(*args)

    return {"raw EVALSHA": raw, "SDK duplicate": lambda: Claim(client, KEY, namespace=NAMESPACE).acquire()}


def async_ops(family: str, client: Any) -> dict[str, Callable[[], Awaitable[object]]]:
    """One call of each operation on an asyncio client."""
    args = claim_args()
    if family == "GLIDE":
        listed = list(args)

        def raw() -> Awaitable[object]:
            return client.custom_command(listed)  # type: ignore[no-any-return]
    else:

        def raw() -> Awaitable[object]:
            return client.execute_command(*args)  # type: ignore[no-any-return]

    return {"raw EVALSHA": raw, "SDK duplicate": lambda: AsyncClaim(client, KEY, namespace=NAMESPACE).acquire()}


def time_threads(pool: ThreadPoolExecutor, op: Callable[[], object], callers: int, calls: int) -> float:
    """ops/s of ``calls`` calls of ``op`` spread over ``callers`` threads, started together."""
    each = max(1, calls // callers)
    gate = threading.Barrier(callers + 1)

    def caller() -> None:
        gate.wait()
        for _ in range(each):
            op()

    futures = [pool.submit(caller) for _ in range(callers)]
    gate.wait()
    started = time.perf_counter()
    for future in futures:
        future.result()
    return each * callers / (time.perf_counter() - started)


async def time_tasks(op: Callable[[], Awaitable[object]], callers: int, calls: int) -> float:
    """ops/s of ``calls`` calls of ``op`` spread over ``callers`` tasks."""
    each = max(1, calls // callers)

    async def caller() -> None:
        for _ in range(each):
            await op()

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return each * callers / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per cell and round")
    args = parser.parse_args()
    with server_url() as url:
        loop = asyncio.new_event_loop()
        sync = sync_clients(url)
        asyncio_ = loop.run_until_complete(async_clients(url))
        done = Claim(sync["redis-py"], KEY, namespace=NAMESPACE)
        done.acquire()
        done.complete(b"receipt")
        ops_sync = {family: sync_ops(family, client) for family, client in sync.items()}
        ops_async = {family: async_ops(family, client) for family, client in asyncio_.items()}
        pool = ThreadPoolExecutor(max(CALLERS))
        cells = [(mode, callers, op) for mode in ("sync", "asyncio") for callers in CALLERS for op in ops_sync["GLIDE"]]

        def measure(mode: str, callers: int, op: str, family: str, calls: int) -> float:
            if mode == "sync":
                return time_threads(pool, ops_sync[family][op], callers, calls)
            return loop.run_until_complete(time_tasks(ops_async[family][op], callers, calls))

        for cell in cells:  # warm up: scripts loaded, connections open, probes sent
            for family in FAMILIES:
                measure(*cell, family, max(100, args.calls // 10))
        rates: dict[tuple[str, int, str, str], list[float]] = {}
        for round_ in range(args.rounds):
            order = FAMILIES[round_ % 3 :] + FAMILIES[: round_ % 3]
            for cell in cells:
                for family in order:
                    rates.setdefault((*cell, family), []).append(measure(*cell, family, args.calls))
        print(
            f"redis-py {redis.__version__}, valkey-py {valkey.__version__}, GLIDE {version('valkey-glide')}; "
            f"{args.rounds} interleaved rounds x {args.calls} calls per cell; median ops/s (ratio to redis-py)"
        )
        print(f"  {'mode':8s} {'callers':>7s}  {'operation':14s} " + "".join(f"{f:>22s}" for f in FAMILIES))
        for cell in cells:
            base = rates[(*cell, "redis-py")]
            row = []
            for family in FAMILIES:
                mine = rates[(*cell, family)]
                ratio = statistics.median(m / b for m, b in zip(mine, base, strict=True))
                row.append(f"{statistics.median(mine):12,.0f} ({ratio:4.2f}x)")
            mode, callers, op = cell
            print(f"  {mode:8s} {callers:7d}  {op:14s} " + "".join(f"{r:>22s}" for r in row))
        pool.shutdown()
        for client in sync.values():
            client.close()
        for family, client in asyncio_.items():
            loop.run_until_complete(client.close() if family == "GLIDE" else client.aclose())
        loop.close()


if __name__ == "__main__":
    main()
