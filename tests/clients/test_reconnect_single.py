"""A client of one connection (``single_connection_client=True``) that a replica answers READONLY.

The handle gives up with ``ServerUnavailableError`` once its lease is spent, and drops
that connection on the way: behind a proxy or a DNS name only a new connection
reaches the new primary. Checked by the connection's id on the server, sync and asyncio.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio

from goblin_claim import AsyncClaim, Claim, ServerUnavailableError
from tests.conftest import unique
from tests.support import servers


def test_a_single_connection_answered_readonly_is_dropped(redis_replicated: Any) -> None:
    """READONLY on a client's one connection: ServerUnavailableError, and the next command runs on a new one."""
    _primary, replica = redis_replicated
    client = redis.Redis(host=servers.HOST, port=replica.port, single_connection_client=True)
    try:
        before = client.client_id()
        with pytest.raises(ServerUnavailableError, match="READONLY"):
            Claim(client, unique("ro"), lease=1).acquire()
        assert client.client_id() != before
    finally:
        client.close()


def test_an_async_single_connection_answered_readonly_is_dropped(redis_replicated: Any) -> None:
    """The asyncio client alike: a new connection after the READONLY that ended the claim."""
    _primary, replica = redis_replicated

    async def scenario() -> None:
        client = redis.asyncio.Redis(host=servers.HOST, port=replica.port, single_connection_client=True)
        try:
            before = await client.client_id()
            with pytest.raises(ServerUnavailableError, match="READONLY"):
                await AsyncClaim(client, unique("ro"), lease=1).acquire()
            assert await client.client_id() != before
        finally:
            await client.aclose()

    asyncio.run(scenario())
