"""One owner per handle: two handles never both hold one claim, whatever tokens they were given.

The token is stored verbatim in claim_key (a worker id stays readable there), so
the server cannot tell a handle's own re-sent claim from another handle given the
same token. The handle can: a re-send its driver made, or a claim of its own whose
lease has not run out, is ``Claimed``; anything else holding its token is
``InFlight``. Every race here counts executions of the work (exactly once = 1), on
every backend, both drivers, and both paths (scripts, and native GOBLIN.CLAIM).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    ConnectionFailedError,
    InFlight,
    InvalidArgumentError,
    StillInFlightError,
)
from tests.conftest import ALL_BACKENDS, Driver, Runner, SyncView, unique
from tests.support.proxy import FaultProxy, Faults, proxy_nodes
from tests.support.servers import HOST, RedisProcess

BACKENDS = ALL_BACKENDS
SHARED = "worker-3"  # the seed's own example of a token: a worker id, shared by every handle of that worker


def race_to_claim(driver: Driver, key: str, tokens: list[str | None], **options: Any) -> list[Any]:
    """Every token's handle acquires ``key`` at once (threads, or tasks on one loop); their outcomes."""
    if driver.run is None:
        barrier = threading.Barrier(len(tokens))
        outcomes: list[Any] = [None] * len(tokens)

        def one(i: int) -> None:
            handle = Claim(driver.client, key, token=tokens[i], **options)
            barrier.wait()
            outcomes[i] = handle.acquire()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(tokens))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return outcomes

    async def all_at_once() -> list[Any]:
        handles = [AsyncClaim(driver.client, key, token=token, **options) for token in tokens]
        return list(await asyncio.gather(*(handle.acquire() for handle in handles)))

    return list(driver.run(all_at_once()))


# --------------------------------------------------------------------------- shared tokens


@pytest.mark.parametrize("fencing", [False, True], ids=["unfenced", "fenced"])
def test_handles_sharing_a_token_race_and_exactly_one_is_claimed(driver: Driver, fencing: bool) -> None:
    """Eight handles given one token race for a key, twenty times: each time exactly one is Claimed."""
    for _ in range(20):
        outcomes = race_to_claim(driver, unique(), [SHARED] * 8, fencing=fencing)
        claimed = [o for o in outcomes if isinstance(o, Claimed)]
        assert len(claimed) == 1, outcomes
        assert all(isinstance(o, InFlight) for o in outcomes if not isinstance(o, Claimed))


def test_a_second_handle_with_the_same_token_is_in_flight_and_the_first_still_owns(driver: Driver) -> None:
    """A holds the claim as worker-3; B, also worker-3, gets InFlight, and A's own second acquire() is Claimed."""
    key = unique()
    first = driver.claim(key, token=SHARED, lease=30)
    second = driver.claim(key, token=SHARED, lease=30)
    assert isinstance(first.acquire(), Claimed)
    assert isinstance(second.acquire(), InFlight)
    with pytest.raises(StillInFlightError):
        second.wait(timeout=0.2)
    assert isinstance(first.acquire(), Claimed)  # its own claim, its lease running
    assert driver.raw.get(first.claim_key) == SHARED.encode()  # stored verbatim


def test_a_handle_whose_lease_lapsed_does_not_take_a_same_token_claim_for_its_own(driver: Driver) -> None:
    """A's lease lapses, B (same token) claims; A acquiring again is InFlight, never a second owner."""
    key = unique()
    first = driver.claim(key, token=SHARED, lease=1)
    assert isinstance(first.acquire(), Claimed)
    time.sleep(1.1)
    second = driver.claim(key, token=SHARED, lease=30)
    assert isinstance(second.acquire(), Claimed)
    assert isinstance(first.acquire(), InFlight)
    assert isinstance(second.acquire(), Claimed)


def test_fences_strictly_increase_across_owners_sharing_a_token(driver: Driver) -> None:
    """Fenced, one token: a taker-over gets a higher fence, and the earlier owner is never Claimed at its old one."""
    key = unique()
    first = driver.claim(key, token=SHARED, fencing=True, lease=30)
    won = first.acquire()
    assert isinstance(won, Claimed)
    assert isinstance(won.fence, int)
    assert isinstance(driver.claim(key, token=SHARED, fencing=True).acquire(), InFlight)
    driver.raw.pexpire(first.claim_key, 1)  # its lease lapses early, by its own clock still running
    time.sleep(0.05)
    second = driver.claim(key, token=SHARED, fencing=True, lease=30)
    took = second.acquire()
    assert isinstance(took, Claimed)
    assert isinstance(took.fence, int)
    assert took.fence > won.fence
    # The counter moved on, so first's own clock no longer makes the claim its own.
    assert isinstance(first.acquire(), InFlight)
    assert second.acquire() == took


