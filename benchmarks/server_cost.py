"""What a claim, a release and a renewal cost the server: the scripts, the module, the built-in owner checks.

Reads ``INFO commandstats`` (``usec`` / ``calls``: the server's own CPU time per
call, round trips excluded). First the SDK's claim script (``EVALSHA``, what the
SDK sends where nothing else serves) against ``GOBLIN.CLAIM`` (the reference module)
and the server's own ``SET ... NX GET`` (what the SDK sends on Redis 7.0 and later for
a one-key record: its key holds the record itself), on the same server in one run,
for three kinds of key:

- fresh: the claim is free, so the call takes it (``CLAIMED``);
- held, completed: a duplicate of finished work (the stored value);
- held, in flight: a duplicate while the owner works (nil; the script also reads the holder).

Then, on a valkey-server that loaded the module too (``make valkey-server``), the
owner-checked writes: release as the script (``EVALSHA release.lua``), as
``GOBLIN.CAD`` and as Valkey's ``DELIFEQ``; extend as the script (``EVALSHA
extend.lua``) and as ``SET ... IFEQ ... EX``; each on a claim held by the token
(it deletes, or renews) and on one held by another (it does nothing). The last
rows are a release as the SDK sends it, with its waiters' wake-up: the script
announces inside itself, a native delete has a ``PUBLISH`` pipelined behind it
(both commands' time counted).

Each side runs in pipelined chunks, alternating which goes first, for several
rounds; the script prints the median of each and the ratios. Uses the server in
REDIS_URL for the claim table (it must have loaded the module), else starts a
redis-server with ``--loadmodule`` on a free port and stops it afterwards.

    python benchmarks/server_cost.py [--module build/native/goblin.so] [--valkey build/valkey/valkey-server]
                                     [--rounds 7] [--calls 20000]
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
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from goblin_claim._protocol.scripts import CLAIM, EXTEND, RELEASE
from tests.support import servers

LEASE = 60
PIPELINE = 1000
TARGET = 0.6
_ids = itertools.count()

# The three kinds of key, and what each side sends for them.
KINDS = ("fresh", "held, completed", "held, in flight")
SIDES = {
    "script": ("evalsha", "EVALSHA claim.lua"),
    "native": ("goblin.claim", "GOBLIN.CLAIM"),
    "own": ("set", "SET NX GET"),
}
RESULT = '{"goblin":1,"kind":"result","fp":null,"value":"charged:txn_551"}'


@contextlib.contextmanager
def module_server_url(module: str) -> Iterator[str]:
    with server_url("--loadmodule", str(Path(module).resolve())) as url:
        yield url


def keys(count: int) -> list[tuple[str, str]]:
    run = f"{os.getpid()}-{next(_ids)}"
    return [(f"cost:{{{run}-{n}}}:claim", f"cost:{{{run}-{n}}}:result") for n in range(count)]


def arrange(client: redis.Redis, kind: str, pairs: list[tuple[str, str]], one_key: bool = False) -> None:
    """Put the keys in the state ``kind`` names (nothing for fresh keys); ``one_key``: the record in the claim key."""
    if kind == "fresh":
        return
    pipe = client.pipeline(transaction=False)
    for claim_key, result_key in pairs:
        if kind == "held, completed" and one_key:
            pipe.set(claim_key, f"done worker-3 {RESULT}", ex=LEASE)
        elif kind == "held, completed":
            pipe.set(claim_key, "done worker-3", ex=LEASE)
            pipe.set(result_key, RESULT, ex=LEASE)
        else:
            pipe.set(claim_key, "worker-3", ex=LEASE)
    pipe.execute()


def send(client: redis.Redis, side: str, pairs: list[tuple[str, str]]) -> None:
    for start in range(0, len(pairs), PIPELINE):
        pipe = client.pipeline(transaction=False)
        for claim_key, result_key in pairs[start : start + PIPELINE]:
            if side == "script":
                pipe.evalsha(CLAIM.sha, 2, claim_key, result_key, "worker-9", LEASE)
            elif side == "own":  # the one-key record: the claim key holds it
                pipe.execute_command("SET", claim_key, "worker-9", "NX", "GET", "EX", LEASE, get=True)
            else:
                pipe.execute_command("GOBLIN.CLAIM", claim_key, result_key, "worker-9", LEASE)
        pipe.execute()


def usec_per_call(client: redis.Redis, stat: str) -> float:
    row = client.info("commandstats")[f"cmdstat_{stat}"]
    return float(row["usec"]) / float(row["calls"])


def measure(client: redis.Redis, side: str, kind: str, calls: int) -> float:
    """One chunk of ``calls`` calls of ``side`` on keys of ``kind``: the server's µs per call."""
    pairs = keys(calls)
    arrange(client, kind, pairs, one_key=side == "own")
    client.config_resetstat()
    send(client, side, pairs)
    cost = usec_per_call(client, SIDES[side][0])
    client.delete(*(key for pair in pairs for key in pair))
    return cost


