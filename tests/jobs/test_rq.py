"""RQ's idempotent_job under real rq workers (a work-horse per job) on a real Redis: runs counted, SIGKILL."""

from __future__ import annotations

import datetime
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.support.queue_workers import (
    Worker,
    charges,
    first_pid,
    held_until_started,
    mid_run_line,
    python,
    ran_once,
    wait_until,
    workers,
)
from tests.support.servers import RedisProcess

if not IN_CI:
    pytest.importorskip("rq")

import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from goblin_claim import Claim, Completed, InterruptedWorkError, StillInFlightError
from goblin_claim._events import key_digest
from goblin_claim._handle import CHECKPOINT_SUFFIX

pytestmark = pytest.mark.timeout(90)

LEASE = 3
NAMESPACE = "jobs.rq.charge"


@pytest.fixture
def queue(data: redis.Redis) -> Queue:
    """The default queue, JSON-serialized (the SDK never pickles; the test jobs do not either)."""
    return Queue(connection=data, serializer=JSONSerializer)


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start rq workers (with the scheduler, for scheduled retries); each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1") -> Worker:
            argv = python(
                "-m", "rq.cli", "worker", "--url", f"redis://127.0.0.1:{broker.port}/0", "--with-scheduler",
                "--serializer", "rq.serializers.JSONSerializer", "--name", f"{name}-{broker.port}", "default",
            )  # fmt: skip
            return started.start(argv, name, "Listening on")

        yield start


def _enqueue(queue: Queue, event_id: str, amount: int, retry: Retry | None = None) -> Job:
    from tests.support.apps.jobs.rq_jobs import charge

    return queue.enqueue(charge, event_id, amount, retry=retry)


def _finish(job: Job, timeout: float = 40) -> Any:
    """The job's return value once it finished; fails if it ever ended FAILED."""

    def done() -> bool:
        status = job.get_status(refresh=True)
        assert status != JobStatus.FAILED, job.latest_result()
        return status == JobStatus.FINISHED

    wait_until(done, timeout, f"job {job.id} to finish")
    return job.return_value(refresh=True)


