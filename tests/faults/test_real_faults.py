"""The fault suite, on real redis-server processes.

Through a fault proxy (``tests/support/proxy.py``), sync and asyncio, standalone and cluster,
with redis-py's clients and with valkey-py's, and on a standalone Valkey 9 (where the store,
the renewal and the release are the server's own commands too, as the claim is everywhere):
for every round trip (acquire, complete, extend, release, forget, the decorator's
final write), a reply lost after the server acted and re-sent by redis-py, a reply
held past the client's timeout, and a connection cut before the server acted.
Without the proxy: CLIENT KILL storms, SCRIPT FLUSH under load, a crash and restart
with AOF, a server pause under keep-alive, and key-expiry hygiene. The storms and
crashes print their figures (also shown in pytest's terminal summary).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import multiprocessing
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.retry
from redis.backoff import NoBackoff

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    ConnectionFailedError,
    GoblinClaimError,
    InFlight,
    PayloadMismatchError,
    ReplayedError,
    ResultLostError,
    StillInFlightError,
    idempotent,
)
from goblin_claim._protocol.scripts import SCRIPTS
from tests.conftest import Runner, SyncView, record, stored, unique
from tests.support import workers
from tests.support.proxy import SET_IFEQ, SET_NX_GET, FaultProxy, Faults, proxy_nodes
from tests.support.servers import HOST, RedisProcess, start_server

SPAWN = multiprocessing.get_context("spawn")
SCRIPT = {script.name: script for script in SCRIPTS}
Figures = Callable[[str], None]


# --------------------------------------------------------------------------- clients through the proxy


def client_options(kind: str, flavour: str) -> dict[str, Any]:
    """Client options: redis-py's defaults, a short socket timeout, or no retries at all."""
    if flavour == "default":
        return {}
    if flavour == "timeout":  # the default Retry re-sends after a timeout
        return {"socket_timeout": 0.5}
    assert flavour == "no-retries"
    retry = redis.asyncio.retry.Retry(NoBackoff(), 0) if kind == "async" else redis.retry.Retry(NoBackoff(), 0)
    return {"retry": retry, "socket_timeout": 0.5, "socket_connect_timeout": 1.0}


@dataclass
class Rig:
    """One driver (sync or asyncio) on one topology; its clients reach Redis through fault proxies.

    ``raw`` is a direct sync client (no proxy, no faults) to arrange and inspect
    data; ``ns`` a namespace of this test only.
    """

    kind: str
    topology: str
    faults: Faults
    raw: Any
    connect: Callable[..., Any]
    ns: str = field(default_factory=lambda: unique("faults"))
    run: Runner | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def client(self, flavour: str = "default") -> Any:
        """A client of this rig's kind, through the proxies."""
        options = client_options(self.kind, flavour)
        if self.run is None:
            client = self.connect(**options)
            self._closers.append(client.close)
            return client
        run = self.run

        async def make() -> Any:
            return self.connect(**options)

        made = run(make())
        self._closers.append(lambda: run(_aclose(made)))
        return made

    def claim(self, client: Any, key: str, **options: Any) -> Any:
        """A ``Claim``, or an ``AsyncClaim`` called like one, in this test's namespace."""
        if self.run is None:
            return Claim(client, key, namespace=self.ns, **options)
        return SyncView(AsyncClaim(client, key, namespace=self.ns, **options), self.run)

    def two_keys(self, client: Any, key: str, **options: Any) -> Any:
        """A ``from_keys`` handle (the two-key protocol) on this test's ``<ns>:{key}:claim`` / ``:result``."""
        claim, result = f"{self.ns}:{{{key}}}:claim", f"{self.ns}:{{{key}}}:result"
        if self.run is None:
            return Claim.from_keys(client, claim, result, **options)
        return SyncView(AsyncClaim.from_keys(client, claim, result, **options), self.run)

    def counted(self, client: Any, **options: Any) -> Callable[[str], dict[str, Any]]:
        """An ``@idempotent`` function of this rig's kind, called like a plain one.

        Each run counts itself with an INCR on ``raw`` (which no fault touches) and
        returns ``{"item", "run", "marker"}``; the marker makes its final write easy
        to pick out in the proxy's traffic.
        """
        raw, ns = self.raw, self.ns

        def body(item: str) -> dict[str, Any]:
            return {"item": item, "run": int(raw.incr(runs_key(ns, item))), "marker": marker(ns, item)}

        options = {"key": "item", "namespace": ns, **options}
        if self.run is None:
            return idempotent(client, **options)(body)
        run = self.run

        async def async_body(item: str) -> dict[str, Any]:
            return body(item)

        wrapped = idempotent(client, **options)(async_body)
        return lambda item: run(wrapped(item))

    def runs(self, item: str) -> int:
        """How many times the counted function ran for ``item``."""
        return int(self.raw.get(runs_key(self.ns, item)) or 0)

    def close(self) -> None:
        """Close this rig's clients and its event loop."""
        for close in reversed(self._closers):
            close()
        if self.run is not None:
            self.run.close()
        self.raw.close()


async def _aclose(client: Any) -> None:
    await client.aclose()
    if hasattr(client, "nodes_manager"):  # redis-py's or valkey-py's asyncio cluster client
        # redis-py 8.1: after a connection error without retries the cluster client
        # marks itself uninitialized, and aclose() then closes nothing.
        await client.nodes_manager.aclose()
        await client.nodes_manager.aclose("startup_nodes")


def runs_key(namespace: str, item: str) -> str:
    """The run counter of ``item``: outside the namespace, so it is no key of the SDK's."""
    return f"runs:{namespace}:{{{item}}}"


def marker(namespace: str, item: str) -> str:
    """A string only the stored result of ``item`` contains."""
    return f"result-of-{namespace}-{item}"


