"""The reference module (``native/goblin.c``) on real servers.

The SDK takes the native path where the module is loaded (standalone and cluster)
and gets the same outcomes as on the scripts; the module's writes reach a replica
and an AOF as plain commands, so neither needs the module; it keeps WATCH, ACL
key patterns and cluster routing working as the scripted form does. Every test
runs on redis-server 7, on valkey-server and on Redis 8's redis-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, ResultLostError, WrongTypeError
from goblin_claim._clients.transport import state_of
from goblin_claim._protocol.record import build_keys
from goblin_claim._protocol.scripts import NATIVE_COMMANDS
from tests.conftest import Driver, record, unique
from tests.support import servers


def commandstats(client: Any) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (summed over a cluster's nodes)."""
    info = client.info("commandstats")
    nodes = info.values() if isinstance(client, redis.cluster.RedisCluster) else [info]
    counts: dict[str, int] = {}
    for stats in nodes:
        for name, row in stats.items():
            name = name.removeprefix("cmdstat_")
            counts[name] = counts.get(name, 0) + int(row["calls"])
    return counts


# The tests that start servers of their own run on all three (tests/conftest.py).
SERVERS = ("redis", "valkey", "redis8")


@pytest.fixture(params=SERVERS)
def with_module(request: pytest.FixtureRequest) -> servers.RedisProcess:
    """The session's standalone server with the module: redis-server 7, valkey-server, Redis 8."""
    server: servers.RedisProcess = request.getfixturevalue(f"{request.param}_native")
    return server


@pytest.fixture(params=SERVERS)
def cluster_with_module(request: pytest.FixtureRequest) -> list[servers.RedisProcess]:
    """The session's cluster with the module on every node: redis-server 7, valkey-server, Redis 8."""
    nodes: list[servers.RedisProcess] = request.getfixturevalue(f"{request.param}_native_cluster")
    return nodes


@pytest.fixture
def native_client(with_module: servers.RedisProcess) -> Iterator[redis.Redis]:
    """A sync client on the standalone server with the module."""
    client = with_module.client()
    yield client
    client.close()


# --------------------------------------------------------------------------- the SDK takes the native path


def _pair(client: Any) -> tuple[str, str]:
    """Two keys of one slot, for a from_keys handle (GOBLIN.CLAIM's layout)."""
    claim_key = f"c:{{{unique()}}}"
    return claim_key, claim_key.replace("c:", "r:", 1)


def test_sdk_sends_goblin_claim_and_cad_where_the_module_is_loaded(native_client: redis.Redis) -> None:
    """native="auto" on a server with the module: two-key claims go out as GOBLIN.CLAIM, releases as GOBLIN.CAD.

    The server's own commands are preferred where it has them: SET ... NX GET for a one-key
    claim (Redis 7 and later, Valkey), DELIFEQ for the release (Valkey 9).
    """
    native_client.config_resetstat()
    keys = _pair(native_client)
    owner = Claim.from_keys(native_client, *keys)
    assert isinstance(owner.acquire(), Claimed)
    assert Claim.from_keys(native_client, *keys).acquire() == InFlight(key=keys[0])
    assert owner.release() is True
    one_key = Claim(native_client, unique())
    assert isinstance(one_key.acquire(), Claimed)
    stats = commandstats(native_client)
    found = state_of(native_client).native
    assert found >= frozenset(NATIVE_COMMANDS)
    assert stats.get("goblin.claim") == 2
    assert stats.get("delifeq" if "DELIFEQ" in found else "goblin.cad") == 1
    assert stats.get("evalsha") == 1  # GOBLIN.CLAIM answered nil: the duplicate peeks once
    assert stats.get("set") == 1  # the one-key claim


@pytest.mark.parametrize(
    "backend",
    [
        "fake-native",
        "native",
        "native-cluster",
        "valkey-native",
        "valkey-native-cluster",
        "redis8-native",
        "redis8-native-cluster",
    ],
    indirect=True,
)
def test_the_native_backends_take_the_native_path(driver: Driver) -> None:
    """The suites' native backends are native: both drivers detect GOBLIN.CLAIM and claim through it, then release."""
    handle = driver.claim(unique(), native="always")
    assert isinstance(handle.acquire(), Claimed)
    assert state_of(driver.client).native >= frozenset(NATIVE_COMMANDS)
    assert driver.backend.native
    assert handle.release() is True  # GOBLIN.CAD (on Valkey its own DELIFEQ, preferred)
    assert driver.raw.exists(handle.claim_key) == 0


