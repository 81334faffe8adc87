"""Fencing: a downstream store refuses the late write of an owner whose lease lapsed.

A lease can lapse while its owner is paused (a long GC, a frozen VM); another
worker then takes the work over. When the first one wakes up it may still try to
write. With ``fencing=True`` every owner gets a number that strictly increases per
key, and the store keeps the highest number it has seen: an older owner's write
matches no row and changes nothing.

Runs on an embedded fakeredis, or on the server in REDIS_URL:

    python examples/fencing.py
    REDIS_URL=redis://localhost:6379/0 python examples/fencing.py
"""

from __future__ import annotations

import os
import sqlite3
import time

import redis

from goblin_claim import Claim, Claimed, ClaimLostError


def connect() -> redis.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        print(f"Using the Redis server at {url}")
        return redis.Redis.from_url(url)
    from goblin_claim.testing import fake_redis

    print("Using an embedded fakeredis (set REDIS_URL to use a real server)")
    return fake_redis(native=False)


def open_ledger() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE ledger (order_id TEXT PRIMARY KEY, status TEXT, fence INTEGER NOT NULL)")
    return db


def write(db: sqlite3.Connection, order_id: str, status: str, fence: int) -> bool:
    """Write only if no newer owner has written: the fence must beat the stored one."""
    db.execute("INSERT OR IGNORE INTO ledger VALUES (?, 'new', 0)", (order_id,))
    cursor = db.execute(
        "UPDATE ledger SET status = ?, fence = ? WHERE order_id = ? AND fence < ?",
        (status, fence, order_id, fence),
    )
    db.commit()
    return cursor.rowcount == 1


def main() -> None:
    client = connect()
    db = open_ledger()
    order = f"order-{os.getpid()}-{time.time_ns()}"

    print("\n== worker-1 claims the order, then stalls past its 1 s lease")
    slow = Claim(client, order, lease=1, fencing=True, namespace="fencing-example")
    first = slow.acquire()
    assert isinstance(first, Claimed)
    assert first.fence is not None
    print(f"worker-1 holds fence {first.fence}")
    time.sleep(1.2)

    print("\n== worker-2 finds the lease lapsed and takes the work over")
    fast = Claim(client, order, lease=30, fencing=True, namespace="fencing-example")
    second = fast.acquire()
    assert isinstance(second, Claimed)
    assert second.fence is not None
    print(f"worker-2 holds fence {second.fence} (greater: {second.fence > first.fence})")
    print(f"worker-2 writes 'shipped by worker-2': accepted={write(db, order, 'shipped by worker-2', second.fence)}")
    fast.complete("shipped by worker-2")

    print("\n== worker-1 wakes up and tries to write its stale result")
    print(f"worker-1 writes 'shipped by worker-1': accepted={write(db, order, 'shipped by worker-1', first.fence)}")
    try:
        slow.complete("shipped by worker-1")
    except ClaimLostError:
        print("worker-1's complete() raises ClaimLostError: the claim was taken over")

    (status,) = db.execute("SELECT status FROM ledger WHERE order_id = ?", (order,)).fetchone()
    print(f"\n== the ledger says: {status}")
    slow.forget()
    db.close()
    client.close()


if __name__ == "__main__":
    main()
