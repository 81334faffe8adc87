"""The RQ job of tests/test_rq.py (enqueued by its import path)."""

from __future__ import annotations

from goblin_claim.rq import idempotent_job
from tests.jobs.common import LEASE, Receipt, charge_card, data


@idempotent_job(data, key="event_id", lease=LEASE, ttl=600, namespace="jobs.rq.charge")
def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id."""
    return charge_card(event_id, amount)
