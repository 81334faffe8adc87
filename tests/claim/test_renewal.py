"""Lease renewal: isolated per server and cluster node, bounded by the lease, pipelined.

On real redis-server processes of the tests' own (stopped by PID): one of two
servers (or one node of a cluster) is paused with ``CLIENT PAUSE`` or frozen with
``SIGSTOP`` while claims on the healthy one are renewed on schedule, and the
decorated work runs exactly once; a renewal stuck past its lease is given up and
its claim marked lost; a black-holed connection does not keep its client's later
claims from renewing; renewals due together go out as one pipeline; a flushed
script cache and a fork do not stop renewals; 10,000 keep-alives hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
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

from goblin_claim import AsyncClaim, Claim, Claimed, ClaimLostError, idempotent
from goblin_claim._drivers.keepalive import COALESCE
from goblin_claim._protocol.scripts import EXTEND
from goblin_claim._protocol.timing import lease_margin
from tests.conftest import in_thread, missing, unique, until, until_async
from tests.support import servers
from tests.support.proxy import FaultProxy
from tests.support.servers import HOST, RedisProcess

Figures = Callable[[str], None]

LEASE = 3  # the lease: renewals every second
STALL = 3.0  # the pause: as long as the lease
WORK = 5.0  # longer than the lease and the stall: without renewals the claim lapses
EXTEND_SHA = EXTEND.sha.encode()


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[list[RedisProcess]]:
    """A three-primary cluster of this module's own (its tests stall a node and let it go again)."""
    binary = servers.redis_server_binary()
    if binary is None:
        missing("redis-server is not installed")
    with servers.cluster(binary) as nodes:
        try:
            yield nodes
        finally:
            for node in nodes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.process.pid, signal.SIGCONT)


def _answering(node: RedisProcess) -> None:
    """Wait until ``node`` answers PING (it may still be thawing from a stall)."""
    client = node.client(socket_timeout=10)
    try:
        assert client.ping()
    finally:
        client.close()


def stall(server: RedisProcess, how: str, seconds: float) -> None:
    """Make ``server`` answer nothing for ``seconds``: CLIENT PAUSE, or SIGSTOP then SIGCONT."""
    if how == "pause":
        admin = server.client()
        admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")
        admin.close()
        return
    os.kill(server.process.pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (server.process.pid, signal.SIGCONT))
    timer.daemon = True
    timer.start()


