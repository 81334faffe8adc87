"""How late a waiter learns of complete(): push wake-up against polling alone, side by side.

Each trial: an owner claims a key, a waiter thread calls ``wait()``, the owner
completes after a random 50-400 ms, and the trial records the time from the
start of ``complete()`` to the waiter's return. Trials alternate between the
default (a wake-up on the claim key's channel) and polling alone (the wake-up
switched off in this process only), and the script prints the median and p99
of each. Uses REDIS_URL, else starts a redis-server on a free port.

    python benchmarks/wakeup.py [--trials 100]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

import goblin_claim._drivers.sync
from goblin_claim import Claim

PUSH = goblin_claim._drivers.sync.wakeups


def trial(client: redis.Redis, key: str, push: bool) -> float:
    goblin_claim._drivers.sync.wakeups = PUSH if push else (lambda client: None)  # type: ignore[assignment]
    owner = Claim(client, key, namespace="bench-wake")
    owner.acquire()
    returned: list[float] = []

    def wait() -> None:
        Claim(client, key, namespace="bench-wake").wait(timeout=10)
        returned.append(time.perf_counter())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(random.uniform(0.05, 0.4))
    started = time.perf_counter()
    owner.complete(b"done")
    waiter.join()
    return (returned[0] - started) * 1000


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    with server_url() as url:
        client = redis.Redis.from_url(url)
        latencies: dict[bool, list[float]] = {True: [], False: []}
        try:
            for n in range(args.trials):
                for push in (n % 2 == 0, n % 2 != 0):
                    latencies[push].append(trial(client, f"{time.time_ns()}-{n}-{push}", push))
        finally:
            goblin_claim._drivers.sync.wakeups = PUSH
            client.close()
    print(f"complete() -> waiter returns, {args.trials} trials each, milliseconds")
    for push, label in ((False, "polling alone (backoff up to 0.5 s)"), (True, "push wake-up (default)")):
        values = latencies[push]
        print(f"  {label:38s} median {statistics.median(values):7.1f}   p99 {percentile(values, 0.99):7.1f}")


if __name__ == "__main__":
    main()
