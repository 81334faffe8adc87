"""arq's idempotent_job under real arq workers on a real Redis: runs counted, SIGKILL, ctx never fingerprinted."""

from __future__ import annotations

import asyncio
import importlib
import json
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
    duplicate_waits,
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
    pytest.importorskip("arq")

import redis
from arq import create_pool

from goblin_claim import Claim, Completed

pytestmark = [
    pytest.mark.timeout(120),
    # arq 0.28 passes redis-py an argument redis-py 6+ deprecates (arq pins redis<6; the suite runs 8).
    pytest.mark.filterwarnings("ignore:Call to '__init__' function with deprecated usage:DeprecationWarning"),
]

LEASE = 3
NAMESPACE = "jobs.arq.charge"


@pytest.fixture
def app(broker: RedisProcess) -> Any:
    """The test's arq settings module (it reads the broker's URL from the environment at import)."""
    import tests.support.apps.jobs.arq_app as module

    return importlib.reload(module)


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start arq workers (two jobs at once each); each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1") -> Worker:
            return started.start(
                python("-m", "arq", "tests.support.apps.jobs.arq_app.WorkerSettings"), name, "Starting worker"
            )

        yield start


def _run_jobs(
    app: Any, calls: list[tuple[str, int]], timeout: float = 40, before: Callable[[], None] | None = None
) -> list[Any]:
    """Enqueue ``charge`` for each call and return every result (arq's job results, JSON)."""

    async def go() -> list[Any]:
        pool = await create_pool(
            app.redis_settings(), job_serializer=app.WorkerSettings.job_serializer,
            job_deserializer=json.loads,
        )  # fmt: skip
        try:
            jobs = [await pool.enqueue_job("charge", event_id, amount) for event_id, amount in calls]
            if before is not None:
                await asyncio.to_thread(before)
            return [await job.result(timeout=timeout, poll_delay=0.1) for job in jobs if job is not None]
        finally:
            await pool.aclose()

    return asyncio.run(go())


def test_five_duplicates_charge_once_with_equal_results(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """Five copies on a worker running two at once: one side effect, five equal results (ctx differs per job)."""
    running = worker()
    data.set("pause:before:evt1", 1.0)
    results = _run_jobs(app, [("evt1", 500)] * 5)
    assert charges(data, "evt1") == 1
    assert results == [{"event_id": "evt1", "amount": 500, "charge_number": 1}] * 5
    assert "PayloadMismatchError" not in running.text()


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_worker_then_rerun_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """A worker SIGKILLed before/after the charge: a new worker re-runs the job past its lease; result stored."""
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    first = worker("w1")
    killed: list[float] = []

    def kill_then_restart() -> None:
        first_pid(data, event)
        if where == "after":
            wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
        killed.append(time.monotonic())
        os.kill(first.process.pid, signal.SIGKILL)  # the worker itself: arq runs jobs in its event loop
        first.stop()
        worker("w2")

    (result,) = _run_jobs(app, [(event, 700)], timeout=60, before=kill_then_restart)
    figures(f"arq: SIGKILL of the worker {where} the side effect -> done {time.monotonic() - killed[0]:.1f}s later")
    assert isinstance(Claim(data, event, namespace=NAMESPACE).acquire(), Completed)
    expected = 1 if where == "before" else 2  # after it: ran again (the README's downstream-key recipe)
    assert charges(data, event) == expected
    assert result == {"event_id": event, "amount": 700, "charge_number": expected}


def test_a_duplicate_is_answered_when_the_first_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, gets the stored answer as the first completes, runs nothing."""
    worker()
    data.set("pause:before:quick", "gate")

    async def go() -> tuple[list[Any], list[Any], float]:
        pool = await create_pool(
            app.redis_settings(), job_serializer=app.WorkerSettings.job_serializer, job_deserializer=json.loads
        )
        try:
            first = await pool.enqueue_job("charge30", "quick", 5)
            await asyncio.to_thread(first_pid, data, "quick")
            sent = time.monotonic()
            duplicate = await pool.enqueue_job("charge30", "quick", 5)
            assert first is not None
            assert duplicate is not None
            started = f"arq:in-progress:{duplicate.job_id}"  # arq's own mark of a job a worker took
            await asyncio.to_thread(
                held_until_started, data, "quick", lambda: data.exists(started), "the duplicate to start"
            )
            # The retry after the lease left would bring it back about 30 s later.
            results = [await job.result(timeout=15, poll_delay=0.05) for job in (first, duplicate)]
            answered_in = time.monotonic() - sent
            return results, [await job.result_info() for job in (first, duplicate)], answered_in
        finally:
            await pool.aclose()

    results, (first, duplicate), answered_in = asyncio.run(go())
    assert results == [{"event_id": "quick", "amount": 5, "charge_number": 1}] * 2
    returned = ran_once(data, "quick")
    assert duplicate.start_time.timestamp() < returned  # delivered while the first ran: it waited
    assert duplicate.job_try == 1  # never deferred
    gap = duplicate.finish_time.timestamp() - returned
    own = first.finish_time.timestamp() - returned
    figures(mid_run_line("arq", gap, own, answered_in))
    assert answered_in < 10


def test_duplicate_of_a_long_job_gives_its_slot_back(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A duplicate of a job outliving the holder's lease left is deferred: the worker's other slot runs other jobs."""
    worker()
    data.set("pause:before:long", 6)
    seen: list[int] = []

    def other_job_meanwhile() -> None:
        first_pid(data, "long")
        duplicate_waits(data, "long")  # in the other slot, at most the 3 s lease left
        (other,) = _run_jobs(app, [("other", 2)], timeout=10)
        assert other["event_id"] == "other"
        seen.append(charges(data, "long"))  # 0: the long job still runs

    results = _run_jobs(app, [("long", 1), ("long", 1)], before=other_job_meanwhile)
    assert seen == [0]
    assert results == [{"event_id": "long", "amount": 1, "charge_number": 1}] * 2
    assert charges(data, "long") == 1


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    app: Any, data: redis.Redis, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (client=; the worker's pool up): fail_open runs each delivery once; else fails."""

    async def go() -> tuple[list[Any], Any]:
        pool = await create_pool(
            app.redis_settings(), job_serializer=app.WorkerSettings.job_serializer, job_deserializer=json.loads
        )
        try:
            sent = [await pool.enqueue_job("charge_open", "evt-open", 5) for _ in range(2)]
            results = [await job.result(timeout=40, poll_delay=0.1) for job in sent if job is not None]
            refused = await pool.enqueue_job("charge_closed", "evt-closed", 5)
            assert refused is not None
            try:
                await refused.result(timeout=40, poll_delay=0.1)
            except Exception as exc:  # the job failed
                return results, exc
            return results, None
        finally:
            await pool.aclose()

    running = worker()
    results, failure = asyncio.run(go())
    assert sorted(result["charge_number"] for result in results) == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    assert failure is not None  # it failed (arq's JSON serializer cannot carry the error itself)
    running.wait_for_log("ConnectionFailedError")  # the worker names it
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")