# --------------------------------------------------------------------------- owner-checked writes

TOKEN = "worker-3"
OWNER_KINDS = ("held by the token", "held by another")
# operation -> side -> (the commandstats rows it costs, its label)
OWNER_SIDES: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {
    "release": {
        "script": (("evalsha",), "EVALSHA release.lua"),
        "module": (("goblin.cad",), "GOBLIN.CAD"),
        "builtin": (("delifeq",), "DELIFEQ"),
    },
    "extend": {
        "script": (("evalsha",), "EVALSHA extend.lua"),
        "builtin": (("set",), "SET IFEQ EX"),
    },
    "release + wake-up": {
        "script": (("evalsha",), "EVALSHA (PUBLISH in)"),
        "module": (("goblin.cad", "publish"), "GOBLIN.CAD+PUBLISH"),
        "builtin": (("delifeq", "publish"), "DELIFEQ+PUBLISH"),
    },
}


def queue_owner(pipe: Any, operation: str, side: str, key: str) -> None:
    """Queue one owner-checked write of ``operation`` on ``key`` by TOKEN, as ``side`` sends it."""
    wake = operation == "release + wake-up"
    if operation == "extend":
        if side == "script":
            pipe.evalsha(EXTEND.sha, 1, key, TOKEN, LEASE)
        else:
            pipe.execute_command("SET", key, TOKEN, "IFEQ", TOKEN, "EX", LEASE)
        return
    if side == "script":
        pipe.evalsha(RELEASE.sha, 1, key, TOKEN, *(("publish",) if wake else ()))
    else:
        pipe.execute_command("GOBLIN.CAD" if side == "module" else "DELIFEQ", key, TOKEN)
        if wake:
            pipe.execute_command("PUBLISH", key, "free")


def measure_owner(client: redis.Redis, operation: str, side: str, kind: str, calls: int) -> float:
    """One chunk of ``calls`` writes of ``operation`` by ``side`` on claims of ``kind``: the server's µs per write."""
    run = f"{os.getpid()}-{next(_ids)}"
    claim_keys = [f"cost:{{{run}-{n}}}:claim" for n in range(calls)]
    pipe = client.pipeline(transaction=False)
    for key in claim_keys:
        pipe.set(key, TOKEN if kind == "held by the token" else "worker-9", ex=LEASE)
    pipe.execute()
    client.config_resetstat()
    for start in range(0, calls, PIPELINE):
        pipe = client.pipeline(transaction=False)
        for key in claim_keys[start : start + PIPELINE]:
            queue_owner(pipe, operation, side, key)
        pipe.execute()
    stats = client.info("commandstats")
    usec = sum(float(stats[f"cmdstat_{row}"]["usec"]) for row in OWNER_SIDES[operation][side][0])
    client.delete(*claim_keys)
    return usec / calls


