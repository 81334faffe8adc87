"""What the ``hiredis`` extra buys: goblin-claim's hot paths with hiredis's parser and with redis-py's own.

Two clients on one server, identical but for the reply parser, run the same calls
in interleaved rounds: a duplicate's ``Claim.acquire`` and an ``@idempotent``
first call (claim, run, store), sync, and ``AsyncClaim.acquire`` with 50 tasks.
Prints each side's median ops/s and the median per-round ratio. Needs hiredis
(``pip install 'goblin-claim[hiredis]'``). Uses REDIS_URL, else starts a
redis-server on a free port.

    python benchmarks/hiredis_gain.py [--rounds 7] [--chunk 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from redis._parsers import _AsyncHiredisParser, _AsyncRESP3Parser, _HiredisParser, _RESP3Parser
from redis.utils import HIREDIS_AVAILABLE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import TASKS, server_url

from goblin_claim import AsyncClaim, Claim, idempotent

_ids = itertools.count()


def sync_paths(client: redis.Redis, tag: str) -> dict[str, Callable[[int], None]]:
    done = Claim(client, f"done-{tag}", namespace="bench-hiredis")
    done.acquire()
    done.complete(b"receipt")

    def work(order_id: str) -> str:
        return f"charged {order_id}"

    charge = idempotent(client, key="order_id", namespace=f"bench-hiredis-{tag}")(work)

    def duplicate(n: int) -> None:
        for _ in range(n):
            Claim(client, f"done-{tag}", namespace="bench-hiredis").acquire()

    def first_call(n: int) -> None:
        for _ in range(n):
            charge(f"o-{time.time_ns()}-{next(_ids)}")

    return {"duplicate, Claim.acquire (sync)": duplicate, "first call, @idempotent (sync)": first_call}


def async_duplicate(client: redis.asyncio.Redis, loop: asyncio.AbstractEventLoop, tag: str) -> Callable[[int], None]:
    async def setup() -> None:
        done = AsyncClaim(client, f"adone-{tag}", namespace="bench-hiredis")
        await done.acquire()
        await done.complete(b"receipt")

    loop.run_until_complete(setup())

    async def run(n: int) -> None:
        async def one() -> None:
            for _ in range(max(1, n // TASKS)):
                await AsyncClaim(client, f"adone-{tag}", namespace="bench-hiredis").acquire()

        await asyncio.gather(*(one() for _ in range(TASKS)))

    return lambda n: loop.run_until_complete(run(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=2000)
    args = parser.parse_args()
    if not HIREDIS_AVAILABLE:
        raise SystemExit("hiredis is not installed: pip install 'goblin-claim[hiredis]'")
    with server_url() as url:
        loop = asyncio.new_event_loop()
        clients: dict[str, Any] = {
            "hiredis": redis.Redis.from_url(url, parser_class=_HiredisParser),
            "python": redis.Redis.from_url(url, parser_class=_RESP3Parser),
        }
        async_clients: dict[str, Any] = {}

        async def make() -> None:
            for name, parser_class in (("hiredis", _AsyncHiredisParser), ("python", _AsyncRESP3Parser)):
                pool = redis.asyncio.BlockingConnectionPool.from_url(
                    url, max_connections=TASKS, parser_class=parser_class
                )
                async_clients[name] = redis.asyncio.Redis.from_pool(pool)

        loop.run_until_complete(make())
        paths: dict[str, dict[str, Callable[[int], None]]] = {}
        for name in ("hiredis", "python"):
            paths[name] = sync_paths(clients[name], name)
            paths[name][f"duplicate, AsyncClaim.acquire ({TASKS} tasks)"] = async_duplicate(
                async_clients[name], loop, name
            )
        rates: dict[tuple[str, str], list[float]] = {}
        for run in paths["hiredis"].values():
            run(args.chunk // 10)  # warm up: scripts loaded, connections open
        for run in paths["python"].values():
            run(args.chunk // 10)
        for round_ in range(args.rounds):
            order = ("hiredis", "python") if round_ % 2 == 0 else ("python", "hiredis")
            for path in paths["hiredis"]:
                for name in order:
                    started = time.perf_counter()
                    paths[name][path](args.chunk)
                    rates.setdefault((path, name), []).append(args.chunk / (time.perf_counter() - started))
        print(f"redis-py {redis.__version__}, {args.rounds} rounds x {args.chunk} calls")
        for path in paths["hiredis"]:
            fast, slow = rates[(path, "hiredis")], rates[(path, "python")]
            ratio = statistics.median(f / s for f, s in zip(fast, slow, strict=True))
            print(
                f"  {path:42s} hiredis {statistics.median(fast):8,.0f} ops/s   python {statistics.median(slow):8,.0f}"
                f" ops/s   ratio {ratio:.2f}"
            )
        for client in clients.values():
            client.close()
        for client in async_clients.values():
            loop.run_until_complete(client.aclose())
        loop.close()


if __name__ == "__main__":
    main()
