"""The RedisHuey and tasks of tests/jobs/test_huey.py, JSON serialized: Huey pickles by default; nothing is here."""

from __future__ import annotations

import datetime
import json
from typing import Any

from huey import RedisHuey
from huey.registry import Message
from huey.serializer import Serializer
from huey.signals import SIGNAL_COMPLETE, SIGNAL_EXECUTING
from huey.utils import Error

from goblin_claim.huey import idempotent_task
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, checkpointed_steps, mark, unreachable, url


class JSONSerializer(Serializer):  # type: ignore[misc]  # Huey ships no type hints
    """Huey's messages, results and revocations as JSON: its tuples, datetimes and errors tagged."""

    def _serialize(self, data: Any) -> bytes:
        return json.dumps(_tagged(data)).encode()

    def _deserialize(self, data: bytes) -> Any:
        return json.loads(data, object_hook=_untagged)


def _tagged(value: Any) -> Any:
    if isinstance(value, Message):
        return {"__message__": [_tagged(field) for field in value]}
    if isinstance(value, Error):
        return {"__error__": _tagged(value.metadata)}
    if isinstance(value, datetime.datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, (list, tuple)):
        return [_tagged(item) for item in value]
    if isinstance(value, dict):
        return {name: _tagged(item) for name, item in value.items()}
    return value


def _untagged(value: dict[str, Any]) -> Any:
    if "__message__" in value:
        return Message(*value["__message__"])
    if "__error__" in value:
        return Error(value["__error__"])
    if "__datetime__" in value:
        return datetime.datetime.fromisoformat(value["__datetime__"])
    return value


huey = RedisHuey("goblin-jobs", url=url(), serializer=JSONSerializer())


@idempotent_task(huey, key="event_id", lease=LEASE, ttl=600, namespace="jobs.huey.charge")
def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id."""
    return charge_card(event_id, amount)


@idempotent_task(huey, key="event_id", lease=30, ttl=600, namespace="jobs.huey.charge30")
def charge30(event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    return charge_card(event_id, amount)


@idempotent_task(huey, key="event_id", client=unreachable, lease=LEASE, ttl=600, namespace="jobs.huey.charge_open",
                 fail_open=True)  # fmt: skip
def charge_open(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return charge_card(event_id, amount)


@idempotent_task(huey, key="event_id", client=unreachable, lease=LEASE, ttl=600, namespace="jobs.huey.charge_closed")
def charge_closed(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return charge_card(event_id, amount)


@idempotent_task(huey, key="event_id", lease=LEASE, ttl=600, namespace="jobs.huey.charge_amo", at_most_once=True)
def charge_at_most_once(event_id: str, amount: int) -> Receipt:
    """Charge at most once per event id: never again after an attempt that ended without a result."""
    return charge_card(event_id, amount)


@idempotent_task(huey, key="event_id", lease=LEASE, ttl=600, namespace="jobs.huey.steps", checkpoints=True)
def steps(event_id: str) -> dict[str, object]:
    """Four checkpointed steps: the copy that runs after a kill resumes after the last one."""
    return checkpointed_steps(event_id)


@huey.signal(SIGNAL_EXECUTING)
def _started(signal: str, task: Any) -> None:
    """Mark each delivery's start, by its task id, for the latency figures."""
    mark("started", task.id)


@huey.signal(SIGNAL_COMPLETE)
def _finished(signal: str, task: Any) -> None:
    """Mark each delivery's end with a result."""
    mark("finished", task.id)
