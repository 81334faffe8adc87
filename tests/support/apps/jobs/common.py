"""What every test job does: count its side effect in Redis, and pause where a test kills it.

The test arranges, per event id, ``pause:before:<id>`` / ``pause:after:<id>`` (seconds,
or ``gate`` to wait until the test sets ``gate:<id>``; taken once with GETDEL so only the
first run pauses) and reads back ``charges:<id>``
(how many times the side effect ran), ``pids:<id>`` (the processes that ran the job) and
``returned:<id>`` (when each run returned, Unix time). ``mark`` records when a queue's
job copy started or finished, by its queue's id, for the latency figures. The fail-open
jobs claim through ``unreachable()``, a Redis nobody listens at, while the broker is up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import redis
import redis.asyncio
from pydantic import BaseModel

from goblin_claim import current_claim

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


def unreachable() -> redis.Redis:
    """A client of a Redis out of reach (``GC_JOBS_UNREACHABLE_URL``: nothing listens there), for the fail-open jobs."""
    return redis.Redis.from_url(os.environ["GC_JOBS_UNREACHABLE_URL"], socket_connect_timeout=1, retry=None)


def unreachable_async() -> redis.asyncio.Redis:
    """The asyncio twin of ``unreachable`` (arq's jobs)."""
    return redis.asyncio.Redis.from_url(os.environ["GC_JOBS_UNREACHABLE_URL"], socket_connect_timeout=1, retry=None)


def _pause(client: redis.Redis, name: str, event_id: str) -> None:
    pause = client.getdel(name)
    if pause == b"gate":  # until the test opens it, or 30 s
        deadline = time.monotonic() + 30
        while not client.exists(f"gate:{event_id}") and time.monotonic() < deadline:
            time.sleep(0.01)
    elif pause is not None:
        time.sleep(float(pause))


def charge_card(event_id: str, amount: int) -> Receipt:
    """The side effect, counted; pauses before and after it when the test asked for it."""
    client = data()
    client.rpush(f"pids:{event_id}", os.getpid())
    _pause(client, f"pause:before:{event_id}", event_id)
    number = int(client.incr(f"charges:{event_id}"))
    _pause(client, f"pause:after:{event_id}", event_id)
    client.rpush(f"returned:{event_id}", time.time())
    return Receipt(event_id=event_id, amount=amount, charge_number=number)


def checkpointed_steps(event_id: str, steps: int = 4, save: Callable[[str], object] | None = None) -> dict[str, object]:
    """Steps, each counted (``step:<id>:<n>``) then checkpointed; resumed after the last checkpoint.

    ``pause:step<n>:<id>`` pauses the first run after step n's checkpoint (the test kills it there).
    ``save`` checkpoints instead of the claim's own ``checkpoint`` (an asyncio claim's, from a thread).
    """
    claim = current_claim()
    save = save or claim.checkpoint
    saved = claim.last_checkpoint
    resumed = None if saved is None else int(saved)
    client = data()
    client.rpush(f"pids:{event_id}", os.getpid())
    for step in range(1 if resumed is None else resumed + 1, steps + 1):
        client.incr(f"step:{event_id}:{step}")
        save(str(step))
        _pause(client, f"pause:step{step}:{event_id}", event_id)
    return {"event_id": event_id, "resumed_after": resumed}


_marks: list[redis.Redis] = []


def mark(what: str, job_id: str) -> None:
    """Record now as when the job copy ``job_id`` (its queue's id) ``what`` ("started", "finished")."""
    at = time.time()  # before the write: the figure is the job's, not this round trip's
    if not _marks:
        _marks.append(data())  # one client per worker process
    _marks[0].set(f"{what}:{job_id}", at, ex=600)


def marked(client: redis.Redis, what: str, job_id: str) -> float:
    """When ``mark`` recorded ``what`` for ``job_id`` (Unix time), waiting a moment for it.

    A queue may hand the job's result out before its own after-job hook has run.
    """
    deadline = time.monotonic() + 10
    while (value := client.get(f"{what}:{job_id}")) is None:
        assert time.monotonic() < deadline, f"no {what} mark for {job_id}"
        time.sleep(0.02)
    return float(value)