@dataclass
class Watch:
    """Samples, from a thread, the least PTTL of the healthy claim keys and when a keep-alive got lost."""

    admin: Any
    keys: list[str]
    lowest: dict[str, int] = field(default_factory=dict)
    lost_at: float | None = None
    keeper: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watch:
        """Begin sampling every 25 ms."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.025):
            if self.keeper is not None and self.keeper.lost and self.lost_at is None:
                self.lost_at = time.monotonic()
            for key in self.keys:
                pttl = int(self.admin.pttl(key))
                if pttl >= 0:  # -2 before the claim is made, which the test checks itself
                    self.lowest[key] = min(self.lowest.get(key, pttl), pttl)


@dataclass
class World:
    """Where a stall scenario runs: clients for the healthy and the stalled side, and the victim."""

    healthy: Callable[[], Any]  # a sync client reaching the healthy keys
    healthy_async: Callable[[], Any]
    stalled: Callable[[], Any]
    stalled_async: Callable[[], Any]
    admin: Any  # a sync client on the healthy side, for sampling
    victim: RedisProcess  # the server or node that stalls
    healthy_key: Callable[[str], str]  # a key whose claim lands on the healthy side
    stalled_key: Callable[[str], str]
    close: Callable[[], None]


def _two_servers(start: Callable[..., RedisProcess]) -> World:
    good, bad = start(), start()
    admin = good.client()
    return World(
        healthy=lambda: redis.Redis(host=HOST, port=good.port),  # socket_timeout=None, redis-py's default
        healthy_async=lambda: redis.asyncio.Redis(host=HOST, port=good.port),
        stalled=lambda: redis.Redis(host=HOST, port=bad.port),
        stalled_async=lambda: redis.asyncio.Redis(host=HOST, port=bad.port),
        admin=admin,
        victim=bad,
        healthy_key=unique,
        stalled_key=unique,
        close=admin.close,
    )


def _cluster_nodes(nodes: list[RedisProcess]) -> World:
    victim = nodes[0]
    router = redis.cluster.RedisCluster(host=HOST, port=nodes[1].port)

    def key_on(on_victim: bool) -> Callable[[str], str]:
        def pick(prefix: str = "k") -> str:
            # A key whose claim lands on (or off) the victim node, as the SDK builds claim keys.
            while True:
                key = unique(prefix)
                node = router.get_node_from_key(f"{{{key}}}")
                if (node.port == victim.port) is on_victim:
                    return key

        return pick

    def make() -> Any:
        return redis.cluster.RedisCluster(host=HOST, port=nodes[1].port)

    def make_async() -> Any:
        return redis.asyncio.cluster.RedisCluster(host=HOST, port=nodes[1].port)

    return World(
        healthy=make,
        healthy_async=make_async,
        stalled=make,
        stalled_async=make_async,
        admin=router,
        victim=victim,
        healthy_key=key_on(False),
        stalled_key=key_on(True),
        close=router.close,
    )


@pytest.fixture(params=["two-servers", "cluster-node"])
def world(request: pytest.FixtureRequest, own_server: Callable[..., RedisProcess]) -> Iterator[World]:
    """Two standalone servers, or a three-node cluster, one of which will stall."""
    if request.param == "two-servers":
        made = _two_servers(own_server)
    else:
        nodes = request.getfixturevalue("own_cluster")
        for node in nodes:  # answering again after an earlier test's stall
            _answering(node)
        made = _cluster_nodes(nodes)
    yield made
    made.close()


# --------------------------------------------------------------------------- isolation


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pause", "sigstop"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stalled_server_never_delays_renewals_on_another(world: World, figures: Figures, kind: str, how: str) -> None:
    """One server or node stalled 3 s (3 s leases): the healthy side is renewed on time and its work runs once.

    The stalled side's keep-alive gives its renewal up before the stall ends (the
    lease ran out under it) and marks its claim lost; duplicates of the healthy
    work, sent during and after the stall, wait for its result and run nothing.
    """
    item = world.healthy_key("item")
    namespace = unique("iso")
    if kind == "sync":
        outcome = _stall_sync(world, how, namespace, item)
    else:
        outcome = asyncio.run(_stall_async(world, how, namespace, item))
    runs, answers, healthy, victim, watch, resumed = outcome
    job_claim = f"{namespace}:{{{item}}}"
    assert runs == [item]  # exactly once, though the work outlived the lease and the stall
    assert len(answers) == 3
    assert answers[0] == answers[1] == answers[2]
    interval = LEASE / 3
    # Never more than one renewal late anywhere on the healthy side: a stall there would
    # have let the PTTL fall towards 0 (it starts at 3000 and is renewed every 1000 ms).
    assert set(watch.lowest) == {job_claim, watch.keys[0]}
    assert min(watch.lowest.values()) > (LEASE - 2 * interval) * 1000
    assert not healthy.lost
    assert healthy.renewals >= 4  # about 5 in the 5.5 s held
    assert victim.lost
    assert watch.lost_at is not None
    assert watch.lost_at < resumed  # given up while the stall lasted
    figures(
        f"renewal isolation ({kind}, {how}, on {_where(world)}): "
        f"{STALL:.0f} s stall on the other side, healthy claim renewed {healthy.renewals}x, least PTTL "
        f"{min(watch.lowest.values())} ms of {LEASE * 1000}, stalled claim given up "
        f"{resumed - watch.lost_at:.2f} s before the stall ended, 1 run for 3 callers"
    )


def _where(world: World) -> str:
    return "a cluster node" if isinstance(world.admin, redis.cluster.RedisCluster) else "a second server"


def _stall_sync(world: World, how: str, namespace: str, item: str) -> tuple[Any, ...]:
    good, bad = world.healthy(), world.stalled()
    runs: list[str] = []
    started = threading.Event()

    @idempotent(good, key="item", namespace=namespace, lease=LEASE, wait=15)
    def job(item: str) -> dict[str, Any]:
        runs.append(item)
        started.set()
        time.sleep(WORK)
        return {"item": item, "runs": len(runs)}

    answers: list[Any] = []
    callers = [threading.Thread(target=lambda: answers.append(job(item))) for _ in range(3)]
    healthy = Claim(good, world.healthy_key(), lease=LEASE)
    victim = Claim(bad, world.stalled_key(), lease=LEASE)
    assert isinstance(healthy.acquire(), Claimed)
    assert isinstance(victim.acquire(), Claimed)
    watch = Watch(world.admin, [healthy.claim_key, f"{namespace}:{{{item}}}"])
    callers[0].start()
    assert started.wait(10)
    with healthy.keep_alive() as kept, victim.keep_alive() as doomed:
        watch.keeper = doomed
        watch.start()
        time.sleep(0.3)
        stall(world.victim, how, STALL)
        resumed = time.monotonic() + STALL
        time.sleep(1.2)
        callers[1].start()  # during the stall
        time.sleep(max(0.0, resumed - time.monotonic()) + 0.4)
        callers[2].start()  # after it
        callers[0].join(15)
        time.sleep(0.2)
    watch.stop()
    for caller in callers:
        caller.join(15)
    healthy.complete(b"done")
    with pytest.raises(ClaimLostError):  # lapsed under the stall, or left lost: nothing more renewed it
        victim.extend()
    good.close()
    bad.close()
    return runs, answers, kept, doomed, watch, resumed


async def _stall_async(world: World, how: str, namespace: str, item: str) -> tuple[Any, ...]:
    good, bad = world.healthy_async(), world.stalled_async()
    runs: list[str] = []
    started = asyncio.Event()

    @idempotent(good, key="item", namespace=namespace, lease=LEASE, wait=15)
    async def job(item: str) -> dict[str, Any]:
        runs.append(item)
        started.set()
        await asyncio.sleep(WORK)
        return {"item": item, "runs": len(runs)}

    healthy = AsyncClaim(good, world.healthy_key(), lease=LEASE)
    victim = AsyncClaim(bad, world.stalled_key(), lease=LEASE)
    assert isinstance(await healthy.acquire(), Claimed)
    assert isinstance(await victim.acquire(), Claimed)
    watch = Watch(world.admin, [healthy.claim_key, f"{namespace}:{{{item}}}"])
    first = asyncio.create_task(job(item))
    await asyncio.wait_for(started.wait(), 10)
    async with healthy.keep_alive() as kept, victim.keep_alive() as doomed:
        watch.keeper = doomed
        watch.start()
        await asyncio.sleep(0.3)
        stall(world.victim, how, STALL)  # the admin call returns at once, even for a pause
        resumed = time.monotonic() + STALL
        await asyncio.sleep(1.2)
        during = asyncio.create_task(job(item))
        await asyncio.sleep(max(0.0, resumed - time.monotonic()) + 0.4)
        after = asyncio.create_task(job(item))
        answers = [await first]
        await asyncio.sleep(0.2)
    watch.stop()
    answers += [await during, await after]
    await healthy.complete(b"done")
    with pytest.raises(ClaimLostError):
        await victim.extend()
    await good.aclose()
    await bad.aclose()
    return runs, answers, kept, doomed, watch, resumed


# --------------------------------------------------------------------------- bounded


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_renewal_stuck_past_the_lease_is_given_up_and_the_result_carries_over(
    own_server: Callable[..., RedisProcess], figures: Figures, kind: str
) -> None:
    """A server frozen longer than the lease: the renewal is given up, lost; the late result raises with .result.

    The frozen server's clock runs on, so the claim lapses; a duplicate sent after
    the thaw takes the work over (a second run: the lease lapsed, as promised), and
    the first call's ``ClaimLostError`` carries what it computed (sync: a thread runs
    on), or says its work was cancelled at the loss (asyncio). Nothing is overwritten.
    """
    server = own_server()
    namespace = unique("bounded")
    lease = 2
    runs: list[int] = []
    if kind == "sync":
        client = redis.Redis(host=HOST, port=server.port)
        started = threading.Event()

        @idempotent(client, key="item", namespace=namespace, lease=lease, wait=15)
        def job(item: str) -> int:
            runs.append(len(runs) + 1)
            run = len(runs)
            started.set()
            time.sleep(4.0 if run == 1 else 0)
            return run

        errors: list[ClaimLostError] = []
        thread = in_thread(lambda: job("x"), errors)
        assert started.wait(10)
        stall(server, "sigstop", lease + 0.6)
        time.sleep(lease + 0.9)
        second = job("x")  # after the thaw: the lapsed claim is taken over
        thread.join(15)
        third = job("x")
        client.close()
    else:

        async def scenario() -> tuple[list[ClaimLostError], int, int]:
            client = redis.asyncio.Redis(host=HOST, port=server.port)
            started = asyncio.Event()

            @idempotent(client, key="item", namespace=namespace, lease=lease, wait=15)
            async def job(item: str) -> int:
                runs.append(len(runs) + 1)
                run = len(runs)
                started.set()
                await asyncio.sleep(4.0 if run == 1 else 0)
                return run

            task = asyncio.create_task(job("x"))
            await asyncio.wait_for(started.wait(), 10)
            stall(server, "sigstop", lease + 0.6)
            await asyncio.sleep(lease + 0.9)
            second = await job("x")
            found: list[ClaimLostError] = []
            try:
                await task
            except ClaimLostError as exc:
                found.append(exc)
            third = await job("x")
            await client.aclose()
            return found, second, third

        errors, second, third = asyncio.run(scenario())
    assert runs == [1, 2]  # the first run's lease lapsed during the freeze; the takeover ran once
    assert second == third == 2  # the second run's result stands; the late first one wrote nothing
    assert len(errors) == 1
    if kind == "sync":
        assert errors[0].result == 1
    else:  # cancelled at its await when the loss was seen: it computed nothing
        assert errors[0].result is None
        assert "was cancelled" in str(errors[0])
    figures(f"bounded renewal ({kind}): server frozen {lease + 0.6:.1f} s under a {lease} s lease: lost, result kept")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_keep_alive_whose_renewal_hangs_is_lost_before_its_lease_ends(
    own_server: Callable[..., RedisProcess], kind: str
) -> None:
    """A renewal whose reply never comes is given up at the lease's end (less the margin), not later."""
    server = own_server()
    lease = 2
    with FaultProxy(server.port, hold_limit=8) as proxy:
        proxy.faults.hold_next_reply(b"EVALSHA", EXTEND_SHA, times=None)
        if kind == "sync":
            client = redis.Redis(host=HOST, port=proxy.port)
            claim = Claim(client, unique(), lease=lease)
            began = time.monotonic()  # the lease runs from when the claim was sent, not from its reply
            assert isinstance(claim.acquire(), Claimed)
            with claim.keep_alive() as keeper:
                while not keeper.lost and time.monotonic() - began < 6:
                    time.sleep(0.01)
                lost_after = time.monotonic() - began
            client.close()
        else:

            async def scenario() -> tuple[Any, float]:
                client = redis.asyncio.Redis(host=HOST, port=proxy.port)
                claim = AsyncClaim(client, unique(), lease=lease)
                began = time.monotonic()
                assert isinstance(await claim.acquire(), Claimed)
                async with claim.keep_alive() as keeper:
                    while not keeper.lost and time.monotonic() - began < 6:  # noqa: ASYNC110 -- polls a flag the renewer sets; there is no event to wait for
                        await asyncio.sleep(0.01)
                    lost_after = time.monotonic() - began
                await client.aclose()
                return keeper, lost_after

            keeper, lost_after = asyncio.run(scenario())
        assert proxy.faults.lost(b"EVALSHA", EXTEND_SHA) >= 1  # the renewal reached the server; its reply was held
    assert keeper.lost
    assert keeper.renewals == 0
    # The give-up comes at lease - margin after the start; generous slack for a loaded machine.
    assert lease - lease_margin(lease) - 0.05 <= lost_after < lease + 0.5


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_black_holed_connection_does_not_stop_later_renewals_of_its_client(
    own_server: Callable[..., RedisProcess], kind: str
) -> None:
    """A renewal hangs forever on one connection; once given up, the client's other claims renew on a new one."""
    server = own_server()
    lease = 2
    with FaultProxy(server.port, hold_limit=12) as proxy:
        if kind == "sync":
            client = redis.Redis(host=HOST, port=proxy.port)
            first, second = Claim(client, unique(), lease=lease), Claim(client, unique(), lease=lease)
            assert isinstance(first.acquire(), Claimed)
            proxy.faults.hold_next_reply(b"EVALSHA", EXTEND_SHA, first.claim_key.encode())
            with first.keep_alive() as stuck:
                while not stuck.lost:
                    time.sleep(0.02)
            assert isinstance(second.acquire(), Claimed)
            with second.keep_alive() as kept:  # the first connection is still held meanwhile
                assert until(lambda: kept.renewals >= 2 or kept.lost, 30)
            held = client.get(second.claim_key)
            client.close()
        else:

            async def scenario() -> tuple[Any, Any, Any, Any]:
                client = redis.asyncio.Redis(host=HOST, port=proxy.port)
                first, second = AsyncClaim(client, unique(), lease=lease), AsyncClaim(client, unique(), lease=lease)
                assert isinstance(await first.acquire(), Claimed)
                proxy.faults.hold_next_reply(b"EVALSHA", EXTEND_SHA, first.claim_key.encode())
                async with first.keep_alive() as stuck:
                    while not stuck.lost:  # noqa: ASYNC110 -- polls a flag the renewer sets; there is no event to wait for
                        await asyncio.sleep(0.02)
                assert isinstance(await second.acquire(), Claimed)
                async with second.keep_alive() as kept:
                    assert await until_async(lambda: kept.renewals >= 2 or kept.lost, 30)
                held = await client.get(second.claim_key)
                await client.aclose()
                return stuck, kept, held, second

            stuck, kept, held, second = asyncio.run(scenario())
        assert proxy.faults.lost(b"EVALSHA", EXTEND_SHA) == 1
    assert stuck.lost
    assert not kept.lost
    assert kept.renewals >= 2
    assert held == second.token.encode()


