"""Huey's idempotent_task under a real huey consumer on a real RedisHuey: runs counted, SIGKILL, the door's copy."""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.support.apps.jobs.common import marked
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
    pytest.importorskip("huey")

import redis

from goblin_claim import Claim, Completed, InterruptedWorkError
from goblin_claim._events import key_digest
from goblin_claim._handle import CHECKPOINT_SUFFIX

pytestmark = pytest.mark.timeout(90)

LEASE = 3
NAMESPACE = "jobs.huey.charge"
RECEIPT = {"event_id": "evt1", "amount": 500, "charge_number": 1}


@pytest.fixture
def app(broker: RedisProcess) -> Any:
    """The test's Huey app, as a sender (it reads the broker's URL from the environment at import)."""
    import tests.support.apps.jobs.huey_app as module

    return importlib.reload(module)


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start huey consumers (two worker threads each); each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1") -> Worker:
            argv = python("-m", "huey.bin.huey_consumer", "tests.support.apps.jobs.huey_app.huey", "-w", "2",
                          "-k", "thread")  # fmt: skip
            return started.start(argv, name, "Huey consumer started")

        yield start


def _get(result: Any, timeout: float = 40) -> Any:
    """A task's result, waiting for it (Huey keeps it until read once)."""
    return result.get(blocking=True, timeout=timeout, preserve=True)


def _kill(worker: Worker) -> float:
    """SIGKILL the consumer (its worker threads with it); when."""
    os.kill(worker.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    worker.stop()
    return killed_at


def _pausing(data: redis.Redis, where: str, event: str) -> bool:
    """The first run is in its pause ``where`` the charge: a kill now cannot leave that pause to the next run."""
    return not data.exists(f"pause:{where}:{event}") and charges(data, event) == int(where == "after")


def test_five_duplicates_charge_once_with_equal_results(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """Five copies on two threads: one side effect, five equal results, no error, no copy left in the schedule."""
    running = worker()
    data.set("pause:before:evt1", 1.0)
    results = [_get(app.charge("evt1", 500)) for _ in range(5)]
    assert charges(data, "evt1") == 1
    assert results == [RECEIPT] * 5
    assert "Unhandled exception" not in running.text()
    assert app.huey.scheduled_count() == 0  # each delivery took its copy back as it ended


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_consumer_then_the_doors_copy_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """A consumer SIGKILLed before/after the charge: the door's copy, run by the next consumer, completes it."""
    first = worker("w1")
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    sent = app.charge(event, 700)
    first_pid(data, event)
    wait_until(lambda: _pausing(data, where, event), 20, "the first run's pause")
    killed_at = _kill(first)
    worker("w2")
    result = _get(sent)
    figures(f"huey: SIGKILL of the consumer {where} the side effect -> done {time.monotonic() - killed_at:.1f}s later")
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
    first = app.charge30("quick", 5)
    first_pid(data, "quick")
    sent = time.monotonic()
    duplicate = app.charge30("quick", 5)
    held_until_started(data, "quick", lambda: data.exists(f"started:{duplicate.id}"), "the duplicate to start")
    answer = {"event_id": "quick", "amount": 5, "charge_number": 1}
    # The retry after the lease left would bring it back about 30 s later.
    assert _get(duplicate, timeout=15) == _get(first, timeout=15) == answer
    answered_in = time.monotonic() - sent
    returned = ran_once(data, "quick")
    assert marked(data, "started", duplicate.id) < returned  # delivered while the first ran: it waited
    gap = marked(data, "finished", duplicate.id) - returned
    own = marked(data, "finished", first.id) - returned
    figures(mid_run_line("huey", gap, own, answered_in))
    assert answered_in < 10


def test_duplicate_of_a_long_job_gives_its_thread_back(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A duplicate of a job outliving the holder's lease left is retried (RetryTask): the other thread runs jobs."""
    running = worker()
    data.set("pause:before:long", 6)
    first = app.charge("long", 1)
    first_pid(data, "long")
    duplicate = app.charge("long", 1)
    time.sleep(0.5)  # the duplicate reaches the free thread and waits there, at most the 3 s lease left
    other = app.charge("other", 2)
    assert _get(other, timeout=10)["event_id"] == "other"
    assert charges(data, "long") == 0  # the long job still runs: the duplicate gave the other thread back
    assert _get(first) == _get(duplicate) == {"event_id": "long", "amount": 1, "charge_number": 1}
    assert charges(data, "long") == 1
    assert "raised RetryTask, retrying" in running.text()
    assert "Unhandled exception" not in running.text()


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    app: Any, data: redis.Redis, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open runs each delivery once; without it, it fails."""
    from huey.exceptions import TaskException

    running = worker()
    results = [_get(app.charge_open("evt-open", 5)) for _ in range(2)]
    assert sorted(result["charge_number"] for result in results) == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    with pytest.raises(TaskException, match="ConnectionFailedError"):
        _get(app.charge_closed("evt-closed", 5))
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")


def test_at_most_once_a_killed_consumer_s_copy_is_acked_and_never_rerun(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A consumer SIGKILLed after the charge: the door's copy completes without running, logged; charged once."""
    first = worker("w1")
    event = "evt-amo"
    data.set(f"pause:after:{event}", 30)
    app.charge_at_most_once(event, 900)
    first_pid(data, event)
    wait_until(lambda: _pausing(data, "after", event), 20, "the side effect")
    _kill(first)
    second = worker("w2")
    digest = key_digest(event)
    wait_until(lambda: f"key {digest} of jobs.huey.charge_amo" in second.text(), 20, "the WARNING line")
    line = next(line for line in second.text().splitlines() if f"key {digest} of" in line)
    assert "acked without running the work" in line
    assert event not in line
    assert charges(data, event) == 1
    assert data.llen(f"pids:{event}") == 1  # the copy never ran the function
    wait_until(lambda: app.huey.scheduled_count() == 0, 10, "the copy's own copy to be taken back")
    with pytest.raises(InterruptedWorkError):
        app.charge_at_most_once.call_local(event, 900)  # called directly: the caller is told


def test_a_killed_checkpointed_task_resumes_after_its_last_checkpoint(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A consumer SIGKILLed after step 2 of 4: the door's copy takes the key over at the lapse and runs steps 3, 4."""
    first = worker("w1")
    event = "evt-steps"
    data.set(f"pause:step2:{event}", 30)
    sent = app.steps(event)
    first_pid(data, event)
    checkpoint = Claim(data, event, namespace="jobs.huey.steps").claim_key + CHECKPOINT_SUFFIX
    wait_until(lambda: data.get(checkpoint) == b"2" and not data.exists(f"pause:step2:{event}"), 20, "step 2's pause")
    _kill(first)
    worker("w2")
    assert _get(sent) == {"event_id": event, "resumed_after": 2}
    assert [int(data.get(f"step:{event}:{step}") or 0) for step in range(1, 5)] == [1, 1, 1, 1]
    assert data.get(checkpoint) is None  # the stored result cleared it
