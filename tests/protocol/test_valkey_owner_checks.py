"""Server-native owner checks: ``SET ... IFEQ ... EX`` for extend() and renewals, ``DELIFEQ`` for release().

On Valkey 9 (valkey-server without the module) the probe the SDK already sends
finds DELIFEQ, and with it SET's IFEQ option: extend(), keep-alive renewals,
release() and release_many() then send those instead of the scripts, and must
answer exactly as the scripts do on Redis 7 and Redis 8.2 (which have neither, and
keep the scripts: SET's IFEQ and DELEX come with Redis 8.4). Checked on both
drivers, standalone and clustered: the replies and errors side by side, the
commands the server counted, a lost reply re-sent, a dropped connection, a
command the user's ACL refuses or maxmemory refuses (the script then), and ``native="never"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.retry
from redis.backoff import NoBackoff

from goblin_claim import AsyncClaim, Claim, Claimed, ClaimLostError, ConnectionFailedError, WrongTypeError
from goblin_claim._clients.errors import translate
from goblin_claim._clients.transport import state_of
from goblin_claim._protocol.scripts import (
    DEL_KEYS,
    DELEX,
    DELIFEQ,
    EXTEND,
    PEXPIRETIME,
    RELEASE,
    SET_IFEQ,
    SET_NX_GET,
    owner_check,
    owner_check_command,
    with_owner_checks,
)
from goblin_claim.testing import fake_redis
from tests.conftest import Driver, Runner, SyncView, missing, stored, unique, until, until_async
from tests.support import servers
from tests.support.proxy import FaultProxy, Faults

# Valkey 9 has the owner checks; Debian's redis-server 7 and Redis 8.2 have none (the
# suites add ``redis8`` and ``redis8-cluster``: REDIS8_SUITES in tests/conftest.py).
BACKENDS = ("valkey", "valkey-cluster", "standalone", "cluster")
OWNER_CHECKS = frozenset({DELIFEQ, SET_IFEQ})


def _has_checks(driver: Driver) -> bool:
    return driver.backend.name.startswith("valkey")


def _commandstats(raw: Any) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, summed over every primary of a cluster."""
    if isinstance(raw, redis.cluster.RedisCluster):
        per_node = [node.redis_connection.info("commandstats") for node in raw.get_primaries()]
    else:
        per_node = [raw.info("commandstats")]
    counted: dict[str, int] = {}
    for stats in per_node:
        for name, row in stats.items():
            command = name.removeprefix("cmdstat_")
            counted[command] = counted.get(command, 0) + int(row["calls"])
    return counted


