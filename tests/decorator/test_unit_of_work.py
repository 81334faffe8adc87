"""@idempotent(at_most_once=True, checkpoints=True): work never run twice, and work resumed where it stopped.

At most once: an attempt whose lease ends without a result (a crash, a kill, a
cancellation mid-work) is never run again; every caller gets ``InterruptedWorkError``
until the key is forgotten. The function's own exception gives the attempt back.
Checkpoints: the work saves its progress through its handle (``current_claim()``),
and whoever takes the key over after a crash resumes from the last one.
"""

from __future__ import annotations

import asyncio
import datetime
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from goblin_claim import (
    AsyncClaim,
    Claim,
    InterruptedWorkError,
    InvalidArgumentTypeError,
    NoCurrentClaimError,
    current_claim,
    idempotent,
)
from goblin_claim._handle import CHECKPOINT_SUFFIX
from goblin_claim._protocol.record import build_keys
from goblin_claim.testing import fake_redis
from tests.conftest import Backend, Deco, unique
from tests.support import workers
from tests.support.servers import RedisProcess

# A fake, a server and a cluster: the scripts' paths, as the decorator's value matrices run.
BACKENDS = ("fake", "standalone", "cluster")
SPAWN = multiprocessing.get_context("spawn")


def _interrupted(raw: Any, namespace: str, key: str, token: str = "worker-1") -> datetime.datetime:
    """Leave ``key`` as a crashed at-most-once owner leaves it: claimed, never completed, its 1 s lease over."""
    before = datetime.datetime.now(datetime.timezone.utc)
    holder = Claim(raw, key, namespace=namespace, lease=1, at_most_once=True, token=token)
    assert holder.acquire().kind == "claimed"
    time.sleep(1.1)
    return before


@pytest.mark.parametrize("option", ["at_most_once", "checkpoints"])
@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_the_options_are_checked_at_decoration(option: str, bad: Any) -> None:
    """A non-bool at_most_once or checkpoints is refused when decorating, before any call."""
    with pytest.raises(InvalidArgumentTypeError, match=f"{option} must be True or False"):
        idempotent(fake_redis(native=False), key="k", namespace="ns", **{option: bad})(lambda k: k)


def test_an_interrupted_key_raises_to_every_caller_and_runs_nothing(deco: Deco) -> None:
    """Claimed at most once and left to lapse: each call gets InterruptedWorkError naming the holder; forget reopens."""
    calls: list[str] = []

    def body(key: str) -> str:
        calls.append(key)
        return f"done {key}"

    work = deco(body, key="key", at_most_once=True, wait=0)
    before = _interrupted(deco.raw, deco.namespace, "k1")
    for _ in range(2):
        with pytest.raises(InterruptedWorkError) as caught:
            work("k1")
        assert caught.value.holder == "worker-1"
        assert caught.value.key == "k1"
        assert (
            before - datetime.timedelta(seconds=1) <= caught.value.claimed_at <= before + datetime.timedelta(seconds=2)
        )
    assert calls == []
    assert work.forget("k1") is True
    assert work("k1") == "done k1"
    assert calls == ["k1"]


def test_a_plain_call_on_an_interrupted_key_raises_too(deco: Deco) -> None:
    """The record says at most once: a function decorated without the option is refused the key as well."""
    work = deco(lambda key: key, key="key", wait=0)
    _interrupted(deco.raw, deco.namespace, "k2")
    with pytest.raises(InterruptedWorkError):
        work("k2")


def test_the_functions_own_exception_gives_its_attempt_back(deco: Deco) -> None:
    """Under at_most_once a function that raises releases its claim: the retry runs at once, and is stored."""
    attempts: list[int] = []

    def body(key: str) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the card network timed out")
        return len(attempts)

    work = deco(body, key="key", at_most_once=True, wait=0)
    with pytest.raises(RuntimeError):
        work("k3")
    record, _ = build_keys(deco.namespace, "k3")
    assert deco.raw.get(record) is None  # given back, not kept as an attempt
    assert work("k3") == 2
    assert work("k3") == 2  # replayed
    assert len(attempts) == 2


def test_a_duplicate_waiting_on_an_attempt_that_dies_gets_interrupted(backend: Backend) -> None:
    """A duplicate waiting (wait=10) on an at-most-once holder that stops renewing is told at its lapse, not at 10 s."""
    namespace = unique("ns")
    raw = backend.raw()
    work = idempotent(backend.sync(), key="key", namespace=namespace, wait=10, at_most_once=True)(lambda key: key)
    holder = Claim(raw, "k4", namespace=namespace, lease=1, at_most_once=True, token="worker-4")
    assert holder.acquire().kind == "claimed"
    started = time.monotonic()
    with pytest.raises(InterruptedWorkError) as caught:
        work("k4")
    assert time.monotonic() - started < 5
    assert caught.value.holder == "worker-4"