# --------------------------------------------------------------------------- pipelined


def _count_pipelines(client: Any, sizes: list[int], is_async: bool) -> None:
    """Record on ``client`` the number of commands in each pipeline it executes."""
    make = client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make(*args, **kwargs)
        execute = pipe.execute
        if is_async:

            async def counted_async(*a: Any, **kw: Any) -> Any:
                sizes.append(len(pipe.command_stack))
                return await execute(*a, **kw)

            pipe.execute = counted_async
        else:

            def counted(*a: Any, **kw: Any) -> Any:
                sizes.append(len(pipe.command_stack))
                return execute(*a, **kw)

            pipe.execute = counted
        return pipe

    client.pipeline = pipeline


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_renewals_due_together_go_out_as_one_pipeline(own_server: Callable[..., RedisProcess], kind: str) -> None:
    """Fifty keep-alives entered together on one client: each tick renews all of them in one round trip."""
    server = own_server()
    sizes: list[int] = []
    if kind == "sync":
        client = redis.Redis(host=HOST, port=server.port)
        claims = [Claim(client, unique(), lease=LEASE) for _ in range(50)]
        for claim in claims:
            assert isinstance(claim.acquire(), Claimed)
        _count_pipelines(client, sizes, is_async=False)
        with contextlib.ExitStack() as stack:
            keepers = [stack.enter_context(claim.keep_alive()) for claim in claims]
            assert until(lambda: all(keeper.renewals >= 2 for keeper in keepers), 30)  # two ticks
        tokens = client.mget([claim.claim_key for claim in claims])
        client.close()
    else:

        async def scenario() -> tuple[list[Any], list[Any]]:
            client = redis.asyncio.Redis(host=HOST, port=server.port)
            claims = [AsyncClaim(client, unique(), lease=LEASE) for _ in range(50)]
            for claim in claims:
                assert isinstance(await claim.acquire(), Claimed)
            _count_pipelines(client, sizes, is_async=True)
            loop = asyncio.get_running_loop()
            # Not astride a coalescing step, so the fifty first renewals share one.
            while loop.time() % COALESCE > COALESCE / 4:  # noqa: ASYNC110 -- waits for a clock value
                await asyncio.sleep(0.001)
            async with contextlib.AsyncExitStack() as stack:
                keepers = [await stack.enter_async_context(claim.keep_alive()) for claim in claims]
                assert await until_async(lambda: all(keeper.renewals >= 2 for keeper in keepers), 30)
            tokens = await client.mget([claim.claim_key for claim in claims])
            await client.aclose()
            return keepers, tokens

        keepers, tokens = asyncio.run(scenario())
        claims = [keeper._claim for keeper in keepers]
    assert sizes == [50, 50]  # one pipeline of 50 renewals per tick
    assert [keeper.renewals for keeper in keepers] == [2] * 50
    assert tokens == [claim.token.encode() for claim in claims]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_renewals_survive_a_flushed_script_cache(own_server: Callable[..., RedisProcess], kind: str) -> None:
    """SCRIPT FLUSH under running keep-alives: the pipeline falls back to EVAL and renewals go on."""
    server = own_server()
    admin = server.client()
    lease = 2  # renewals every 0.67 s; a stalled second does not lapse it
    if kind == "sync":
        client = redis.Redis(host=HOST, port=server.port)
        claims = [Claim(client, unique(), lease=lease) for _ in range(5)]
        for claim in claims:
            assert isinstance(claim.acquire(), Claimed)
        with contextlib.ExitStack() as stack:
            keepers = [stack.enter_context(claim.keep_alive()) for claim in claims]
            deadline = time.monotonic() + 30
            while not all(k.renewals >= 4 or k.lost for k in keepers) and time.monotonic() < deadline:
                time.sleep(0.5)
                admin.script_flush()
        tokens = client.mget([claim.claim_key for claim in claims])
        client.close()
    else:

        async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
            client = redis.asyncio.Redis(host=HOST, port=server.port)
            claims = [AsyncClaim(client, unique(), lease=lease) for _ in range(5)]
            for claim in claims:
                assert isinstance(await claim.acquire(), Claimed)
            async with contextlib.AsyncExitStack() as stack:
                keepers = [await stack.enter_async_context(claim.keep_alive()) for claim in claims]
                deadline = time.monotonic() + 30
                while not all(k.renewals >= 4 or k.lost for k in keepers) and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    admin.script_flush()
            tokens = await client.mget([claim.claim_key for claim in claims])
            await client.aclose()
            return claims, keepers, tokens

        claims, keepers, tokens = asyncio.run(scenario())
    admin.close()
    assert all(not keeper.lost and keeper.renewals >= 4 for keeper in keepers)
    assert tokens == [claim.token.encode() for claim in claims]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+ warns on fork with threads running
