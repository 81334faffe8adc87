"""A unit of work's round trips on the failure path, through the fault proxy, on real redis-server processes.

Sync and asyncio, standalone and cluster (``tests/faults/test_real_faults.py``'s rig, with
redis-py's clients): for an at-most-once or checkpointed claim, ``checkpoint()``, and the
``complete()``, ``release()``, ``extend()`` and ``forget()`` of an at-most-once record, a
reply lost after the server acted (re-sent by redis-py) and a connection cut before the
server acted; each test counts the sends that reached the server and reads the record
afterwards. A dead process is ``tests/claim/test_interrupted_work_is_never_run_again.py``
and ``tests/claim/test_checkpoints_resume_after_a_kill.py``. Also: what an at-most-once
claim and a checkpointed win cost in round trips (one each).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from goblin_claim import Claimed, ClaimLostError, ConnectionFailedError, InFlight, InterruptedWorkError
from tests.conftest import Runner, record, unique
from tests.faults.test_real_faults import Rig, _partial, expiry_offenders, sent
from tests.support.proxy import FaultProxy, Faults, proxy_nodes
from tests.support.servers import HOST, RedisProcess
from tests.support.units import checkpoint_key, held, lapse_lease, pass_deadline


@pytest.fixture(params=["sync-standalone", "async-standalone", "sync-cluster", "async-cluster"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Each driver on each topology, through fault proxies (one per node, sharing their faults)."""
    kind, topology = request.param.split("-")
    faults = Faults()
    with contextlib.ExitStack() as stack:
        if topology == "standalone":
            server: RedisProcess = request.getfixturevalue("redis_standalone")
            proxy = stack.enter_context(FaultProxy(server.port, faults))
            raw: Any = redis.Redis(host=HOST, port=server.port)
            factory: Any = redis.Redis if kind == "sync" else redis.asyncio.Redis
            connect = _partial(factory, host=HOST, port=proxy.port)
        else:
            nodes: list[RedisProcess] = request.getfixturevalue("redis_cluster")
            proxies, remap = stack.enter_context(proxy_nodes([node.port for node in nodes], faults))
            raw = redis.cluster.RedisCluster(host=HOST, port=nodes[0].port)
            factory = redis.cluster.RedisCluster if kind == "sync" else redis.asyncio.cluster.RedisCluster
            connect = _partial(factory, host=HOST, port=proxies[0].port, address_remap=remap)
        made = Rig(kind, topology, faults, raw, connect, run=Runner() if kind == "async" else None)
        try:
            yield made
            assert expiry_offenders(raw, f"{made.ns}:") == {}, "every key the SDK writes must expire"
        finally:
            made.close()


AMO = {"at_most_once": True, "checkpoints": True}


def _owner(rig: Rig, flavour: str = "default", **options: Any) -> Any:
    handle = rig.claim(rig.client(flavour), unique(), lease=30, ttl=600, **(options or AMO))
    assert isinstance(handle.acquire(), Claimed)
    return handle


def _key(handle: Any) -> bytes:
    return handle.claim_key.encode()


def _warm(rig: Rig, flavour: str) -> Any:
    """A client of ``flavour`` that has made its first round trip (the probe, SCRIPT LOAD) before any fault is armed."""
    client = rig.client(flavour)
    assert isinstance(rig.claim(client, unique()).acquire(), Claimed)
    return client


# --------------------------------------------------------------------------- acquire


@pytest.mark.parametrize("options", [AMO, {"at_most_once": True}], ids=["with-checkpoints", "at-most-once"])
def test_an_at_most_once_claim_whose_reply_was_lost_is_its_own_and_never_interrupted(
    rig: Rig, options: dict[str, Any]
) -> None:
    """The claim ran, its reply was lost, redis-py sent it again: Claimed, on a cluster too.

    A cluster client re-sends through ``execute_command``, unseen by the handle; at most once,
    a token the handle made is its own wherever it is found. Never InterruptedWorkError while
    the lease lasts: the re-send reads the deadline ahead.
    """
    handle = rig.claim(_warm(rig, "default"), unique(), lease=30, ttl=600, **options)
    rig.faults.lose_next_reply(_key(handle))
    outcome = handle.acquire()
    assert sent(rig.faults, handle.claim_key, "claim") == 2
    found = held(rig.raw, handle)
    assert found is not None
    assert found.token == handle.token
    assert isinstance(outcome, Claimed)
    assert isinstance(handle.acquire(), Claimed)  # and again, while its lease lasts
    handle.complete(b"ran once")  # its own record, either way
    assert rig.raw.get(handle.claim_key) == record(handle.token, b"ran once")


