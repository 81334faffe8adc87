"""The FastStream app of tests/jobs/test_faststream.py: ``faststream run tests.support.apps.jobs.faststream_app:app``.

Each handler reads its Redis stream through the consumer group ``billing`` twice, as a
FastStream service that wants a dead consumer's messages redelivered does: one subscriber
reads new entries (two at a time, so a duplicate can arrive while the first copy runs), the
other claims entries left pending for ``RECLAIM_MS`` (XAUTOCLAIM), a killed process's and
those a handler nacked as in flight. Each answer is published on the stream ``receipts``,
carrying the correlation id of the message it answers.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import redis.asyncio
from faststream import BaseMiddleware, FastStream
from faststream.redis import RedisBroker, StreamSub

from goblin_claim.faststream import idempotent_handler
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, mark, unreachable_async, url

RECLAIM_MS = 1500  # a pending entry idle this long is delivered again
CONSUMER = os.environ.get("GC_FASTSTREAM_CONSUMER", f"consumer-{os.getpid()}")


class Marks(BaseMiddleware):
    """When each delivery started and finished in the app (by correlation id), for the latency figures."""

    async def consume_scope(self, call_next: Callable[[Any], Any], msg: Any) -> Any:
        """Mark the delivery's start, and its end when it ended with an answer."""
        await asyncio.to_thread(mark, "started", msg.correlation_id)
        result = await call_next(msg)
        await asyncio.to_thread(mark, "finished", msg.correlation_id)
        return result


broker = RedisBroker(url(), middlewares=[Marks])
app = FastStream(broker)


def claims() -> redis.asyncio.Redis:
    """The claims' client, made on the first call, in the app's event loop."""
    return redis.asyncio.Redis.from_url(url())


def consumed(stream: str) -> Callable[[Any], Any]:
    """Both subscribers of ``stream`` (new entries, and pending ones reclaimed), answering on ``receipts``."""
    new = broker.subscriber(stream=StreamSub(stream, group="billing", consumer=CONSUMER), max_workers=2)
    reclaimed = broker.subscriber(
        stream=StreamSub(stream, group="billing", consumer=CONSUMER, min_idle_time=RECLAIM_MS, polling_interval=100)
    )
    answers = broker.publisher(stream="receipts")
    return lambda handler: new(reclaimed(answers(handler)))


@consumed("charges")
@idempotent_handler(claims, key="event_id", lease=LEASE, ttl=600, namespace="jobs.faststream.charge")
async def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id (the side effect runs in a thread: it is the shared blocking helper)."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@consumed("charges30")
@idempotent_handler(claims, key="event_id", lease=30, ttl=600, namespace="jobs.faststream.charge30")
async def charge30(event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: a duplicate waits for the first copy."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@consumed("charges_once")
@idempotent_handler(
    claims, key="event_id", lease=LEASE, ttl=600, namespace="jobs.faststream.charge_once", at_most_once=True
)
async def charge_once(event_id: str, amount: int) -> Receipt:
    """Charge at most once per event id: a redelivery after a killed attempt is acked, never run."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@consumed("charges_open")
@idempotent_handler(
    unreachable_async, key="event_id", lease=LEASE, ttl=600, namespace="jobs.faststream.charge_open", fail_open=True
)
async def charge_open(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@consumed("charges_closed")
@idempotent_handler(unreachable_async, key="event_id", lease=LEASE, ttl=600, namespace="jobs.faststream.charge_closed")
async def charge_closed(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return await asyncio.to_thread(charge_card, event_id, amount)
