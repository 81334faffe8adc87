"""A Redis Streams consumer group that runs every message once: XREADGROUP, acquire_many, XACK, XAUTOCLAIM.

A batch's claims are reserved for a few seconds only (``acquire_many(lease=2)``);
a message takes the full lease when it starts (``extend(lease=30)``, owner-checked:
``ClaimLostError`` means the reservation lapsed and another consumer took the
message, so this one skips it); on shutdown the unstarted claims go back in one
round trip (``release_many``). A consumer killed mid-batch leaves only
reservations behind: the survivor's XAUTOCLAIM takes those messages over within
seconds, not a lease.

    python examples/streams_consumer.py           # the story, on an embedded fakeredis
    REDIS_URL=redis://localhost:6379/0 python examples/streams_consumer.py
    REDIS_URL=redis://localhost:6379/0 python examples/streams_consumer.py consume NAME
                                                  # one consumer, until SIGTERM or Ctrl-C
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import redis

from goblin_claim import Claim, Claimed, ClaimLostError, Completed

STREAM = os.environ.get("STREAM", "demo-payments")
GROUP = "chargers"
NAMESPACE = os.environ.get("NAMESPACE", "demo-streams")
LEDGER = f"{NAMESPACE}:ledger"  # the side effect's own record (a real one: the payment provider)
BATCH = int(os.environ.get("BATCH", "12"))
WORK = float(os.environ.get("WORK", "0.2"))  # seconds per message: a batch outlasts its reservation
RESERVE = 2  # seconds a batch's claims are held before their messages start
LEASE = 30  # seconds a started message's claim is held (renew longer work with claim.keep_alive())
IDLE_MS = 1000  # pending this long without an ack, a message is taken over by XAUTOCLAIM


def connect() -> redis.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        print(f"Using the Redis server at {url}")
        return redis.Redis.from_url(url)
    from goblin_claim.testing import fake_redis

    print("Using an embedded fakeredis that knows GOBLIN.CLAIM (set REDIS_URL to use a real server)")
    return fake_redis(native=True)


def charge(client: redis.Redis, consumer: str, event: str) -> bytes:
    """The side effect: one charge per run, counted, so a second run of an event would show."""
    client.incr(f"{NAMESPACE}:charges:{event}")
    client.rpush(LEDGER, json.dumps({"event": event, "by": consumer, "at": time.time()}))
    time.sleep(WORK)  # the provider's slow confirmation
    return f"receipt-{event}".encode()


def _entries(reply: Any) -> list[Any]:
    """XREADGROUP's entries, from its RESP2 list or its RESP3 map."""
    streams = reply.values() if isinstance(reply, dict) else [entries for _name, entries in reply or []]
    return [
        entry for entries in streams for entry in (entries[0] if entries and isinstance(entries[0], list) else entries)
    ]


_cursors: dict[str, bytes] = {}  # per consumer: where its XAUTOCLAIM scan of the pending list goes on


def read_batch(client: redis.Redis, consumer: str) -> list[tuple[bytes, str]]:
    """Up to BATCH messages: first those pending too long with another consumer, then new ones."""
    # A consumer that died, or is slow, leaves messages pending: after IDLE_MS they move here.
    start = _cursors.get(consumer, b"0-0")
    reply = client.xautoclaim(STREAM, GROUP, consumer, min_idle_time=IDLE_MS, start_id=start, count=BATCH)
    _cursors[consumer] = reply[0]  # resume the scan there: messages in flight elsewhere do not starve the rest
    messages = list(reply[1])
    if len(messages) < BATCH:
        messages += _entries(client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=BATCH - len(messages)))
    return [(message_id, fields[b"event"].decode()) for message_id, fields in messages if fields]


def process(
    client: redis.Redis, consumer: str, batch: list[tuple[bytes, str]], stop: threading.Event, die_after: int = -1
) -> int:
    """Run one batch; returns how many of its messages this consumer charged.

    ``die_after`` simulates ``kill -9`` after that many charges (nothing given back, nothing acked).
    """
    pairs = Claim.acquire_many(client, [event for _, event in batch], lease=RESERVE, namespace=NAMESPACE)
    # Claimed and not yet started: what a shutdown gives back.
    unstarted = {id(claim): claim for claim, outcome in pairs if isinstance(outcome, Claimed)}
    charged = 0
    try:
        for (message_id, event), (claim, outcome) in zip(batch, pairs, strict=True):
            if isinstance(outcome, Completed):
                client.xack(STREAM, GROUP, message_id)  # done before: a redelivery, or a duplicate XADD
                continue
            if not isinstance(outcome, Claimed):
                continue  # in flight elsewhere (or a failure): it stays pending, XAUTOCLAIM brings it back
            if stop.is_set():
                break
            del unstarted[id(claim)]
            if not start(claim):
                print(f"{consumer}: skipped {event}: its reservation lapsed and another consumer took it")
                continue
            try:
                receipt = charge(client, consumer, event)
            except Exception:
                claim.release()  # failed: free at once for the retry XAUTOCLAIM brings
                raise
            charged += 1
            if charged == die_after:
                print(f"{consumer}: dies now, after charging {event} and before storing its receipt")
                return charged
            claim.complete(receipt)
            client.xack(STREAM, GROUP, message_id)
    except BaseException:
        _give_back(client, consumer, list(unstarted.values()))
        raise
    _give_back(client, consumer, list(unstarted.values()))
    return charged


