"""Whether cost grows as it should: per record with records stored, per claim with live keep-alives.

Two series, from one run on one redis-server of its own (on a free port):

- **Records stored.** For 10^4, 10^5 and 10^6 completed ``@idempotent`` records
  (the 2-field pydantic result of ``benchmarks/memory.py``, a day's ttl), each
  size in a database of its own, filled one after another on the emptied server:
  bytes per record (``used_memory`` grown by the fill, after ``MEMORY PURGE``, as
  ``memory.py`` reads it); then the median and p99 latency of a duplicate call (a
  stored key picked at random) and of a first call (a new key, forgotten after
  its round so each size stays exact), sync, with every size and both kinds
  interleaved in rounds so that a busy moment of a shared machine falls on all of
  them. A store's cost at scale should not grow with its size.
- **Live keep-alives.** For 10^2, 10^3 and 10^4 claims held under ``keep_alive()``
  (3 s leases, renewed about every second) for ``--hold`` seconds, sync (the
  renewer's threads) and asyncio (the event loop): the process's CPU seconds per
  wall second, per claim and per renewal, the renewer threads' own share (sync),
  the server's CPU per renewal (its idle CPU taken off), the least lease left on
  any claim at the end, and how many were lost, beside an idle row (no claims
  held, measured the same way). CPU per claim should stay about constant.

Every table ends with each size's ratio to the smallest one, computed from the
measurements. The records are filled fast: the calls the decorator makes for each
key (claim, then complete with its encoded result), pipelined a batch at a time
rather than one call after another. That the stored records are exactly the
decorator's is checked before anything is measured: records written by the
decorator itself and by the fill have the same keys, types, lengths and ttl, and
filled keys read back through the decorator give the stored result without
running the function (also checked on every duplicate measured).

    python benchmarks/scaling.py [--max 1000000] [--calls 3000] [--hold 7] [--no-async] [--valkey]

``--max 100000`` stops the records series at 10^5 for a quick run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import TTL, Charge, server, used_memory
from renewals import LEASE, renewer_cpu

from goblin_claim import AsyncClaim, Claim, idempotent
from goblin_claim._clients.transport import reply_encoding
from goblin_claim._drivers.wakeup import wake_kind
from goblin_claim._protocol.record import new_token
from goblin_claim._protocol.scripts import CLAIM, COMPLETE, script_command

RECORDS = (10_000, 100_000, 1_000_000)
CLAIMS = (100, 1_000, 10_000)
BATCH = 1000  # keys per pipeline while filling (two commands each)
ROUNDS = 10  # the latency calls go in this many rounds over every size and both kinds
_CLAIMED = (b"CLAIMED", "CLAIMED")


def order_id(n: int) -> str:
    """The n-th order id: one length for every n (as ``memory.py``'s ids), so key names cost the same."""
    return f"ord-d-{n:09d}"


def decorated(client: redis.Redis, runs: list[int]) -> Any:
    """The measured function: ``@idempotent`` with a day's ttl, counting its executions in ``runs``."""

    @idempotent(client, key="order_id", ttl=TTL)
    def charge(order_id: str) -> Charge:
        runs[0] += 1
        return Charge(order_id=order_id, status="charged")

    return charge


def fill(client: redis.Redis, charge: Any, ids: Sequence[str]) -> None:
    """Store a completed record for each id, as ``charge(order_id=id)`` would, a pipeline per batch.

    For each key the decorator's own steps make the handle (key, fingerprint and
    the token that carries it) and encode the result; what goes out is the claim
    and the complete the decorator sends for a first call, in that order on one
    connection. A reply other than "claimed" and "stored" stops the run.
    """
    spec = charge._goblin_spec
    encoding, wake = reply_encoding(client), wake_kind(client)
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(ids), BATCH):
        for key in ids[start : start + BATCH]:
            call = spec.prepare((key,), {})
            handle = spec.handle(Claim, call)
            # No fingerprint in the envelope: the decorator's record carries it in its token.
            payload = spec.codec.encode_result(Charge(order_id=key, status="charged"), None, call.key)
            pipe.execute_command(*handle._claim_command(None))  # no native command: the claim script
            script, args = handle._complete_call(payload, *encoding, wake)
            pipe.execute_command(*script_command(script, args))
        replies = pipe.execute()
        claims, completes = replies[0::2], replies[1::2]
        if not all(reply in _CLAIMED for reply in claims) or not all(reply == 1 for reply in completes):
            bad = next(r for r in replies if r not in _CLAIMED and r != 1)
            raise SystemExit(f"fill: unexpected reply {bad!r} (is the server empty?)")


