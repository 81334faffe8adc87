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

    python benchmarks/memory.py [--records 20000] [--valkey]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--valkey", action="store_true", help="measure on Valkey 9 (make valkey-server)")
    args = parser.parse_args()
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
