"""RQ's idempotent_job under real rq workers (a work-horse per job) on a real Redis: runs counted, SIGKILL."""

from __future__ import annotations

import datetime
import importlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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

from goblin_claim import (
    Claim,
    Completed,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    StillInFlightError,
)
from goblin_claim._events import key_digest
from goblin_claim._handle import CHECKPOINT_SUFFIX
from goblin_claim.rq import enqueue_once
from goblin_claim.testing import fake_redis

pytestmark = pytest.mark.timeout(90)

LEASE = 3
NAMESPACE = "jobs.rq.charge"
# The worker options the RQ page gives for recovery after a whole worker's death: RQ's
# maintenance (which takes a dead scheduler's lock and hands a dead worker's jobs to their
# Retry) every 5 s, a loop that wakes every 5 s to run it (dequeue timeout = worker-ttl - 15),
# and a work-horse heartbeat every 5 s.
RECOVERY_OPTIONS = ("--maintenance-interval", "5", "--worker-ttl", "20", "--job-monitoring-interval", "5")
# The RQ page's bounds after a whole worker's death (SIGKILL, restarted at once with RECOVERY_OPTIONS):
# a duplicate waiting on the dead job's key takes the work over within the lease and a round;
# the killed job itself comes back through RQ's abandoned-job handling (60 s of RQ's own, then maintenance).
DUPLICATE_BOUND = LEASE + 5
KILLED_JOB_BOUND = 80


@pytest.fixture
def queue(data: redis.Redis) -> Queue:
    """The default queue, JSON-serialized (the SDK never pickles; the test jobs do not either)."""
    return Queue(connection=data, serializer=JSONSerializer)


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start rq workers (with the scheduler, for scheduled retries, and ``options``), each stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1", options: Sequence[str] = ()) -> Worker:
            argv = python(
                "-m", "rq.cli", "worker", "--url", f"redis://127.0.0.1:{broker.port}/0", "--with-scheduler",
                "--serializer", "rq.serializers.JSONSerializer", "--name", f"{name}-{broker.port}", *options,
                "default",
            )  # fmt: skip
            return started.start(argv, name, "Listening on")

        yield start


@pytest.fixture
def jobs(broker: RedisProcess) -> Any:
    """The test jobs' module, loaded afresh: a job called in this process makes its client on this test's Redis."""
    import tests.support.apps.jobs.rq_jobs as module

    return importlib.reload(module)


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
    """A duplicate of a job outliving its wait goes back to the end of the queue: the second worker runs other jobs."""
    first_worker = worker("w1")
    second_worker = worker("w2")
    data.set("pause:before:long", 6)
    first = _enqueue(queue, "long", 1)
    first_pid(data, "long")
    duplicate = _enqueue(queue, "long", 1)
    wait_until(lambda: duplicate.get_status(refresh=True) == JobStatus.STARTED, 10, "the duplicate to start")
    other = _enqueue(queue, "other", 2)  # queued behind the duplicate's wait of a round (the 3 s lease left)
    assert _finish(other, timeout=10)["event_id"] == "other"
    assert first.get_status(refresh=True) == JobStatus.STARTED  # still running: the duplicate gave its worker back
    assert _finish(first) == _finish(duplicate) == {"event_id": "long", "amount": 1, "charge_number": 1}
    assert charges(data, "long") == 1
    duplicate.refresh()
    assert (duplicate.number_of_retries or 0) >= 1  # it went round at least once
    assert duplicate.retries_left is None  # none of its own retries spent (it had none)
    logs = first_worker.text() + second_worker.text()
    assert "Traceback" not in logs
    assert "exception raised while executing" not in logs