def owner_costs(binary: str, module: str, rounds: int, calls: int) -> tuple[str, dict[tuple[str, str, str], float]]:
    """The median µs per write of every operation, side and kind, on a valkey-server with the module."""
    with servers.standalone(binary, "--loadmodule", str(Path(module).resolve())) as server:
        client = server.client()
        version = client.info("server").get("valkey_version") or client.info("server")["redis_version"]
        if not all(client.execute_command("COMMAND INFO", "delifeq", "goblin.cad")):
            raise SystemExit(f"{binary} lacks DELIFEQ or did not load the module: Valkey 9 and `make native`")
        client.script_load(RELEASE.source)
        client.script_load(EXTEND.source)
        samples: dict[tuple[str, str, str], list[float]] = {}
        for operation, sides in OWNER_SIDES.items():
            for side in sides:  # warm up every side
                measure_owner(client, operation, side, OWNER_KINDS[0], PIPELINE)
        for round_ in range(rounds):
            for operation, sides in OWNER_SIDES.items():
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for kind in OWNER_KINDS:
                    for side in order:
                        cost = measure_owner(client, operation, side, kind, calls)
                        samples.setdefault((operation, side, kind), []).append(cost)
        client.close()
    return version, {name: statistics.median(values) for name, values in samples.items()}


def print_owner_costs(version: str, costs: dict[tuple[str, str, str], float], rounds: int, calls: int) -> None:
    print(f"\nowner-checked writes, server CPU per write (INFO commandstats usec/calls), valkey {version} "
          f"with the module, median of {rounds} rounds x {calls} writes per side and kind")  # fmt: skip
    print(f"  {'':20} {'':18} {'script':>22} {'module':>20} {'built-in':>18} {'built-in/script':>16}")
    for operation, sides in OWNER_SIDES.items():
        for kind in OWNER_KINDS:
            script = costs[operation, "script", kind]
            module = f"{costs[operation, 'module', kind]:.2f} us" if "module" in sides else "-"
            builtin = costs[operation, "builtin", kind]
            print(f"  {operation:20} {kind:18} {script:>19.2f} us {module:>20} {builtin:>15.2f} us "
                  f"{builtin / script:>16.2f}")  # fmt: skip
    print("  labels: " + "; ".join(f"{op}: " + ", ".join(label for _, label in sides.values())
                                   for op, sides in OWNER_SIDES.items()))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=str(servers.MODULE), help="the module to load (without REDIS_URL)")
    parser.add_argument("--valkey", default=str(servers.VALKEY_SERVER), help="the valkey-server for the owner checks")
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
        for side in SIDES:  # warm up every side
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
    print(f"  {'':18} {SIDES['script'][1]:>18} {SIDES['native'][1]:>14} {'native/script':>14} "
          f"{SIDES['own'][1]:>12} {'own/script':>11}")  # fmt: skip
    ratios = []
    for kind in KINDS:
        script = statistics.median(costs[kind, "script"])
        native = statistics.median(costs[kind, "native"])
        own = statistics.median(costs[kind, "own"])
        ratios.append(native / script)
        print(f"  {kind:18} {script:>15.2f} us {native:>11.2f} us {native / script:>14.2f} "
              f"{own:>9.2f} us {own / script:>11.2f}")  # fmt: skip
    worst = max(ratios)
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"\ntarget: GOBLIN.CLAIM at most {TARGET} of the script's server cost on every kind: {verdict} "
          f"(worst {worst:.2f})")  # fmt: skip
    if not os.access(args.valkey, os.X_OK):
        raise SystemExit(f"{args.valkey} not found: run `make valkey-server` for the owner-check table")
    valkey_version, owner = owner_costs(args.valkey, args.module, args.rounds, args.calls)
    print_owner_costs(valkey_version, owner, args.rounds, args.calls)


if __name__ == "__main__":
    main()