def test_a_forked_child_renews_with_its_own_renewer(own_server: Callable[..., RedisProcess]) -> None:
    """A child forked while the parent renews starts fresh: its keep-alive renews; the parent's keeps going."""
    server = own_server()
    client = redis.Redis(host=HOST, port=server.port)
    parent = Claim(client, unique(), lease=3)
    assert isinstance(parent.acquire(), Claimed)
    with parent.keep_alive() as kept:
        time.sleep(0.5)  # the renewer and a lane are running now
        pid = os.fork()
        if pid == 0:  # the child: report through the exit code only
            code = 1
            try:
                child_client = redis.Redis(host=HOST, port=server.port)
                child = Claim(child_client, unique(), lease=3)
                child.acquire()
                with child.keep_alive() as keeper:
                    until(lambda: keeper.renewals >= 2 or keeper.lost, 30)
                code = 0 if keeper.renewals >= 2 and not keeper.lost else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        until(lambda: kept.renewals >= 3 or kept.lost, 30)
    client.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert kept.renewals >= 3
    assert not kept.lost


# --------------------------------------------------------------------------- many


MANY = 10_000
HOLD = 7.0  # two leases and more


@pytest.mark.slow
@pytest.mark.alone  # its renewals are CPU-bound: a busy second worker would make them late
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_ten_thousand_keep_alives_hold_with_no_lapse(
    own_server: Callable[..., RedisProcess], figures: Figures, kind: str
) -> None:
    """10,000 keep-alives with 3 s leases in one process: none lapses or is lost; every claim is still held."""
    server = own_server()
    admin = server.client()
    namespace = unique("many")
    keys = [f"k{i}" for i in range(MANY)]
    lowest: list[int] = []
    if kind == "sync":
        figure = _many_sync(server, admin, namespace, keys, lowest)
    else:
        figure = asyncio.run(_many_async(server, admin, namespace, keys, lowest))
    keepers, held, renewals_per_s, cpu = figure
    admin.close()
    assert len(keepers) == MANY
    assert not [keeper for keeper in keepers if keeper.lost]
    assert min(keeper.renewals for keeper in keepers) >= HOLD // (LEASE / 3) - 2
    assert held == MANY  # every claim still holds its token
    assert min(lowest) > (LEASE - 2 * LEASE / 3) * 1000  # never more than one renewal late
    figures(
        f"{MANY} keep-alives ({kind}), {LEASE} s leases, {HOLD:.0f} s: {renewals_per_s:,.0f} renewals/s, "
        f"renewer CPU {cpu:.2f} s per s, least PTTL {min(lowest)} ms, none lost"
    )


