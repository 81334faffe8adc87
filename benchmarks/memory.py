"""Bytes per stored record, goblin-claim's kinds beside Powertools', from one run.

Every kind writes ``--records`` records into an emptied redis-server (a day's
ttl, as an idempotency store keeps them), and the table gives ``used_memory``
grown per record, read after ``MEMORY PURGE`` before and after. Ids are of one
length across kinds, and the floor's key is named as a record's, so the key names
cost the same; the values are those the
issue's table names: a 15-byte value for ``Claim`` and the floor, a 2-field
result for the decorator and Powertools.

Needs the ``peers`` dependency group for the Powertools row (``make bench-peers``
installs it; without it the row is left out). Starts its own redis-server on a
free port (``--valkey`` starts the Valkey 9 of ``make valkey-server`` instead).

``--units`` measures what a unit of work adds instead, side by side in one run: a
plain in-flight record (the token), an at-most-once one (``held <deadline> <claimed>
<token>``), a completed record, and an in-flight record with a small checkpoint beside
it; per record ``used_memory`` grown, ``MEMORY USAGE`` of one key, and the value's length.

    python benchmarks/memory.py [--records 20000] [--valkey] [--units]
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from goblin_claim import Claim, idempotent
from goblin_claim._protocol.record import build_keys
from tests.support import servers

TTL = 86400
VALUE = b"x" * 15  # the 15-byte value of the floor and of Claim.complete
CHECKPOINT = b"step=7"  # a small checkpoint: where the work got to
BATCH = 500


class Charge(BaseModel):
    """The decorator's 2-field result."""

    order_id: str
    status: str


def ids(kind: str, count: int) -> Iterator[str]:
    """``count`` ids of one length (``ord-<kind initial>-<n>``, zero-padded)."""
    return (f"ord-{kind[0]}-{n:09d}" for n in range(count))


def used_memory(client: redis.Redis) -> int:
    client.execute_command("MEMORY PURGE")
    return int(client.info("memory")["used_memory"])


def floor(client: redis.Redis, count: int) -> None:
    pipe = client.pipeline(transaction=False)
    for n, key in enumerate(ids("floor", count), 1):
        pipe.set(build_keys("goblin", key)[0], VALUE, ex=TTL)  # the name a Claim's record has
        if n % BATCH == 0:
            pipe.execute()
    pipe.execute()


def claim_completed(client: redis.Redis, count: int, fencing: bool = False) -> None:
    for key in ids("claim", count):
        claim = Claim(client, key, ttl=TTL, fencing=fencing)
        claim.acquire()
        claim.complete(VALUE)


def claim_in_flight(client: redis.Redis, count: int) -> None:
    for key in ids("inflight", count):
        Claim(client, key, lease=TTL).acquire()


def unit_in_flight(client: redis.Redis, count: int, **options: Any) -> None:
    """In-flight records of ``Claim(..., **options)``: acquire only, a lease as long as the ttl."""
    for key in ids("unit", count):
        Claim(client, key, lease=TTL, ttl=TTL, **options).acquire()


def held_in_flight(client: redis.Redis, count: int) -> None:
    """In-flight records of at-most-once claims."""
    unit_in_flight(client, count, at_most_once=True)


def unit_checkpointed(client: redis.Redis, count: int) -> None:
    """In-flight records of checkpointed claims, each with a checkpoint of a small value beside it."""
    for key in ids("unit", count):
        claim = Claim(client, key, lease=TTL, ttl=TTL, checkpoints=True)
        claim.acquire()
        claim.checkpoint(CHECKPOINT)


def unit_completed(client: redis.Redis, count: int) -> None:
    """Completed records (15-byte value) of at-most-once claims: the same as any completed record."""
    for key in ids("unit", count):
        claim = Claim(client, key, lease=TTL, ttl=TTL, at_most_once=True)
        claim.acquire()
        claim.complete(VALUE)


def decorated(client: redis.Redis, count: int) -> None:
    @idempotent(client, key=lambda order_id: order_id, ttl=TTL, keep_alive=False)
    def charge(order_id: str) -> Charge:
        return Charge(order_id=order_id, status="charged")

    for key in ids("deco", count):
        charge(key)