def test_with_wait_0_a_duplicate_is_scheduled_for_the_lapse(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """wait=0: a duplicate of a running job holds no worker, it is scheduled for the lapse (RQ's scheduler), once."""
    from tests.support.apps.jobs.rq_jobs import charge_nowait

    first_worker = worker("w1")
    second_worker = worker("w2")
    data.set("pause:before:nowait", 5)
    first = queue.enqueue(charge_nowait, "nowait", 1)
    first_pid(data, "nowait")
    duplicate = queue.enqueue(charge_nowait, "nowait", 1)
    wait_until(lambda: duplicate.get_status(refresh=True) == JobStatus.SCHEDULED, 10, "the duplicate to be scheduled")
    assert first.get_status(refresh=True) == JobStatus.STARTED
    assert _finish(first) == _finish(duplicate) == {"event_id": "nowait", "amount": 1, "charge_number": 1}
    assert charges(data, "nowait") == 1
    assert "Traceback" not in first_worker.text() + second_worker.text()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_whole_worker_killed_mid_job_and_restarted_recovers_within_the_pages_bounds(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """The worker, its scheduler and its work-horse SIGKILLed mid-job, restarted at once (the page's options).

    Its scheduler's lock outlives it (about 60 s), so the restarted worker has no scheduler
    meanwhile. A duplicate waiting on the dead job's key needs none: it goes round the queue
    and takes the work over once the lease lapses. The killed job comes back through RQ's
    abandoned-job handling and its Retry, and returns the stored result: one side effect.
    """
    from tests.support.apps.jobs.rq_jobs import charge_brief

    running = worker("w1", RECOVERY_OPTIONS)
    event = "evt-whole"
    data.set(f"pause:before:{event}", 60)
    killed = queue.enqueue(charge_brief, event, 9, retry=Retry(max=1, interval=0))
    horse = first_pid(data, event)
    duplicate = queue.enqueue(charge_brief, event, 9)  # queued behind it: one worker
    killed_at = time.monotonic()
    os.killpg(running.process.pid, signal.SIGKILL)  # the worker and its scheduler
    os.killpg(horse, signal.SIGKILL)  # the work-horse leads a process group of its own
    running.process.wait(timeout=10)
    assert data.exists("rq:scheduler-lock:default")  # the dead scheduler's lock lives on
    worker("w2", RECOVERY_OPTIONS)  # the supervisor's restart (another name: the dead one's is registered)
    answer = {"event_id": event, "amount": 9, "charge_number": 1}
    assert _finish(duplicate, timeout=DUPLICATE_BOUND) == answer
    duplicate_after = time.monotonic() - killed_at
    assert _finish(killed, timeout=KILLED_JOB_BOUND) == answer
    killed_after = time.monotonic() - killed_at
    figures(
        f"rq: whole worker SIGKILLed mid-job (lease {LEASE} s), restarted at once: a duplicate FINISHED "
        f"{duplicate_after:.1f} s later, the killed job (abandoned -> Retry) {killed_after:.1f} s later"
    )
    assert charges(data, event) == 1
    assert data.llen(f"pids:{event}") == 2  # the killed run, then the duplicate's takeover; the retry replayed


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


def test_enqueue_once_from_racing_processes_and_threads_enqueues_one_job(
    queue: Queue, data: redis.Redis, jobs: Any
) -> None:
    """Six processes, then eight threads, call enqueue_once for one key at once: one job each time, one id for all."""
    charge, enqueue_once_racer = jobs.charge, jobs.enqueue_once_racer

    context = multiprocessing.get_context("spawn")
    start, out = context.Barrier(6), context.Queue()
    url = data.connection_pool.connection_kwargs
    racers = [
        context.Process(
            target=enqueue_once_racer,
            args=(f"redis://{url['host']}:{url['port']}/0", start, out, "evt-race"),
        )
        for _ in range(6)
    ]
    for racer in racers:
        racer.start()
    ids = [out.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=10)
        assert racer.exitcode == 0
    assert len(set(ids)) == 1
    assert queue.job_ids == ids[:1]  # one job enqueued, the one every caller got

    barrier, got = threading.Barrier(8), []

    def call() -> None:
        barrier.wait()
        got.append(enqueue_once(queue, charge, "evt-race-threads", 5).id)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(got) == 8
    assert len(set(got)) == 1
    assert queue.job_ids == [ids[0], got[0]]


def test_enqueue_once_returns_the_first_job_while_its_key_is_queued_or_done(
    queue: Queue, data: redis.Redis, worker: Callable[..., Worker], jobs: Any
) -> None:
    """Queued, done, let go by RQ, failed, forgotten: enqueue_once enqueues only where the key needs a run."""
    charge, charge_flaky = jobs.charge, jobs.charge_flaky

    first = enqueue_once(queue, charge, "evt-once", 5, retry=Retry(max=1))
    assert enqueue_once(queue, charge, "evt-once", 5).id == first.id  # queued: not again
    assert queue.job_ids == [first.id]
    marker = f"{Claim(data, 'evt-once', namespace=NAMESPACE).claim_key}:task"
    assert data.get(marker) == first.id.encode()  # beside the record, where the CLI looks
    worker()
    answer = {"event_id": "evt-once", "amount": 5, "charge_number": 1}
    assert _finish(first) == answer
    done = enqueue_once(queue, charge, "evt-once", 5)
    assert done.id == first.id
    assert done.get_status() == JobStatus.FINISHED
    first.delete()  # what RQ does once the job's result_ttl has passed
    again = enqueue_once(queue, charge, "evt-once", 5)
    assert again.id == first.id  # enqueued again under its id...
    assert _finish(again) == answer  # ...it replays the stored result
    assert charges(data, "evt-once") == 1
    charge.forget("evt-once", 5)  # reopens the key, marker included
    assert data.get(marker) is None
    fresh = enqueue_once(queue, charge, "evt-once", 5)
    assert fresh.id != first.id
    assert _finish(fresh)["charge_number"] == 2

    data.set("fail:evt-flaky", 1)
    failed = enqueue_once(queue, charge_flaky, "evt-flaky", 5)
    wait_until(lambda: failed.get_status(refresh=True) == JobStatus.FAILED, 20, "the job to fail")
    retried = enqueue_once(queue, charge_flaky, "evt-flaky", 5)  # its claim was given back: requeued
    assert retried.id == failed.id
    assert _finish(retried) == {"event_id": "evt-flaky", "amount": 5, "charge_number": 1}


def test_enqueue_once_refuses_bad_input_before_writing_anything() -> None:
    """A function not under @idempotent_job, or options RQ's unique enqueue refuses: typed errors, nothing written."""
    from tests.support.apps.jobs.rq_jobs import charge

    client = fake_redis(native=False)
    queue = Queue(connection=client, serializer=JSONSerializer)
    with pytest.raises(InvalidArgumentTypeError, match="@idempotent_job"):
        enqueue_once(queue, print, "evt")
    with pytest.raises(InvalidArgumentError, match="depends_on"):
        enqueue_once(queue, charge, "evt", 5, depends_on="other-job")
    with pytest.raises(InvalidArgumentTypeError):
        enqueue_once(queue, charge, "evt")  # charge takes an amount too: what calling it would raise
    assert client.dbsize() == 0
