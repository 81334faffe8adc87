"""What every test job does: count its side effect in Redis, and pause where a test kills it.

The test arranges, per event id, ``pause:before:<id>`` / ``pause:after:<id>`` (seconds,
taken once with GETDEL so only the first run pauses) and reads back ``charges:<id>``
(how many times the side effect ran) and ``pids:<id>`` (the processes that ran the job).
"""

from __future__ import annotations

import os
import time

import redis
from pydantic import BaseModel

LEASE = int(os.environ.get("GC_JOBS_LEASE", "3"))


def url() -> str:
    """The test's Redis URL, read when asked (the tests set it per test)."""
    return os.environ.get("GC_JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")


class Receipt(BaseModel):
    """What a charge returns: a pydantic model, stored as JSON and replayed equal."""

    event_id: str
    amount: int
    charge_number: int


def data() -> redis.Redis:
    """The test's Redis (the same server as the broker)."""
    return redis.Redis.from_url(url())


def _pause(client: redis.Redis, name: str) -> None:
    seconds = client.getdel(name)
    if seconds is not None:
        time.sleep(float(seconds))


def charge_card(event_id: str, amount: int) -> Receipt:
    """The side effect, counted; pauses before and after it when the test asked for it."""
    client = data()
    client.rpush(f"pids:{event_id}", os.getpid())
    _pause(client, f"pause:before:{event_id}")
    number = int(client.incr(f"charges:{event_id}"))
    _pause(client, f"pause:after:{event_id}")
    return Receipt(event_id=event_id, amount=amount, charge_number=number)
