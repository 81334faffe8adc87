"""FastStream's idempotent_handler under a real app run by ``faststream run``, on a Redis stream: SIGKILL, redelivery.

The app (tests/support/apps/jobs/faststream_app.py) reads each stream through a consumer
group with two subscribers, new entries and pending ones reclaimed after 1.5 s idle
(XAUTOCLAIM): a killed process's entries, and those nacked as in flight, come back that way.
Every answer is published on the stream ``receipts`` under the correlation id it answers.
"""

from __future__ import annotations

import asyncio
import json
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
    pytest.importorskip("faststream")

import redis
from faststream.redis import RedisBroker
from faststream.redis.parser.binary import BinaryMessageFormatV1

from goblin_claim import Claim, Completed

pytestmark = pytest.mark.timeout(90)

LEASE = 3


@pytest.fixture
def app(broker: RedisProcess, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start the app with FastStream's own CLI, its consumer named after ``name``; each is stopped by PID afterwards."""
    with workers(broker.port, LEASE, tmp_path) as started:

        def start(name: str = "w1") -> Worker:
            argv = python("-m", "faststream", "run", "tests.support.apps.jobs.faststream_app:app")
            return started.start(argv, name, "FastStream app started successfully", GC_FASTSTREAM_CONSUMER=name)

        yield start


def publish(broker: RedisProcess, stream: str, calls: list[tuple[str, int, str]]) -> float:
    """Publish ``(event_id, amount, correlation_id)`` messages on ``stream`` as a FastStream producer does; when."""

    async def go() -> float:
        async with RedisBroker(f"redis://127.0.0.1:{broker.port}/0") as producer:
            for event_id, amount, correlation_id in calls:
                await producer.publish({"event_id": event_id, "amount": amount}, stream=stream,
                                       correlation_id=correlation_id)  # fmt: skip
        return time.monotonic()

    return asyncio.run(go())


def answers(data: redis.Redis, correlation_id: str) -> list[Any]:
    """The answers the app published on ``receipts`` for the message ``correlation_id``, decoded."""
    found = []
    for _, fields in data.xrange("receipts"):
        body, headers = BinaryMessageFormatV1.parse(fields[b"__data__"])
        if headers.get("correlation_id") == correlation_id:
            found.append(json.loads(body))
    return found


def answer(data: redis.Redis, correlation_id: str, timeout: float = 40) -> Any:
    """The first answer to ``correlation_id``, waiting for it."""
    return wait_until(lambda: answers(data, correlation_id), timeout, f"an answer to {correlation_id}")[0]


def settled(data: redis.Redis, stream: str) -> None:
    """Wait until the group ``billing`` has acked every entry of ``stream`` (nothing pending)."""
    wait_until(lambda: data.xpending(stream, "billing")["pending"] == 0, 30, f"{stream}'s entries acked")


def test_five_duplicates_charge_once_with_equal_answers(
    broker: RedisProcess, data: redis.Redis, app: Callable[..., Worker]
) -> None:
    """Five copies read two at a time: one side effect, five equal answers published, every entry acked."""
    running = app()
    data.set("pause:before:evt1", 1.0)
    publish(broker, "charges", [("evt1", 500, f"dup-{n}") for n in range(5)])
    found = [answer(data, f"dup-{n}") for n in range(5)]
    assert found == [{"event_id": "evt1", "amount": 500, "charge_number": 1}] * 5
    assert charges(data, "evt1") == 1
    settled(data, "charges")
    # A copy reclaimed while queued behind the others (pending 1.5 s) is answered alike.
    assert all(found == answer(data, "dup-0") for n in range(5) for found in answers(data, f"dup-{n}"))
    assert "ERROR" not in running.text()


@pytest.mark.parametrize("where", ["before", "after"])
def test_killed_app_then_redelivery_completes(
    broker: RedisProcess, data: redis.Redis, app: Callable[..., Worker], figures: Callable[[str], None], where: str
) -> None:
    """The app SIGKILLed before/after the charge: another app reclaims the pending entry and completes it, answered."""
    event = f"evt-{where}"
    data.set(f"pause:{where}:{event}", 30)
    first = app("w1")
    publish(broker, "charges", [(event, 700, f"kill-{where}")])
    first_pid(data, event)
    if where == "after":
        wait_until(lambda: charges(data, event) == 1, 20, "the side effect")
    killed_at = time.monotonic()
    os.kill(first.process.pid, signal.SIGKILL)  # the app itself: FastStream runs handlers in its event loop
    first.stop()
    app("w2")
    found = answer(data, f"kill-{where}")
    after = time.monotonic() - killed_at
    figures(f"faststream: SIGKILL of the app {where} the side effect -> answered {after:.1f}s later")
    expected = 1 if where == "before" else 2  # after it: ran again (the README's downstream-key recipe)
    assert found == {"event_id": event, "amount": 700, "charge_number": expected}
    assert charges(data, event) == expected
    assert isinstance(Claim(data, event, namespace="jobs.faststream.charge").acquire(), Completed)
    settled(data, "charges")


def test_at_most_once_acks_the_redelivery_of_a_killed_attempt_without_running_it(
    broker: RedisProcess, data: redis.Redis, app: Callable[..., Worker]
) -> None:
    """at_most_once: the app SIGKILLed after the charge; the redelivered entry is acked, never run, nothing answered."""
    data.set("pause:after:evt-once", 30)
    first = app("w1")
    publish(broker, "charges_once", [("evt-once", 900, "once")])
    wait_until(lambda: charges(data, "evt-once") == 1, 20, "the side effect")
    os.kill(first.process.pid, signal.SIGKILL)
    first.stop()
    second = app("w2")
    second.wait_for_log("acked without running the work")
    settled(data, "charges_once")
    assert charges(data, "evt-once") == 1
    assert data.llen("pids:evt-once") == 1  # the handler never ran again
    assert answers(data, "once") == []  # AckMessage: nothing published
    assert "ERROR" not in second.text()


def test_a_duplicate_is_answered_when_the_first_completes(
    broker: RedisProcess, data: redis.Redis, app: Callable[..., Worker], figures: Callable[[str], None]
) -> None:
    """A duplicate delivered mid-run (30 s lease) waits, is answered with the first answer as it completes."""
    app()
    data.set("pause:before:quick", "gate")
    publish(broker, "charges30", [("quick", 5, "first")])
    first_pid(data, "quick")
    sent = publish(broker, "charges30", [("quick", 5, "duplicate")])
    held_until_started(data, "quick", lambda: data.exists("started:duplicate"), "the duplicate to start")
    expected = {"event_id": "quick", "amount": 5, "charge_number": 1}
    assert answer(data, "duplicate", timeout=15) == answer(data, "first", timeout=15) == expected
    answered_in = time.monotonic() - sent
    returned = ran_once(data, "quick")
    assert marked(data, "started", "duplicate") < returned  # delivered while the first ran: it waited
    gap = marked(data, "finished", "duplicate") - returned
    own = marked(data, "finished", "first") - returned
    figures(mid_run_line("faststream", gap, own, answered_in))
    assert answered_in < 10
    settled(data, "charges30")
    assert all(found == expected for cid in ("first", "duplicate") for found in answers(data, cid))


def test_a_duplicate_still_in_flight_is_nacked_and_redelivered(
    broker: RedisProcess, data: redis.Redis, app: Callable[..., Worker]
) -> None:
    """A duplicate of work outliving the holder's lease left is nacked, reclaimed later, then given the first answer."""
    running = app()
    data.set("pause:before:long", 6)
    publish(broker, "charges", [("long", 1, "long-1")])
    first_pid(data, "long")
    publish(broker, "charges", [("long", 1, "long-2")])
    expected = {"event_id": "long", "amount": 1, "charge_number": 1}
    assert answer(data, "long-2") == answer(data, "long-1") == expected
    assert charges(data, "long") == 1
    settled(data, "charges")
    # Every copy answered (a reclaimed one too) carried the first answer.
    assert {json.dumps(found) for cid in ("long-1", "long-2") for found in answers(data, cid)} == {json.dumps(expected)}
    log = running.text()
    assert "Message was nacked" in log  # the in-flight answer: left pending, not failed
    assert "ERROR" not in log


def test_with_fail_open_each_delivery_runs_once_while_the_claims_redis_is_out_of_reach(
    broker: RedisProcess, data: redis.Redis, out_of_reach: str, app: Callable[..., Worker]
) -> None:
    """The claims' Redis out of reach (the broker up): fail_open runs each delivery once; without it, nothing runs."""
    running = app()
    publish(broker, "charges_open", [("evt-open", 5, "open-1"), ("evt-open", 5, "open-2")])
    found = sorted(answer(data, f"open-{n}")["charge_number"] for n in (1, 2))
    assert found == [1, 2]  # at-least-once: once per delivery
    assert charges(data, "evt-open") == 2
    settled(data, "charges_open")
    running.wait_for_log("fail_open runs the work without one")
    publish(broker, "charges_closed", [("evt-closed", 5, "closed")])
    running.wait_for_log("ConnectionFailedError")  # FastStream logs the handler's error; the entry stays pending
    assert data.xpending("charges_closed", "billing")["pending"] == 1
    assert charges(data, "evt-closed") == 0
    assert answers(data, "closed") == []
