"""Choosing between the server's own commands, GOBLIN.CLAIM / GOBLIN.CAD and the scripts.

A plain one-key claim takes the server's SET ... NX GET where it has it (Redis 7,
Valkey, the fakes), before GOBLIN.CLAIM; two keys take GOBLIN.CLAIM where the module
is loaded; a Redis 6.2 (a fake playing one) runs the scripts. Also recovering from a
cold script cache, counted command by command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, NativeUnavailableError
from goblin_claim._clients.transport import state_of
from goblin_claim._protocol.scripts import DEL_KEYS, NATIVE_COMMANDS, PEXPIRETIME, SCRIPTS, SET_NX_GET
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import unique
from tests.support.servers import RedisProcess

# What the probe finds on a Redis 7 with the module: its commands, and SET ... NX GET (with DEL for forget).
OWN = frozenset({PEXPIRETIME, SET_NX_GET, DEL_KEYS})
NATIVE_AND_OWN = frozenset(NATIVE_COMMANDS) | OWN


def redis_62(native: bool = False) -> Any:
    """A fake playing Redis 6.2: no SET ... NX GET (nor PEXPIRETIME), so claims run the scripts."""
    import fakeredis

    return fake_redis(native=native, server=fakeredis.FakeServer(version=(6, 2)))


class Recorder:
    """Records the name of every command a sync client sends, pipelined ones too (the server is never mocked)."""

    def __init__(self, client: Any) -> None:
        self.names: list[str] = []
        client.execute_command = self._recording(client.execute_command)
        make_pipeline = client.pipeline

        def pipeline(*args: Any, **options: Any) -> Any:
            pipe = make_pipeline(*args, **options)
            pipe.execute_command = self._recording(pipe.execute_command)
            return pipe

        client.pipeline = pipeline

    def _recording(self, original: Any) -> Any:
        def execute_command(*args: Any, **options: Any) -> Any:
            self.names.append(str(args[0]).upper())
            return original(*args, **options)

        return execute_command


def test_auto_uses_native_commands_where_present() -> None:
    """native="auto" with the module: SET ... NX GET claims one key, GOBLIN.CLAIM two, GOBLIN.CAD releases."""
    client = fake_redis(native=True)
    log = Recorder(client)
    handle = Claim(client, unique())
    assert isinstance(handle.acquire(), Claimed)
    assert handle.release() is True
    pair = Claim.from_keys(client, f"c:{{{unique()}}}", f"r:{{{unique()}}}")
    pair = Claim.from_keys(client, pair.claim_key, pair.claim_key.replace("c:", "r:", 1))
    assert isinstance(pair.acquire(), Claimed)
    assert state_of(client).native == NATIVE_AND_OWN
    assert log.names.count("SET") == 1
    assert log.names.count("GOBLIN.CLAIM") == 1
    assert log.names.count("GOBLIN.CAD") == 1
    assert "EVALSHA" not in log.names


def test_auto_on_a_stock_redis_7_claims_with_set_nx_get() -> None:
    """native="auto" on a stock Redis 7: each plain claim is one SET ... NX GET, after one probe per client."""
    client = fake_redis(native=False)
    log = Recorder(client)
    for _ in range(3):
        Claim(client, unique()).acquire()
    assert state_of(client).native == OWN
    assert log.names.count("SET") == 3
    assert "EVALSHA" not in log.names


def test_auto_falls_back_to_scripts_without_native() -> None:
    """native="auto" on a stock Redis 6.2 uses EVALSHA, after one probe per client."""
    client = redis_62()
    log = Recorder(client)
    for _ in range(3):
        Claim(client, unique()).acquire()
    assert state_of(client).native == frozenset()
    assert log.names.count("EVALSHA") == 3
    assert "GOBLIN.CLAIM" not in log.names
    assert "SET" not in log.names


def test_a_server_that_refuses_set_nx_get_costs_one_call_then_the_scripts() -> None:
    """A server the probe took for Redis 7 that answers SET ... NX GET with a syntax error: the script, from then on."""
    client = redis_62()
    state = state_of(client)
    state.native, state.ready = OWN, True  # what a probe had wrongly found
    log = Recorder(client)
    key = unique()
    assert isinstance(Claim(client, key).acquire(), Claimed)
    assert state.native == frozenset()
    assert Claim(client, key).acquire() == InFlight(key=key)
    # The scripts were never loaded here, so the first one recovers through EVAL.
    assert log.names == ["SET", "EVALSHA", "EVAL", "EVALSHA"]


def test_never_uses_scripts_even_with_native() -> None:
    """native="never" sends EVALSHA although the server has GOBLIN.CLAIM; the replies are the same."""
    client = fake_redis(native=True)
    log = Recorder(client)
    key = unique()
    owner = Claim(client, key, native="never")
    assert isinstance(owner.acquire(), Claimed)
    assert Claim(client, key, native="never").acquire() == InFlight(key=key)
    owner.complete(b"v")
    assert Claim(client, key, native="never").acquire() == Completed(key=key, value=b"v")
    assert "GOBLIN.CLAIM" not in log.names
    assert "GOBLIN.CAD" not in log.names


def test_always_without_native_raises_before_writing() -> None:
    """native="always" on a stock server raises NativeUnavailableError and writes nothing."""
    client = fake_redis(native=False)
    handle = Claim(client, unique(), native="always")
    with pytest.raises(NativeUnavailableError) as info:
        handle.acquire()
    assert info.value.key == handle.key
    assert client.keys("*") == []


def test_always_with_native_works() -> None:
    """native="always" on a server with the commands claims two keys through GOBLIN.CLAIM (one key: SET ... NX GET)."""
    client = fake_redis(native=True)
    log = Recorder(client)
    claim_key = f"c:{{{unique()}}}"
    pair = Claim.from_keys(client, claim_key, claim_key.replace("c:", "r:", 1), native="always")
    assert isinstance(pair.acquire(), Claimed)
    assert isinstance(Claim(client, unique(), native="always").acquire(), Claimed)
    assert log.names.count("GOBLIN.CLAIM") == 1
    assert log.names.count("SET") == 1


def test_unknown_command_at_run_time_switches_the_client_to_scripts() -> None:
    """A client that believed in native (its node was replaced) retries with the script and stays there."""
    client = fake_redis(native=False)
    state = state_of(client)
    state.native, state.ready = frozenset(NATIVE_COMMANDS), True  # what an earlier probe had found
    log = Recorder(client)
    key = unique()
    assert isinstance(Claim(client, key).acquire(), Claimed)
    assert state.native == frozenset()
    assert Claim(client, key).acquire() == InFlight(key=key)
    # The scripts were never loaded here, so the first one recovers through EVAL.
    assert log.names == ["GOBLIN.CLAIM", "EVALSHA", "EVAL", "EVALSHA"]


def test_state_is_per_client_not_per_class() -> None:
    """Two clients of different servers keep separate native decisions."""
    native, stock = fake_redis(native=True), redis_62()
    Claim(native, unique()).acquire()
    Claim(stock, unique()).acquire()
    assert state_of(native).native == NATIVE_AND_OWN
    assert state_of(stock).native == frozenset()


def test_plain_fakeredis_still_lacks_the_commands() -> None:
    """Making a native fake does not teach plain fakeredis clients the commands."""
    import fakeredis

    fake_redis(native=True).execute_command("GOBLIN.CLAIM", "c", "r", "t", 30)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        fakeredis.FakeRedis().execute_command("GOBLIN.CLAIM", "c", "r", "t", 30)


def test_async_native_detection() -> None:
    """AsyncClaim detects the native commands once and uses them."""

    async def scenario() -> tuple[object, object, frozenset[str] | None]:
        client = fake_async_redis(native=True)
        key = unique()
        results = await asyncio.gather(*(AsyncClaim(client, key).acquire() for _ in range(20)))
        native = state_of(client).native
        await client.aclose()
        return sum(isinstance(r, Claimed) for r in results), results[-1], native

    claimed, _last, native = asyncio.run(scenario())
    assert claimed == 1
    assert native == NATIVE_AND_OWN


# --------------------------------------------------------------------------- real servers


@pytest.fixture
def standalone_client(redis_standalone: RedisProcess) -> Iterator[redis.Redis]:
    """A fresh sync client on the session's standalone server."""
    client = redis_standalone.client()
    yield client
    client.close()