def test_sdk_on_the_module_cluster_routes_native_commands_to_each_keys_node(
    cluster_with_module: list[servers.RedisProcess],
) -> None:
    """On a cluster with the module on every node, the client routes GOBLIN.CLAIM by its keys to every primary."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=cluster_with_module[0].port)
    try:
        client.config_resetstat(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        keys = [unique() for _ in range(30)]
        pairs = [(f"c:{{{key}}}", f"r:{{{key}}}") for key in keys]
        assert all(isinstance(Claim.from_keys(client, *pair).acquire(), Claimed) for pair in pairs)
        assert state_of(client).native >= frozenset(NATIVE_COMMANDS)
        per_node = [int(node.client().info("commandstats").get("cmdstat_goblin.claim", {}).get("calls", 0))
                    for node in cluster_with_module]  # fmt: skip
        assert sum(per_node) == 30
        assert all(per_node), per_node  # 30 keys land on all three primaries
        for claim_key, _result_key in pairs:
            assert client.get(claim_key) is not None  # each claim is on the node its slot maps to
    finally:
        client.close()


# --------------------------------------------------------------------------- the same outcomes on both paths

# What the keys hold before a duplicate (token worker-9) calls acquire(), and the layout:
# "one" is the default handle's one key (build_keys gives it as both names), "two" a
# from_keys handle on the seed's two keys (a done marker in the claim key, the value in
# the result key), whose lost result and non-string result only that layout can have.
SCENARIOS: dict[str, tuple[str, Callable[[redis.Redis, str, str], object]]] = {
    "fresh": ("one", lambda raw, claim, result: None),
    "held by another token": ("one", lambda raw, claim, result: raw.set(claim, "worker-3", ex=30)),
    "held by this token (a re-sent acquire)": ("one", lambda raw, claim, result: raw.set(claim, "worker-9", ex=30)),
    "completed": ("one", lambda raw, claim, result: raw.set(claim, record("worker-3", "charged:txn_551"), ex=60)),
    "completed by this token": ("one", lambda raw, claim, result: raw.set(claim, record("worker-9", "v"), ex=60)),
    "claim key a hash": ("one", lambda raw, claim, result: raw.hset(claim, "f", "v")),
    "two keys: fresh": ("two", lambda raw, claim, result: None),
    "two keys: held by another token": ("two", lambda raw, claim, result: raw.set(claim, "worker-3", ex=30)),
    "two keys: held by this token (a re-sent acquire)": (
        "two",
        lambda raw, claim, result: raw.set(claim, "worker-9", ex=30),
    ),
    "two keys: completed": (
        "two",
        lambda raw, claim, result: (
            raw.set(claim, "done worker-3", ex=60),
            raw.set(result, "charged:txn_551", ex=60),
        ),
    ),
    "two keys: completed, result lost": ("two", lambda raw, claim, result: raw.set(claim, "done worker-3", ex=60)),
    "two keys: held, result a hash": (
        "two",
        lambda raw, claim, result: (raw.set(claim, "worker-3", ex=30), raw.hset(result, "f", "v")),
    ),
    "two keys: claim key a hash": ("two", lambda raw, claim, result: raw.hset(claim, "f", "v")),
}


def _keys(layout: str, key: str) -> tuple[str, str]:
    """The claim and result keys of ``key`` on ``layout``: the default's one key, or two in one slot."""
    if layout == "one":
        return build_keys("goblin", key)
    return f"goblin:{{{key}}}:claim", f"goblin:{{{key}}}:result"