def record_key(namespace: str, item: str) -> str:
    """The one key the SDK keeps ``item``'s claim and record in (README: ``<namespace>:{<key>}``)."""
    return f"{namespace}:{{{item}}}"


def completed_record(raw: Any, namespace: str, item: str) -> bool:
    """Whether ``item``'s one key holds a completed record (not a token, not nothing)."""
    held = raw.get(record_key(namespace, item))
    return held is not None and held.startswith(b"done ")


# The server's own commands some operations send instead of their scripts, as the proxy sees them
# (the claim and forget on every server here; the store, the renewal and the release on Valkey 9).
BY_COMMAND = {
    "claim": SET_NX_GET, "complete": SET_IFEQ, "extend": SET_IFEQ, "release": b"DELIFEQ", "forget": b"$3\r\nDEL\r\n",
}  # fmt: skip


def sent(faults: Faults, key: str, script: str) -> int:
    """How many times ``script`` on ``key`` reached the server (EVALSHA, EVAL after a flushed cache, or its command)."""
    found = SCRIPT[script]
    scripted = faults.count(key.encode(), found.sha.encode()) + faults.count(key.encode(), found.source.encode())
    command = BY_COMMAND.get(script)
    return scripted + (faults.count(key.encode(), command) if command is not None else 0)


def expiry_offenders(raw: Any, prefix: str) -> dict[str, int]:
    """Keys starting with ``prefix`` that would live forever (PTTL -1), with their PTTL."""
    offenders: dict[str, int] = {}
    for key in raw.scan_iter(match=f"{prefix}*", count=1000):
        pttl = raw.pttl(key)
        if pttl == -1:
            offenders[key.decode() if isinstance(key, bytes) else key] = pttl
    return offenders


# Each driver on each topology, with redis-py's clients and again with valkey-py's; and on a
# standalone Valkey 9 with redis-py's (its own SET ... IFEQ store, renewal and DELIFEQ release).
_RIGS = [
    f"{kind}-{topology}{family}"
    for family in ("", "-valkey-py")
    for topology in ("standalone", "cluster")
    for kind in ("sync", "async")
] + ["sync-valkey", "async-valkey"]


def _valkey_py(kind: str, topology: str) -> Callable[..., Any]:
    """The valkey-py client class of a rig, taking redis-py's options (tests/support/valkey_py.py translates them)."""
    import valkey
    import valkey.asyncio
    import valkey.asyncio.cluster
    import valkey.cluster

    from tests.support.valkey_py import translate

    asyncio = kind == "async"
    if topology == "standalone":
        factory: Any = valkey.asyncio.Valkey if asyncio else valkey.Valkey
    else:
        factory = valkey.asyncio.cluster.ValkeyCluster if asyncio else valkey.cluster.ValkeyCluster
    cluster = topology == "cluster"
    return lambda **options: factory(**translate(options, asyncio=asyncio, cluster=cluster))


@pytest.fixture(params=_RIGS)
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Each driver on each topology and client family, through fault proxies (one per node, sharing their faults)."""
    kind, topology, *family = request.param.split("-", 2)
    faults = Faults()
    with contextlib.ExitStack() as stack:
        connect: Callable[..., Any]
        if topology in ("standalone", "valkey"):
            server: RedisProcess = request.getfixturevalue(
                f"{'redis' if topology == 'standalone' else 'valkey'}_standalone"
            )
            proxy = stack.enter_context(FaultProxy(server.port, faults))
            raw: Any = redis.Redis(host=HOST, port=server.port)
            connect = redis.Redis if kind == "sync" else redis.asyncio.Redis
            connect = _partial(_valkey_py(kind, topology) if family else connect, host=HOST, port=proxy.port)
        else:
            nodes: list[RedisProcess] = request.getfixturevalue("redis_cluster")
            proxies, remap = stack.enter_context(proxy_nodes([node.port for node in nodes], faults))
            raw = redis.cluster.RedisCluster(host=HOST, port=nodes[0].port)
            connect = redis.cluster.RedisCluster if kind == "sync" else redis.asyncio.cluster.RedisCluster
            if family:
                connect = _valkey_py(kind, topology)
            connect = _partial(connect, host=HOST, port=proxies[0].port, address_remap=remap)
        made = Rig(kind, topology, faults, raw, connect, run=Runner() if kind == "async" else None)
        try:
            yield made
            assert expiry_offenders(raw, f"{made.ns}:") == {}, "every key the SDK writes must expire"
        finally:
            made.close()  # clients first, then the proxies


def _partial(factory: Callable[..., Any], **bound: Any) -> Callable[..., Any]:
    return lambda **options: factory(**bound, **options)


# --------------------------------------------------------------------------- acquire


def _resent_claim_outcome(rig: Rig, outcome: object, handle: Any) -> None:
    """Claimed where the SDK sent the claim itself; through a cluster client's execute_command, InFlight.

    redis-py's re-send there is identical to the first send, so it cannot say it
    is one: the safe side, as the README says (tests/claim/test_one_owner.py shows wait()
    taking the lapsed claim over).
    """
    if rig.topology == "cluster":
        assert isinstance(outcome, InFlight)
    else:
        assert isinstance(outcome, Claimed)
    assert rig.raw.get(handle.claim_key) == handle.token.encode()


def _acquire_resent(rig: Rig, fault: str, flavour: str = "default") -> None:
    """acquire() with ``fault`` (a ``Faults`` method) armed on its key's reply: sent twice, the claim taken once."""
    handle = rig.claim(rig.client(flavour), unique())
    getattr(rig.faults, fault)(handle.claim_key.encode())
    _resent_claim_outcome(rig, handle.acquire(), handle)
    assert sent(rig.faults, handle.claim_key, "claim") == 2
    assert rig.raw.get(handle.claim_key) == handle.token.encode()