def test_an_at_most_once_claim_whose_reply_was_lost_without_retries_is_claimed_by_the_same_handle(rig: Rig) -> None:
    """Retries off: the lost reply raises ConnectionFailedError; the same handle's next acquire() is Claimed."""
    handle = rig.claim(_warm(rig, "no-retries"), unique(), lease=30, ttl=600, **AMO)
    rig.faults.lose_next_reply(_key(handle))
    with pytest.raises(ConnectionFailedError):
        handle.acquire()
    assert held(rig.raw, handle) is not None  # the server did claim
    assert isinstance(handle.acquire(), Claimed)
    assert isinstance(rig.claim(rig.client(), handle.key, at_most_once=True).acquire(), InFlight)
    assert sent(rig.faults, handle.claim_key, "claim") == 3


def test_an_at_most_once_claim_cut_before_the_server_writes_nothing(rig: Rig) -> None:
    """Retries off, the connection cut before the claim arrives: ConnectionFailedError, no record; a retry claims."""
    handle = rig.claim(_warm(rig, "no-retries"), unique(), lease=30, ttl=600, **AMO)
    rig.faults.drop_before(_key(handle))
    with pytest.raises(ConnectionFailedError):
        handle.acquire()
    assert rig.raw.exists(handle.claim_key) == 0
    assert sent(rig.faults, handle.claim_key, "claim") == 0
    assert isinstance(handle.acquire(), Claimed)


@pytest.mark.parametrize("flavour", ["default", "no-retries"])
def test_a_checkpointed_claim_whose_reply_was_lost_resumes_from_the_checkpoint(rig: Rig, flavour: str) -> None:
    """The win's reply lost: the re-sent claim (redis-py's, or the handle's own retry) still carries the checkpoint."""
    first = _owner(rig, checkpoints=True)
    first.checkpoint(b"step=3")
    lapse_lease(rig.raw, first)
    second = rig.claim(_warm(rig, flavour), first.key, lease=30, ttl=600, checkpoints=True)
    rig.faults.lose_next_reply(_key(second))
    if flavour == "no-retries":
        with pytest.raises(ConnectionFailedError):
            second.acquire()
    outcome = second.acquire()
    if rig.topology == "cluster" and flavour == "default":
        assert isinstance(outcome, InFlight)  # redis-py's re-send cannot say it is one
        return
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=3"
    assert second.last_checkpoint == b"step=3"


# --------------------------------------------------------------------------- checkpoint


def test_a_checkpoint_whose_reply_was_lost_is_resent_and_succeeds(rig: Rig) -> None:
    """checkpoint()'s reply lost after it stored: the re-send is a success, the value stored."""
    owner = _owner(rig)
    rig.faults.lose_next_reply(_key(owner), b"step=2")
    owner.checkpoint(b"step=2")
    assert sent(rig.faults, owner.claim_key, "checkpoint") == 2
    assert rig.raw.get(checkpoint_key(owner)) == b"step=2"


def test_a_checkpoint_cut_without_retries_raises_and_writes_nothing(rig: Rig) -> None:
    """Retries off, cut before the server: ConnectionFailedError, the last checkpoint intact; a retry stores."""
    owner = _owner(rig, "no-retries")
    owner.checkpoint(b"step=1")
    rig.faults.drop_before(_key(owner), b"step=2")
    with pytest.raises(ConnectionFailedError):
        owner.checkpoint(b"step=2")
    assert rig.raw.get(checkpoint_key(owner)) == b"step=1"
    assert owner.last_checkpoint == b"step=1"
    owner.checkpoint(b"step=2")
    assert rig.raw.get(checkpoint_key(owner)) == b"step=2"


def test_a_stale_checkpoint_whose_reply_was_lost_is_refused_both_times(rig: Rig) -> None:
    """A stale owner's checkpoint, its reply lost: refused twice (ClaimLostError), the new owner's intact."""
    first = _owner(rig, checkpoints=True)
    lapse_lease(rig.raw, first)
    second = rig.claim(rig.client(), first.key, checkpoints=True)
    assert isinstance(second.acquire(), Claimed)
    second.checkpoint(b"step=1 by second")
    rig.faults.lose_next_reply(_key(first), b"stale")
    with pytest.raises(ClaimLostError):
        first.checkpoint(b"stale")
    assert sent(rig.faults, first.claim_key, "checkpoint") == 3  # second's, then first's twice
    assert rig.raw.get(checkpoint_key(first)) == b"step=1 by second"


# --------------------------------------------------------------------------- complete, release, extend, forget


@pytest.mark.parametrize("past", [False, True], ids=["within", "past-deadline"])
def test_complete_of_an_attempt_whose_reply_was_lost_is_resent_and_succeeds(rig: Rig, past: bool) -> None:
    """complete() of a held record, its reply lost: a success, stored once, the checkpoint gone (a late owner too)."""
    owner = _owner(rig)
    owner.checkpoint(b"step=9")
    if past:
        pass_deadline(rig.raw, owner)
    rig.faults.lose_next_reply(_key(owner), b"receipt")
    owner.complete(b"receipt")
    assert sent(rig.faults, owner.claim_key, "complete") == 2
    assert rig.raw.get(owner.claim_key) == record(owner.token, b"receipt")
    assert rig.raw.exists(checkpoint_key(owner)) == 0