def _reset_stats(raw: Any) -> None:
    if isinstance(raw, redis.cluster.RedisCluster):
        raw.config_resetstat(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
    else:
        raw.config_resetstat()


def _keep_alive(driver: Any, handle: Any, done: Callable[[Any], bool], interval: float = 0.2) -> Any:
    """Hold ``handle``'s keep-alive open until ``done(keeper)`` (or 30 s); the keep-alive, for its counters.

    Waiting on the renewals themselves, not a window, keeps a loaded machine (late
    renewals) from failing the test.
    """
    if driver.run is None:
        with handle.keep_alive(interval=interval) as keeper:
            assert until(lambda: done(keeper), 30)
        return keeper

    async def hold() -> Any:
        async with handle._handle.keep_alive(interval=interval) as keeper:
            assert await until_async(lambda: done(keeper), 30)
        return keeper

    return driver.run(hold())


# --------------------------------------------------------------------------- detection


def test_the_probe_finds_the_owner_checks_where_the_server_has_them(driver: Driver) -> None:
    """Valkey 9's probe lists DELIFEQ and infers SET IFEQ (not DELEX, new in 9.2); Redis 7's and 8.2's list none."""
    handle = driver.claim(unique())
    assert isinstance(handle.acquire(), Claimed)
    found = state_of(driver.client).native
    assert found is not None
    if _has_checks(driver):
        assert found >= OWNER_CHECKS
        assert DELEX not in found
    else:
        assert not found & (OWNER_CHECKS | {DELEX})


# --------------------------------------------------------------------------- replies and errors

Scenario = Callable[[Callable[..., Any], Any, str], object]


def _extend_own(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key, lease=5)
    handle.acquire()
    handle.extend(lease=60)
    return ("renewed", 50_000 < raw.pttl(handle.claim_key) <= 60_000)


def _extend_held_by_another(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    raw.set(handle.claim_key, "someone-else", ex=30)
    with pytest.raises(ClaimLostError):
        handle.extend(lease=60)
    return (raw.get(handle.claim_key), raw.ttl(handle.claim_key) <= 30)


def _extend_missing(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    with pytest.raises(ClaimLostError):
        handle.extend()
    return raw.exists(handle.claim_key)


def _extend_completed(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    handle.acquire()
    handle.complete(b"done")
    with pytest.raises(ClaimLostError):
        handle.extend()
    return stored(raw, handle)


def _extend_wrong_type(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    raw.hset(handle.claim_key, "f", "v")
    raw.expire(handle.claim_key, 30)
    with pytest.raises(WrongTypeError):
        handle.extend()
    return raw.type(handle.claim_key)


def _release_own(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    handle.acquire()
    return (handle.release(), raw.exists(handle.claim_key), handle.release())


def _release_held_by_another(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    raw.set(handle.claim_key, "someone-else", ex=30)
    return (handle.release(), raw.get(handle.claim_key))


def _release_missing(claim: Callable[..., Any], raw: Any, key: str) -> object:
    return claim(key).release()


def _release_completed(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    handle.acquire()
    handle.complete(b"done")
    return (handle.release(), stored(raw, handle))


def _release_wrong_type(claim: Callable[..., Any], raw: Any, key: str) -> object:
    handle = claim(key)
    raw.hset(handle.claim_key, "f", "v")
    raw.expire(handle.claim_key, 30)
    with pytest.raises(WrongTypeError):
        handle.release()
    return raw.type(handle.claim_key)


# What every scenario comes to, on every server and path: the scripts' answers.
SCENARIOS: dict[str, tuple[Scenario, object]] = {
    "extend, held by this token: renewed": (_extend_own, ("renewed", True)),
    "extend, held by another: ClaimLostError, kept": (_extend_held_by_another, (b"someone-else", True)),
    "extend, missing: ClaimLostError, nothing made": (_extend_missing, 0),
    "extend, completed: ClaimLostError, result kept": (_extend_completed, b"done"),
    "extend, a hash: WrongTypeError, kept": (_extend_wrong_type, b"hash"),
    "release, held by this token: True, then False": (_release_own, (True, 0, False)),
    "release, held by another: False, kept": (_release_held_by_another, (False, b"someone-else")),
    "release, missing: False": (_release_missing, False),
    "release, completed: False, result kept": (_release_completed, (False, b"done")),
    "release, a hash: WrongTypeError, kept": (_release_wrong_type, b"hash"),
}


@pytest.mark.parametrize("native", ["auto", "never"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_replies_and_errors_are_the_scripts(driver: Driver, scenario: str, native: str) -> None:
    """Owner checks answer as the scripts: same values, same errors, same keyspace, with or without them."""
    run, expected = SCENARIOS[scenario]

    def claim(key: str, **options: Any) -> Any:
        return driver.claim(key, native=native, **options)

    assert run(claim, driver.raw, unique("owner")) == expected


# --------------------------------------------------------------------------- the commands sent


@pytest.mark.parametrize("backend", ["valkey", "standalone", "redis8"], indirect=True)
def test_the_server_runs_set_ifeq_and_delifeq_on_valkey_and_the_scripts_on_redis(driver: Driver) -> None:
    """INFO commandstats: on Valkey 9 extend and renewals are SETs, release a DELIFEQ; on Redis 7 and 8.2 EVALSHAs."""
    handle = driver.claim(unique("sent"), lease=3)
    assert isinstance(handle.acquire(), Claimed)  # the probe and SCRIPT LOAD come before the counting
    _reset_stats(driver.raw)
    handle.extend(lease=3)
    keeper = _keep_alive(driver, handle, lambda k: k.renewals >= 2 or k.lost)
    assert handle.release() is True
    renewals = keeper.renewals
    assert renewals >= 1
    assert not keeper.lost
    stats = _commandstats(driver.raw)
    if _has_checks(driver):
        assert stats.get("set") == 1 + renewals
        assert stats.get("delifeq") == 1
        assert stats.get("publish") == 1  # the wake-up, pipelined behind the DELIFEQ
        assert "evalsha" not in stats
        assert "expire" not in stats
    else:
        assert stats.get("evalsha") == 2 + renewals  # extend, each renewal, release
        assert stats.get("expire") == 1 + renewals
        assert "delifeq" not in stats
        assert "set" not in stats


@pytest.mark.parametrize("backend", ["valkey"], indirect=True)
def test_native_never_keeps_the_scripts_on_valkey(driver: Driver) -> None:
    """native="never" on Valkey 9: extend and release run the scripts, as on a server without owner checks."""
    handle = driver.claim(unique("never"), native="never")
    assert isinstance(handle.acquire(), Claimed)
    _reset_stats(driver.raw)
    handle.extend()
    assert handle.release() is True
    stats = _commandstats(driver.raw)
    assert stats.get("evalsha") == 2
    assert "delifeq" not in stats


@pytest.mark.parametrize("backend", ["valkey", "valkey-cluster", "standalone", "redis8"], indirect=True)
def test_release_many_sends_delifeq_with_each_wake_up_in_one_round_trip(driver: Driver) -> None:
    """release_many on Valkey: one DELIFEQ and one announcement per claim; one not held answers False."""
    handles = [driver.claim(unique("many")) for _ in range(3)]
    for handle in handles:
        assert isinstance(handle.acquire(), Claimed)
    stranger = driver.claim(unique("many"))
    driver.raw.set(stranger.claim_key, "someone-else", ex=30)
    _reset_stats(driver.raw)
    batch = [handle._handle for handle in [*handles, stranger]] if driver.run else [*handles, stranger]
    if driver.run is None:
        released = Claim.release_many(driver.client, batch)
    else:
        released = driver.run(AsyncClaim.release_many(driver.client, batch))
    assert released == [True, True, True, False]
    assert [driver.raw.exists(h.claim_key) for h in handles] == [0, 0, 0]
    assert driver.raw.get(stranger.claim_key) == b"someone-else"
    stats = _commandstats(driver.raw)
    if _has_checks(driver):
        assert stats.get("delifeq") == 4
        assert stats.get("spublish" if driver.backend.is_cluster else "publish") == 4
        assert "evalsha" not in stats
    else:
        assert stats.get("evalsha") == 4


@pytest.mark.parametrize("backend", ["valkey", "valkey-cluster"], indirect=True)
def test_a_renewal_that_finds_another_holder_marks_the_claim_lost(driver: Driver) -> None:
    """Keep-alive by SET IFEQ: while held it renews; once another token holds the key, lost, and nothing written."""
    handle = driver.claim(unique("renew"), lease=2)
    assert isinstance(handle.acquire(), Claimed)
    driver.raw.set(handle.claim_key, "someone-else", ex=30)
    keeper = _keep_alive(driver, handle, lambda k: k.lost)
    assert keeper.lost
    assert driver.raw.get(handle.claim_key) == b"someone-else"
    assert 25 < driver.raw.ttl(handle.claim_key) <= 30


# --------------------------------------------------------------------------- faults


class _Proxied:
    """A driver whose client reaches one server through a fault proxy (``raw``: direct, no faults)."""

    def __init__(self, kind: str, server: servers.RedisProcess, retries: bool) -> None:
        self.kind = kind
        self.faults = Faults()
        self.proxy = FaultProxy(server.port, self.faults).start()
        self.raw = server.client()
        self.run = Runner() if kind == "async" else None
        options: dict[str, Any] = {"host": servers.HOST, "port": self.proxy.port}
        if not retries:
            retry = redis.asyncio.retry.Retry(NoBackoff(), 0) if kind == "async" else redis.retry.Retry(NoBackoff(), 0)
            options.update(retry=retry, socket_timeout=0.5, socket_connect_timeout=1.0)
        self.client = redis.Redis(**options) if kind == "sync" else redis.asyncio.Redis(**options)

    def claim(self, key: str, **options: Any) -> Any:
        if self.run is None:
            return Claim(self.client, key, **options)
        return SyncView(AsyncClaim(self.client, key, **options), self.run)

    def close(self) -> None:
        if self.run is None:
            self.client.close()
        else:
            self.run(self.client.aclose())
            self.run.close()
        self.proxy.stop()
        self.raw.close()


@pytest.fixture(params=["sync-valkey", "async-valkey", "sync-redis", "async-redis"])
def proxied(request: pytest.FixtureRequest) -> Iterator[Callable[..., _Proxied]]:
    """Make a proxied driver (``retries=False``: no re-sends) on Valkey 9 or Redis 7, sync or asyncio."""
    kind, server = request.param.split("-")
    target: servers.RedisProcess = request.getfixturevalue(
        "valkey_standalone" if server == "valkey" else "redis_standalone"
    )
    made: list[_Proxied] = []

    def make(retries: bool = True) -> _Proxied:
        made.append(_Proxied(kind, target, retries))
        return made[-1]

    yield make
    for rig in made:
        rig.close()


def _release_sent(rig: _Proxied, key: str) -> int:
    """How many releases of ``key`` reached the server: DELIFEQs on Valkey, release scripts on Redis."""
    return rig.faults.count(b"DELIFEQ", key.encode()) + rig.faults.count(RELEASE.sha.encode(), key.encode())


def _extend_sent(rig: _Proxied, key: str) -> int:
    """How many renewals of ``key`` reached the server: SET ... IFEQ on Valkey, extend scripts on Redis."""
    return rig.faults.count(b"IFEQ", key.encode()) + rig.faults.count(EXTEND.sha.encode(), key.encode())


def _valkey(rig: _Proxied) -> bool:
    return state_of(rig.client).native is not None and DELIFEQ in (state_of(rig.client).native or ())


def test_extend_reply_lost_is_resent_and_renews(proxied: Callable[..., _Proxied]) -> None:
    """extend()'s reply is lost after the server renewed; the re-send (SET IFEQ, or the script) renews again."""
    rig = proxied()
    handle = rig.claim(unique("lost"), lease=60)
    assert isinstance(handle.acquire(), Claimed)
    rig.raw.expire(handle.claim_key, 5)
    rig.faults.lose_next_reply(handle.claim_key.encode())
    handle.extend()
    assert _extend_sent(rig, handle.claim_key) == 2
    assert rig.faults.count(b"IFEQ", handle.claim_key.encode()) == (2 if _valkey(rig) else 0)
    assert 5 < rig.raw.ttl(handle.claim_key) <= 60


def test_extend_cut_without_retries_raises_and_renews_nothing(proxied: Callable[..., _Proxied]) -> None:
    """Without retries, extend() cut before the server raises ConnectionFailedError; the lease is unchanged."""
    rig = proxied(retries=False)
    handle = rig.claim(unique("cut"), lease=60)
    assert isinstance(handle.acquire(), Claimed)
    rig.raw.expire(handle.claim_key, 5)
    rig.faults.drop_before(handle.claim_key.encode())
    with pytest.raises(ConnectionFailedError):
        handle.extend()
    assert rig.raw.ttl(handle.claim_key) <= 5
    assert rig.raw.get(handle.claim_key) == handle.token.encode()


def test_a_renewal_reply_lost_is_resent_and_the_claim_stays_held(proxied: Callable[..., _Proxied]) -> None:
    """A keep-alive renewal's reply is lost; the pipeline is re-sent (SET IFEQ twice): renewed, not lost."""
    rig = proxied()
    handle = rig.claim(unique("lost"), lease=3)
    assert isinstance(handle.acquire(), Claimed)
    rig.faults.lose_next_reply(handle.claim_key.encode())
    keeper = _keep_alive(rig, handle, lambda k: k.renewals >= 1 or k.lost, interval=0.3)
    assert not keeper.lost
    assert keeper.renewals >= 1
    assert rig.faults.lost(handle.claim_key.encode()) == 1
    assert _extend_sent(rig, handle.claim_key) >= 2
    assert rig.faults.count(b"IFEQ", handle.claim_key.encode()) == (
        _extend_sent(rig, handle.claim_key) if _valkey(rig) else 0
    )
    assert rig.raw.get(handle.claim_key) == handle.token.encode()


def test_release_reply_lost_is_resent_and_reports_false_with_the_claim_free(proxied: Callable[..., _Proxied]) -> None:
    """release()'s reply is lost after it deleted; the re-sent DELIFEQ (or script) says False, as the script does."""
    rig = proxied()
    handle = rig.claim(unique("lost"))
    assert isinstance(handle.acquire(), Claimed)
    rig.faults.lose_next_reply(handle.claim_key.encode())
    assert handle.release() is False
    assert _release_sent(rig, handle.claim_key) == 2
    assert rig.faults.count(b"DELIFEQ", handle.claim_key.encode()) == (2 if _valkey(rig) else 0)
    assert rig.raw.exists(handle.claim_key) == 0
    assert isinstance(rig.claim(handle.key).acquire(), Claimed)


def test_release_cut_before_the_server_is_retried_once(proxied: Callable[..., _Proxied]) -> None:
    """The connection drops before release() reaches the server; the retry releases, reporting True."""
    rig = proxied()
    handle = rig.claim(unique("cut"))
    assert isinstance(handle.acquire(), Claimed)
    rig.faults.drop_before(handle.claim_key.encode())
    assert handle.release() is True
    assert _release_sent(rig, handle.claim_key) == 1
    assert rig.raw.exists(handle.claim_key) == 0


def test_release_cut_without_retries_raises_and_keeps_the_claim(proxied: Callable[..., _Proxied]) -> None:
    """Without retries, release() cut before the server raises; the claim is still held by its token."""
    rig = proxied(retries=False)
    handle = rig.claim(unique("cut"))
    assert isinstance(handle.acquire(), Claimed)
    rig.faults.drop_before(handle.claim_key.encode())
    with pytest.raises(ConnectionFailedError):
        handle.release()
    assert rig.raw.get(handle.claim_key) == handle.token.encode()
    assert handle.release() is True


# --------------------------------------------------------------------------- refusals: the script instead


@pytest.fixture(scope="module")
def own_valkey() -> Iterator[servers.RedisProcess]:
    """A valkey-server of this module's own (its ACL users and maxmemory touch no other test)."""
    binary = servers.valkey_server_binary()
    if binary is None:
        missing("valkey-server is not built (make valkey-server)")
    with servers.standalone(binary) as server:
        yield server


@contextlib.contextmanager
def _client(kind: str, server: servers.RedisProcess, **options: Any) -> Iterator[tuple[Any, Callable[..., Any]]]:
    """A client of ``kind`` on ``server``, and a maker of handles on it."""
    run = Runner() if kind == "async" else None
    client: Any = (redis.Redis if kind == "sync" else redis.asyncio.Redis)(
        host=servers.HOST, port=server.port, **options
    )

    def claim(key: str, **handle_options: Any) -> Any:
        if run is None:
            return Claim(client, key, **handle_options)
        return SyncView(AsyncClaim(client, key, **handle_options), run)

    try:
        yield client, claim
    finally:
        if run is None:
            client.close()
        else:
            run(client.aclose())
            run.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_user_without_delifeq_releases_through_the_script(own_valkey: servers.RedisProcess, kind: str) -> None:
    """An ACL naming its commands one by one, without DELIFEQ: NOPERM once, then the script, from then on."""
    admin = own_valkey.client()
    namespace, user = unique("acl"), unique("user")
    line = f"~{namespace}:* &{namespace}:* +evalsha +eval +get +set +del +expire +pttl +publish +command|info"
    admin.execute_command("ACL SETUSER", user, "reset", "on", ">pw", *line.split())
    try:
        with _client(kind, own_valkey, username=user, password="pw") as (client, claim):
            first = claim(unique(), namespace=namespace)
            assert isinstance(first.acquire(), Claimed)
            first.extend()  # SET IFEQ: the user has +set
            assert first.release() is True
            assert admin.exists(first.claim_key) == 0
            found = state_of(client).native
            assert found is not None
            assert DELIFEQ not in found
            assert SET_IFEQ in found
            admin.config_resetstat()
            second = claim(unique(), namespace=namespace)
            assert isinstance(second.acquire(), Claimed)
            assert second.release() is True
            stats = _commandstats(admin)
            assert "delifeq" not in stats  # not even tried again
            assert stats.get("evalsha") == 1  # the release script (the claim is SET ... NX GET)
    finally:
        admin.acl_deluser(user)
        admin.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_renewal_under_maxmemory_goes_as_the_script(own_valkey: servers.RedisProcess, kind: str) -> None:
    """At maxmemory (noeviction) SET is refused and EXPIRE is not: extend and renewals still renew, by script."""
    admin = own_valkey.client()
    with _client(kind, own_valkey) as (client, claim):
        handle = claim(unique("oom"), lease=2)
        assert isinstance(handle.acquire(), Claimed)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        try:
            admin.config_resetstat()
            handle.extend(lease=60)
            assert 50 < admin.ttl(handle.claim_key) <= 60
            stats = admin.info("commandstats")
            assert stats["cmdstat_set"]["rejected_calls"] == 1  # refused before it ran
            assert stats["cmdstat_expire"]["calls"] == 1  # then the script's EXPIRE
            assert SET_IFEQ in (state_of(client).native or ())  # kept: it is only this once
        finally:
            admin.config_set("maxmemory", "0")
            admin.close()


# --------------------------------------------------------------------------- a command table that lists too much


def test_the_fakes_do_not_list_owner_checks_they_cannot_run() -> None:
    """The fakes of goblin_claim.testing answer nil for DELEX, which fakeredis lists but does not run."""
    for native in (False, True):
        client = fake_redis(native=native)
        assert Claim(client, unique()).release() is False
        assert not (state_of(client).native or frozenset()) & (OWNER_CHECKS | {DELEX})
        client.close()


def test_a_listed_delete_the_server_lacks_falls_back_and_takes_set_ifeq_with_it() -> None:
    """A probe that found DELEX on a server without it: unknown command, the script, and no SET IFEQ either."""
    client = fakeredis.FakeRedis()  # plain fakeredis: its COMMAND INFO lists DELEX
    assert client.execute_command("COMMAND INFO", "delex")[0]
    handle = Claim(client, unique())
    assert isinstance(handle.acquire(), Claimed)
    own = frozenset({PEXPIRETIME, SET_NX_GET, DEL_KEYS})  # fakeredis plays Redis 7: SET ... NX GET is there
    assert state_of(client).native == {DELEX, SET_IFEQ} | own  # what the table made the probe believe
    assert handle.release() is True
    assert client.exists(handle.claim_key) == 0
    assert state_of(client).native == own  # SET IFEQ was only inferred from DELEX
    other = Claim(client, unique())
    assert isinstance(other.acquire(), Claimed)
    other.extend()  # the script at once: no SET IFEQ tried
    assert other.release() is True
    client.close()


# --------------------------------------------------------------------------- the choice, in the pure core


@pytest.mark.parametrize(
    ("mode", "available", "script", "expected"),
    [
        ("auto", frozenset({DELIFEQ, SET_IFEQ}), RELEASE, DELIFEQ),
        ("auto", frozenset({DELIFEQ, DELEX, SET_IFEQ}), RELEASE, DELIFEQ),  # the cheaper delete first
        ("auto", frozenset({DELEX, SET_IFEQ}), RELEASE, DELEX),
        ("auto", frozenset({DELIFEQ, SET_IFEQ}), EXTEND, SET_IFEQ),
        ("always", frozenset({DELIFEQ, SET_IFEQ, "GOBLIN.CLAIM", "GOBLIN.CAD"}), RELEASE, DELIFEQ),
        ("never", frozenset({DELIFEQ, SET_IFEQ}), RELEASE, None),
        ("auto", frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD"}), RELEASE, None),  # the module's GOBLIN.CAD, chosen elsewhere
        ("auto", None, EXTEND, None),  # not probed yet
    ],
)
def test_owner_check_choice(mode: Any, available: frozenset[str] | None, script: Any, expected: str | None) -> None:
    """The built-in check replaces extend and release where listed, best first; never with native="never"."""
    assert owner_check(mode, available, script) == expected


def test_set_ifeq_is_inferred_from_either_delete_and_commands_are_built_from_the_script_arguments() -> None:
    """DELIFEQ or DELEX implies SET IFEQ; the commands carry the script's key, token and seconds."""
    assert with_owner_checks(frozenset({DELIFEQ})) == {DELIFEQ, SET_IFEQ}
    assert with_owner_checks(frozenset({DELEX})) == {DELEX, SET_IFEQ}
    assert with_owner_checks(frozenset({"GOBLIN.CAD"})) == {"GOBLIN.CAD"}
    assert owner_check_command(SET_IFEQ, ("c", "t", 30)) == ("SET", "c", "t", "IFEQ", "t", "EX", 30)
    assert owner_check_command(DELIFEQ, ("c", "t", "publish")) == ("DELIFEQ", "c", "t")
    assert owner_check_command(DELEX, ("c", "t")) == ("DELEX", "c", "IFEQ", "t")


@pytest.mark.parametrize(
    "reply",
    [
        "WRONGTYPE Operation against a key holding the wrong kind of value",  # scripts, DELIFEQ, SET IFEQ
        "Key should be of string type if conditions are specified",  # Redis 8.4's DELEX ... IFEQ on a hash
    ],
)
def test_an_owner_check_on_a_key_of_another_type_is_wrong_type_error(reply: str) -> None:
    """Redis 8.4's DELEX words WRONGTYPE its own way; a release over a hash raises WrongTypeError on every server."""
    error = translate(redis.ResponseError(reply), "k", "goblin:{k}")
    assert type(error) is WrongTypeError
    assert error.key == "k"