def _acquire(kind: str, port: int, layout: str, key: str, native: str) -> object:
    """The outcome of one acquire() by token worker-9 (its key blanked), or the error's class name."""
    claim_key, result_key = _keys(layout, key)
    options: Any = {"token": "worker-9", "native": native}

    async def run_async() -> object:
        client = redis.asyncio.Redis(host=servers.HOST, port=port)
        try:
            if layout == "one":
                return await AsyncClaim(client, key, **options).acquire()
            return await AsyncClaim.from_keys(client, claim_key, result_key, **options).acquire()
        finally:
            await client.aclose()

    client = redis.Redis(host=servers.HOST, port=port)
    try:
        if kind == "async":
            outcome: Any = asyncio.run(run_async())
        elif layout == "one":
            outcome = Claim(client, key, **options).acquire()
        else:
            outcome = Claim.from_keys(client, claim_key, result_key, **options).acquire()
    except (ResultLostError, WrongTypeError) as exc:
        return type(exc).__name__
    finally:
        client.close()
    return outcome.model_copy(update={"key": ""})


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_script_and_native_paths_give_the_same_outcomes(
    with_module: servers.RedisProcess, native_client: redis.Redis, scenario: str, kind: str
) -> None:
    """On the module's server, native="never" (scripts) and native="always" (the module) agree, keys included.

    On the default one key and, through ``from_keys`` handles, on the seed's two keys.
    """
    layout, setup = SCENARIOS[scenario]
    seen, ttls = {}, {}
    for native in ("never", "always"):
        key = unique()
        claim_key, result_key = _keys(layout, key)
        setup(native_client, claim_key, result_key)
        outcome = _acquire(kind, with_module.port, layout, key, native)
        held = [
            native_client.get(name) if native_client.type(name) == b"string" else None
            for name in (claim_key, result_key)
        ]
        seen[native] = (outcome, held)
        ttls[native] = native_client.ttl(claim_key)
    assert seen["never"] == seen["always"], seen
    assert abs(ttls["never"] - ttls["always"]) <= 1, ttls


@pytest.mark.parametrize("native", ["never", "always"])
def test_release_and_complete_agree_on_both_paths(native_client: redis.Redis, native: str) -> None:
    """release() is True once, then False; complete() then release() reopens nothing: on scripts and natively."""
    key = unique()
    owner = Claim(native_client, key, native=native)
    assert isinstance(owner.acquire(), Claimed)
    assert owner.release() is True
    assert owner.release() is False
    assert isinstance(owner.acquire(), Claimed)
    owner.complete(b"v")
    assert owner.release() is False
    assert Claim(native_client, key, native=native).acquire() == Completed(key=key, value=b"v")


# --------------------------------------------------------------------------- replication and AOF, without the module


def test_a_replica_without_the_module_follows_a_primary_with_it(redis_server_binary: str, goblin_module: str) -> None:
    """Claims and CADs replicate as SET ... PXAT and DEL: the replica's keys, values and expiries match exactly."""
    with servers.primary_with_replica(redis_server_binary, primary_args=("--loadmodule", goblin_module)) as pair:
        primary, replica = (server.client() for server in pair)
        try:
            with pytest.raises(redis.ResponseError, match="unknown command"):
                replica.execute_command("GOBLIN.CLAIM", "a", "b", "t", 5)
            errors_before = replica.info("errorstats")  # the handshake's own, and the one above
            keys = [f"claim:{index}" for index in range(6)]
            for key in keys:
                assert primary.execute_command("GOBLIN.CLAIM", key, f"result:{key}", f"token-{key}", 300) == b"CLAIMED"
            primary.execute_command("GOBLIN.CLAIM", keys[0], "result", "late", 300)  # held: writes nothing
            assert primary.execute_command("GOBLIN.CAD", keys[1], f"token-{keys[1]}") == 1
            assert primary.execute_command("GOBLIN.CAD", keys[2], "not-the-token") == 0
            claims = Claim(primary, unique(), ttl=600)
            assert isinstance(claims.acquire(), Claimed)
            claims.complete(b"charged")
            keys += [claims.claim_key, claims.result_key]
            assert primary.wait(1, 5000) == 1
            for key in keys:
                assert replica.get(key) == primary.get(key), key
                assert replica.pexpiretime(key) == primary.pexpiretime(key), key
            assert replica.exists(keys[1]) == 0
            assert replica.info("replication")["master_link_status"] == "up"
            stats = commandstats(replica)
            assert not any(name.startswith("goblin") for name in stats), stats
            assert replica.info("errorstats") == errors_before  # no replicated command failed
        finally:
            primary.close()
            replica.close()


