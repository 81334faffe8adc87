"""A payment webhook handler made idempotent with @idempotent (sync).

Providers redeliver webhooks; the card must be charged once per event, and
every redelivery must get the same receipt. Runs on an embedded fakeredis, or on
the server in REDIS_URL:

    python examples/webhook_handler.py
"""

from __future__ import annotations

import os
import threading
from decimal import Decimal

import pydantic
import redis

from goblin_claim import PayloadMismatchError, idempotent


class Receipt(pydantic.BaseModel):
    event_id: str
    txn: str
    amount: Decimal


def connect() -> redis.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        return redis.Redis.from_url(url)
    from goblin_claim.testing import fake_redis

    return fake_redis(native=True)


client = connect()
charges: list[str] = []  # what the payment provider saw
charge_lock = threading.Lock()


@idempotent(client, key="event_id", namespace="examples.webhook", lease=30, ttl=86400, wait=10)
def handle_payment_webhook(event_id: str, amount: Decimal) -> Receipt:
    """Charge the card for one webhook event; redeliveries replay the receipt."""
    with charge_lock:
        charges.append(event_id)
        txn = f"txn_{len(charges):03d}"
    return Receipt(event_id=event_id, txn=txn, amount=amount)


def main() -> None:
    for key in client.scan_iter("examples.webhook:*"):
        client.delete(key)  # a fresh run, also on a reused server

    first = handle_payment_webhook("evt88", Decimal("25.00"))
    print(f"first delivery   -> {first!r}")
    again = handle_payment_webhook("evt88", Decimal("25.00"))
    print(f"redelivery       -> {again!r} (equal: {again == first})")

    # Ten redeliveries racing each other on threads: still one charge.
    results: list[Receipt] = []
    threads = [
        threading.Thread(target=lambda: results.append(handle_payment_webhook("evt89", Decimal("9.99"))))
        for _ in range(10)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"10 racing copies -> {len({r.txn for r in results})} distinct receipt(s): {results[0].txn}")

    try:
        handle_payment_webhook("evt88", Decimal("99.00"))
    except PayloadMismatchError as exc:
        print(f"same event id, different amount -> PayloadMismatchError: {exc}")

    print(f"the provider charged: {charges}")
    assert charges == ["evt88", "evt89"]


if __name__ == "__main__":
    main()