def start(claim: Claim) -> bool:
    """Take the full lease as a message starts; ``False`` when another consumer has the message now."""
    try:
        claim.extend(lease=LEASE)  # owner-checked: only while the reservation is still this claim's
        return True
    except ClaimLostError:
        pass
    # The reservation lapsed. Claim again: free unless another consumer took it meanwhile.
    if isinstance(claim.acquire(), Claimed):
        claim.extend(lease=LEASE)
        return True
    return False


def _give_back(client: redis.Redis, consumer: str, claims: list[Claim]) -> None:
    """Release the unstarted claims in one round trip, so another consumer takes them at once."""
    if claims:
        released = Claim.release_many(client, claims)
        print(f"{consumer}: gave back {sum(released)} unstarted claim(s) in one round trip")


def consume(client: redis.Redis, consumer: str, stop: threading.Event, die_after: int = -1) -> None:
    """Read and run batches until ``stop`` is set (or the simulated death)."""
    charged = 0
    while not stop.is_set():
        batch = read_batch(client, consumer)
        if not batch:
            time.sleep(0.05)
            continue
        left = die_after - charged if die_after > 0 else -1
        done = process(client, consumer, batch, stop, left)
        charged += done
        if done == left:
            return


def setup(client: redis.Redis) -> None:
    """A fresh stream and consumer group (also on a reused server)."""
    client.delete(STREAM, LEDGER, *client.keys(f"{NAMESPACE}:*"))
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)


def step(text: str) -> None:
    print(f"\n== {text}")


def main() -> None:
    client = connect()
    setup(client)
    events = [f"evt{n:03}" for n in range(30)]
    step(f"a producer adds {len(events)} payment events, three of them twice (at-least-once delivery)")
    for event in [*events, *events[:3]]:
        client.xadd(STREAM, {"event": event})

    step(f"consumers a and b read batches of {BATCH} ({BATCH * WORK:.1f} s of work, reservations of {RESERVE} s)")
    stop = threading.Event()
    a = threading.Thread(target=consume, args=(client, "a", stop, 4))
    b = threading.Thread(target=consume, args=(client, "b", stop))
    a.start()
    _until(lambda: client.llen(LEDGER) > 0)  # a has its first batch: the story reads the same every run
    b.start()
    a.join()
    died = time.time()
    step("consumer a died mid-batch (as kill -9: nothing given back, nothing acked)")
    pending = client.xpending_range(STREAM, GROUP, min="-", max="+", count=100, consumername="a")
    left = {_event_of(client, entry["message_id"]) for entry in pending}
    _until(lambda: len(_charged(client)) == len(events))
    ledger = [json.loads(line) for line in client.lrange(LEDGER, 0, -1)]
    taken = [entry["at"] - died for entry in ledger if entry["by"] == "b" and entry["event"] in left]
    print(f"b took a's unstarted messages over {min(taken):.1f} s after the death, not after the {LEASE} s lease")

    step("b shuts down mid-batch and gives back what it reserved but had not started")
    more = [f"evt{n:03}" for n in range(30, 30 + BATCH)]
    for event in more:
        client.xadd(STREAM, {"event": event})
    _until(lambda: any(e in _charged(client) for e in more))
    stop.set()
    b.join()
    step("consumer c starts: XAUTOCLAIM hands it b's given-back messages, free at once")
    stop_c = threading.Event()
    c = threading.Thread(target=consume, args=(client, "c", stop_c))
    c.start()
    _until(lambda: len(_charged(client)) == len(events) + len(more))
    stop_c.set()
    c.join()

    step("done")
    counts = _charged(client)
    twice = sorted(e for e, n in counts.items() if n > 1)
    interrupted = sorted(e for e in counts if not _completed(client, e))
    print(f"{len(counts)} events charged, {sum(counts.values())} charges, charged more than once: {twice}")
    print(f"charged, receipt not stored (a died there; it runs again once its {LEASE} s lease lapses): {interrupted}")


def _until(condition: Any, timeout: float = 40.0) -> None:
    """Poll ``condition`` until it holds (the consumers run in threads meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the consumers did not get there in time")
        time.sleep(0.05)


def _event_of(client: redis.Redis, message_id: bytes) -> str:
    ((_id, fields),) = client.xrange(STREAM, min=message_id, max=message_id)
    return fields[b"event"].decode()


def _charged(client: redis.Redis) -> dict[str, int]:
    """How many times each event was charged."""
    prefix = f"{NAMESPACE}:charges:"
    return {key.decode()[len(prefix) :]: int(client.get(key)) for key in client.keys(f"{prefix}*")}


def _completed(client: redis.Redis, event: str) -> bool:
    # One key per event: its holder's token while in flight, "done <token> <receipt>" once stored.
    held = client.get(Claim(client, event, namespace=NAMESPACE).claim_key)
    return held is not None and held.startswith(b"done ")


def serve(consumer: str) -> None:
    """One consumer process: runs batches until SIGTERM or Ctrl-C, then gives back what it had not started."""
    client = connect()
    with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: it exists
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"{consumer}: consuming {STREAM}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        consume(client, consumer, stop)
    print(f"{consumer}: stopped", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["consume"]:
        serve(sys.argv[2])
    else:
        main()
