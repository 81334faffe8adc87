"""The job-queue rule shared by every queue door (goblin_claim._jobs), with real threads on a real Redis.

A duplicate job waits for the first copy, woken by its completion, at most ``wait``
seconds and never past the holder's lease left; still running then, it raises
``StillInFlightError`` for the queue's own retry. The queue doors themselves run
under real workers in tests/jobs/test_celery.py, test_rq.py, test_dramatiq.py and test_arq.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio

from goblin_claim import Claim, StillInFlightError
from goblin_claim._jobs import WAIT, job_function, retry_delay, wait_bound
from tests.conftest import subscribed, unique, until, until_async
from tests.support.servers import HOST, RedisProcess


def test_wait_bound_stops_just_past_the_lease_left() -> None:
    """The wait is the smaller of wait and the holder's lease left plus a margin; 0 never waits."""
    assert wait_bound(10.0, 2.5, lease=30) == pytest.approx(2.55)
    assert wait_bound(10.0, 25.0, lease=30) == 10.0
    assert wait_bound(10.0, 0.0, lease=30) == pytest.approx(0.05)  # lapsing now: one more try
    assert wait_bound(10.0, None, lease=30) == 1.0  # unknown: the claim freed between two reads
    assert wait_bound(0.5, None, lease=30) == 0.5
    assert wait_bound(0.0, 25.0, lease=30) == 0.0
    # The wait's end and the retry's delay are one rule: both just past the lapse.
    assert wait_bound(60.0, 2.5, lease=30) == retry_delay(StillInFlightError("x", key="k", retry_after=2.5), lease=30)
    assert WAIT == 10.0


