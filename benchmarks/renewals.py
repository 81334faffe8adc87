"""What 10,000 keep-alives cost one process: renewals per second, the renewer's CPU, and no lapse.

Holds N claims (3 s leases, renewed every second) under keep-alives for a few
seconds, sync (the renewer's threads) and asyncio (the event loop), and prints
renewals per second, the renewer's CPU seconds per second (the scheduler's and
lanes' own thread clocks, or the loop thread's), the least lease left seen on a
sample of the claims, and how many were lost. Side by side, one tick's worth of
renewals sent one round trip each (``claim.extend()`` in a loop, as renewals
went before lanes) against the same renewals as one pipeline per tick, with the
ratio. Uses REDIS_URL, else starts a redis-server on a free port.

    python benchmarks/renewals.py [--claims 10000] [--hold 7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from goblin_claim import AsyncClaim, Claim
from goblin_claim._protocol.scripts import EXTEND, script_command

LEASE = 3


def renewer_cpu() -> float:
    """CPU seconds of the renewer's threads (scheduler and lanes), from their pthread clocks."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("goblin-claim renew") and thread.ident is not None:
            with contextlib.suppress(OSError):
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def least_pttl(client: redis.Redis, keys: list[str]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.pttl(key)
    return int(min(pipe.execute()))


def hold_sync(url: str, claims: int, hold: float) -> tuple[float, float, int, int]:
    client = redis.Redis.from_url(url)
    namespace = f"bench-renew-{time.monotonic_ns()}"
    handles = [
        h for h, _ in Claim.acquire_many(client, [f"k{i}" for i in range(claims)], lease=LEASE, namespace=namespace)
    ]
    sample = [h.claim_key for h in handles[:: max(1, claims // 200)]]
    lowest = LEASE * 1000
    with contextlib.ExitStack() as stack:
        keepers = [stack.enter_context(h.keep_alive()) for h in handles]
        cpu, began = renewer_cpu(), time.monotonic()
        while time.monotonic() - began < hold:
            time.sleep(0.25)
            lowest = min(lowest, least_pttl(client, sample))
        cpu, spent = renewer_cpu() - cpu, time.monotonic() - began
    renewed = sum(k.renewals for k in keepers)
    lost = sum(k.lost for k in keepers)
    client.close()
    return renewed / spent, cpu / spent, lowest, lost


async def hold_async(url: str, claims: int, hold: float) -> tuple[float, float, int, int]:
    client = redis.asyncio.Redis.from_url(url)
    sampler = redis.Redis.from_url(url)
    namespace = f"bench-renew-{time.monotonic_ns()}"
    pairs = await AsyncClaim.acquire_many(client, [f"k{i}" for i in range(claims)], lease=LEASE, namespace=namespace)
    handles = [h for h, _ in pairs]
    sample = [h.claim_key for h in handles[:: max(1, claims // 200)]]
    lowest = LEASE * 1000
    async with contextlib.AsyncExitStack() as stack:
        keepers = [await stack.enter_async_context(h.keep_alive()) for h in handles]
        cpu, began = time.thread_time(), time.monotonic()
        while time.monotonic() - began < hold:
            await asyncio.sleep(0.25)
            lowest = min(lowest, await asyncio.to_thread(least_pttl, sampler, sample))
        cpu, spent = time.thread_time() - cpu, time.monotonic() - began
    renewed = sum(k.renewals for k in keepers)
    lost = sum(k.lost for k in keepers)
    await client.aclose()
    sampler.close()
    return renewed / spent, cpu / spent, lowest, lost


def one_tick(url: str, claims: int) -> tuple[float, float]:
    """Seconds to renew ``claims`` leases once: one round trip each, then one pipeline."""
    client = redis.Redis.from_url(url)
    namespace = f"bench-tick-{time.monotonic_ns()}"
    handles = [
        h for h, _ in Claim.acquire_many(client, [f"k{i}" for i in range(claims)], lease=LEASE, namespace=namespace)
    ]
    started = time.perf_counter()
    for handle in handles:
        handle.extend()
    each = time.perf_counter() - started
    started = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for handle in handles:
        pipe.execute_command(*script_command(EXTEND, (handle.claim_key, handle.token, handle.lease)))
    assert all(pipe.execute())
    piped = time.perf_counter() - started
    client.close()
    return each, piped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--hold", type=float, default=7.0)
    options = parser.parse_args()
    with server_url() as url:
        each, piped = one_tick(url, options.claims)
        print(f"one tick of {options.claims} renewals ({options.claims / LEASE * 3:.0f} are due per lease/3)")
        print(f"  one round trip each : {each:8.3f} s")
        print(f"  one pipeline        : {piped:8.3f} s   ({each / piped:.1f}x faster)")
        if each > LEASE / 3:
            print(f"  one round trip each cannot keep {options.claims} leases: a tick outlasts the interval")
        print(f"{options.claims} keep-alives, {LEASE} s leases, held {options.hold:.0f} s")
        print(f"  {'':6} {'renewals/s':>11} {'renewer CPU s/s':>16} {'least PTTL ms':>14} {'lost':>5}")
        for name, figures in (
            ("sync", hold_sync(url, options.claims, options.hold)),
            ("async", asyncio.run(hold_async(url, options.claims, options.hold))),
        ):
            rate, cpu, lowest, lost = figures
            print(f"  {name:6} {rate:11,.0f} {cpu:16.3f} {lowest:14d} {lost:5d}")


if __name__ == "__main__":
    main()
