"""Celery's IdempotentTask under a real worker (prefork pool) on a real Redis broker: runs counted, kills by SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
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
    pytest.importorskip("celery")

from goblin_claim import Claim, Completed, InterruptedWorkError, StillInFlightError
from goblin_claim._events import key_digest

pytestmark = pytest.mark.timeout(90)

LEASE = 3


@pytest.fixture
def broker(broker: RedisProcess, monkeypatch: pytest.MonkeyPatch) -> RedisProcess:
    """The shared job broker, with the lease the Celery app reads at import."""
    monkeypatch.setenv("GC_JOBS_LEASE", str(LEASE))
    return broker


@pytest.fixture
def app(broker: RedisProcess) -> Any:
    """The test's Celery app, as a client (it reads the broker's URL from the environment at import)."""
    import importlib

    import tests.support.apps.jobs.celery_app as module

    module = importlib.reload(module)
    yield module
    module.app.close()


@pytest.fixture
def worker(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start celery workers (prefork) on the broker; each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(concurrency: int = 2, visibility: int = 3600, name: str = "w1") -> Worker:
            argv = python(
                "-m", "celery", "-A", "tests.support.apps.jobs.celery_app", "worker",
                "-P", "prefork", "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO", "-n", f"{name}@%h",
            )  # fmt: skip
            return started.start(argv, name, "ready.", GC_JOBS_VISIBILITY=str(visibility))

        yield start


class States:
    """Every state the result backend showed for some task ids, sampled until stopped."""

    def __init__(self, app: Any, ids: list[str]) -> None:
        self.seen: set[str] = set()
        self._app, self._ids = app, ids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                for task_id in self._ids:
                    self.seen.add(self._app.AsyncResult(task_id).state)
            except Exception:  # the server stopped under a failed test: nothing left to sample
                return
            time.sleep(0.02)

    def stop(self) -> set[str]:
        """Stop sampling; the states seen."""
        self._stop.set()
        self._thread.join(5)
        return self.seen


def test_five_duplicates_charge_once_with_equal_results(app: Any, worker: Callable[..., Worker]) -> None:
    """Five copies of one charge on two pool processes: one side effect, five equal SUCCESS results."""
    worker()
    data = app.data()
    data.set("pause:before:evt1", 1.0)  # the first copy is in flight while the others arrive
    sent = [app.charge.delay("evt1", 500) for _ in range(5)]
    states = States(app.app, [result.id for result in sent])
    results = [result.get(timeout=40) for result in sent]
    seen = states.stop()
    assert charges(data, "evt1") == 1
    assert results == [{"event_id": "evt1", "amount": 500, "charge_number": 1}] * 5
    assert "FAILURE" not in seen
    assert "RETRY" not in seen


def _kill_and_recover(
    app: Any, worker: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> tuple[dict[str, Any], int, set[str]]:
    worker()
    data = app.data()
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    sent = app.charge.delay(event, 700)
    states = States(app.app, [sent.id])
    pid = first_pid(data, event)
    if where == "after":
        wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    result = sent.get(timeout=40)
    recovered = time.monotonic() - killed_at
    seen = states.stop()
    figures(
        f"celery: SIGKILL of the pool child {where} the side effect -> SUCCESS {recovered:.1f}s later (lease {LEASE}s)"
    )
    stored = Claim(data, event, namespace="jobs.charge").acquire()
    assert isinstance(stored, Completed)
    return result, charges(data, event), seen


def test_kill_before_the_side_effect_then_redelivery_charges_once(
    app: Any, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A pool child SIGKILLed before the charge: the redelivery takes over after the lease, charges once, no FAILURE."""
    result, count, seen = _kill_and_recover(app, worker, figures, "before")
    assert count == 1
    assert result == {"event_id": "evt-before", "amount": 700, "charge_number": 1}
    assert "FAILURE" not in seen


