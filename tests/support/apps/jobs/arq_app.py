"""The arq worker settings and job of tests/jobs/test_arq.py (JSON serialized: nothing is pickled)."""

from __future__ import annotations

import json
from typing import Any

from arq.connections import RedisSettings

from goblin_claim.arq import idempotent_job
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, unreachable_async, url

JOB_TIMEOUT = 8  # arq re-runs a dead worker's job once its in-progress key lapses: this plus 10 s


@idempotent_job(key="event_id", lease=LEASE, ttl=600, namespace="jobs.arq.charge")
async def charge(ctx: dict[str, Any], event_id: str, amount: int) -> Receipt:
    """Charge once per event id (the side effect runs in a thread: it is the shared blocking helper)."""
    import asyncio

    return await asyncio.to_thread(charge_card, event_id, amount)


@idempotent_job(key="event_id", lease=30, ttl=600, namespace="jobs.arq.charge30")
async def charge30(ctx: dict[str, Any], event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    import asyncio

    return await asyncio.to_thread(charge_card, event_id, amount)


@idempotent_job(
    key="event_id", client=unreachable_async, lease=LEASE, ttl=600, namespace="jobs.arq.charge_open", fail_open=True
)
async def charge_open(ctx: dict[str, Any], event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    import asyncio

    return await asyncio.to_thread(charge_card, event_id, amount)


@idempotent_job(key="event_id", client=unreachable_async, lease=LEASE, ttl=600, namespace="jobs.arq.charge_closed")
async def charge_closed(ctx: dict[str, Any], event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    import asyncio

    return await asyncio.to_thread(charge_card, event_id, amount)


def redis_settings() -> RedisSettings:
    """The test's Redis, from its URL."""
    return RedisSettings.from_dsn(url())


class WorkerSettings:
    """``arq tests.support.apps.jobs.arq_app.WorkerSettings``."""

    functions = [charge, charge30, charge_open, charge_closed]  # noqa: RUF012 -- arq reads these class attributes
    redis_settings = redis_settings()
    job_serializer = staticmethod(lambda value: json.dumps(value).encode())
    job_deserializer = staticmethod(json.loads)
    job_timeout = JOB_TIMEOUT
    max_jobs = 2
    max_tries = 2  # a crash spends one; in-flight answers give theirs back (or the duplicates would fail)
    poll_delay = 0.1
