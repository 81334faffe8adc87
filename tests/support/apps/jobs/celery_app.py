"""The Celery app of tests/jobs/test_celery.py, with the settings at-least-once delivery needs."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun

from goblin_claim.celery import IdempotentTask
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, data, mark, unreachable, url

app = Celery("gc_jobs", broker=url(), backend=url())
app.conf.update(
    task_acks_late=True,  # ack after the task ran, so a killed worker's task is redelivered
    task_reject_on_worker_lost=True,  # a killed pool child's task goes back to the queue
    worker_prefetch_multiplier=1,
    broker_transport_options={
        # How long a running task's message stays unacked before the broker hands it out again.
        "visibility_timeout": int(os.environ.get("GC_JOBS_VISIBILITY", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    result_extended=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.charge",
    idempotency={"client": data, "key": "event_id", "lease": LEASE, "ttl": 600},
)
def charge(self: IdempotentTask, event_id: str, amount: int) -> Receipt:
    """Charge once per event id."""
    return charge_card(event_id, amount)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.charge30",
    idempotency={"client": data, "key": "event_id", "lease": 30, "ttl": 600},
)
def charge30(self: IdempotentTask, event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    return charge_card(event_id, amount)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.charge_open",
    idempotency={"client": unreachable, "key": "event_id", "lease": LEASE, "ttl": 600, "fail_open": True},
)
def charge_open(self: IdempotentTask, event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return charge_card(event_id, amount)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.charge_closed",
    idempotency={"client": unreachable, "key": "event_id", "lease": LEASE, "ttl": 600},
)
def charge_closed(self: IdempotentTask, event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return charge_card(event_id, amount)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.charge_at_most_once",
    idempotency={"client": data, "key": "event_id", "lease": LEASE, "ttl": 600, "at_most_once": True},
)
def charge_at_most_once(self: IdempotentTask, event_id: str, amount: int) -> Receipt:
    """Charge at most once per event id: never again after an attempt that ended without a result."""
    return charge_card(event_id, amount)


@task_prerun.connect
def _started(task_id: str, **_: Any) -> None:
    mark("started", task_id)


@task_postrun.connect
def _finished(task_id: str, state: str | None = None, **_: Any) -> None:
    if state == "SUCCESS":  # not a copy that was sent again for later (IGNORED)
        mark("finished", task_id)


@app.task(
    base=IdempotentTask,
    name="jobs.charge_once",
    idempotency={"client": data, "key": "event_id", "lease": LEASE, "ttl": 600, "enqueue_once": True},
)
def charge_once(event_id: str, amount: int) -> Receipt:
    """Charge once per event id, and send one message per event id."""
    return charge_card(event_id, amount)


@app.task(
    base=IdempotentTask,
    bind=True,
    name="jobs.flaky",
    autoretry_for=(RuntimeError,),
    max_retries=1,
    default_retry_delay=0,
    idempotency={"client": data, "key": "event_id", "lease": LEASE, "ttl": 600},
)
def flaky(self: IdempotentTask, event_id: str) -> int:
    """Fail the first attempt (the claim is released), succeed on Celery's own retry."""
    client = data()
    attempt = int(client.incr(f"attempts:{event_id}"))
    if attempt == 1:
        raise RuntimeError("the card network timed out")
    return attempt