def test_acquire_reply_lost_is_resent_and_still_claimed(rig: Rig) -> None:
    """acquire()'s reply is lost after the server claimed; redis-py re-sends it: Claimed (InFlight on a cluster)."""
    _acquire_resent(rig, "lose_next_reply")


def test_acquire_reply_held_past_socket_timeout_is_resent_and_still_claimed(rig: Rig) -> None:
    """acquire()'s reply is held past the client's timeout; the re-sent claim is Claimed (InFlight on a cluster)."""
    _acquire_resent(rig, "hold_next_reply", "timeout")


def test_acquire_cut_before_the_server_is_retried_once(rig: Rig) -> None:
    """The connection drops before the claim reaches the server; redis-py's retry claims, sent once."""
    handle = rig.claim(rig.client(), unique())
    rig.faults.drop_before(handle.claim_key.encode())
    assert isinstance(handle.acquire(), Claimed)
    assert rig.faults.dropped(handle.claim_key.encode()) == 1
    assert sent(rig.faults, handle.claim_key, "claim") == 1


def test_acquire_cut_without_retries_raises_and_writes_nothing(rig: Rig) -> None:
    """With retries off, a claim cut before the server raises ConnectionFailedError and writes nothing."""
    handle = rig.claim(rig.client("no-retries"), unique())
    rig.faults.drop_before(handle.claim_key.encode())
    with pytest.raises(ConnectionFailedError) as info:
        handle.acquire()
    assert info.value.key == handle.key
    assert rig.raw.exists(handle.claim_key) == 0
    assert isinstance(handle.acquire(), Claimed)


def test_acquire_reply_lost_without_retries_raises_then_the_same_handle_is_claimed(rig: Rig) -> None:
    """With retries off, a lost claim reply raises; the caller's own retry with the same handle is Claimed."""
    handle = rig.claim(rig.client("no-retries"), unique())
    rig.faults.lose_next_reply(handle.claim_key.encode())
    with pytest.raises(ConnectionFailedError):
        handle.acquire()
    assert rig.raw.get(handle.claim_key) == handle.token.encode()  # the server did claim
    assert isinstance(handle.acquire(), Claimed)
    assert isinstance(rig.claim(rig.client(), handle.key).acquire(), InFlight)  # and nobody else can


# --------------------------------------------------------------------------- complete


def _claimed(rig: Rig, flavour: str = "default", **options: Any) -> Any:
    handle = rig.claim(rig.client(flavour), unique(), **options)
    assert isinstance(handle.acquire(), Claimed)
    return handle


def _assert_completed(rig: Rig, handle: Any, value: bytes) -> None:
    assert rig.raw.get(handle.claim_key) == record(handle.token, value)  # the record, stored once, for ttl
    assert rig.raw.ttl(handle.claim_key) > 60
    outcome = rig.claim(rig.client(), handle.key).acquire()
    assert isinstance(outcome, Completed)
    assert outcome.value == value


def _complete_through(rig: Rig, fault: str, sends: int, flavour: str = "default") -> None:
    """complete() with ``fault`` (a ``Faults`` method) armed on its write: a success, sent ``sends`` times."""
    handle = _claimed(rig, flavour)
    getattr(rig.faults, fault)(handle.claim_key.encode(), b"receipt")
    handle.complete(b"receipt")
    assert sent(rig.faults, handle.claim_key, "complete") == sends
    _assert_completed(rig, handle, b"receipt")


def test_complete_reply_lost_is_resent_and_succeeds(rig: Rig) -> None:
    """complete()'s reply is lost after it stored; the re-sent complete is a success, stored once."""
    _complete_through(rig, "lose_next_reply", 2)


def test_complete_reply_held_past_socket_timeout_is_resent_and_succeeds(rig: Rig) -> None:
    """complete()'s reply is held until the client times out; the re-sent complete is a success."""
    _complete_through(rig, "hold_next_reply", 2, "timeout")


def test_complete_cut_before_the_server_is_retried_once(rig: Rig) -> None:
    """The connection drops before complete() reaches the server; redis-py's retry stores it, sent once."""
    _complete_through(rig, "drop_before", 1)


def test_complete_cut_without_retries_raises_and_writes_nothing(rig: Rig) -> None:
    """With retries off, complete() cut before the server raises; nothing is half-written; a retry stores it."""
    handle = _claimed(rig, "no-retries")
    rig.faults.drop_before(handle.claim_key.encode(), b"receipt")
    with pytest.raises(ConnectionFailedError):
        handle.complete(b"receipt")
    assert rig.raw.get(handle.claim_key) == handle.token.encode()  # still in flight: no record
    handle.complete(b"receipt")
    _assert_completed(rig, handle, b"receipt")


def test_complete_reply_lost_without_retries_raises_then_the_same_handle_succeeds(rig: Rig) -> None:
    """With retries off, a lost complete() reply raises; completing again with the same value succeeds."""
    handle = _claimed(rig, "no-retries")
    rig.faults.lose_next_reply(handle.claim_key.encode(), b"receipt")
    with pytest.raises(ConnectionFailedError):
        handle.complete(b"receipt")
    assert stored(rig.raw, handle) == b"receipt"  # the server did store it
    handle.complete(b"receipt")
    _assert_completed(rig, handle, b"receipt")


