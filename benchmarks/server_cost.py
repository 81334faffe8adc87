"""What a claim costs the server: the EVALSHA claim script against the native GOBLIN.CLAIM.

Reads ``INFO commandstats`` (``usec`` / ``calls``: the server's own CPU time per
call, round trips excluded) for the SDK's claim script (``EVALSHA``, what the SDK
sends on stock Redis) and for ``GOBLIN.CLAIM`` (the reference module), on the same
server in one run, for three kinds of key:

- fresh: the claim is free, so the call takes it (``CLAIMED``);
- held, completed: a duplicate of finished work (the stored value);
- held, in flight: a duplicate while the owner works (nil; the script also reads the holder).

Each side runs in pipelined chunks, alternating which goes first, for several
rounds; the script prints the median of each and the ratio native/script.
Uses the server in REDIS_URL (it must have loaded the module), else starts a
redis-server with ``--loadmodule`` on a free port and stops it afterwards.

    python benchmarks/server_cost.py [--module build/native/goblin.so] [--rounds 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from goblin_claim._core import CLAIM
from tests import servers

LEASE = 60
PIPELINE = 1000
TARGET = 0.6
_ids = itertools.count()

# The three kinds of key, and what each side sends for them.
KINDS = ("fresh", "held, completed", "held, in flight")
SIDES = {"script": ("evalsha", "EVALSHA claim.lua"), "native": ("goblin.claim", "GOBLIN.CLAIM")}


@contextlib.contextmanager
def module_server_url(module: str) -> Iterator[str]:
    with server_url("--loadmodule", str(Path(module).resolve())) as url:
        yield url


def keys(count: int) -> list[tuple[str, str]]:
    run = f"{os.getpid()}-{next(_ids)}"
    return [(f"cost:{{{run}-{n}}}:claim", f"cost:{{{run}-{n}}}:result") for n in range(count)]


def arrange(client: redis.Redis, kind: str, pairs: list[tuple[str, str]]) -> None:
    """Put the keys in the state ``kind`` names (nothing for fresh keys)."""
    if kind == "fresh":
        return
    pipe = client.pipeline(transaction=False)
    for claim_key, result_key in pairs:
        if kind == "held, completed":
            pipe.set(claim_key, "done worker-3", ex=LEASE)
            pipe.set(result_key, '{"goblin":1,"kind":"result","fp":null,"value":"charged:txn_551"}', ex=LEASE)
        else:
            pipe.set(claim_key, "worker-3", ex=LEASE)
    pipe.execute()


def send(client: redis.Redis, side: str, pairs: list[tuple[str, str]]) -> None:
    for start in range(0, len(pairs), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for claim_key, result_key in pairs[start : start + PIPELINE]:
            if side == "script":
                pipe.evalsha(CLAIM.sha, 2, claim_key, result_key, "worker-9", LEASE)
            else:
                pipe.execute_command("GOBLIN.CLAIM", claim_key, result_key, "worker-9", LEASE)
        pipe.execute()


def usec_per_call(client: redis.Redis, stat: str) -> float:
    row = client.info("commandstats")[f"cmdstat_{stat}"]
    return float(row["usec"]) / float(row["calls"])


def measure(client: redis.Redis, side: str, kind: str, calls: int) -> float:
    """One chunk of ``calls`` calls of ``side`` on keys of ``kind``: the server's µs per call."""
    pairs = keys(calls)
    arrange(client, kind, pairs)
    client.config_resetstat()
    send(client, side, pairs)
    cost = usec_per_call(client, SIDES[side][0])
    client.delete(*(key for pair in pairs for key in pair))
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=str(servers.MODULE), help="the module to load (without REDIS_URL)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000, help="calls per side, kind and round")
    args = parser.parse_args()
    if not os.environ.get("REDIS_URL") and not Path(args.module).exists():
        raise SystemExit(f"{args.module} not found: run `make native`")
    with module_server_url(args.module) as url:
        client = redis.Redis.from_url(url)
        version = client.info("server")["redis_version"]
        if not client.execute_command("COMMAND INFO", "goblin.claim")[0]:
            raise SystemExit("this server has no GOBLIN.CLAIM: load the module (make native; --loadmodule)")
        client.script_load(CLAIM.source)
        for side in SIDES:  # warm up both
            measure(client, side, "fresh", PIPELINE)
        costs: dict[tuple[str, str], list[float]] = {(k, s): [] for k in KINDS for s in SIDES}
        for round_ in range(args.rounds):
            order = tuple(SIDES) if round_ % 2 == 0 else tuple(reversed(SIDES))
            for kind in KINDS:
                for side in order:
                    costs[kind, side].append(measure(client, side, kind, args.calls))
        client.close()
    print(f"server CPU per call (INFO commandstats usec/calls), redis {version}, "
          f"median of {args.rounds} rounds x {args.calls} calls per side and kind")  # fmt: skip
    print(f"  {'':18} {SIDES['script'][1]:>18} {SIDES['native'][1]:>14} {'native/script':>14}")
    ratios = []
    for kind in KINDS:
        script = statistics.median(costs[kind, "script"])
        native = statistics.median(costs[kind, "native"])
        ratios.append(native / script)
        print(f"  {kind:18} {script:>15.2f} us {native:>11.2f} us {native / script:>14.2f}")
    worst = max(ratios)
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"\ntarget: GOBLIN.CLAIM at most {TARGET} of the script's server cost on every kind: {verdict} "
          f"(worst {worst:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