def shape(client: redis.Redis, key: str) -> list[tuple[str, str, int, bool]]:
    """Every Redis key of one record: its name (the id replaced), type, length, and whether it lives about ``TTL``."""
    found = []
    for name in sorted(client.scan_iter(match=f"*{key}*", count=1000)):
        text = name.decode() if isinstance(name, bytes) else name
        kind = client.type(name)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        size = int(client.strlen(name)) if kind == "string" else int(client.memory_usage(name) or 0)
        ttl = int(client.ttl(name))
        found.append((text.replace(key, "<id>"), kind, size, TTL - 120 <= ttl <= TTL))
    return found


def check_fill(client: redis.Redis, charge: Any, runs: list[int], pairs: int = 50) -> None:
    """Refuse to measure unless the fill stores exactly what the decorator does.

    ``pairs`` records each way, interleaved so that their tokens (a process prefix
    and a counter) have one length: the decorator's record and the filled one must
    match key for key, and a filled key read back through the decorator must give
    the stored result without running the function.
    """
    client.execute_command("FLUSHALL", "SYNC")
    for _ in range(0x1000):  # tokens' counters past 0xfff: every token below has 4 hex digits
        new_token()
    for n in range(pairs):
        by_decorator, by_fill = f"ord-r-{n:09d}", f"ord-f-{n:09d}"
        charge(by_decorator)
        fill(client, charge, [by_fill])
        expected, got = shape(client, by_decorator), shape(client, by_fill)
        if not expected or got != expected:
            raise SystemExit(f"the fill does not store what @idempotent stores:\n  {expected}\n  {got}")
    before = runs[0]
    for n in range(pairs):
        key = f"ord-f-{n:09d}"
        if charge(key) != Charge(order_id=key, status="charged"):
            raise SystemExit(f"a filled record read back unequal: {key}")
    if runs[0] != before:
        raise SystemExit(f"reading filled records back ran the function {runs[0] - before} times")
    print(f"  checked: {pairs} filled records match @idempotent's own, key for key: {expected}", file=sys.stderr)
    client.execute_command("FLUSHALL", "SYNC")


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Store:
    """One size of the records series: its database, its decorated function, and what was measured on it."""

    def __init__(self, client: redis.Redis, size: int) -> None:
        self.client, self.size = client, size
        self.runs = [0]
        self.charge = decorated(client, self.runs)
        self.rng = random.Random(size)
        self.fresh = size  # the next new order id: past every stored one
        self.duplicates: list[float] = []
        self.firsts: list[float] = []

    def measure_duplicates(self, count: int) -> None:
        """``count`` duplicate calls on random stored keys; each must replay its result without running."""
        before, clock = self.runs[0], time.perf_counter_ns
        for _ in range(count):
            key = order_id(self.rng.randrange(self.size))
            started = clock()
            result = self.charge(key)
            self.duplicates.append((clock() - started) / 1000)
            if result.order_id != key:
                raise SystemExit(f"a duplicate of {key} returned {result!r}")
        if self.runs[0] != before:
            raise SystemExit(f"duplicate calls ran the function {self.runs[0] - before} times")

    def measure_firsts(self, count: int) -> None:
        """``count`` first calls on new keys, each running the function; then forgotten, so ``size`` stays exact."""
        before, clock = self.runs[0], time.perf_counter_ns
        keys = [order_id(n) for n in range(self.fresh, self.fresh + count)]
        self.fresh += count
        for key in keys:
            started = clock()
            self.charge(key)
            self.firsts.append((clock() - started) / 1000)
        if self.runs[0] != before + count:
            raise SystemExit(f"{count} first calls ran the function {self.runs[0] - before} times")
        for key in keys:
            self.charge.forget(key)