def test_complete_after_the_lease_lapsed_unclaimed_succeeds(rig: Rig) -> None:
    """Fenced, the lease lapses (the server expires the claim) and nobody claims: complete() still stores.

    Unfenced, nothing proves that nobody claimed since: refused (tests/claim/test_late_complete.py).
    """
    handle = _claimed(rig, fencing=True)
    rig.raw.pexpire(handle.claim_key, 1)
    time.sleep(0.05)
    assert rig.raw.exists(handle.claim_key) == 0
    handle.complete(b"late")
    _assert_completed(rig, handle, b"late")


def test_complete_after_a_takeover_raises_claim_lost_and_writes_nothing(rig: Rig) -> None:
    """The lease lapses and another token claims, or completes: complete() raises ClaimLostError, writes nothing."""
    handle = _claimed(rig)
    rig.raw.pexpire(handle.claim_key, 1)
    time.sleep(0.05)
    other = rig.claim(rig.client(), handle.key)
    assert isinstance(other.acquire(), Claimed)
    with pytest.raises(ClaimLostError):
        handle.complete(b"late")
    assert rig.raw.get(handle.claim_key) == other.token.encode()  # the new owner's token: nothing stored
    other.complete(b"theirs")
    with pytest.raises(ClaimLostError):
        handle.complete(b"late")
    _assert_completed(rig, other, b"theirs")


# --------------------------------------------------------------------------- extend


def test_extend_reply_lost_is_resent_and_renews(rig: Rig) -> None:
    """extend()'s reply is lost; the re-sent renewal is fine and the lease is renewed."""
    handle = _claimed(rig, lease=60)
    rig.raw.expire(handle.claim_key, 5)
    rig.faults.lose_next_reply(handle.claim_key.encode())
    handle.extend()
    assert sent(rig.faults, handle.claim_key, "extend") == 2
    assert 5 < rig.raw.ttl(handle.claim_key) <= 60


def test_extend_cut_without_retries_raises_and_renews_nothing(rig: Rig) -> None:
    """With retries off, extend() cut before the server raises ConnectionFailedError; the lease is unchanged."""
    handle = _claimed(rig, "no-retries", lease=60)
    rig.raw.expire(handle.claim_key, 5)
    rig.faults.drop_before(handle.claim_key.encode())
    with pytest.raises(ConnectionFailedError):
        handle.extend()
    assert rig.raw.ttl(handle.claim_key) <= 5
    assert rig.raw.get(handle.claim_key) == handle.token.encode()


# --------------------------------------------------------------------------- release and forget


def _completed(rig: Rig, flavour: str = "default") -> Any:
    handle = _claimed(rig, flavour)
    handle.complete(b"stored")
    return handle


def _to_delete(rig: Rig, operation: str, flavour: str = "default") -> tuple[Any, bytes]:
    """A handle for ``operation`` to delete (claimed for release, completed for forget) and its record."""
    if operation == "release":
        handle = _claimed(rig, flavour)
        return handle, handle.token.encode()
    handle = _completed(rig, flavour)
    return handle, record(handle.token, b"stored")


def _delete_through(rig: Rig, operation: str, fault: str, reported: bool, sends: int) -> Any:
    """``operation`` with ``fault`` (a ``Faults`` method) armed: it answers ``reported``, sent ``sends`` times."""
    handle, _ = _to_delete(rig, operation)
    getattr(rig.faults, fault)(handle.claim_key.encode())
    assert getattr(handle, operation)() is reported
    assert sent(rig.faults, handle.claim_key, operation) == sends
    assert rig.raw.exists(handle.claim_key) == 0
    return handle


def _delete_reply_lost(rig: Rig, operation: str) -> None:
    """``operation`` deletes, its reply is lost: the re-send reports False, the key is free."""
    handle = _delete_through(rig, operation, "lose_next_reply", False, 2)
    assert isinstance(rig.claim(rig.client(), handle.key).acquire(), Claimed)


def test_release_reply_lost_is_resent_and_reports_false_with_the_claim_free(rig: Rig) -> None:
    """release()'s reply is lost after it deleted; the re-send reports False and the claim is free."""
    _delete_reply_lost(rig, "release")


def test_forget_reply_lost_is_resent_and_reports_false_with_the_record_gone(rig: Rig) -> None:
    """forget()'s reply is lost after it deleted; the re-send reports False and the key is open again."""
    _delete_reply_lost(rig, "forget")


@pytest.mark.parametrize("operation", ["release", "forget"])
def test_delete_cut_before_the_server_is_retried_once(rig: Rig, operation: str) -> None:
    """The connection drops before release() or forget() reaches the server; redis-py's retry deletes: True."""
    _delete_through(rig, operation, "drop_before", True, 1)


@pytest.mark.parametrize("operation", ["release", "forget"])
def test_delete_cut_without_retries_raises_and_deletes_nothing(rig: Rig, operation: str) -> None:
    """With retries off, release() or forget() cut before the server raises; the record is still there, whole.

    Except where the delete goes pipelined with its announcement through a sync cluster
    client (forget's DEL, Valkey's DELIFEQ): that pipeline sends a command cut before the
    server again by itself, whatever the client's retries, and it deletes, once.
    """
    handle, kept = _to_delete(rig, operation, "no-retries")
    rig.faults.drop_before(handle.claim_key.encode())
    if rig.kind == "sync" and rig.topology == "cluster" and operation == "forget":
        assert handle.forget() is True
        assert rig.raw.exists(handle.claim_key) == 0
        return
    with pytest.raises(ConnectionFailedError):
        getattr(handle, operation)()
    assert rig.raw.get(handle.claim_key) == kept
    assert getattr(handle, operation)() is True


# --------------------------------------------------------------------------- the decorator


