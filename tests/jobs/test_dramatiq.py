"""Dramatiq's Idempotency middleware under real dramatiq workers on a real Redis broker: runs counted, SIGKILL."""

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
    pytest.importorskip("dramatiq")

import redis

from goblin_claim import Claim, Completed

pytestmark = pytest.mark.timeout(90)

LEASE = 3
NAMESPACE = "jobs.dramatiq.charge"


@pytest.fixture
def app(broker: RedisProcess) -> Iterator[Any]:
    """The test's Dramatiq app, as a sender (it reads the broker's URL from the environment at import)."""
    import tests.support.apps.jobs.dramatiq_app as module

    module = importlib.reload(module)
    yield module
    module.broker.close()


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start dramatiq workers (one process, two threads each); each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1", threads: int = 2) -> Worker:
            argv = python(
                "-m", "dramatiq", "tests.support.apps.jobs.dramatiq_app", "--processes", "1", "--threads", str(threads)
            )
            return started.start(argv, name, "is ready for action")

        yield start


def _result(app: Any, message: Any, timeout: float = 40) -> Any:
    return message.get_result(backend=app.backend, block=True, timeout=int(timeout * 1000))


def test_five_duplicates_charge_once_with_equal_results(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """Five copies on two threads (max_retries=0): one side effect, five equal results, nothing logged as an error."""
    running = worker()
    data.set("pause:before:evt1", 1.0)
    sent = [app.charge.send("evt1", 500) for _ in range(5)]
    results = [_result(app, message) for message in sent]
    assert charges(data, "evt1") == 1
    assert results == [{"event_id": "evt1", "amount": 500, "charge_number": 1}] * 5
    assert "ERROR" not in running.text()


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_worker_then_requeue_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """A worker process SIGKILLed before/after the charge: a new worker requeues and completes it, result stored."""
    first = worker("w1")
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    message = app.charge.send(event, 700)
    pid = first_pid(data, event)
    if where == "after":
        wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    first.stop()  # the rest of the dead worker (its parent), by its PID
    worker("w2")
    result = _result(app, message)
    figures(
        f"dramatiq: SIGKILL of the worker {where} the side effect -> done {time.monotonic() - killed_at:.1f}s later"
    )
    assert isinstance(Claim(data, event, namespace=NAMESPACE).acquire(), Completed)
    expected = 1 if where == "before" else 2  # after it: ran again (the README's downstream-key recipe)
    assert charges(data, event) == expected
    assert result == {"event_id": event, "amount": 700, "charge_number": expected}


def test_a_duplicate_is_answered_when_the_first_completes(
    app: Any, data: redis.Redis, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, gets the stored answer as the first completes, runs nothing."""
    running = worker()
    data.set("pause:before:quick", "gate")
    first = app.charge30.send("quick", 5)
    first_pid(data, "quick")
    sent = time.monotonic()
    duplicate = app.charge30.send("quick", 5)
    held_until_started(data, "quick", lambda: data.exists(f"started:{duplicate.message_id}"), "the duplicate to start")
    answer = {"event_id": "quick", "amount": 5, "charge_number": 1}
    # The retry after the lease left would bring it back about 30 s later.
    assert _result(app, duplicate, timeout=15) == _result(app, first, timeout=15) == answer
    answered_in = time.monotonic() - sent
    returned = ran_once(data, "quick")
    assert marked(data, "started", duplicate.message_id) < returned  # delivered while the first ran: it waited
    gap = marked(data, "finished", duplicate.message_id) - returned
    own = marked(data, "finished", first.message_id) - returned
    figures(mid_run_line("dramatiq", gap, own, answered_in))
    assert answered_in < 10
    assert "Retrying message" not in running.text()  # answered in its thread, never sent back


def test_duplicate_of_a_long_job_gives_its_thread_back(
    app: Any, data: redis.Redis, worker: Callable[..., Worker]
) -> None:
    """A duplicate of a job outliving the holder's lease left is retried at INFO: the second thread runs other jobs."""
    running = worker()
    data.set("pause:before:long", 6)
    first = app.charge.send("long", 1)
    first_pid(data, "long")
    duplicate = app.charge.send("long", 1)
    duplicate_waits(data, "long")  # in the free thread, at most the 3 s lease left
    other = app.charge.send("other", 2)
    assert _result(app, other, timeout=10)["event_id"] == "other"
    assert charges(data, "long") == 0  # the long job still runs: the duplicate gave the other thread back
    assert _result(app, first) == _result(app, duplicate) == {"event_id": "long", "amount": 1, "charge_number": 1}
    assert charges(data, "long") == 1
    log = running.text()
    assert "Retrying message" in log
    assert "ERROR" not in log


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    app: Any, data: redis.Redis, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open runs each delivery once; without it, it fails."""
    from dramatiq.results import ResultFailure

    running = worker()
    sent = [app.charge_open.send("evt-open", 5) for _ in range(2)]
    results = [_result(app, message) for message in sent]
    assert sorted(result["charge_number"] for result in results) == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    refused = app.charge_closed.send("evt-closed", 5)
    with pytest.raises(ResultFailure, match="ConnectionFailedError"):
        _result(app, refused)
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")