def test_five_duplicates_charge_once_with_equal_results(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """Five copies on two workers: one side effect, five FINISHED jobs with equal results, none FAILED."""
    worker("w1")
    worker("w2")
    data.set("pause:before:evt1", 1.0)
    jobs = [_enqueue(queue, "evt1", 500) for _ in range(5)]  # no Retry: an in-flight answer must not need one
    results = [_finish(job) for job in jobs]
    assert charges(data, "evt1") == 1
    assert results == [{"event_id": "evt1", "amount": 500, "charge_number": 1}] * 5


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_work_horse_then_retry_completes(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """A work-horse SIGKILLed before/after the charge: its Retry re-runs it past the lease; stored, not FAILED."""
    worker()
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    # Retry(max=1): the kill spends it; the in-flight answers after it borrow their own.
    job = _enqueue(queue, event, 700, retry=Retry(max=1, interval=0))
    pid = first_pid(data, event)
    if where == "after":
        wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    result = _finish(job)
    figures(
        f"rq: SIGKILL of the work-horse {where} the side effect -> FINISHED {time.monotonic() - killed_at:.1f}s later"
    )
    assert isinstance(Claim(data, event, namespace=NAMESPACE).acquire(), Completed)
    expected = 1 if where == "before" else 2  # after it: ran again (the README's downstream-key recipe)
    assert charges(data, event) == expected
    assert result == {"event_id": event, "amount": 700, "charge_number": expected}


def _at(moment: datetime.datetime | None) -> float:
    """A job's RQ timestamp (UTC) as Unix time."""
    assert moment is not None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).timestamp()


def test_a_duplicate_is_answered_when_the_first_completes(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, gets the stored answer as the first completes, runs nothing."""
    from tests.support.apps.jobs.rq_jobs import charge30

    worker("w1")
    worker("w2")
    data.set("pause:before:quick", "gate")
    first = queue.enqueue(charge30, "quick", 5)
    first_pid(data, "quick")
    sent = time.monotonic()
    duplicate = queue.enqueue(charge30, "quick", 5)
    held_until_started(
        data, "quick", lambda: duplicate.get_status(refresh=True) == JobStatus.STARTED, "the duplicate to start"
    )
    answer = {"event_id": "quick", "amount": 5, "charge_number": 1}
    # The retry after the lease left would bring it back about 30 s later.
    assert _finish(duplicate, timeout=15) == _finish(first, timeout=15) == answer
    answered_in = time.monotonic() - sent
    returned = ran_once(data, "quick")
    duplicate.refresh()
    first.refresh()
    assert _at(duplicate.started_at) < returned  # delivered while the first ran: it waited
    gap = _at(duplicate.ended_at) - returned
    own = _at(first.ended_at) - returned
    figures(mid_run_line("rq", gap, own, answered_in, ended="ended"))
    assert answered_in < 10
    assert duplicate.retries_left is None  # no retry was borrowed: it never left the worker


def test_duplicate_of_a_long_job_gives_its_worker_back(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A duplicate of a job outliving the holder's lease left is scheduled again: the second worker runs other jobs."""
    worker("w1")
    worker("w2")
    data.set("pause:before:long", 6)
    first = _enqueue(queue, "long", 1)
    first_pid(data, "long")
    duplicate = _enqueue(queue, "long", 1)
    # It waits at most the 3 s lease left, then is scheduled for after the lease.
    wait_until(lambda: duplicate.get_status(refresh=True) == JobStatus.SCHEDULED, 10, "the duplicate to be scheduled")
    other = _enqueue(queue, "other", 2)
    assert _finish(other, timeout=10)["event_id"] == "other"
    assert first.get_status(refresh=True) == JobStatus.STARTED  # still running: the duplicate gave its worker back
    assert _finish(first) == _finish(duplicate) == {"event_id": "long", "amount": 1, "charge_number": 1}
    assert charges(data, "long") == 1
    assert duplicate.retries_left is None  # the borrowed retry was given back


def test_called_outside_a_worker_in_flight_raises(data: redis.Redis) -> None:
    """Called as a plain function while a live worker holds the key, the job waits its lease left, then raises."""
    from tests.support.apps.jobs.rq_jobs import charge

    holder = Claim(data, "evt-d", namespace=NAMESPACE, lease=LEASE)
    assert holder.acquire().kind == "claimed"
    with holder.keep_alive(), pytest.raises(StillInFlightError) as caught:  # renewed: long work elsewhere
        charge("evt-d", 1)
    assert caught.value.retry_after is not None
    assert charges(data, "evt-d") == 0


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    queue: Queue, data: redis.Redis, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open: each delivery runs once, FINISHED; else FAILED."""
    from tests.support.apps.jobs.rq_jobs import charge_closed, charge_open

    running = worker()
    sent = [queue.enqueue(charge_open, "evt-open", 5) for _ in range(2)]
    results = [_finish(job) for job in sent]
    assert sorted(result["charge_number"] for result in results) == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    refused = queue.enqueue(charge_closed, "evt-closed", 5)
    wait_until(lambda: refused.get_status(refresh=True) == JobStatus.FAILED, 40, "the refused job to fail")
    assert "ConnectionFailedError" in str(refused.latest_result().exc_string)  # type: ignore[union-attr]
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")


def test_at_most_once_a_killed_work_horse_is_retried_acked_and_never_rerun(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A work-horse SIGKILLed after the charge: its Retry finds the attempt interrupted, FINISHED (None), not rerun."""
    from tests.support.apps.jobs.rq_jobs import charge_at_most_once

    running = worker()
    event = "evt-amo"
    data.set(f"pause:after:{event}", 30)
    job = queue.enqueue(charge_at_most_once, event, 900, retry=Retry(max=1, interval=0))
    pid = first_pid(data, event)
    wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    os.kill(pid, signal.SIGKILL)
    assert _finish(job) is None
    assert charges(data, event) == 1
    assert data.llen(f"pids:{event}") == 1  # the retry never ran the function
    digest = key_digest(event)
    wait_until(lambda: f"key {digest} of jobs.rq.charge_amo" in running.text(), 10, "the WARNING line")
    line = next(line for line in running.text().splitlines() if f"key {digest} of" in line)
    assert "acked without running the work" in line
    assert event not in line
    with pytest.raises(InterruptedWorkError):
        charge_at_most_once(event, 900)  # outside a worker: the caller is told


def test_a_killed_checkpointed_job_resumes_after_its_last_checkpoint(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A work-horse SIGKILLed after step 2 of 4: its Retry takes the key over at the lapse and runs steps 3 and 4."""
    from tests.support.apps.jobs.rq_jobs import steps

    worker()
    event = "evt-steps"
    data.set(f"pause:step2:{event}", 30)
    job = queue.enqueue(steps, event, retry=Retry(max=1, interval=0))
    pid = first_pid(data, event)
    checkpoint = Claim(data, event, namespace="jobs.rq.steps").claim_key + CHECKPOINT_SUFFIX
    wait_until(lambda: data.get(checkpoint) == b"2", 20, "step 2's checkpoint")
    os.kill(pid, signal.SIGKILL)
    assert _finish(job) == {"event_id": event, "resumed_after": 2}
    assert [int(data.get(f"step:{event}:{step}") or 0) for step in range(1, 5)] == [1, 1, 1, 1]
    assert data.get(checkpoint) is None  # the stored result cleared it