def test_decorator_acquire_reply_lost_runs_once_without_waiting(rig: Rig) -> None:
    """The decorator's claim reply is lost and re-sent: it runs the function at once (wait=0), once.

    Through a cluster client redis-py's identical re-send cannot say it is one: the
    call is in flight (StillInFlightError at wait=0) and nothing runs twice.
    """
    work = rig.counted(rig.client(), wait=0)
    key = record_key(rig.ns, "evt")
    rig.faults.lose_next_reply(key.encode())
    if rig.topology == "cluster":
        with pytest.raises(StillInFlightError):
            work("evt")
        assert sent(rig.faults, key, "claim") == 2
        assert rig.runs("evt") == 0
        return
    assert work("evt")["run"] == 1
    assert sent(rig.faults, key, "claim") == 2
    assert work("evt")["run"] == 1
    assert rig.runs("evt") == 1


def test_decorator_final_write_reply_lost_is_resent_and_returns_the_result(rig: Rig) -> None:
    """The decorator's complete() reply is lost and re-sent by redis-py: the caller gets its result, stored once."""
    work = rig.counted(rig.client())
    rig.faults.lose_next_reply(marker(rig.ns, "evt").encode())
    first = work("evt")
    assert rig.faults.count(marker(rig.ns, "evt").encode()) == 2
    assert work("evt") == first
    assert rig.runs("evt") == 1


@pytest.mark.parametrize("fault", ["drop", "lose", "hold"])
def test_decorator_final_write_failing_without_retries_is_retried_by_the_decorator(rig: Rig, fault: str) -> None:
    """With redis-py's retries off, a final write cut, lost or timed out is retried by the decorator: stored once."""
    work = rig.counted(rig.client("no-retries"))
    match = marker(rig.ns, "evt").encode()
    {"drop": rig.faults.drop_before, "lose": rig.faults.lose_next_reply, "hold": rig.faults.hold_next_reply}[fault](
        match
    )
    first = work("evt")
    assert rig.faults.armed() == 0
    assert rig.faults.count(match) == (1 if fault == "drop" else 2)
    assert completed_record(rig.raw, rig.ns, "evt")
    assert work("evt") == first
    assert rig.runs("evt") == 1


@pytest.mark.slow
def test_decorator_final_write_failing_for_the_whole_lease_raises_with_the_result(rig: Rig) -> None:
    """Every final write is cut for longer than the lease: the caller gets an error carrying .result; nothing stored."""
    work = rig.counted(rig.client("no-retries"), lease=1)
    match = marker(rig.ns, "evt").encode()
    rig.faults.drop_before(match, times=None)
    started = time.monotonic()
    with pytest.raises(GoblinClaimError) as info:
        work("evt")
    assert time.monotonic() - started < 5
    assert info.value.result == {"item": "evt", "run": 1, "marker": match.decode()}
    assert rig.faults.dropped(match) >= 2  # retried, not given up at the first error
    assert rig.faults.count(match) == 0
    assert not completed_record(rig.raw, rig.ns, "evt")
    assert rig.runs("evt") == 1


# --------------------------------------------------------------------------- results gone


def _evicted(rig: Rig) -> Any:
    """A completed ``from_keys`` handle (two keys) whose result key is gone; the done marker stays."""
    handle = rig.two_keys(rig.client(), unique())
    assert isinstance(handle.acquire(), Claimed)
    handle.complete(b"stored")
    rig.raw.delete(handle.result_key)  # what an allkeys-* eviction does to it
    return handle


def _duplicate(rig: Rig, handle: Any) -> Any:
    """Another caller's ``from_keys`` handle on the keys of ``handle``."""
    if rig.run is None:
        return Claim.from_keys(rig.client(), handle.claim_key, handle.result_key)
    return SyncView(AsyncClaim.from_keys(rig.client(), handle.claim_key, handle.result_key), rig.run)


def test_result_evicted_after_completion_acquire_raises_result_lost(rig: Rig) -> None:
    """Two keys (from_keys): the claim says done but the result is gone: acquire() raises ResultLostError."""
    handle = _evicted(rig)
    with pytest.raises(ResultLostError) as info:
        _duplicate(rig, handle).acquire()
    assert info.value.key == handle.key
    assert rig.raw.exists(handle.result_key) == 0
    assert rig.raw.get(handle.claim_key) != handle.token.encode()  # the marker stays: nothing was claimed


def test_result_evicted_after_completion_wait_raises_result_lost_at_once(rig: Rig) -> None:
    """Two keys (from_keys): the claim says done, the result is gone: wait() raises ResultLostError at once."""
    handle = _evicted(rig)
    started = time.monotonic()
    with pytest.raises(ResultLostError):
        _duplicate(rig, handle).wait(timeout=10)
    assert time.monotonic() - started < 2


def test_record_evicted_after_completion_reopens_the_work(rig: Rig) -> None:
    """One key: the completed record is evicted: the work is free again; the next acquire() is Claimed."""
    handle = _completed(rig)
    rig.raw.delete(handle.claim_key)  # what an allkeys-* eviction does to the record
    again = rig.claim(rig.client(), handle.key)
    assert isinstance(again.acquire(), Claimed)
    assert rig.raw.get(again.claim_key) == again.token.encode()


def test_record_evicted_decorator_runs_again_at_once(rig: Rig) -> None:
    """The decorator's record is evicted: the work is free again; a duplicate runs it at once, stored anew."""
    work = rig.counted(rig.client(), wait=10)
    assert work("evt")["run"] == 1
    rig.raw.delete(record_key(rig.ns, "evt"))
    started = time.monotonic()
    assert work("evt")["run"] == 2
    assert time.monotonic() - started < 2
    assert completed_record(rig.raw, rig.ns, "evt")
    assert work("evt")["run"] == 2
    assert rig.runs("evt") == 2


# --------------------------------------------------------------------------- key-expiry hygiene


class Declined(Exception):
    """A terminal error the decorator stores and replays."""