def commandstats(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in client.info("commandstats").items()}


def test_cold_script_cache_costs_one_extra_round_trip(standalone_client: redis.Redis) -> None:
    """After SCRIPT FLUSH, the next scripted acquire costs EVALSHA (NOSCRIPT) + EVAL, and later ones EVALSHA alone."""
    admin = standalone_client
    client = redis.Redis(host=admin.connection_pool.connection_kwargs["host"],
                         port=admin.connection_pool.connection_kwargs["port"])  # fmt: skip
    Claim(client, unique(), native="never").acquire()  # probe and SCRIPT LOAD happen here, once
    admin.script_flush()
    admin.config_resetstat()
    assert isinstance(Claim(client, unique(), native="never").acquire(), Claimed)
    first = commandstats(admin)
    assert first.get("evalsha") == 1
    assert first.get("eval") == 1
    assert "script|load" not in first
    admin.config_resetstat()
    Claim(client, unique(), native="never").acquire()
    second = commandstats(admin)
    assert second.get("evalsha") == 1
    assert "eval" not in second
    client.close()


def test_first_use_probes_and_loads_in_one_round_trip(standalone_client: redis.Redis) -> None:
    """A new client's first acquire sends COMMAND INFO and SCRIPT LOAD (pipelined), then SET ... NX GET, as the next."""
    kwargs = standalone_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"])
    standalone_client.config_resetstat()
    Claim(client, unique()).acquire()
    Claim(client, unique()).acquire()
    stats = commandstats(standalone_client)
    assert stats.get("command|info") == 1
    assert stats.get("script|load") == len(SCRIPTS)
    assert stats.get("set") == 2
    assert "evalsha" not in stats
    client.close()


def test_acl_without_command_permission_means_no_native(standalone_client: redis.Redis) -> None:
    """A user whose ACL forbids COMMAND INFO still claims, through the scripts."""
    user = unique("user")
    standalone_client.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "-command")
    kwargs = standalone_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"], username=user, password="pw")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("COMMAND INFO", "get")
        key = unique()
        assert isinstance(Claim(client, key).acquire(), Claimed)
        assert state_of(client).native == frozenset()
        assert Claim(client, key).acquire() == InFlight(key=key)
    finally:
        client.close()
        standalone_client.execute_command("ACL", "DELUSER", user)
