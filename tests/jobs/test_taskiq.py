"""taskiq's idempotent_task under real taskiq workers on a real Redis stream broker: runs counted, SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.support.apps.jobs.common import Receipt, marked
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
    pytest.importorskip("taskiq_redis")

import redis

from goblin_claim import Claim, Completed
from goblin_claim._events import key_digest
from goblin_claim._handle import CHECKPOINT_SUFFIX

pytestmark = pytest.mark.timeout(90)

LEASE = 3
NAMESPACE = "jobs.taskiq.charge"


@pytest.fixture
def app(broker: RedisProcess) -> Any:
    """The test's taskiq app, as a sender (it reads the broker's URL from the environment at import)."""
    import tests.support.apps.jobs.taskiq_app as module

    return importlib.reload(module)


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start taskiq workers (one worker process each, its parent restarting it); each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1") -> Worker:
            argv = python(
                "-m", "taskiq", "worker", "tests.support.apps.jobs.taskiq_app:broker", "--workers", "1",
                "--max-async-tasks", "10", "--shutdown-timeout", "2", "--wait-tasks-timeout", "2",
            )  # fmt: skip
            return started.start(argv, name, "Listening started.")

        yield start
        # taskiq 0.13's parent process outlives a SIGTERM by 10 s and more: its group is killed instead.
        for made in started.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(made.process.pid, signal.SIGKILL)


def _send(
    app: Any, calls: list[tuple[Any, tuple[Any, ...]]], timeout: float = 40,
    before: Callable[[], None] | None = None, traffic: bool = False,
) -> list[Any]:  # fmt: skip
    """Kick each (task, args), run ``before`` in a thread, and return every TaskiqResult (its value typed by the task).

    With ``traffic``, a no-op task is sent every half second meanwhile: taskiq-redis's stream
    broker hands a dead worker's messages on only after a read that returned new ones.
    """

    async def go() -> list[Any]:
        await app.broker.startup()  # the stream's consumer group, before the first message
        try:
            sent = [await task.kiq(*args) for task, args in calls]
            if before is not None:
                await asyncio.to_thread(before)
            ticking = asyncio.create_task(_tick(app)) if traffic else None
            try:
                return [await one.wait_result(timeout=timeout, check_interval=0.05) for one in sent]
            finally:
                if ticking is not None:
                    ticking.cancel()
        finally:
            await app.broker.shutdown()

    return asyncio.run(go())


async def _tick(app: Any) -> None:
    """Send the no-op task every half second, until cancelled."""
    while True:
        await app.tick.kiq()
        await asyncio.sleep(0.5)


def _pausing(data: redis.Redis, where: str, event: str) -> bool:
    """The first run is in its pause ``where`` the charge: a kill now cannot leave that pause to the next run."""
    return not data.exists(f"pause:{where}:{event}") and charges(data, event) == int(where == "after")


def test_five_duplicates_charge_once_with_equal_results(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """Five copies on a worker running them at once: one side effect, five equal results, no error."""
    running = worker()
    data.set("pause:before:evt1", 1.0)
    results = _send(app, [(app.charge, ("evt1", 500))] * 5)
    assert charges(data, "evt1") == 1
    assert [result.return_value for result in results] == [Receipt(event_id="evt1", amount=500, charge_number=1)] * 5
    assert not any(result.is_err for result in results)
    assert "Exception found while executing" not in running.text()


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_worker_then_redelivery_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """A worker process SIGKILLed before/after the charge: the stream hands its message on, which completes it."""
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    worker("w1")
    killed: list[float] = []

    def kill() -> None:
        pid = first_pid(data, event)
        wait_until(lambda: _pausing(data, where, event), 20, "the first run's pause")
        killed.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)  # the worker process; taskiq's parent starts another

    (result,) = _send(app, [(app.charge, (event, 700))], timeout=60, before=kill, traffic=True)
    figures(f"taskiq: SIGKILL of the worker {where} the side effect -> done {time.monotonic() - killed[0]:.1f}s later")
    assert isinstance(Claim(data, event, namespace=NAMESPACE).acquire(), Completed)
    expected = 1 if where == "before" else 2  # after it: ran again (the README's downstream-key recipe)
    assert charges(data, event) == expected
    assert result.return_value == Receipt(event_id=event, amount=700, charge_number=expected)


def test_a_duplicate_is_answered_when_the_first_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, gets the stored answer as the first completes, runs nothing."""
    worker()
    data.set("pause:before:quick", "gate")

    async def go() -> tuple[list[Any], str, str, float]:
        await app.broker.startup()
        try:
            first = await app.charge30.kiq("quick", 5)
            await asyncio.to_thread(first_pid, data, "quick")
            sent = time.monotonic()
            duplicate = await app.charge30.kiq("quick", 5)
            await asyncio.to_thread(
                held_until_started, data, "quick", lambda: data.exists(f"started:{duplicate.task_id}"),
                "the duplicate to start",
            )  # fmt: skip
            # The retry after the lease left would bring it back about 30 s later.
            results = [await task.wait_result(timeout=15, check_interval=0.05) for task in (first, duplicate)]
            return results, first.task_id, duplicate.task_id, time.monotonic() - sent
        finally:
            await app.broker.shutdown()

    results, first_id, duplicate_id, answered_in = asyncio.run(go())
    assert [result.return_value for result in results] == [Receipt(event_id="quick", amount=5, charge_number=1)] * 2
    returned = ran_once(data, "quick")
    assert marked(data, "started", duplicate_id) < returned  # delivered while the first ran: it waited
    assert "X-Taskiq-requeue" not in results[1].labels  # answered in its delivery, never sent again
    gap = marked(data, "finished", duplicate_id) - returned
    own = marked(data, "finished", first_id) - returned
    figures(mid_run_line("taskiq", gap, own, answered_in))
    assert answered_in < 10