def _sample(admin: Any, claim_keys: list[str], lowest: list[int]) -> None:
    pipe = admin.pipeline(transaction=False)
    for key in claim_keys:
        pipe.pttl(key)
    lowest.append(min(pipe.execute()))


def _renewer_cpu() -> float:
    # Every renewer thread's CPU time (scheduler and lanes), read through its pthread clock.
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("goblin-claim renew") and thread.ident is not None:
            with contextlib.suppress(OSError, ProcessLookupError):
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def _many_sync(
    server: RedisProcess, admin: Any, namespace: str, keys: list[str], lowest: list[int]
) -> tuple[list[Any], int, float, float]:
    client = redis.Redis(host=HOST, port=server.port)
    pairs = Claim.acquire_many(client, keys, lease=LEASE, namespace=namespace)
    assert all(isinstance(outcome, Claimed) for _, outcome in pairs)
    claims = [handle for handle, _ in pairs]
    with contextlib.ExitStack() as stack:
        keepers = [stack.enter_context(claim.keep_alive()) for claim in claims]
        cpu_before, began = _renewer_cpu(), time.monotonic()
        while time.monotonic() - began < HOLD:
            time.sleep(0.5)
            _sample(admin, [claim.claim_key for claim in claims[::50]], lowest)
        cpu, spent = _renewer_cpu() - cpu_before, time.monotonic() - began
    renewed = sum(keeper.renewals for keeper in keepers)
    tokens = client.mget([claim.claim_key for claim in claims])
    held = sum(token == claim.token.encode() for token, claim in zip(tokens, claims, strict=True))
    client.close()
    return keepers, held, renewed / spent, cpu / spent


