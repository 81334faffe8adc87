"""The server's own commands answer as the scripts do: outcome for outcome, error for error, key for key.

A plain one-key record's claim goes as ``SET key token NX GET EX lease`` where the server
has it (Redis 7.0 and later, Valkey, fakeredis), its store as ``SET key "done <token>
<value>" IFEQ token EX ttl`` where it has SET IFEQ (Valkey 9), forget as ``DEL``. Each
record a key can hold (free, in flight, completed by this token or another, an
at-most-once record in time or interrupted, a hash, a raw writer's value...) is put in two
namespaces; each operation runs on one through the server's own commands
(``native="auto"``) and on the other through the scripts (``native="never"``), and both
must give the same outcome (``InFlight.retry_after`` within a second), raise the same error
with the same message, and leave the same key behind (type, value, TTL within two seconds).
On Redis 7.0, Redis 8.2, Valkey 9 standalone and clustered, and fakeredis; both drivers.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from goblin_claim import AsyncClaim, Claim, InFlight, ServerUnavailableError
from goblin_claim._clients.transport import state_of
from goblin_claim._handle import _STORE_TRIES, ClaimBase
from goblin_claim._protocol.scripts import SET_IFEQ, SET_NX_GET, owner_check
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import missing, unique
from tests.support import servers

TOKEN = "tok-1"
OTHER = "worker-3"


def _held(deadline_from_now_ms: int, token: str) -> Callable[[], bytes]:
    """An at-most-once record (claim.lua): its deadline ``deadline_from_now_ms`` away, claimed 20 s before it."""

    def value() -> bytes:
        now = int(time.time() * 1000)
        deadline = now + deadline_from_now_ms
        return f"held {deadline} {deadline - 20_000} {token}".encode()

    return value


# name -> what the key holds before the operation: (value or a maker of it, its expiry in ms or None), or "hash".
STATES: dict[str, Any] = {
    "free": None,
    "held by another token": (OTHER.encode(), 30_000),
    "held by this token (another handle's)": (TOKEN.encode(), 30_000),
    "held without an expiry": (OTHER.encode(), None),
    "completed by another token": (b"done worker-3 charged:txn_551", 600_000),
    "completed by this token, this value": (b"done tok-1 v", 600_000),
    "completed by this token, another value": (b"done tok-1 w", 600_000),
    "a done marker without a value": (b"done worker-3", 600_000),
    "at most once, another token, in time": (_held(20_000, OTHER), 600_000),
    "at most once, another token, interrupted": (_held(-1_000, OTHER), 600_000),
    "at most once, this token, in time": (_held(20_000, TOKEN), 600_000),
    "at most once, this token, interrupted": (_held(-1_000, TOKEN), 600_000),
    "an empty value": (b"", 30_000),
    "a raw holder named CLAIMED": (b"CLAIMED", 30_000),
    "a hash": "hash",
}
OPERATIONS = ("acquire", "acquire twice", "wait(timeout=0)", "acquire_many", "complete", "forget")
SERVERS = ("redis", "redis8", "valkey", "valkey-cluster", "fake")


class Server:
    """One server: a sync client, an asyncio one on demand, and a raw one to arrange and look."""

    def __init__(self, name: str, request: pytest.FixtureRequest) -> None:
        self.name = name
        self.cluster = name.endswith("-cluster")
        if name == "fake":
            import fakeredis

            self.fake = fakeredis.FakeServer()
            self.raw: Any = fake_redis(native=False, server=self.fake)
            return
        fixture = {"redis": "redis_standalone", "redis8": "redis8_standalone", "valkey": "valkey_standalone"}
        if name == "redis8" and servers.redis8_server_binary() is None:
            missing("Redis 8's redis-server is not there (make redis8-server)")
        if name.startswith("valkey") and servers.valkey_server_binary() is None:
            missing("valkey-server is not built (make valkey-server)")
        value = request.getfixturevalue("valkey_cluster" if self.cluster else fixture[name])
        self.port = value[0].port if self.cluster else value.port
        self.raw = self.sync()

    def sync(self) -> Any:
        """A new sync client."""
        if self.name == "fake":
            return fake_redis(native=False, server=self.fake)
        if self.cluster:
            return redis.cluster.RedisCluster(host=servers.HOST, port=self.port)
        return redis.Redis(host=servers.HOST, port=self.port)

    def async_(self) -> Any:
        """A new asyncio client (made inside the loop that uses it)."""
        if self.name == "fake":
            return fake_async_redis(native=False, server=self.fake)
        if self.cluster:
            return redis.asyncio.cluster.RedisCluster(host=servers.HOST, port=self.port)
        return redis.asyncio.Redis(host=servers.HOST, port=self.port)


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Server:
    """Each server in turn."""
    made = Server(request.param, request)
    yield made  # type: ignore[misc]
    made.raw.close()


def _arrange(raw: Any, keys: list[str], state: str) -> None:
    """Put ``state`` in each of ``keys``, the same bytes in each (an at-most-once record's deadline made once)."""
    held = STATES[state]
    if held is None:
        return
    if held == "hash":
        for key in keys:
            raw.hset(key, "field", "value")
        return
    value, expiry = held
    value = value() if callable(value) else value
    for key in keys:
        raw.set(key, value, px=expiry)


def _look(raw: Any, key: str) -> tuple[object, ...]:
    kind = raw.type(key)
    value = raw.hgetall(key) if kind == b"hash" else raw.get(key)
    return kind, value, raw.pttl(key)


def _same_look(a: tuple[object, ...], b: tuple[object, ...], namespaces: tuple[str, str]) -> bool:
    (kind_a, value_a, ttl_a), (kind_b, value_b, ttl_b) = a, b
    if (kind_a, value_a) != (kind_b, value_b):
        return False
    if int(ttl_a) < 0 or int(ttl_b) < 0:  # type: ignore[call-overload]
        return ttl_a == ttl_b
    return abs(int(ttl_a) - int(ttl_b)) <= 2000  # type: ignore[call-overload]


def _normal(result: object, namespace: str) -> object:
    """An outcome or an error, comparable across the two namespaces (retry_after in whole seconds, rounded)."""
    if isinstance(result, BaseException):
        # From inside a script the server appends where it failed (" script: <sha>, on @user_script:86.").
        text = re.sub(r" script: (?:[0-9a-f]{40}, )?on @user_script:\d+\.", "", str(result))
        return type(result).__name__, text.replace(namespace, "NS")
    if isinstance(result, list):
        return [_normal(item, namespace) for item in result]
    if isinstance(result, InFlight):
        seconds = None if result.retry_after is None else round(result.retry_after)
        return "InFlight", result.key, result.holder, seconds
    return result


def _sync_op(client: Any, namespace: str, key: str, operation: str, native: str) -> object:
    handle = Claim(client, key, namespace=namespace, token=TOKEN, native=native)  # type: ignore[arg-type]
    try:
        if operation == "acquire":
            return handle.acquire()
        if operation == "acquire twice":
            first = handle.acquire()
            return [first, handle.acquire()]
        if operation == "wait(timeout=0)":
            return handle.wait(timeout=0)
        if operation == "acquire_many":
            pairs = Claim.acquire_many(client, [key], namespace=namespace, native=native, token=TOKEN)
            return [outcome for _, outcome in pairs]
        if operation == "complete":
            return handle.complete(b"v")
        return handle.forget()
    except Exception as exc:
        return exc


async def _async_op(client: Any, namespace: str, key: str, operation: str, native: str) -> object:
    handle = AsyncClaim(client, key, namespace=namespace, token=TOKEN, native=native)  # type: ignore[arg-type]
    try:
        if operation == "acquire":
            return await handle.acquire()
        if operation == "acquire twice":
            first = await handle.acquire()
            return [first, await handle.acquire()]
        if operation == "wait(timeout=0)":
            return await handle.wait(timeout=0)
        if operation == "acquire_many":
            pairs = await AsyncClaim.acquire_many(client, [key], namespace=namespace, native=native, token=TOKEN)
            return [outcome for _, outcome in pairs]
        if operation == "complete":
            return await handle.complete(b"v")
        return await handle.forget()
    except Exception as exc:
        return exc


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("state", list(STATES))
def test_the_server_s_own_commands_answer_as_the_scripts(server: Server, state: str, operation: str, kind: str) -> None:
    """Each operation on each record: the same outcome or error, and the same key, through both paths."""
    namespaces = (unique("own"), unique("scripted"))
    key = unique("k")
    records = [f"{namespace}:{{{key}}}" for namespace in namespaces]
    _arrange(server.raw, records, state)
    results = []
    if kind == "sync":
        client = server.sync()
        try:
            for namespace, native in zip(namespaces, ("auto", "never"), strict=True):
                results.append(_sync_op(client, namespace, key, operation, native))
            found = state_of(client).native
            probe = Claim(client, key, namespace=namespaces[0], token=TOKEN)
        finally:
            client.close()
    else:

        async def both() -> tuple[list[object], Any, Any]:
            client = server.async_()
            try:
                got = [
                    await _async_op(client, namespace, key, operation, native)
                    for namespace, native in zip(namespaces, ("auto", "never"), strict=True)
                ]
                return got, state_of(client).native, AsyncClaim(client, key, namespace=namespaces[0], token=TOKEN)
            finally:
                await client.aclose()

        results, found, probe = asyncio.run(both())
    assert found is not None
    assert SET_NX_GET in found  # every server here has it: the first namespace took the server's own commands
    if operation == "complete":
        assert owner_check("auto", found, probe._store_script) == (SET_IFEQ if SET_IFEQ in found else None)
    own, scripted = (_normal(result, namespace) for result, namespace in zip(results, namespaces, strict=True))
    assert own == scripted, (state, operation)
    looks = [_look(server.raw, record) for record in records]
    assert _same_look(*looks, namespaces), (state, operation, looks)


def test_a_store_whose_record_keeps_changing_gives_up_after_a_few_reads(
    valkey_standalone: servers.RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that changes under each store: a bounded retry, then a transient error, nothing written.

    SET ... IFEQ misses, and each read finds the record this token's to complete again; the
    next complete() stores.
    """
    client = valkey_standalone.client()
    try:
        handle = Claim(client, unique(), token=TOKEN)
        handle.acquire()
        client.set(handle.claim_key, f"held 1 1 {OTHER}")  # another owner's: SET ... IFEQ tok-1 misses
        reads: list[object] = []

        def always_mine(self: Any, raw: object, stored: object, encoding: str) -> tuple[object, object]:
            reads.append(raw)
            return None, TOKEN  # as if the read found this token again, each time

        monkeypatch.setattr(ClaimBase, "_store_verdict", always_mine)
        with pytest.raises(ServerUnavailableError, match="changed between each store and the read"):
            handle.complete(b"v")
        assert len(reads) == _STORE_TRIES
        assert client.get(handle.claim_key) == f"held 1 1 {OTHER}".encode()
        monkeypatch.undo()
        client.set(handle.claim_key, TOKEN)
        handle.complete(b"v")
        assert client.get(handle.claim_key) == b"done tok-1 v"
    finally:
        client.close()