def test_a_late_result_is_stored_and_the_callers_in_between_were_told(backend: Backend) -> None:
    """No keep-alive: the owner outlives its lease: callers meanwhile get InterruptedWorkError; its result stands."""
    namespace = unique("ns")
    runs: list[int] = []

    @idempotent(backend.sync(), key="key", namespace=namespace, lease=1, wait=0, keep_alive=False, at_most_once=True)
    def slow(key: str) -> dict[str, int]:
        runs.append(1)
        time.sleep(1.6)
        return {"runs": len(runs)}

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(slow("k5")))
    first.start()
    time.sleep(1.2)  # past its lease, while it still runs
    with pytest.raises(InterruptedWorkError):
        slow("k5")
    first.join(10)
    assert results == [{"runs": 1}]
    assert slow("k5") == {"runs": 1}  # its late result was stored: replayed
    assert runs == [1]


def test_an_async_call_cancelled_mid_work_keeps_its_attempt(backend: Backend) -> None:
    """A cancellation stops the work at an unknown point: under at_most_once the key reads interrupted, never rerun."""
    namespace = unique("ns")
    runs: list[int] = []

    async def scenario() -> None:
        client = backend.async_()
        client = await client if asyncio.iscoroutine(client) else client
        started = asyncio.Event()

        @idempotent(client, key="key", namespace=namespace, lease=1, wait=0, at_most_once=True)
        async def work(key: str) -> str:
            runs.append(1)
            started.set()
            await asyncio.sleep(30)
            return key

        task = asyncio.ensure_future(work("k6"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.2)
        with pytest.raises(InterruptedWorkError):
            await work("k6")
        assert runs == [1]
        await client.aclose()

    asyncio.run(scenario())


def test_without_at_most_once_a_cancelled_call_still_gives_its_claim_back(backend: Backend) -> None:
    """The keep only holds under at_most_once: a plain decorated call cancelled mid-work releases, as before."""
    namespace = unique("ns")

    async def scenario() -> None:
        client = backend.async_()
        client = await client if asyncio.iscoroutine(client) else client
        started = asyncio.Event()

        @idempotent(client, key="key", namespace=namespace, lease=30, wait=0)
        async def work(key: str) -> str:
            started.set()
            await asyncio.sleep(30)
            return key

        task = asyncio.ensure_future(work("k7"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await AsyncClaim(client, "k7", namespace=namespace).acquire()).kind == "claimed"
        await client.aclose()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_reaches_the_next_caller_and_a_result_clears_it(backend: Backend) -> None:
    """A call checkpoints, then fails (giving the key back): the next resumes from it; the stored result clears it."""
    namespace = unique("ns")
    client = backend.sync()
    seen: list[Any] = []

    @idempotent(client, key="key", namespace=namespace, wait=0, checkpoints=True)
    def work(key: str) -> str:
        claim = current_claim()
        seen.append(claim.last_checkpoint)
        if claim.last_checkpoint is None:
            claim.checkpoint("half")
            raise RuntimeError("stopped halfway")
        return "whole"

    with pytest.raises(RuntimeError):
        work("k8")
    checkpoint = build_keys(namespace, "k8")[0] + CHECKPOINT_SUFFIX
    assert backend.raw().get(checkpoint) == b"half"  # a release keeps it
    assert work("k8") == "whole"
    assert seen == [None, b"half"]
    assert backend.raw().get(checkpoint) is None  # complete() cleared it
    assert work.forget("k8") is True
    with pytest.raises(RuntimeError):
        work("k8")  # afresh: no checkpoint
    assert seen[-1] is None


def test_async_work_checkpoints_through_its_handle(backend: Backend) -> None:
    """An async def reaches its AsyncClaim the same way and awaits checkpoint(); the next call resumes from it."""
    namespace = unique("ns")
    seen: list[Any] = []

    async def scenario() -> None:
        client = backend.async_()
        client = await client if asyncio.iscoroutine(client) else client

        @idempotent(client, key="key", namespace=namespace, wait=0, checkpoints=True)
        async def work(key: str) -> str:
            claim = current_claim()
            assert isinstance(claim, AsyncClaim)
            seen.append(claim.last_checkpoint)
            if claim.last_checkpoint is None:
                await claim.checkpoint(b"step-1")
                raise RuntimeError("stopped after step 1")
            return "whole"

        with pytest.raises(RuntimeError):
            await work("k9")
        assert await work("k9") == "whole"
        await client.aclose()

    asyncio.run(scenario())
    assert seen == [None, b"step-1"]


def test_current_claim_is_the_innermost_checkpointed_call_and_none_outside(backend: Backend) -> None:
    """Inside nested checkpointed calls each sees its own handle; outside any, none; a thread of its own sees none."""
    namespace = unique("ns")
    client = backend.sync()
    found: dict[str, Any] = {}

    def outside() -> str:
        try:
            return current_claim().key
        except NoCurrentClaimError:
            return "none"

    @idempotent(client, key="key", namespace=namespace + "-inner", checkpoints=True)
    def inner(key: str) -> str:
        found["inner"] = current_claim().key
        return key

    @idempotent(client, key="key", namespace=namespace, checkpoints=True)
    def outer(key: str) -> str:
        found["before"] = current_claim().key
        inner(key + "-in")
        found["after"] = current_claim().key
        thread = threading.Thread(target=lambda: found.update(thread=outside()))
        thread.start()
        thread.join()
        return key

    assert outside() == "none"
    outer("k10")
    assert found == {"before": "k10", "inner": "k10-in", "after": "k10", "thread": "none"}
    assert outside() == "none"


# --------------------------------------------------------------------------- killed for real


@pytest.fixture(params=["standalone", "cluster"])
def real(request: pytest.FixtureRequest) -> tuple[int, bool]:
    """(port, is_cluster) of a real server."""
    if request.param == "standalone":
        server: RedisProcess = request.getfixturevalue("redis_standalone")
        return server.port, False
    nodes: list[RedisProcess] = request.getfixturevalue("redis_cluster")
    return nodes[0].port, True


def _killed_after(port: int, cluster: bool, namespace: str, item: str, step: int, at_most_once: bool) -> None:
    """Run the stepped work in a process of its own, and SIGKILL it once ``step`` is checkpointed."""
    client = workers.connect(port, cluster)
    checkpoint = build_keys(namespace, item)[0] + CHECKPOINT_SUFFIX
    victim = SPAWN.Process(target=workers.steps_until_killed, args=(port, cluster, namespace, item, step, at_most_once))
    victim.start()
    deadline = time.monotonic() + 60
    while client.get(checkpoint) != str(step).encode():
        assert time.monotonic() < deadline, "the victim never reached its step"
        assert victim.exitcode is None, "the victim ended on its own"
        time.sleep(0.05)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    assert victim.exitcode == -signal.SIGKILL
    client.close()


@pytest.mark.slow
def test_work_killed_mid_way_resumes_in_the_next_caller_from_its_checkpoint(real: tuple[int, bool]) -> None:
    """SIGKILLed after step 3 of 5: the next caller takes over at the lapse, resumes after 3; every step ran once."""
    port, cluster = real
    namespace, item = unique("ns"), "payout-1"
    _killed_after(port, cluster, namespace, item, 3, at_most_once=False)
    client = workers.connect(port, cluster)
    work = workers.stepped_work(client, namespace, lease=2, wait=20)
    result = work(item)
    assert result == {"item": item, "resumed_after": 3, "pid": os.getpid()}
    assert [int(client.get(workers.step_key(namespace, item, step)) or 0) for step in range(1, 6)] == [1] * 5
    assert client.get(build_keys(namespace, item)[0] + CHECKPOINT_SUFFIX) is None  # cleared by the stored result
    assert work(item) == result  # replayed, nothing runs
    assert [int(client.get(workers.step_key(namespace, item, step)) or 0) for step in range(1, 6)] == [1] * 5
    client.close()


@pytest.mark.slow
def test_at_most_once_work_killed_mid_way_is_never_run_again(real: tuple[int, bool]) -> None:
    """SIGKILLed after step 2 under at_most_once: callers get InterruptedWorkError; steps 1-2 ran once, 3-5 never."""
    port, cluster = real
    namespace, item = unique("ns"), "payout-2"
    _killed_after(port, cluster, namespace, item, 2, at_most_once=True)
    client = workers.connect(port, cluster)
    work = workers.stepped_work(client, namespace, lease=2, wait=20, at_most_once=True)
    started = time.monotonic()
    for _ in range(2):
        with pytest.raises(InterruptedWorkError) as caught:
            work(item)
        assert caught.value.holder  # the victim's token
    assert time.monotonic() - started < 10  # told at the lapse, not after the 20 s wait
    assert [int(client.get(workers.step_key(namespace, item, step)) or 0) for step in range(1, 6)] == [1, 1, 0, 0, 0]
    # Its progress stays for the operator to read (goblin-claim inspect); forget() deletes both.
    checkpoint = build_keys(namespace, item)[0] + CHECKPOINT_SUFFIX
    assert client.get(checkpoint) == b"2"
    assert work.forget(item) is True
    assert client.get(checkpoint) is None
    client.close()