def latencies(stores: Sequence[Store], calls: int) -> None:
    """Duplicate and first-call latencies on every store, interleaved in time.

    Each of ``ROUNDS`` rounds visits every size (the order rotating) and runs a
    block of each kind there (which goes first alternating), so a busy moment
    on a shared machine falls on every size and both kinds alike, not on one.
    """
    for store in stores:  # warm-up: connections, scripts, caches
        store.measure_duplicates(200)
        store.measure_firsts(200)
        store.duplicates.clear()
        store.firsts.clear()
    per_round = max(1, calls // ROUNDS)
    for n in range(ROUNDS if stores else 0):
        for store in [*stores[n % len(stores) :], *stores[: n % len(stores)]]:
            if n % 2 == 0:
                store.measure_duplicates(per_round)
                store.measure_firsts(per_round)
            else:
                store.measure_firsts(per_round)
                store.measure_duplicates(per_round)


def records_series(client: redis.Redis, sizes: Sequence[int], calls: int) -> list[dict[str, float]]:
    """Bytes per record at each size, then call latencies on all sizes at once.

    Each size fills a database of its own (``SELECT``), one after another on the
    emptied server: a database's records are its own hash table, and ``used_memory``
    grows by exactly what its fill stored. The latencies are then measured on all
    of them, interleaved.
    """
    check = Store(client, 0)
    client.script_load(CLAIM.source)  # the fill sends EVALSHA, before any call has loaded them
    client.script_load(COMPLETE.source)
    check_fill(client, check.charge, check.runs)
    client.execute_command("FLUSHALL", "SYNC")  # freed now, not by a lazy-free thread meanwhile
    where = client.connection_pool.connection_kwargs
    stores, rows = [], []
    for db, size in enumerate(sizes, 1):
        store = Store(redis.Redis(host=where["host"], port=where["port"], db=db), size)
        gc.collect()
        before = used_memory(client)
        started = time.monotonic()
        fill(store.client, store.charge, [order_id(n) for n in range(size)])
        filled = time.monotonic() - started
        per_record = (used_memory(client) - before) / size
        keys = int(store.client.dbsize())
        print(
            f"  filled {size:,} records ({keys:,} keys) in {filled:.1f} s: {per_record:.0f} B/record", file=sys.stderr
        )
        stores.append(store)
        rows.append({"size": size, "keys": keys / size, "bytes": per_record, "fill": filled})
    latencies(stores, calls)
    for store, row in zip(stores, rows, strict=True):
        if store.client.dbsize() != round(row["keys"] * store.size):
            raise SystemExit(f"{store.size:,} records: the first calls' records were not all forgotten")
        row.update(
            dup_median=statistics.median(store.duplicates),
            dup_p99=percentile(store.duplicates, 0.99),
            first_median=statistics.median(store.firsts),
            first_p99=percentile(store.firsts, 0.99),
            calls=len(store.duplicates),
        )
        store.client.close()
    return rows


def server_cpu(client: redis.Redis) -> float:
    """The server's CPU seconds so far (user and system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def least_pttl(client: redis.Redis, keys: Sequence[str]) -> int:
    """The least milliseconds left on any of ``keys`` (-2 when one is gone)."""
    least = LEASE * 1000
    for start in range(0, len(keys), BATCH):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + BATCH]:
            pipe.pttl(key)
        least = min(least, *(int(left) for left in pipe.execute()))
    return least


def hold_sync(url: str, claims: int, hold: float) -> dict[str, float]:
    """``claims`` claims under sync keep-alives for ``hold`` seconds, measured with nothing else running."""
    client = redis.Redis.from_url(url)
    probe = redis.Redis.from_url(url)
    namespace = f"bench-scale-{time.monotonic_ns()}"
    keys = [f"k{i}" for i in range(claims)]
    handles = [h for h, _ in Claim.acquire_many(client, keys, lease=LEASE, namespace=namespace)]
    with contextlib.ExitStack() as stack:
        keepers = [stack.enter_context(h.keep_alive()) for h in handles]
        time.sleep(LEASE / 3)  # every keep-alive registered and on its schedule
        renewed = sum(k.renewals for k in keepers)
        served, threads = server_cpu(probe), renewer_cpu()
        cpu, began = time.process_time(), time.monotonic()
        time.sleep(hold)  # the main thread does nothing meanwhile: the process's CPU is the renewer's
        cpu, spent = time.process_time() - cpu, time.monotonic() - began
        threads, served = renewer_cpu() - threads, server_cpu(probe) - served
        renewed = sum(k.renewals for k in keepers) - renewed
        lowest = least_pttl(probe, [h.claim_key for h in handles])
    lost = sum(k.lost for k in keepers)
    probe.execute_command("FLUSHALL", "SYNC")  # no lease left to expire while the next size is measured
    client.close()
    probe.close()
    return _hold_row(claims, spent, cpu, threads, served, renewed, lowest, lost)


async def hold_async(url: str, claims: int, hold: float) -> dict[str, float]:
    """``claims`` claims under asyncio keep-alives for ``hold`` seconds; the loop only sleeps besides."""
    client = redis.asyncio.Redis.from_url(url)
    probe = redis.Redis.from_url(url)
    namespace = f"bench-scale-async-{time.monotonic_ns()}"
    keys = [f"k{i}" for i in range(claims)]
    handles = [h for h, _ in await AsyncClaim.acquire_many(client, keys, lease=LEASE, namespace=namespace)]
    async with contextlib.AsyncExitStack() as stack:
        keepers = [await stack.enter_async_context(h.keep_alive()) for h in handles]
        await asyncio.sleep(LEASE / 3)
        renewed = sum(k.renewals for k in keepers)
        served = server_cpu(probe)
        cpu, began = time.process_time(), time.monotonic()
        await asyncio.sleep(hold)
        cpu, spent = time.process_time() - cpu, time.monotonic() - began
        served = server_cpu(probe) - served
        renewed = sum(k.renewals for k in keepers) - renewed
        lowest = least_pttl(probe, [h.claim_key for h in handles])
    lost = sum(k.lost for k in keepers)
    probe.execute_command("FLUSHALL", "SYNC")
    await client.aclose()
    probe.close()
    return _hold_row(claims, spent, cpu, None, served, renewed, lowest, lost)


def _hold_row(
    claims: int, spent: float, cpu: float, threads: float | None, served: float, renewed: int, lowest: int, lost: int
) -> dict[str, float]:
    row = {
        "size": claims,
        "rate": renewed / spent,
        "cpu": cpu / spent,
        "per_claim": cpu / spent / claims * 1e6 if claims else float("nan"),
        "per_renewal": cpu / renewed * 1e6 if renewed else float("nan"),
        "server": served / spent,
        "lowest": lowest,
        "lost": lost,
    }
    if threads is not None:
        row["threads"] = threads / spent
    return row


def ratio(rows: list[dict[str, float]], field: str, i: int) -> str:
    """Row ``i``'s ``field`` against the first row's, as the growth factor."""
    first = rows[0][field]
    return f"{rows[i][field] / first:.2f}x" if first else "-"


def power(n: float) -> str:
    """10^k for a power of ten, else the number."""
    k = len(str(int(n))) - 1
    return f"10^{k}" if n == 10**k else f"{int(n):,}"


def print_table(title: str, headers: Sequence[str], cells: Sequence[Sequence[str]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in cells:
        print("| " + " | ".join(row) + " |")


def print_records(rows: list[dict[str, float]], name: str) -> None:
    size0 = power(rows[0]["size"])
    print_table(
        f"bytes per completed @idempotent record, by records stored (ttl {TTL} s, {name})",
        ["records stored", "keys per record", "bytes per record", f"/ {size0}", "fill s"],
        [
            [power(r["size"]), f"{r['keys']:.2f}", f"{r['bytes']:.0f}", ratio(rows, "bytes", i), f"{r['fill']:.1f}"]
            for i, r in enumerate(rows)
        ],
    )
    for kind, label in (("dup", "duplicate call (a stored key at random)"), ("first", "first call (a new key)")):
        print_table(
            f"@idempotent (sync) {label}, µs, {int(rows[0]['calls'])} calls per size",
            ["records stored", "median", f"/ {size0}", "p99", f"/ {size0}"],
            [
                [
                    power(r["size"]),
                    f"{r[kind + '_median']:.0f}",
                    ratio(rows, kind + "_median", i),
                    f"{r[kind + '_p99']:.0f}",
                    ratio(rows, kind + "_p99", i),
                ]
                for i, r in enumerate(rows)
            ],
        )


def print_claims(idle: dict[str, float], rows: list[dict[str, float]], flavour: str, hold: float) -> None:
    """The keep-alive table: an idle row (no claims held), then each size with its growth per claim.

    The server's CPU per renewal has the idle server's own (its timers) taken off.
    """
    size0 = power(rows[0]["size"])
    headers = ["live claims", "renewals/s", "process CPU s/s", "CPU µs per claim-second", f"/ {size0}", "/ previous"]
    headers.append("CPU µs per renewal")
    threads = "threads" in idle
    if threads:
        headers.append("renewer threads CPU s/s")
    headers += ["server CPU s/s", "server CPU µs per renewal", "least lease left ms", "lost"]
    first = ["0 (idle)", "0", f"{idle['cpu']:.4f}", "-", "-", "-", "-"]
    first += [f"{idle['threads']:.4f}"] if threads else []
    cells = [[*first, f"{idle['server']:.4f}", "-", "-", f"{int(idle['lost'])}"]]
    for i, r in enumerate(rows):
        previous = f"{r['per_claim'] / rows[i - 1]['per_claim']:.2f}x" if i else "-"
        row = [power(r["size"]), f"{r['rate']:,.0f}", f"{r['cpu']:.4f}", f"{r['per_claim']:.1f}"]
        row += [ratio(rows, "per_claim", i), previous, f"{r['per_renewal']:.1f}"]
        row += [f"{r['threads']:.4f}"] if threads else []
        server = (r["server"] - idle["server"]) / r["rate"] * 1e6 if r["rate"] else float("nan")
        row += [f"{r['server']:.4f}", f"{server:.1f}", f"{int(r['lowest'])}", f"{int(r['lost'])}"]
        cells.append(row)
    print_table(f"keep-alive cost, {flavour}, {LEASE} s leases, held {hold:.0f} s", headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max", type=int, default=RECORDS[-1], help="the most records stored (10^5: a quick run)")
    parser.add_argument("--calls", type=int, default=3000, help="calls of each kind measured per size")
    parser.add_argument("--hold", type=float, default=7.0, help="seconds the keep-alives are measured")
    parser.add_argument("--max-claims", type=int, default=CLAIMS[-1])
    parser.add_argument("--no-async", action="store_true", help="skip the asyncio keep-alive series")
    parser.add_argument("--valkey", action="store_true", help="measure on Valkey 9 (make valkey-server)")
    args = parser.parse_args()
    sizes = [n for n in RECORDS if n <= args.max]
    claims = [n for n in CLAIMS if n <= args.max_claims]
    with server(args.valkey) as client:
        version = client.info("server")
        valkey = version.get("valkey_version")
        name = f"Valkey {valkey}" if valkey else f"Redis {version['redis_version']}"
        records = records_series(client, sizes, args.calls)
        client.execute_command("FLUSHALL", "SYNC")
        pool = client.connection_pool.connection_kwargs
        url = f"redis://{pool['host']}:{pool['port']}/0"
        held: list[tuple[str, Callable[[int], dict[str, float]]]] = [
            ("sync (renewer threads)", lambda n: hold_sync(url, n, args.hold))
        ]
        if not args.no_async:
            held.append(("asyncio (event loop)", lambda n: asyncio.run(hold_async(url, n, args.hold))))
        kept = []
        for flavour, hold in held if claims else ():
            idle = hold(0)  # the process and the server with no claim held: what every row has anyway
            rows = []
            for n in claims:
                rows.append(hold(n))
                print(f"  held {n:,} claims, {flavour}: {rows[-1]['cpu']:.4f} CPU s/s", file=sys.stderr)
            kept.append((flavour, idle, rows))
    if records:
        print_records(records, name)
    for flavour, idle, rows in kept:
        print_claims(idle, rows, flavour, args.hold)


if __name__ == "__main__":
    main()
