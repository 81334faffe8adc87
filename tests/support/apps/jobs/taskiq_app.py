"""The taskiq broker and tasks of tests/jobs/test_taskiq.py (JSON results: nothing is pickled)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.serializers import JSONSerializer
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from goblin_claim import current_claim
from goblin_claim.taskiq import idempotent_task
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, checkpointed_steps, mark, unreachable_async, url

# A dead worker's unacked messages go to another consumer once idle this long (ms): above
# the wait plus the lease, so that a copy asleep before its in-flight retry is left alone.
IDLE_TIMEOUT = 8000


class Marks(TaskiqMiddleware):
    """When each delivery started and finished in the worker, for the latency figures."""

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Mark the delivery's start, by its task id."""
        mark("started", message.task_id)
        return message

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Mark the delivery's end."""
        mark("finished", message.task_id)


broker = (
    RedisStreamBroker(url(), idle_timeout=IDLE_TIMEOUT, xread_block=500)
    .with_result_backend(RedisAsyncResultBackend(url(), serializer=JSONSerializer(), result_ex_time=600))
    .with_middlewares(Marks())
)


def claims() -> redis.asyncio.Redis:
    """The claims' client, made in the worker's event loop on first use."""
    return redis.asyncio.Redis.from_url(url())


@broker.task(task_name="jobs.taskiq.charge")
@idempotent_task(claims, key="event_id", lease=LEASE, ttl=600, namespace="jobs.taskiq.charge")
async def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id (the side effect runs in a thread: it is the shared blocking helper)."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@broker.task(task_name="jobs.taskiq.charge30")
@idempotent_task(claims, key="event_id", lease=30, ttl=600, namespace="jobs.taskiq.charge30")
async def charge30(event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@broker.task(task_name="jobs.taskiq.charge_open")
@idempotent_task(unreachable_async, key="event_id", lease=LEASE, ttl=600, namespace="jobs.taskiq.charge_open",
                 fail_open=True)  # fmt: skip
async def charge_open(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@broker.task(task_name="jobs.taskiq.charge_closed")
@idempotent_task(unreachable_async, key="event_id", lease=LEASE, ttl=600, namespace="jobs.taskiq.charge_closed")
async def charge_closed(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@broker.task(task_name="jobs.taskiq.charge_amo")
@idempotent_task(claims, key="event_id", lease=LEASE, ttl=600, namespace="jobs.taskiq.charge_amo", at_most_once=True)
async def charge_at_most_once(event_id: str, amount: int) -> Receipt:
    """Charge at most once per event id: never again after an attempt that ended without a result."""
    return await asyncio.to_thread(charge_card, event_id, amount)


@broker.task(task_name="jobs.taskiq.steps")
@idempotent_task(claims, key="event_id", lease=LEASE, ttl=600, namespace="jobs.taskiq.steps", checkpoints=True)
async def steps(event_id: str) -> dict[str, object]:
    """Four checkpointed steps (in a thread, each checkpoint sent on this loop): a redelivery resumes after the last."""
    claim, loop = current_claim(), asyncio.get_running_loop()

    def save(value: str) -> object:
        return asyncio.run_coroutine_threadsafe(claim.checkpoint(value), loop).result()  # type: ignore[arg-type]

    return await asyncio.to_thread(checkpointed_steps, event_id, save=save)


@broker.task(task_name="jobs.taskiq.tick")
async def tick() -> None:
    """Nothing: traffic. The stream broker hands a dead worker's messages on only after a read that got new ones."""