def test_every_key_the_sdk_writes_has_a_ttl(rig: Rig) -> None:
    """After every operation and decorator path, errors and replays included, each key under the namespace expires."""
    client = rig.client()
    rig.claim(client, "in-flight").acquire()
    _completed(rig)
    _claimed(rig).extend(lease=60)
    _claimed(rig).release()
    _evicted(rig)
    _completed(rig).forget()
    lapsed = _claimed(rig)
    rig.raw.pexpire(lapsed.claim_key, 50)
    taker = rig.claim(client, lapsed.key)
    assert isinstance(taker.wait(timeout=5), Claimed)
    taker.complete(b"taken over")

    work = rig.counted(client, wait=0)
    work("ok")
    work("ok")
    with pytest.raises(PayloadMismatchError):
        rig.counted(client, fingerprint=lambda item: "other")("ok")
    failing = _failing(rig, client)
    for item in ("boom", "declined", "declined"):
        with pytest.raises((RuntimeError, Declined, ReplayedError)):
            failing(item)
    held = rig.claim(client, "held-by-hand")
    held.acquire()
    with pytest.raises(StillInFlightError):
        rig.counted(client, wait=0)("held-by-hand")
    # One key per idempotency key (two for the from_keys handle): in flight, completed,
    # extended, evicted, taken over, "ok", "declined", "held-by-hand".
    assert len(list(rig.raw.scan_iter(match=f"{rig.ns}:*"))) >= 8
    # The rig fixture asserts that no key under the namespace lacks a TTL.


def _failing(rig: Rig, client: Any) -> Callable[[str], None]:
    options: dict[str, Any] = {"key": "item", "namespace": rig.ns, "replay_errors": (Declined,)}

    def fail(item: str) -> None:
        if item == "boom":
            raise RuntimeError("released, not stored")
        raise Declined("stored and replayed")

    if rig.run is None:
        return idempotent(client, **options)(fail)
    run = rig.run

    async def async_fail(item: str) -> None:
        fail(item)

    wrapped = idempotent(client, **options)(async_fail)
    return lambda item: run(wrapped(item))


# --------------------------------------------------------------------------- storms


@dataclass
class Storm:
    """What a crowd of callers saw: answers per id, errors by type, in-flight retries."""

    answers: dict[str, set[str]]
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    busy: int = 0
    calls: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def describe_errors(self) -> str:
        """Errors by type, for the figures."""
        return ", ".join(f"{count} {name}" for name, count in self.errors.most_common()) or "none"


def count_run(client: Any, key: str, run: str) -> None:
    """Record one run of the work: SADD of its run id, re-sent until it lands.

    Not INCR: an INCR whose reply a kill swallows is re-sent by redis-py and would
    count one run twice; adding the same run id twice changes nothing.
    """
    deadline = time.monotonic() + 30
    while True:
        try:
            client.sadd(key, run)
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def storm(client: Any, namespace: str, ids: list[str], callers: int, *, lease: int = 2, wait: float = 0.2) -> Storm:
    """``callers`` threads each ask for every id (shuffled) through ``@idempotent`` until each is answered.

    A caller that gets an error (or still-in-flight) puts the id back at the end of
    its queue, like a client retrying later. Every run records itself in Redis.
    """

    @idempotent(client, key="item", namespace=namespace, lease=lease, ttl=600, wait=wait)
    def work(item: str) -> str:
        run = uuid.uuid4().hex
        count_run(client, storm_runs_key(namespace, item), run)
        return f"{item}/{run}"

    result = Storm({item: set() for item in ids})
    deadline = time.monotonic() + 60

    def caller(seed: int) -> None:
        queue = collections.deque(random.Random(seed).sample(ids, len(ids)))
        while queue and time.monotonic() < deadline:
            item = queue.popleft()
            try:
                answer = work(item)
            except StillInFlightError:
                with result.lock:
                    result.busy += 1
                queue.append(item)
                continue
            except Exception as exc:  # every kind is counted; the test then checks they are all ours
                with result.lock:
                    result.errors[type(exc).__name__ + ("" if isinstance(exc, GoblinClaimError) else " (leaked)")] += 1
                queue.append(item)
                continue
            finally:
                with result.lock:
                    result.calls += 1
            with result.lock:
                result.answers[item].add(answer)

    started = time.monotonic()
    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    return result


def storm_beside(
    disturb: Callable[[threading.Event], None], client: Any, namespace: str, ids: list[str], **options: Any
) -> Storm:
    """``storm`` with 4 callers while ``disturb`` runs in a thread of its own, until the event it is given is set."""
    stop = threading.Event()
    thread = threading.Thread(target=disturb, args=(stop,))
    thread.start()
    try:
        return storm(client, namespace, ids, callers=4, **options)
    finally:
        stop.set()
        thread.join()


def storm_runs_key(namespace: str, item: str) -> str:
    """Where the runs of ``item`` are recorded (a set of run ids), outside the namespace."""
    return f"storm-runs:{namespace}:{{{item}}}"


def check_storm(raw: Any, namespace: str, result: Storm) -> int:
    """Assert every id was answered, ran exactly once, and every caller got that one run's answer; return runs."""
    runs = {item: raw.smembers(storm_runs_key(namespace, item)) for item in result.answers}
    unanswered = [item for item, answers in result.answers.items() if not answers]
    assert not unanswered, f"{len(unanswered)} ids never answered (deadline), e.g. {unanswered[:5]}"
    twice = {item: len(found) for item, found in runs.items() if len(found) != 1}
    assert not twice, (
        f"{len(twice)} ids did not run exactly once: {dict(list(twice.items())[:10])}; errors {dict(result.errors)}"
    )
    for item, answers in result.answers.items():
        (run,) = runs[item]
        assert answers == {f"{item}/{run.decode()}"}, item
    assert not [name for name in result.errors if name.endswith("(leaked)")], result.errors
    assert expiry_offenders(raw, f"{namespace}:") == {}
    return sum(len(found) for found in runs.values())


