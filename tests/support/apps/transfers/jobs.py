"""The receipt job, as the RQ page writes one: ``@idempotent_job`` on the project's client, a JSON queue."""

from __future__ import annotations

import os

import redis
from pydantic import BaseModel
from rq import Queue
from rq.serializers import JSONSerializer

import goblin_claim.django
from goblin_claim.rq import idempotent_job
from tests.support.apps.transfers import faults, ledger

payments = Queue(
    "payments", connection=redis.Redis.from_url(os.environ["REDIS_URL"]), serializer=JSONSerializer
)  # fmt: skip


class Receipt(BaseModel):
    """What sending a transfer's receipt returns (every later copy of the job gets it back)."""

    transfer_id: str
    amount: int
    row: int


@idempotent_job(goblin_claim.django.client, key="transfer_id", lease=30, ttl=86400)
def send_receipt(transfer_id: str, amount: int) -> Receipt:
    """Send the receipt once per transfer: a ledger row."""
    faults.hold("job-before-ledger", transfer_id)
    return Receipt(transfer_id=transfer_id, amount=amount, row=ledger.record("receipt", transfer_id))