def test_duplicate_of_a_long_job_is_sent_again_and_answered(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A duplicate of a job outliving the holder's lease left sends itself again (same task id), then replays."""
    running = worker()
    data.set("pause:before:long", 6)

    async def go() -> tuple[list[Any], int]:
        await app.broker.startup()
        try:
            first = await app.charge.kiq("long", 1)
            duplicate = await app.charge.kiq("long", 1)
            await asyncio.to_thread(first_pid, data, "long")
            await asyncio.sleep(0.5)  # the duplicate waits, at most the 3 s lease left, then sleeps before its retry
            other = await app.charge.kiq("other", 2)
            assert (await other.wait_result(timeout=10, check_interval=0.05)).return_value.event_id == "other"
            meanwhile = charges(data, "long")  # 0: the long job still runs
            return [await task.wait_result(timeout=40, check_interval=0.05) for task in (first, duplicate)], meanwhile
        finally:
            await app.broker.shutdown()

    (first, duplicate), meanwhile = asyncio.run(go())
    assert meanwhile == 0
    assert first.return_value == duplicate.return_value == Receipt(event_id="long", amount=1, charge_number=1)
    assert int(duplicate.labels["X-Taskiq-requeue"]) >= 1  # it came back as its own message, same task id
    assert charges(data, "long") == 1
    assert "Exception found while executing" not in running.text()


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    app: Any, data: redis.Redis, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open runs each delivery once; without it, it fails."""
    running = worker()
    opened = _send(app, [(app.charge_open, ("evt-open", 5))] * 2)
    assert sorted(result.return_value.charge_number for result in opened) == [1, 2]  # once per delivery
    assert charges(data, "evt-open") == 2
    (refused,) = _send(app, [(app.charge_closed, ("evt-closed", 5))])
    assert refused.is_err
    running.wait_for_log("ConnectionFailedError")
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")


def test_at_most_once_a_killed_worker_s_redelivery_is_acked_and_never_rerun(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A worker SIGKILLed after the charge: the redelivered message completes (None) without running, logged."""
    running = worker()
    event = "evt-amo"
    data.set(f"pause:after:{event}", 30)

    def kill() -> None:
        pid = first_pid(data, event)
        wait_until(lambda: _pausing(data, "after", event), 20, "the side effect")
        os.kill(pid, signal.SIGKILL)

    (result,) = _send(app, [(app.charge_at_most_once, (event, 900))], timeout=60, before=kill, traffic=True)
    assert not result.is_err
    assert result.return_value is None
    assert charges(data, event) == 1
    assert data.llen(f"pids:{event}") == 1  # the redelivery never ran the function
    digest = key_digest(event)
    wait_until(lambda: f"key {digest} of jobs.taskiq.charge_amo" in running.text(), 10, "the WARNING line")
    line = next(line for line in running.text().splitlines() if f"key {digest} of" in line)
    assert "acked without running the work" in line
    assert event not in line  # (called directly it raises: test_job_doors_in_process.py, on taskiq's own broker)


def test_a_killed_checkpointed_task_resumes_after_its_last_checkpoint(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A worker SIGKILLed after step 2 of 4: the stream's redelivery takes the key over and runs steps 3 and 4."""
    worker()
    event = "evt-steps"
    data.set(f"pause:step2:{event}", 30)
    checkpoint = Claim(data, event, namespace="jobs.taskiq.steps").claim_key + CHECKPOINT_SUFFIX

    def kill() -> None:
        pid = first_pid(data, event)
        wait_until(lambda: data.get(checkpoint) == b"2" and not data.exists(f"pause:step2:{event}"), 20, "step 2")
        os.kill(pid, signal.SIGKILL)

    (result,) = _send(app, [(app.steps, (event,))], timeout=60, before=kill, traffic=True)
    assert result.return_value == {"event_id": event, "resumed_after": 2}
    assert [int(data.get(f"step:{event}:{step}") or 0) for step in range(1, 5)] == [1, 1, 1, 1]
    assert data.get(checkpoint) is None  # the stored result cleared it