def test_an_aof_written_with_the_module_loads_without_it(redis_server_binary: str, goblin_module: str) -> None:
    """The AOF holds SET ... PXAT and DEL, so a server restarted without the module loads the claims unchanged."""
    server = servers.start_server(
        redis_server_binary, "--appendonly", "yes", "--appendfsync", "always", "--loadmodule", goblin_module
    )
    try:
        client = server.client()
        assert client.execute_command("GOBLIN.CLAIM", "claim:1", "result:1", "worker-3", 300) == b"CLAIMED"
        assert client.execute_command("GOBLIN.CLAIM", "claim:2", "result:2", "worker-3", 300) == b"CLAIMED"
        assert client.execute_command("GOBLIN.CAD", "claim:2", "worker-3") == 1
        expiry = client.pexpiretime("claim:1")
        client.close()
        server.process.terminate()
        server = servers.restart(server, [arg for arg in server.args if arg not in ("--loadmodule", goblin_module)])
        client = server.client()
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("GOBLIN.CLAIM", "claim:1", "result:1", "worker-9", 300)
        assert client.get("claim:1") == b"worker-3"
        assert client.pexpiretime("claim:1") == expiry
        assert client.exists("claim:2") == 0
        client.close()
    finally:
        server.stop()


# --------------------------------------------------------------------------- what scripts keep working, natively too


def test_a_claim_on_a_held_key_keeps_a_watch_intact(native_client: redis.Redis) -> None:
    """As SET NX on a held key, GOBLIN.CLAIM on one writes nothing, so a WATCH on it holds; a claim breaks it."""
    held, free = unique(), unique()
    native_client.set(held, "worker-3")
    with native_client.pipeline() as pipe:
        pipe.watch(held)
        native_client.execute_command("GOBLIN.CLAIM", held, "r", "worker-9", 30)
        pipe.multi()
        pipe.get(held)
        assert pipe.execute() == [b"worker-3"]
    with native_client.pipeline() as pipe:
        pipe.watch(free)
        native_client.execute_command("GOBLIN.CLAIM", free, "r", "worker-9", 30)
        pipe.multi()
        pipe.get(free)
        with pytest.raises(redis.WatchError):
            pipe.execute()


def test_acl_key_patterns_apply_to_the_declared_keys(
    native_client: redis.Redis, with_module: servers.RedisProcess
) -> None:
    """A user limited to ~goblin:* may claim goblin: keys natively, and gets NOPERM for either key outside it."""
    user = unique("user")
    native_client.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["goblin:*"], commands=["+@all"])
    client = redis.Redis(host=servers.HOST, port=with_module.port, username=user, password="pw")
    try:
        assert client.execute_command("GOBLIN.CLAIM", "goblin:c", "goblin:r", "t", 30) == b"CLAIMED"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("GOBLIN.CLAIM", "goblin:c", "other:r", "t", 30)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("GOBLIN.CAD", "other:c", "t")
        assert isinstance(Claim(client, unique()).acquire(), Claimed)
        assert state_of(client).native >= frozenset(NATIVE_COMMANDS)
    finally:
        client.close()
        native_client.acl_deluser(user)
        native_client.delete("goblin:c")


def test_keyspace_notifications_match_set_and_del(native_client: redis.Redis) -> None:
    """A claim notifies "set" and "expire", a CAD "del": what SET ... EX and DEL notify."""
    native_client.config_set("notify-keyspace-events", "KEA")
    key = unique()
    pubsub = native_client.pubsub()
    try:
        pubsub.psubscribe(f"__keyspace@0__:{key}")
        pubsub.get_message(timeout=1)
        native_client.execute_command("GOBLIN.CLAIM", key, "r", "worker-3", 30)
        native_client.execute_command("GOBLIN.CAD", key, "worker-3")
        events = []
        while (message := pubsub.get_message(timeout=1)) is not None:
            events.append(message["data"])
        assert events == [b"set", b"expire", b"del"]
    finally:
        pubsub.close()
        native_client.config_set("notify-keyspace-events", "")