async def _many_async(
    server: RedisProcess, admin: Any, namespace: str, keys: list[str], lowest: list[int]
) -> tuple[list[Any], int, float, float]:
    client = redis.asyncio.Redis(host=HOST, port=server.port)
    pairs = await AsyncClaim.acquire_many(client, keys, lease=LEASE, namespace=namespace)
    assert all(isinstance(outcome, Claimed) for _, outcome in pairs)
    claims = [handle for handle, _ in pairs]
    async with contextlib.AsyncExitStack() as stack:
        keepers = [await stack.enter_async_context(claim.keep_alive()) for claim in claims]
        cpu_before, began = time.thread_time(), time.monotonic()  # the loop's thread does the renewing
        sampled = [claim.claim_key for claim in claims[::50]]
        while time.monotonic() - began < HOLD:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(_sample, admin, sampled, lowest)
        cpu, spent = time.thread_time() - cpu_before, time.monotonic() - began
    renewed = sum(keeper.renewals for keeper in keepers)
    tokens = await client.mget([claim.claim_key for claim in claims])
    held = sum(token == claim.token.encode() for token, claim in zip(tokens, claims, strict=True))
    await client.aclose()
    return keepers, held, renewed / spent, cpu / spent


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_keep_alive_begun_late_counts_the_lease_from_the_claims_send(
    redis_standalone: RedisProcess, kind: str
) -> None:
    """A keep-alive begun 0.5 s after its claim knows the lease has that much less left, sync and asyncio alike."""
    lease = 10
    if kind == "sync":
        client = redis.Redis(host=HOST, port=redis_standalone.port)
        try:
            claim = Claim(client, unique("late-keeper"), lease=lease)
            assert isinstance(claim.acquire(), Claimed)
            time.sleep(0.5)
            with claim.keep_alive() as keeper:
                left = keeper._deadline - time.monotonic()
            claim.release()
        finally:
            client.close()
    else:

        async def main() -> float:
            client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port)
            try:
                claim = AsyncClaim(client, unique("late-keeper"), lease=lease)
                assert isinstance(await claim.acquire(), Claimed)
                await asyncio.sleep(0.5)
                async with claim.keep_alive() as keeper:
                    remaining = keeper._deadline - asyncio.get_running_loop().time()
                await claim.release()
                return remaining
            finally:
                await client.aclose()

        left = asyncio.run(main())
    assert lease - 1.5 < left < lease - 0.45