def test_complete_of_an_attempt_cut_without_retries_raises_and_writes_nothing(rig: Rig) -> None:
    """Retries off, cut before the server: ConnectionFailedError, the attempt and its checkpoint as they were."""
    owner = _owner(rig, "no-retries")
    owner.checkpoint(b"step=9")
    before = rig.raw.get(owner.claim_key)
    rig.faults.drop_before(_key(owner), b"receipt")
    with pytest.raises(ConnectionFailedError):
        owner.complete(b"receipt")
    assert rig.raw.get(owner.claim_key) == before
    assert rig.raw.get(checkpoint_key(owner)) == b"step=9"
    owner.complete(b"receipt")
    assert rig.raw.get(owner.claim_key) == record(owner.token, b"receipt")


def test_release_of_an_attempt_whose_reply_was_lost_reports_false_and_the_key_is_free(rig: Rig) -> None:
    """release() of a held record, its reply lost: the re-send answers False; the key is free, never interrupted."""
    owner = _owner(rig)
    owner.checkpoint(b"step=4")
    rig.faults.lose_next_reply(_key(owner))
    assert owner.release() is False
    assert sent(rig.faults, owner.claim_key, "release") == 2
    assert rig.raw.exists(owner.claim_key) == 0
    again = rig.claim(rig.client(), owner.key, **AMO)
    outcome = again.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=4"  # release keeps the progress


def test_extend_of_an_attempt_whose_reply_was_lost_is_resent_and_moves_the_deadline(rig: Rig) -> None:
    """extend() of a held record, its reply lost: a success, the deadline moved, the record's ttl kept."""
    owner = _owner(rig)
    first = held(rig.raw, owner)
    assert first is not None
    rig.faults.lose_next_reply(_key(owner))
    owner.extend(lease=120)
    assert sent(rig.faults, owner.claim_key, "extend") == 2
    moved = held(rig.raw, owner)
    assert moved is not None
    assert moved.deadline_ms - first.deadline_ms > 80_000
    assert 590 <= rig.raw.ttl(owner.claim_key) <= 600


def test_extend_of_an_attempt_cut_without_retries_raises_and_moves_nothing(rig: Rig) -> None:
    """Retries off, cut before the server: ConnectionFailedError, the deadline where it was."""
    owner = _owner(rig, "no-retries")
    before = held(rig.raw, owner)
    rig.faults.drop_before(_key(owner))
    with pytest.raises(ConnectionFailedError):
        owner.extend(lease=120)
    assert held(rig.raw, owner) == before


def test_forget_of_an_interrupted_attempt_whose_reply_was_lost_reports_false_with_everything_gone(rig: Rig) -> None:
    """forget() of an interrupted attempt and its checkpoint, its reply lost: False on the re-send, both gone."""
    owner = _owner(rig)
    owner.checkpoint(b"step=4")
    pass_deadline(rig.raw, owner)
    operator = rig.claim(rig.client(), owner.key)
    rig.faults.lose_next_reply(_key(owner))
    assert operator.forget() is False
    assert sent(rig.faults, owner.claim_key, "forget") == 2
    assert rig.raw.exists(owner.claim_key, checkpoint_key(owner)) == 0
    assert isinstance(rig.claim(rig.client(), owner.key, at_most_once=True).acquire(), Claimed)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "options", [{"at_most_once": True}, {**AMO, "fencing": True}], ids=["at-most-once", "all-three"]
)
def test_an_at_most_once_claim_and_its_interrupted_answer_are_one_round_trip_each(
    rig: Rig, options: dict[str, Any]
) -> None:
    """Keeping the attempt past its lease costs the claim no round trip: one request wins, one answers interrupted."""
    client = rig.client()
    assert isinstance(rig.claim(client, unique(), **options).acquire(), Claimed)  # the probe, SCRIPT LOAD first
    owner = rig.claim(client, unique(), **options)
    before = rig.faults.count()
    assert isinstance(owner.acquire(), Claimed)
    assert rig.faults.count() - before == 1
    pass_deadline(rig.raw, owner)
    before = rig.faults.count()
    with pytest.raises(InterruptedWorkError):
        rig.claim(client, owner.key, **options).acquire()
    assert rig.faults.count() - before == 1


@pytest.mark.parametrize("options", [{"checkpoints": True}, {**AMO, "fencing": True}], ids=["checkpoints", "all-three"])
def test_a_checkpointed_win_reads_its_checkpoint_in_the_same_round_trip(rig: Rig, options: dict[str, Any]) -> None:
    """The next owner's win carries the saved checkpoint: one request, no read after it."""
    client = rig.client()
    first = rig.claim(client, unique(), **options)
    assert isinstance(first.acquire(), Claimed)
    first.checkpoint(b"step=2")
    assert first.release() is True
    before = rig.faults.count()
    outcome = rig.claim(client, first.key, **options).acquire()
    assert rig.faults.count() - before == 1
    assert isinstance(outcome, Claimed)
    assert outcome.checkpoint == b"step=2"