def powertools(client: redis.Redis, count: int) -> None:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer

    logging.getLogger("aws_lambda_powertools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    persistence = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(expires_after_seconds=TTL)

    @idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=config)
    def charge(order: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": order["order_id"], "status": "charged"}

    for key in ids("powertools", count):
        charge(order={"order_id": key})


def have_powertools() -> bool:
    try:
        import aws_lambda_powertools  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def server(valkey: bool) -> Iterator[redis.Redis]:
    binary = servers.valkey_server_binary() if valkey else servers.redis_server_binary()
    if binary is None:
        raise SystemExit(("valkey-server (make valkey-server)" if valkey else "redis-server") + " not found")
    with servers.standalone(binary) as srv:
        client = redis.Redis(host=servers.HOST, port=srv.port)
        try:
            yield client
        finally:
            client.close()


def sample(client: redis.Redis) -> tuple[int, int]:
    """MEMORY USAGE and STRLEN of one key of the last kind written, summed over its record and checkpoint."""
    record = build_keys("goblin", next(ids("unit", 1)))[0]
    usage = length = 0
    for key in (record, f"{record}:checkpoint"):
        if client.exists(key):
            usage += int(client.memory_usage(key, samples=0) or 0)
            length += int(client.strlen(key))
    return usage, length


def units(client: redis.Redis, records: int, name: str, number: str) -> None:
    """``--units``: what at_most_once and checkpoints add to a record, side by side."""
    checkpointed = (
        f"Claim in flight, checkpoints=True, a {len(CHECKPOINT)}-byte checkpoint: the token, the checkpoint key"
    )
    kinds: list[tuple[str, Callable[[redis.Redis, int], None]]] = [
        ("Claim in flight: the token", unit_in_flight),
        ("Claim in flight, at_most_once=True: `held <deadline> <claimed> <token>`", held_in_flight),
        ("Claim completed, at_most_once=True (15-byte value): `done <token> <value>`", unit_completed),
        (checkpointed, unit_checkpointed),
    ]
    for _label, write in kinds:  # the probe, the scripts loaded and the client's buffers, before any counting
        client.execute_command("FLUSHALL", "SYNC")
        write(client, 10)
    rows: list[tuple[str, float, int, int]] = []
    for label, write in kinds:
        client.execute_command("FLUSHALL", "SYNC")
        before = used_memory(client)
        write(client, records)
        keys = client.dbsize()
        rows.append((label, (used_memory(client) - before) / records, *sample(client)))
        print(f"  measured: {label} ({keys} keys)", file=sys.stderr)
    plain = rows[0][1]
    print(f"\nbytes per record, {records} records each, ttl {TTL} s, {name} {number}\n")
    print("| record | used_memory per record | more than in flight | MEMORY USAGE of one | value bytes |")
    print("|---|---|---|---|---|")
    for label, size, usage, length in rows:
        print(f"| {label} | {size:.0f} | {size - plain:+.0f} | {usage} | {length} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--valkey", action="store_true", help="measure on Valkey 9 (make valkey-server)")
    parser.add_argument("--units", action="store_true", help="what at_most_once and checkpoints add to a record")
    args = parser.parse_args()
    if args.units:
        with server(args.valkey) as client:
            version = client.info("server")
            name = "Valkey" if "valkey_version" in version else "Redis"
            units(client, args.records, name, str(version.get("valkey_version") or version["redis_version"]))
        return
    kinds: list[tuple[str, Callable[[redis.Redis, int], None]]] = [
        ("one SET key value EX (15-byte value): the floor for one key", floor),
        ("goblin Claim acquire + complete (15-byte value)", claim_completed),
        ("goblin Claim acquire + complete, fencing=True", lambda c, n: claim_completed(c, n, fencing=True)),
        ("goblin Claim in flight (acquire only)", claim_in_flight),
        ("goblin @idempotent, a 2-field pydantic model", decorated),
    ]
    if have_powertools():
        kinds.append(("Powertools idempotency (Redis layer), a 2-field result", powertools))
    rows: list[tuple[str, float]] = []
    with server(args.valkey) as client:
        version = client.info("server")
        name = "Valkey" if "valkey_version" in version else "Redis"
        number = version.get("valkey_version") or version["redis_version"]
        for label, write in kinds:
            client.execute_command("FLUSHALL", "SYNC")  # freed now, not by a lazy-free thread meanwhile
            before = used_memory(client)
            write(client, args.records)
            keys = client.dbsize()
            rows.append((label, (used_memory(client) - before) / args.records))
            print(f"  measured: {label} ({keys} keys)", file=sys.stderr)
    floor_bytes = rows[0][1]
    by_label = dict(rows)
    pt = by_label.get("Powertools idempotency (Redis layer), a 2-field result")
    print(f"\nbytes per record, {args.records} records each, ttl {TTL} s, {name} {number}\n")
    print("| record | bytes per record | / floor | / Powertools |")
    print("|---|---|---|---|")
    for label, size in rows:
        against_pt = f"{size / pt:.2f}x" if pt else "-"
        print(f"| {label} | {size:.0f} | {size / floor_bytes:.2f}x | {against_pt} |")


if __name__ == "__main__":
    main()