def test_kill_after_the_side_effect_then_redelivery_completes(
    app: Any, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A pool child SIGKILLed after the charge, before the store: the redelivery completes and stores, no FAILURE."""
    result, count, seen = _kill_and_recover(app, worker, figures, "after")
    # The crash between side effect and store is the one no library can close: it ran again
    # (the README's downstream-key recipe is the fix).
    assert count == 2
    assert result == {"event_id": "evt-after", "amount": 700, "charge_number": 2}
    assert "FAILURE" not in seen


def test_a_duplicate_is_answered_when_the_first_completes(
    app: Any, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, gets the stored answer as the first completes, runs nothing."""
    worker(concurrency=2)
    data = app.data()
    data.set("pause:before:quick", "gate")
    first = app.charge30.delay("quick", 5)
    first_pid(data, "quick")
    sent = time.monotonic()
    duplicate = app.charge30.delay("quick", 5)
    held_until_started(data, "quick", lambda: data.exists(f"started:{duplicate.id}"), "the duplicate to start")
    answer = {"event_id": "quick", "amount": 5, "charge_number": 1}
    # The retry after the lease left would bring it back about 30 s later.
    assert duplicate.get(timeout=15) == first.get(timeout=15) == answer
    answered_in = time.monotonic() - sent
    returned = ran_once(data, "quick")
    assert marked(data, "started", duplicate.id) < returned  # delivered while the first ran: it waited
    gap = marked(data, "finished", duplicate.id) - returned
    own = marked(data, "finished", first.id) - returned
    figures(mid_run_line("celery", gap, own, answered_in))
    assert answered_in < 10


def test_duplicate_of_a_long_job_gives_its_slot_back(app: Any, worker: Callable[..., Worker]) -> None:
    """A duplicate of a job outliving the holder's lease left waits no longer: other work runs, then it replays."""
    worker(concurrency=2)
    data = app.data()
    data.set("pause:before:long", 6)
    first = app.charge.delay("long", 1)
    first_pid(data, "long")
    duplicate = app.charge.delay("long", 1)
    duplicate_waits(data, "long")  # in the free process, at most the 3 s lease left
    other = app.charge.delay("other", 2)
    assert other.get(timeout=10)["event_id"] == "other"  # the second process was given back for it
    assert not first.ready()  # the long job still runs: the duplicate did not wait for it in a slot
    assert first.get(timeout=30) == duplicate.get(timeout=30) == {"event_id": "long", "amount": 1, "charge_number": 1}
    assert charges(data, "long") == 1


def test_visibility_timeout_redelivery_of_a_running_task_never_fails(
    app: Any, worker: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A task outliving the broker's visibility timeout is handed out again: it never shows FAILURE, and runs once."""
    running = worker(concurrency=2, visibility=1)
    data = app.data()
    data.set("pause:before:vis", 5)
    started = time.monotonic()
    sent = app.charge.delay("vis", 3)
    states = States(app.app, [sent.id])
    assert sent.get(timeout=40) == {"event_id": "vis", "amount": 3, "charge_number": 1}
    done = time.monotonic() - started
    # The broker handed the running task's message out again (it ran, found the work in flight).
    wait_until(lambda: running.text().count(f"[{sent.id}] received") >= 2, 10, "the redelivery")
    time.sleep(LEASE + 1)  # copies sent again meanwhile run and replay
    seen = states.stop()
    figures(f"celery: visibility-timeout redelivery of a 5s task -> SUCCESS after {done:.1f}s")
    assert charges(data, "vis") == 1
    assert "FAILURE" not in seen
    assert app.app.AsyncResult(sent.id).state == "SUCCESS"


def test_forget_reopens_the_key_and_self_is_not_an_argument(app: Any, worker: Callable[..., Worker]) -> None:
    """charge.forget(event_id, amount) on the bound task reopens the key: the next message charges again."""
    worker()
    data = app.data()
    assert app.charge.delay("evt-f", 9).get(timeout=20)["charge_number"] == 1
    assert app.charge.forget("evt-f", 9) is True
    assert app.charge.delay("evt-f", 9).get(timeout=20)["charge_number"] == 2
    assert charges(data, "evt-f") == 2


def test_called_directly_in_flight_raises_with_retry_after(app: Any) -> None:
    """Called as a plain function while a live worker holds the key, the task waits its lease left, then raises."""
    data = app.data()
    holder = Claim(data, "evt-d", namespace="jobs.charge", lease=LEASE)
    assert holder.acquire().kind == "claimed"
    with holder.keep_alive(), pytest.raises(StillInFlightError) as caught:  # renewed: long work elsewhere
        app.charge("evt-d", 1)
    assert caught.value.retry_after is not None
    assert 0 < caught.value.retry_after <= LEASE
    assert charges(data, "evt-d") == 0


def test_enqueue_once_returns_the_first_messages_result(app: Any, worker: Callable[..., Worker]) -> None:
    """With enqueue_once, duplicates queued, running or done are not sent: they get the first message's AsyncResult."""
    data = app.data()
    first = app.charge_once.delay("evt-q", 4)
    queued = app.charge_once.delay("evt-q", 4)  # no worker yet: the first is only queued
    assert queued.id == first.id
    # The first id is kept beside the key's record: in its namespace and its cluster slot.
    record_key = Claim(data, "evt-q", namespace="jobs.charge_once").claim_key
    assert data.get(record_key + ":task") == first.id.encode()
    worker()
    assert first.get(timeout=20) == {"event_id": "evt-q", "amount": 4, "charge_number": 1}
    done = app.charge_once.apply_async(("evt-q", 4))
    assert done.id == first.id
    assert done.get(timeout=5) == first.get()
    assert data.llen("pids:evt-q") == 1  # one message ran
    assert app.charge_once.forget("evt-q", 4) is True
    again = app.charge_once.delay("evt-q", 4)
    assert again.id != first.id
    assert again.get(timeout=20)["charge_number"] == 2


def test_an_exception_releases_the_claim_so_autoretry_runs(app: Any, worker: Callable[..., Worker]) -> None:
    """A task raising under autoretry_for gives its claim back: Celery's own retry runs it and succeeds."""
    worker()
    data = app.data()
    sent = app.flaky.delay("evt-r")
    assert sent.get(timeout=20) == 2
    assert int(data.get("attempts:evt-r")) == 2
    assert app.flaky.delay("evt-r").get(timeout=20) == 2  # done: a duplicate replays, nothing runs
    assert int(data.get("attempts:evt-r")) == 2


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    app: Any, out_of_reach: str, worker: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open: each delivery runs once, SUCCESS; else FAILURE."""
    running = worker()
    data = app.data()
    sent = [app.charge_open.delay("evt-open", 5) for _ in range(2)]
    results = [result.get(timeout=40) for result in sent]
    assert sorted(result["charge_number"] for result in results) == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    refused = app.charge_closed.delay("evt-closed", 5)
    refused.get(timeout=40, propagate=False)
    assert refused.state == "FAILURE"
    assert "ConnectionFailedError" in str(refused.traceback)
    assert charges(data, "evt-closed") == 0
    running.wait_for_log("fail_open runs the work without one")


@pytest.mark.parametrize("where", ["before", "after"])
def test_at_most_once_a_killed_task_is_acked_on_redelivery_and_never_rerun(
    app: Any, worker: Callable[..., Worker], where: str
) -> None:
    """A pool child SIGKILLed before/after the charge: the redelivery finds the attempt interrupted and acks it.

    The message comes back at once (reject_on_worker_lost), waits out the dead owner's lease, and
    ends SUCCESS with None without running the task; the worker logs it at WARNING by key digest.
    """
    running = worker()
    data = app.data()
    event = f"evt-amo-{where}"
    data.set(f"pause:{where}:{event}", 30)
    sent = app.charge_at_most_once.delay(event, 800)
    states = States(app.app, [sent.id])
    pid = first_pid(data, event)
    if where == "after":
        wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    os.kill(pid, signal.SIGKILL)
    assert sent.get(timeout=40) is None
    seen = states.stop()
    assert charges(data, event) == (1 if where == "after" else 0)
    assert data.llen(f"pids:{event}") == 1  # the redelivery never ran the task
    assert "FAILURE" not in seen
    digest = key_digest(event)
    wait_until(lambda: f"key {digest} of jobs.charge_at_most_once" in running.text(), 10, "the WARNING line")
    line = next(line for line in running.text().splitlines() if f"key {digest} of" in line)
    assert "WARNING" in line
    assert "acked without running the work" in line
    assert event not in line  # the key as its digest, never as it is
    with pytest.raises(InterruptedWorkError):
        app.charge_at_most_once("evt-amo-" + where, 800)  # called directly: the caller is told
