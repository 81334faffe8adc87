"""The service's views and URLs: transfers under the door, a webhook keyed by its event's id, a health check."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel
from rq import Retry

from goblin_claim import GoblinClaimError, idempotent
from goblin_claim.django import client, idempotency_key, problem_response
from goblin_claim.rq import enqueue_once
from tests.support.apps.transfers import faults, ledger
from tests.support.apps.transfers.jobs import payments, send_receipt


class ReceiptRefused(RuntimeError):
    """The receipt's address was refused: raised after the transfer's row is written."""


def health(request: HttpRequest) -> HttpResponse:
    """Answer GET: the service is up."""
    return HttpResponse("ok")


def transfers(request: HttpRequest) -> HttpResponse:
    """Book a transfer (a ledger row), then enqueue its receipt; the door claims it by its Idempotency-Key.

    A refused address (``.invalid``), or an enqueue failing while Redis restarts, raises
    after the row is written: Django answers 500, and the door keeps that answer.
    ``slow`` seconds pass before it answers (a client that gives up sooner abandons it).
    """
    transfer = json.loads(request.body)
    key = transfer["id"]
    faults.hold("view-before-ledger", key)
    row = ledger.record("transfer", key)
    faults.hold("view-before-enqueue", key)
    try:
        if transfer["email"].endswith(".invalid"):
            raise ReceiptRefused(f"receipt address refused for {key}")
        job = enqueue_once(payments, send_receipt, key, transfer["amount"], retry=Retry(max=3))
    except Exception:
        faults.reached("enqueue-failed", key)
        raise
    time.sleep(transfer.get("slow", 0))
    return JsonResponse({"transfer": key, "row": row, "receipt_job": job.id, "pid": os.getpid()}, status=201)


class Applied(BaseModel):
    """What applying an event returns (every later delivery of it gets it back)."""

    event_id: str
    row: int
    pid: int


@idempotent(client, key=lambda event: event["id"], wait=0)  # a copy in flight: 409, its sender retries
def apply_event(event: dict[str, Any]) -> Applied:
    """Apply a payment event once per event id: a ledger row."""
    row = ledger.record("event", event["id"])
    time.sleep(event.get("slow", 0))
    return Applied(event_id=event["id"], row=row, pid=os.getpid())


@csrf_exempt
@idempotency_key("ignore")  # no Idempotency-Key comes: the door's required=True must not answer 400
def events(request: HttpRequest) -> HttpResponse:
    """A webhook keyed by its event's id; goblin-claim's errors answered as the door answers them."""
    event = json.loads(request.body)
    try:
        applied = apply_event(event)
    except GoblinClaimError as exc:
        return problem_response(exc)
    return JsonResponse(applied.model_dump())


urlpatterns = [path("health", health), path("api/transfers", transfers), path("webhooks/events", events)]