@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["default", "no-retries"])
def test_client_kill_storm_runs_each_of_2000_ids_once(
    own_server: Callable[..., RedisProcess], figures: Figures, flavour: str
) -> None:
    """CLIENT KILL every 5 ms while 4 callers ask for each of 2000 ids: every id runs exactly once."""
    server = own_server()
    client = redis.Redis(host=HOST, port=server.port, **client_options("sync", flavour))
    namespace, ids = unique("kill"), [f"id-{n}" for n in range(2000)]
    kills, killed = [0], [0]

    def killer(stop: threading.Event) -> None:
        admin = server.client()
        while not stop.wait(0.005):
            killed[0] += admin.client_kill_filter(_type="normal", skipme=True)
            kills[0] += 1
        admin.close()

    # A kill every 5 ms makes every command a gamble: on a loaded machine an owner's
    # renewals and stores can all miss for two seconds, and past its lease the SDK
    # says so (ClaimLostError) and another caller may run the work. The lease here
    # outlasts such a run of misses, so what is tested is lost replies, not lapses.
    result = storm_beside(killer, client, namespace, ids, lease=6)
    raw = server.client()
    runs = check_storm(raw, namespace, result)
    figures(
        f"client-kill storm ({flavour}): {len(ids)} ids x 4 callers, {result.calls} calls, {runs} runs, "
        f"{sum(result.errors.values())} errors ({result.describe_errors()}), {result.busy} in-flight retries, "
        f"{kills[0]} kills ({killed[0]} connections), {result.seconds:.1f} s"
    )
    assert kills[0] > 100, "the storm must really kill connections under load"
    raw.close()
    client.close()


def _eval_calls(nodes: list[RedisProcess]) -> int:
    total = 0
    for node in nodes:
        client = node.client()
        total += int(client.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))
        client.close()
    return total


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["standalone", "cluster"])
def test_script_flush_every_100ms_under_load_runs_each_id_once(
    request: pytest.FixtureRequest, own_server: Callable[..., RedisProcess], figures: Figures, topology: str
) -> None:
    """SCRIPT FLUSH every 100 ms while 4 callers ask for each of 1500 ids: every id runs once, no caller errs."""
    nodes: list[RedisProcess]
    client: Any
    if topology == "standalone":
        nodes = [own_server()]
        client = redis.Redis(host=HOST, port=nodes[0].port)
    else:
        nodes = request.getfixturevalue("redis_cluster")
        client = redis.cluster.RedisCluster(host=HOST, port=nodes[0].port)
    namespace, ids = unique("flush"), [f"id-{n}" for n in range(1500)]
    evals_before, flushes = _eval_calls(nodes), [0]

    def flusher(stop: threading.Event) -> None:
        admins = [node.client() for node in nodes]
        while not stop.wait(0.1):
            for admin in admins:
                admin.script_flush()
            flushes[0] += 1
        for admin in admins:
            admin.close()

    result = storm_beside(flusher, client, namespace, ids, wait=5)
    runs = check_storm(client, namespace, result)
    figures(
        f"script-flush storm ({topology}): {len(ids)} ids x 4 callers, {result.calls} calls, {runs} runs, "
        f"{sum(result.errors.values())} errors, {flushes[0]} flushes, "
        f"{_eval_calls(nodes) - evals_before} EVAL recoveries, {result.seconds:.1f} s"
    )
    assert result.errors == {}
    assert flushes[0] >= 3
    client.close()


# --------------------------------------------------------------------------- restart with AOF


