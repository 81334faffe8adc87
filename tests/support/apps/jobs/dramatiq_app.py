"""The Dramatiq broker and actor of tests/jobs/test_dramatiq.py."""

from __future__ import annotations

from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from goblin_claim.dramatiq import Idempotency
from tests.support.apps.jobs.common import LEASE, Receipt, charge_card, data, mark, unreachable, url


class Marks(dramatiq.Middleware):
    """When each message started and finished in the worker, for the latency figures."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Mark the message's start."""
        mark("started", message.message_id)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """Mark the message's end, when it ended with a result (not retried)."""
        if exception is None:
            mark("finished", message.message_id)


# A dead worker's messages go back to the queue once its heartbeat is 2 s old; maintenance
# (which does the requeue) runs on every command here instead of one in a thousand.
broker = RedisBroker(url=url(), heartbeat_timeout=2000, maintenance_chance=1_000_000)
# Results are read with a blocking pop: no socket timeout shorter than the wait.
backend = RedisBackend(client=redis.Redis.from_url(url(), socket_timeout=60))
broker.add_middleware(Results(backend=backend))
broker.add_middleware(Idempotency(data))
broker.add_middleware(Marks())
dramatiq.set_broker(broker)


@dramatiq.actor(
    actor_name="jobs.dramatiq.charge",
    store_results=True,
    max_retries=0,  # an in-flight answer must not need a retry of the actor's own
    idempotency={"key": "event_id", "lease": LEASE, "ttl": 600},
)
def charge(event_id: str, amount: int) -> Receipt:
    """Charge once per event id."""
    return charge_card(event_id, amount)


@dramatiq.actor(
    actor_name="jobs.dramatiq.charge30",
    store_results=True,
    max_retries=0,
    idempotency={"key": "event_id", "lease": 30, "ttl": 600},
)
def charge30(event_id: str, amount: int) -> Receipt:
    """Charge once per event id under the README's 30 s lease: an in-flight retry would come a lease later."""
    return charge_card(event_id, amount)


@dramatiq.actor(
    actor_name="jobs.dramatiq.charge_open",
    store_results=True,
    max_retries=0,
    idempotency={"client": unreachable, "key": "event_id", "lease": LEASE, "ttl": 600, "fail_open": True},
)
def charge_open(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: runs anyway (fail_open), once per delivery."""
    return charge_card(event_id, amount)


@dramatiq.actor(
    actor_name="jobs.dramatiq.charge_closed",
    store_results=True,
    max_retries=0,
    idempotency={"client": unreachable, "key": "event_id", "lease": LEASE, "ttl": 600},
)
def charge_closed(event_id: str, amount: int) -> Receipt:
    """Charge per event id, claimed on a Redis out of reach: refused (the default), never runs."""
    return charge_card(event_id, amount)