def test_shared_token_work_runs_once_through_wait(driver: Driver) -> None:
    """Two handles of worker-3 do a job the way the README says; the work runs once and both get its answer."""
    key = unique()
    runs: list[str] = []
    first, second = driver.claim(key, token=SHARED), driver.claim(key, token=SHARED)
    answers = []
    for handle in (first, second):
        outcome = handle.acquire()
        if isinstance(outcome, InFlight):
            if not runs:
                raise AssertionError("in flight before anyone ran")
            first.complete(b"charged")  # the owner finishes meanwhile
            outcome = handle.wait(timeout=5)
        if isinstance(outcome, Claimed):
            runs.append(handle.token)
            answers.append(b"charged")
        else:
            assert isinstance(outcome, Completed)
            answers.append(outcome.value)
    assert runs == [SHARED]
    assert answers == [b"charged", b"charged"]


# --------------------------------------------------------------------------- markers are no tokens


@pytest.mark.parametrize("token", ["CLAIMED", "done worker-3", "done"])
def test_protocol_markers_are_refused_as_tokens_before_anything_is_written(driver: Driver, token: str) -> None:
    """token="CLAIMED" (and anything the done marker could be read as) raises before any I/O; "done" is fine."""
    key = unique()
    if token == "done":
        handle = driver.claim(key, token=token)
        assert isinstance(handle.acquire(), Claimed)
        assert isinstance(driver.claim(key, token=token).acquire(), InFlight)
        return
    with pytest.raises(InvalidArgumentError):
        driver.claim(key, token=token)
    with pytest.raises(InvalidArgumentError):
        driver.from_keys(f"c:{{{key}}}", f"r:{{{key}}}", token=token)
    assert driver.raw.exists(f"goblin:{{{key}}}", f"c:{{{key}}}") == 0


@pytest.mark.parametrize("fencing", [False, True], ids=["unfenced", "fenced"])
def test_a_raw_holder_reading_claimed_is_in_flight_for_every_handle(driver: Driver, fencing: bool) -> None:
    """Raw code put the literal CLAIMED in claim_key: every handle is InFlight, none takes it for a win.

    claim.lua (and the fenced claim) answer a holder inside a list, so it never reads as
    the win; SET ... NX GET answers its win as nil, so a holder named CLAIMED is only a
    holder. (``GOBLIN.CLAIM k k`` on the one-key record would answer the holder itself, as
    the seed prescribes, and a holder named CLAIMED is then the seed's own ambiguity: the
    SDK refuses that token, ``test_protocol_markers_are_refused_as_tokens_before_anything_is_written``,
    and the README says raw code must not hold it; one-key claims take SET ... NX GET
    wherever the module runs here.)
    """
    key = unique()
    probe = driver.claim(key, fencing=fencing)
    driver.raw.set(probe.claim_key, b"CLAIMED", ex=30)
    outcomes = race_to_claim(driver, key, [None] * 4, fencing=fencing)
    assert all(isinstance(outcome, InFlight) for outcome in outcomes), outcomes
    assert driver.raw.get(probe.claim_key) == b"CLAIMED"


def test_raw_code_can_still_release_a_worker_id_claim(driver: Driver) -> None:
    """The worker id stays verbatim in claim_key: raw GOBLIN.CAD (or its script) with it releases the claim."""
    key = unique()
    owner = driver.claim(key, token=SHARED)
    assert isinstance(owner.acquire(), Claimed)
    raw_release = Claim(driver.raw, key, token=SHARED)  # raw code speaking the protocol with the worker id
    assert raw_release.release() is True
    assert driver.raw.exists(owner.claim_key) == 0
    with pytest.raises(ClaimLostError):
        owner.complete(b"v")  # its claim was given up: nothing proves nobody claimed since


# --------------------------------------------------------------------------- re-sends, on the wire


@dataclass
class Wire:
    """One driver on one real server (or cluster) through fault proxies; ``raw`` goes around them."""

    kind: str
    topology: str
    faults: Faults
    raw: Any
    connect: Callable[..., Any]
    run: Runner | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def direct(self) -> bool:
        """Whether the SDK sends through the pool itself (and so sees redis-py's re-sends)."""
        return "cluster" not in self.topology

    def claim(self, key: str, **options: Any) -> Any:
        """A handle on a new client through the proxies (sync, or async called like sync)."""
        if self.run is None:
            client = self.connect()
            self._closers.append(client.close)
            return Claim(client, key, **options)
        run = self.run

        async def make() -> Any:
            return self.connect()

        client = run(make())
        self._closers.append(lambda: run(client.aclose()))
        return SyncView(AsyncClaim(client, key, **options), run)

    def close(self) -> None:
        """Close the clients, then the loop."""
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        if self.run is not None:
            self.run.close()
        self.raw.close()


WIRES = [
    f"{kind}-{topology}"
    for kind in ("sync", "async")
    for topology in ("standalone", "native", "cluster", "native-cluster")
]


