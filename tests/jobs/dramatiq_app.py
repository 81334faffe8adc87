"""The Dramatiq broker and actor of tests/test_dramatiq.py."""

from __future__ import annotations

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from goblin_claim.dramatiq import Idempotency
from tests.jobs.common import LEASE, Receipt, charge_card, data, url

# A dead worker's messages go back to the queue once its heartbeat is 2 s old; maintenance
# (which does the requeue) runs on every command here instead of one in a thousand.
broker = RedisBroker(url=url(), heartbeat_timeout=2000, maintenance_chance=1_000_000)
# Results are read with a blocking pop: no socket timeout shorter than the wait.
backend = RedisBackend(client=redis.Redis.from_url(url(), socket_timeout=60))
broker.add_middleware(Results(backend=backend))
broker.add_middleware(Idempotency(data))
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
