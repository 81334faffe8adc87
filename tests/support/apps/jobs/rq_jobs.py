"""The RQ job of tests/jobs/test_rq.py (enqueued by its import path)."""

from __future__ import annotations

from typing import Any

from goblin_claim.rq import idempotent_job
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, checkpointed_steps, data, unreachable


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge")
def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id."""
    return charge_card(event_id, amount)


@idempotent_job(data, key="event_id", lease=30, ttl=600, namespace="jobs.rq.charge30")
def charge30(event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    return charge_card(event_id, amount)


@idempotent_job(unreachable, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_open", fail_open=True)
def charge_open(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return charge_card(event_id, amount)


@idempotent_job(unreachable, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_closed")
def charge_closed(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return charge_card(event_id, amount)


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_amo", at_most_once=True)
def charge_at_most_once(event_id: str, amount: int) -> Receipt:
    """Charge at most once per event id: never again after an attempt that ended without a result."""
    return charge_card(event_id, amount)


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.steps", checkpoints=True)
def steps(event_id: str) -> dict[str, object]:
    """Four checkpointed steps: a retry after a kill resumes after the last one."""
    return checkpointed_steps(event_id)


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_brief", wait=1)
def charge_brief(event_id: str, amount: int) -> Receipt:
    """Charge once per event id; a duplicate waits 1 s a round, less than the lease: it comes round again."""
    return charge_card(event_id, amount)


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_nowait", wait=0)
def charge_nowait(event_id: str, amount: int) -> Receipt:
    """Charge once per event id; a duplicate never waits: it is scheduled for the lapse (RQ's scheduler)."""
    return charge_card(event_id, amount)


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge_flaky")
def charge_flaky(event_id: str, amount: int) -> Receipt:
    """Charge once per event id; raises (before the side effect) while ``fail:<id>`` is set, once per setting."""
    if data().getdel(f"fail:{event_id}") is not None:
        raise RuntimeError(f"declined {event_id}")
    return charge_card(event_id, amount)


def enqueue_once_racer(url: str, start: Any, out: Any, event_id: str) -> None:
    """A process of tests/jobs/test_rq.py's race: ``enqueue_once`` at the barrier, the job id it got put in ``out``."""
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    from goblin_claim.rq import enqueue_once

    queue = Queue(connection=redis.Redis.from_url(url), serializer=JSONSerializer)
    start.wait()
    out.put(enqueue_once(queue, charge, event_id, 5).id)