def _restart(server: RedisProcess) -> RedisProcess:
    """Start a killed server again on the same port and directory (same arguments)."""
    server.process.wait(10)
    process = subprocess.Popen(server.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    restarted = RedisProcess(server.port, server.directory, process, server.args)
    probe = restarted.client(socket_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        assert process.poll() is None, (server.directory / "redis.log").read_text(errors="replace")[-2000:]
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            if probe.ping():
                break
        assert time.monotonic() < deadline, "redis-server did not come back"
        time.sleep(0.02)
    probe.close()
    return restarted


@pytest.mark.slow
def test_restart_with_aof_keeps_claims_and_results_and_a_dead_owner_is_taken_over(
    redis_server_binary: str, figures: Figures
) -> None:
    """Crash and restart with AOF: results and live claims survive; an owner killed meanwhile is taken over."""
    server = start_server(redis_server_binary, "--appendonly", "yes", "--appendfsync", "always")
    try:
        client = redis.Redis(host=HOST, port=server.port)  # the default Retry rides out the restart
        namespace = unique("aof")
        done, orphans = [f"done-{n}" for n in range(20)], [f"orphan-{n}" for n in range(5)]
        work = workers.counted_work(client, namespace, lease=2, wait=20, slow_first=0)
        answers = {item: work(item) for item in done}
        live = Claim(client, "live", namespace=namespace, lease=60)
        assert isinstance(live.acquire(), Claimed)

        victim = SPAWN.Process(target=workers.hold_until_killed, args=(server.port, False, namespace, orphans))
        victim.start()
        deadline = time.monotonic() + 60
        while any(client.get(workers.runs_key(namespace, item)) is None for item in orphans):
            assert time.monotonic() < deadline, "the victim never started its work"
            time.sleep(0.05)

        server.process.send_signal(signal.SIGKILL)  # the server crashes first...
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)  # ...and the owner of the orphans dies while it is down
        victim.join(10)
        started = time.monotonic()
        server = _restart(server)
        restart = time.monotonic() - started

        assert {item: work(item) for item in done} == answers  # replayed from the AOF, not rerun
        live.extend()  # the live claim survived, still ours
        live.complete(b"after restart")
        outcome = asyncio.run(_acquire_async(server.port, namespace, "live"))
        assert isinstance(outcome, Completed)
        assert outcome.value == b"after restart"

        started = time.monotonic()
        rescued = {item: work(item) for item in orphans}
        takeover = time.monotonic() - started
        assert all(answer["pid"] == os.getpid() for answer in rescued.values())
        runs = {item: int(client.get(workers.runs_key(namespace, item)) or 0) for item in done + orphans}
        assert runs == {**dict.fromkeys(done, 1), **dict.fromkeys(orphans, 2)}
        assert 0.5 < takeover < 2 + 3  # the dead owner's claim survived the restart, and lapsed after its lease
        assert expiry_offenders(client, f"{namespace}:{{") == {}  # the SDK's keys (runs_key lies beside them)
        figures(
            f"aof restart: {len(done)} results and 1 live claim kept, {len(orphans)} orphans taken over "
            f"in {takeover:.1f} s (lease 2 s), restart {restart:.2f} s, runs {sum(runs.values())} "
            f"({len(done)} + {len(orphans)} killed mid-work + {len(orphans)} takeovers)"
        )
        client.close()
    finally:
        server.stop()


async def _acquire_async(port: int, namespace: str, key: str) -> Any:
    client = redis.asyncio.Redis(host=HOST, port=port)
    try:
        return await AsyncClaim(client, key, namespace=namespace).acquire()
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- server pause


PAUSE_MS = 1100  # longer than a keep-alive tick (lease / 3), shorter than the lease
LEASE = 2
WORK_SECONDS = 2.6  # longer than the lease: without renewals the claim would lapse


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_server_pause_under_keep_alive_keeps_the_claim_and_runs_once(
    own_server: Callable[..., RedisProcess], figures: Figures, kind: str
) -> None:
    """CLIENT PAUSE longer than a renewal tick, shorter than the lease: keep-alives keep the claim; one run."""
    server = own_server()
    admin = server.client()
    namespace = unique("pause")
    options = {"socket_timeout": 0.5}  # renewals time out during the pause and are re-sent
    started = time.monotonic()
    if kind == "sync":
        handle_result, answers, renewals = _pause_sync(server, admin, namespace, options)
    else:
        handle_result, answers, renewals = asyncio.run(_pause_async(server, admin, namespace, options))
    elapsed = time.monotonic() - started
    assert handle_result == b"done"
    assert renewals >= 1
    assert len(answers) == 2
    assert answers[0] == answers[1]
    assert int(admin.get(runs_key(namespace, "job")) or 0) == 1
    assert expiry_offenders(admin, f"{namespace}:") == {}
    figures(
        f"server pause ({kind}): CLIENT PAUSE {PAUSE_MS} ms under a {LEASE} s lease, work {WORK_SECONDS} s, "
        f"{renewals} handle renewals, claim kept, 1 run for 2 callers, {elapsed:.1f} s"
    )
    admin.close()


def _pause_sync(
    server: RedisProcess, admin: Any, namespace: str, options: dict[str, Any]
) -> tuple[bytes, list[Any], int]:
    client = redis.Redis(host=HOST, port=server.port, **options)
    handle = Claim(client, "by-hand", namespace=namespace, lease=LEASE)

    @idempotent(client, key="item", namespace=namespace, lease=LEASE, wait=10)
    def job(item: str) -> dict[str, Any]:
        run = admin.incr(runs_key(namespace, item))
        time.sleep(WORK_SECONDS)
        return {"item": item, "run": run}

    answers: list[Any] = []

    def call() -> None:
        answers.append(job("job"))

    assert isinstance(handle.acquire(), Claimed)
    first = threading.Thread(target=call)
    first.start()
    with handle.keep_alive() as keeper:
        time.sleep(0.3)
        duplicate = threading.Thread(target=call)  # waits for the first call's result, through the pause
        duplicate.start()
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        time.sleep(WORK_SECONDS - 0.3)
    assert not keeper.lost
    handle.complete(b"done")
    first.join()
    duplicate.join()
    value = stored(admin, handle)
    assert value is not None
    client.close()
    return value, answers, keeper.renewals


async def _pause_async(
    server: RedisProcess, admin: Any, namespace: str, options: dict[str, Any]
) -> tuple[bytes, list[Any], int]:
    # Not from_pool(BlockingConnectionPool(...)): a pool made by hand has no Retry, so a
    # timed-out poll of the waiting duplicate would be an error instead of a re-send.
    client = redis.asyncio.Redis(host=HOST, port=server.port, **options)
    handle = AsyncClaim(client, "by-hand", namespace=namespace, lease=LEASE)

    @idempotent(client, key="item", namespace=namespace, lease=LEASE, wait=10)
    async def job(item: str) -> dict[str, Any]:
        run = admin.incr(runs_key(namespace, item))
        await asyncio.sleep(WORK_SECONDS)
        return {"item": item, "run": run}

    assert isinstance(await handle.acquire(), Claimed)
    first = asyncio.create_task(job("job"))
    async with handle.keep_alive() as keeper:
        await asyncio.sleep(0.3)
        duplicate = asyncio.create_task(job("job"))
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        await asyncio.sleep(WORK_SECONDS - 0.3)
    assert not keeper.lost
    await handle.complete(b"done")
    answers = list(await asyncio.gather(first, duplicate))
    value = stored(admin, handle)
    assert value is not None
    await client.aclose()
    return value, answers, keeper.renewals
