"""GLIDE's adapters at their edges, sync and asyncio.

GLIDE's timeouts and a closed client as redis-py's errors, a user whose ACL refuses
the native probe (the claims go through the scripts), and a script the cluster refuses.

Real redis-servers, GLIDE clients made as tests/clients/test_glide.py makes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis.exceptions

from goblin_claim import AsyncClaim, Claim, Claimed
from goblin_claim._clients.families import adapt
from tests.clients.test_glide import async_client, sync_client
from tests.conftest import IN_CI, Runner, unique
from tests.support import servers

try:
    import glide
    import glide_sync
except ImportError:  # pragma: no cover -- the dev group installs both
    if IN_CI:
        raise
    pytest.skip("valkey-glide and valkey-glide-sync are not installed", allow_module_level=True)


@pytest.fixture
def run() -> Iterator[Runner]:
    """An event loop for the asyncio clients of one test."""
    runner = Runner()
    yield runner
    runner.close()


def test_a_glide_timeout_and_a_closed_client_are_redis_py_errors(own_server: Any, run: Runner) -> None:
    """A request past GLIDE's timeout is redis-py's TimeoutError; a closed client's batch, its ConnectionError."""
    server = own_server("--enable-debug-command", "yes")
    adapter = adapt(sync_client(server.port, timeout_ms=200))
    with pytest.raises(redis.exceptions.TimeoutError, match="GLIDE"):
        adapter.execute_command("DEBUG", "SLEEP", "1")
    adapter.glide.close()
    with pytest.raises(redis.exceptions.ConnectionError, match="GLIDE"):
        adapter.pipeline().execute_command("GET", unique()).execute(raise_on_error=False)

    async def scenario() -> None:
        made = adapt(await async_client(server.port, timeout_ms=200))
        with pytest.raises(redis.exceptions.TimeoutError, match="GLIDE"):
            await made.execute_command("DEBUG", "SLEEP", "1")
        await made.glide.close()
        with pytest.raises(redis.exceptions.ConnectionError, match="GLIDE"):
            await made.pipeline().execute_command("GET", unique()).execute(raise_on_error=False)

    run(scenario())


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # Its cluster layer lost a node's reply mid-request (seen under a client-kill storm).
        ("BrokenPipe: Cluster: Failed to receive command response from internal sender. RecvError(())",
         redis.exceptions.ConnectionError),
        ("FatalReceiveError: channel closed", redis.exceptions.ConnectionError),
        ("WRONGTYPE: Operation against a key holding the wrong kind of value", redis.exceptions.ResponseError),
        ("An error was signalled by the server: - ReadOnly: You can't write against a read only replica.",
         redis.exceptions.ReadOnlyError),
    ],
)  # fmt: skip
def test_a_glide_request_error_is_what_redis_py_raises_for_the_same_failure(text: str, kind: type) -> None:
    """A link that broke under a request is a connection error (transient), a server's reply its own error."""
    from glide_shared.exceptions import RequestError

    from goblin_claim._clients.glide_base import redis_error

    made = redis_error(RequestError(text))
    assert type(made) is kind, (type(made), made)


def test_a_user_refused_the_native_probe_claims_through_the_scripts(redis_standalone: Any, run: Runner) -> None:
    """An ACL user without COMMAND: the probe's refusal means no native commands, and the claim still lands."""
    admin = redis_standalone.client()
    user = unique("glide-user")
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-command")
    try:
        address = [glide_sync.NodeAddress(servers.HOST, redis_standalone.port)]
        config = glide_sync.GlideClientConfiguration(
            address, credentials=glide_sync.ServerCredentials("pw", user), request_timeout=2000
        )
        client = glide_sync.GlideClient.create(config)
        try:
            key = unique()
            claim = Claim(client, key, native="auto")
            assert isinstance(claim.acquire(), Claimed)
            assert admin.get(claim.claim_key) is not None
        finally:
            client.close()

        async def scenario() -> None:
            made = await glide.GlideClient.create(
                glide.GlideClientConfiguration(
                    [glide.NodeAddress(servers.HOST, redis_standalone.port)],
                    credentials=glide.ServerCredentials("pw", user),
                    request_timeout=2000,
                )
            )
            try:
                handle = AsyncClaim(made, unique(), native="auto")
                assert isinstance(await handle.acquire(), Claimed)
                assert admin.get(handle.claim_key) is not None
            finally:
                await made.close()

        run(scenario())
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_a_script_a_cluster_refuses_is_its_reply_in_the_batch(redis_cluster: Any, run: Runner) -> None:
    """On a cluster a batch holding SCRIPT LOAD runs command by command: a refused script is that command's reply."""
    adapter = adapt(sync_client(redis_cluster[0].port, cluster=True))
    try:
        replies = adapter.pipeline().script_load("this is not lua(").execute_command("ECHO", "ok").execute(False)
        assert isinstance(replies[0], redis.exceptions.ResponseError)
        assert "Error compiling script" in str(replies[0])
        assert replies[1] == b"ok"
    finally:
        adapter.glide.close()

    async def scenario() -> None:
        made = adapt(await async_client(redis_cluster[0].port, cluster=True))
        try:
            pipe = made.pipeline().script_load("this is not lua(").execute_command("ECHO", "ok")
            replies = await pipe.execute(False)
            assert isinstance(replies[0], redis.exceptions.ResponseError)
            assert replies[1] == b"ok"
        finally:
            await made.glide.close()

    run(scenario())


def test_an_adapter_names_its_glide_client(redis_standalone: Any) -> None:
    """An adapter's repr names the GLIDE client it speaks for (as logs and errors show it)."""
    client = sync_client(redis_standalone.port)
    try:
        assert repr(adapt(client)) == f"GlideAdapter({type(client).__module__}.{type(client).__qualname__})"
    finally:
        client.close()
