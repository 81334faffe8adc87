"""The payment-webhook story, step by step: claim, charge, duplicates, a crash.

Runs on an embedded fakeredis that speaks GOBLIN.CLAIM natively, or on the
server in REDIS_URL (stock Redis takes the Lua path; the story is the same):

    python examples/payment_webhook.py
    REDIS_URL=redis://localhost:6379/0 python examples/payment_webhook.py
"""

from __future__ import annotations

import os
import time

import redis

from goblin_claim import Claim, Claimed, Completed, InFlight


def connect() -> redis.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        print(f"Using the Redis server at {url}")
        return redis.Redis.from_url(url)
    from goblin_claim.testing import fake_redis

    print("Using an embedded fakeredis that knows GOBLIN.CLAIM (set REDIS_URL to use a real server)")
    return fake_redis(native=True)


def step(text: str) -> None:
    print(f"\n== {text}")


def charge_card(event: str) -> str:
    time.sleep(0.2)  # the payment provider is slow
    return f"charged:txn_{551 if event == 'evt88' else 552}"


def main() -> None:
    client = connect()
    namespace = "demo-webhook"
    for event in ("evt88", "evt89"):  # a fresh story, also on a reused server
        Claim(client, event, namespace=namespace).forget()

    step("worker-3 receives event evt88 and claims it")
    worker3 = Claim(client, "evt88", namespace=namespace, token="worker-3", lease=30)
    outcome = worker3.acquire()
    print(f"worker-3 -> {outcome!r}")
    assert isinstance(outcome, Claimed)
    print(f"   {worker3.claim_key} now holds {client.get(worker3.claim_key)!r}")

    step("a duplicate delivery races in while worker-3 is still charging")
    worker9 = Claim(client, "evt88", namespace=namespace, token="worker-9", lease=30)
    outcome = worker9.acquire()
    print(f"worker-9 -> {outcome!r}   (in flight: retry shortly, do not charge)")
    assert isinstance(outcome, InFlight)

    step("worker-3 charges the card and publishes the answer")
    answer = charge_card("evt88")
    worker3.complete(answer)
    print(f"   {worker3.claim_key} now holds {client.get(worker3.claim_key)!r} (kept for the ttl)")

    step("the duplicate delivery, seconds later, gets the same answer without charging")
    outcome = Claim(client, "evt88", namespace=namespace, token="worker-9").acquire()
    print(f"worker-9 -> {outcome!r}")
    assert isinstance(outcome, Completed)

    step("worker-3 claims evt89 with a 2 s lease... and crashes mid-charge")
    crashed = Claim(client, "evt89", namespace=namespace, token="worker-3", lease=2)
    print(f"worker-3 -> {crashed.acquire()!r}   (then nothing: the process died)")

    step("worker-9 gets evt89 too: in flight, so it waits; the lease lapses and it takes over")
    worker9 = Claim(client, "evt89", namespace=namespace, token="worker-9", lease=30)
    started = time.monotonic()
    outcome = worker9.wait(timeout=10)
    print(f"worker-9 -> {outcome!r} after {time.monotonic() - started:.1f}s")
    assert isinstance(outcome, Claimed)
    worker9.complete(charge_card("evt89"))
    print(f"worker-9 retried the work: {Claim(client, 'evt89', namespace=namespace).acquire()!r}")

    step("done: each event was charged exactly once")


if __name__ == "__main__":
    main()