@pytest.fixture(params=WIRES)
def wire(request: pytest.FixtureRequest) -> Iterator[Wire]:
    """Each driver on each real server kind (scripts and native; direct and execute_command), through proxies."""
    kind, topology = request.param.split("-", 1)
    faults = Faults()
    cluster = "cluster" in topology
    fixture = {
        "standalone": "redis_standalone",
        "native": "redis_native",
        "cluster": "redis_cluster",
        "native-cluster": "redis_native_cluster",
    }[topology]
    with contextlib.ExitStack() as stack:
        if not cluster:
            server: RedisProcess = request.getfixturevalue(fixture)
            proxy = stack.enter_context(FaultProxy(server.port, faults))
            raw: Any = redis.Redis(host=HOST, port=server.port)
            factory: Any = redis.Redis if kind == "sync" else redis.asyncio.Redis

            def connect() -> Any:
                return factory(host=HOST, port=proxy.port)
        else:
            nodes: list[RedisProcess] = request.getfixturevalue(fixture)
            _proxies, remap = stack.enter_context(proxy_nodes([node.port for node in nodes], faults))
            raw = redis.cluster.RedisCluster(host=HOST, port=nodes[0].port)
            cluster_factory: Any = redis.cluster.RedisCluster if kind == "sync" else redis.asyncio.cluster.RedisCluster

            def connect() -> Any:
                return cluster_factory(host=HOST, port=_proxies[0].port, address_remap=remap)

        made = Wire(kind, topology, faults, raw, connect, run=Runner() if kind == "async" else None)
        try:
            yield made
        finally:
            made.close()


@pytest.mark.parametrize("shared", [False, True], ids=["own-token", "worker-id"])
def test_a_claim_whose_reply_was_lost_is_claimed_once_and_never_by_two(wire: Wire, shared: bool) -> None:
    """The claim's reply is lost and redis-py re-sends it: Claimed on the direct path, InFlight through execute_command.

    Either way exactly one handle ever holds it: a second handle with the same
    token is InFlight, and through execute_command the first handle's wait()
    takes its own lapsed claim over, so the work runs once.
    """
    key = unique()
    token = SHARED if shared else None
    handle = wire.claim(key, token=token, lease=2)  # lapses within the wait below; holds through a stall
    wire.faults.lose_next_reply(handle.claim_key.encode())
    outcome = handle.acquire()
    assert wire.faults.lost(handle.claim_key.encode()) == 1
    assert wire.raw.get(handle.claim_key) == handle.token.encode()  # the first send did claim
    other = wire.claim(key, token=handle.token, lease=2)
    runs = 0
    if wire.direct:
        assert isinstance(outcome, Claimed)
        runs += 1
        assert isinstance(other.acquire(), InFlight)  # same token, another handle
    else:
        # redis-py's identical re-send cannot say it is one: the safe side.
        assert isinstance(outcome, InFlight)
        assert isinstance(other.acquire(), InFlight)
        taken = handle.wait(timeout=15)  # the lease lapses, then this handle claims afresh
        assert isinstance(taken, Claimed)
        runs += 1
        assert isinstance(other.acquire(), InFlight)
    handle.complete(b"done once")
    assert other.wait(timeout=1) == Completed(key=key, value=b"done once")
    assert runs == 1


def test_a_batch_whose_reply_was_lost_is_resent_and_each_key_claimed_once(wire: Wire) -> None:
    """acquire_many's reply is lost and the round re-sent: Claimed on the direct path, InFlight through a pipeline.

    The first send took every claim; the re-send reads each key held by its own
    handle's token. The direct round counts its tries, so its handles know it was
    theirs; redis-py's pipeline re-sends unseen, the safe side. Either way no
    other handle ever gets one of the keys.
    """
    keys = [unique() for _ in range(5)]
    lost = Claim(wire.raw, keys[2]).claim_key.encode()
    wire.faults.lose_next_reply(lost)
    if wire.run is None:
        client = wire.connect()
        wire._closers.append(client.close)
        pairs: list[Any] = Claim.acquire_many(client, keys, lease=30)
    else:

        async def batch() -> list[Any]:
            client = wire.connect()
            try:
                return await AsyncClaim.acquire_many(client, keys, lease=30)
            finally:
                await client.aclose()

        pairs = wire.run(batch())
    assert wire.faults.lost(lost) == 1
    for handle, _ in pairs:
        assert wire.raw.get(handle.claim_key) == handle.token.encode()  # the first send did claim
    outcomes = [type(outcome) for _, outcome in pairs]
    if wire.direct:
        assert outcomes == [Claimed] * len(keys)
    else:
        # A cluster's pipeline goes out per node and is redis-py's to re-send or give up:
        # the safe sides (InFlight, or the key's error in its place), never another's claim.
        assert set(outcomes) <= {Claimed, InFlight, ConnectionFailedError}
    for key in keys:
        assert isinstance(wire.claim(key).acquire(), InFlight)


def test_a_claim_that_never_got_a_reply_is_the_same_handles_on_its_next_try(wire: Wire) -> None:
    """Every reply lost until redis-py gives up: acquire() raises; its next acquire() is Claimed, another's InFlight."""
    key = unique()
    handle = wire.claim(key, token=SHARED, lease=30)
    wire.faults.lose_next_reply(handle.claim_key.encode(), times=None)
    with pytest.raises(ConnectionFailedError):
        handle.acquire()
    wire.faults.clear()
    assert wire.raw.get(handle.claim_key) == SHARED.encode()  # the server did claim
    assert isinstance(handle.acquire(), Claimed)
    assert isinstance(wire.claim(key, token=SHARED).acquire(), InFlight)
