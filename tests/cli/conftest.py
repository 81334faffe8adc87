"""What the CLI's tests share: a client on the stock server (the command itself is in invoke.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support import servers


@pytest.fixture
def stock(redis_standalone: servers.RedisProcess) -> Iterator[redis.Redis]:
    """A client on the stock standalone server."""
    client = redis_standalone.client()
    yield client
    client.close()
