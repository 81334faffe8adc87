"""The project's client factory, as the Django page writes it (``GOBLIN_CLAIM_CLIENT`` names it)."""

from __future__ import annotations

import os

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry


def make_client() -> redis.Redis:
    """A client with timeouts and re-sends: the door, the webhook's ``@idempotent`` and the receipt job use it."""
    return redis.Redis.from_url(
        os.environ["REDIS_URL"], socket_timeout=2, socket_connect_timeout=2, health_check_interval=30,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 8),
    )  # fmt: skip