class Job:
    """A job function that counts its runs and, on its first run, holds until released."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = threading.Event()
        self.go_on = threading.Event()

    def __call__(self, event_id: str) -> dict[str, Any]:
        """Run: count it; the first run holds until ``go_on`` is set."""
        self.runs += 1
        self.started.set()
        if self.runs == 1:
            assert self.go_on.wait(30)
        return {"event_id": event_id, "run": self.runs}


def test_a_duplicate_job_is_answered_when_the_first_completes(redis_standalone: RedisProcess) -> None:
    """A duplicate arriving mid-run waits (lease 30 s) and gets the stored answer as the first completes."""
    client = redis_standalone.client()
    job = Job()
    namespace = unique("jobs")
    charge = job_function(job, client, "event_id", {"lease": 30}, namespace=namespace)
    first: list[Any] = []
    answered: list[tuple[Any, float]] = []
    runner = threading.Thread(target=lambda: first.append(charge("e1")))
    runner.start()
    assert job.started.wait(10)

    def duplicate() -> None:
        answered.append((charge("e1"), time.monotonic()))

    waiter = threading.Thread(target=duplicate)
    waiter.start()
    # The duplicate found the work in flight and waits for its announcement.
    claim_key = Claim(client, "e1", namespace=namespace).claim_key
    assert until(lambda: subscribed(client, claim_key), timeout=10), "the duplicate never waited"
    assert not answered
    released = time.monotonic()
    job.go_on.set()
    runner.join(10)
    waiter.join(10)
    try:
        assert first == [{"event_id": "e1", "run": 1}]
        ((result, at),) = answered
        assert result == first[0]
        assert job.runs == 1  # the duplicate ran nothing
        assert at - released < 5  # its answer came with the completion, not after the 30 s lease
    finally:
        client.close()


@contextlib.contextmanager
def _held_elsewhere(redis_standalone: RedisProcess, event_id: str, lease: int) -> Iterator[tuple[Any, str, Claim]]:
    """A client, a fresh namespace, and ``event_id`` claimed in it by another holder; released, then closed."""
    client = redis_standalone.client()
    namespace = unique("jobs")
    holder = Claim(client, event_id, namespace=namespace, lease=lease)
    assert holder.acquire().kind == "claimed"
    try:
        yield client, namespace, holder
    finally:
        holder.release()
        client.close()


def test_a_duplicate_job_stops_waiting_at_the_holders_lease_left(redis_standalone: RedisProcess) -> None:
    """A live holder renewing a 2 s lease: the duplicate gives up near the lease left, not after wait=10."""
    job = Job()
    with _held_elsewhere(redis_standalone, "e2", lease=2) as (client, namespace, holder):
        charge = job_function(job, client, "event_id", {"lease": 30, "wait": 10}, namespace=namespace)
        with holder.keep_alive():  # long work elsewhere, its lease renewed
            started = time.monotonic()
            with pytest.raises(StillInFlightError) as caught:
                charge("e2")
            waited = time.monotonic() - started
        assert 1.0 < waited < 6  # about the 2 s lease left: well short of wait=10
        assert caught.value.retry_after is not None  # what the door's retry is timed by
        assert job.runs == 0


def test_a_duplicate_job_takes_over_a_crashed_holder_as_its_lease_lapses(redis_standalone: RedisProcess) -> None:
    """A holder that died with 1 s of lease left: the waiting duplicate runs the work itself once it lapses."""
    client = redis_standalone.client()
    namespace = unique("jobs")
    job = Job()
    job.runs = 1  # no first-run hold: this copy is the one that runs
    charge = job_function(job, client, "event_id", {"lease": 30}, namespace=namespace)
    assert Claim(client, "e3", namespace=namespace, lease=1).acquire().kind == "claimed"  # never completed
    started = time.monotonic()
    try:
        assert charge("e3") == {"event_id": "e3", "run": 2}
        assert time.monotonic() - started < 5  # taken over as the lease lapsed, not after wait=10
        assert job.runs == 2
    finally:
        client.close()


def test_wait_zero_answers_in_flight_at_once(redis_standalone: RedisProcess) -> None:
    """wait=0: a duplicate of running work raises StillInFlightError at once, with the lease left."""
    job = Job()
    with _held_elsewhere(redis_standalone, "e4", lease=30) as (client, namespace, _):
        charge = job_function(job, client, "event_id", {"lease": 30, "wait": 0}, namespace=namespace)
        started = time.monotonic()
        with pytest.raises(StillInFlightError) as caught:
            charge("e4")
        assert time.monotonic() - started < 5  # at once: not the 10 s wait, nor the 30 s lease left
        assert caught.value.retry_after is not None
        assert 0 < caught.value.retry_after <= 30
        assert job.runs == 0


def test_an_async_duplicate_job_is_answered_when_the_first_completes(redis_standalone: RedisProcess) -> None:
    """The asyncio twin (arq's door): a duplicate task waits and gets the stored answer as the first completes."""
    runs: list[str] = []
    admin = redis_standalone.client()
    namespace = unique("jobs")
    claim_key = Claim(admin, "e5", namespace=namespace).claim_key

    async def scenario() -> tuple[Any, Any, float]:
        client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port)
        go_on = asyncio.Event()

        async def job(event_id: str) -> dict[str, Any]:
            runs.append(event_id)
            await go_on.wait()
            return {"event_id": event_id}

        charge = job_function(job, client, "event_id", {"lease": 30}, namespace=namespace)
        try:
            first = asyncio.create_task(charge("e5"))
            assert await until_async(lambda: bool(runs), timeout=10), "the first copy never started"
            duplicate = asyncio.create_task(charge("e5"))
            # The duplicate found the work in flight and waits for its announcement.
            assert await until_async(lambda: subscribed(admin, claim_key), timeout=10), "the duplicate never waited"
            assert not duplicate.done()
            released = time.monotonic()
            go_on.set()
            answer = await duplicate
            return await first, answer, time.monotonic() - released
        finally:
            await client.aclose()

    try:
        first, answer, after = asyncio.run(scenario())
    finally:
        admin.close()
    assert first == answer == {"event_id": "e5"}
    assert runs == ["e5"]
    assert after < 5
