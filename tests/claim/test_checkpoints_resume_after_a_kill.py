"""Checkpoints under real process faults: the next owner resumes, the steps before the checkpoint run once.

A child process owns a 10-step piece of work (``checkpoints=True``, lease 1 s, a
keep-alive), counts each step's side effect (an ``INCR`` outside the SDK's namespace) and
checkpoints after it. Killed with SIGKILL after step k, the next owner's ``Claimed``
carries checkpoint k once the lease lapsed: it resumes at k + 1 and completes, and every
step ran exactly once. Stopped with SIGSTOP past its lease instead, while a second owner
takes over and checkpoints, then woken with SIGCONT: the stale owner's ``checkpoint()``
raises ``ClaimLostError`` and the second owner's checkpoint stands. On a standalone redis-server.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest

from goblin_claim import Claim, Claimed, Completed
from tests.conftest import unique
from tests.support.servers import RedisProcess
from tests.support.unit_workers import run_steps, step_key
from tests.support.units import checkpoint_key

SPAWN = multiprocessing.get_context("spawn")
STEPS = 10


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _counts(client: Any, namespace: str, key: str, owner: str) -> dict[int, int]:
    return {step: int(client.get(step_key(namespace, key, step, owner)) or 0) for step in range(1, STEPS + 1)}


def _resume(client: Any, namespace: str, key: str, owner: str) -> tuple[Claimed, Claim]:
    """The next owner: claims once the lease lapsed, and returns its outcome and handle."""
    handle = Claim(client, key, namespace=namespace, lease=5, ttl=600, checkpoints=True, token=owner)
    deadline = time.monotonic() + 10
    while True:
        outcome = handle.acquire()
        if isinstance(outcome, Claimed):
            return outcome, handle
        assert time.monotonic() < deadline, f"never claimed: {outcome}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("killed_after", [3, 7])
def test_the_next_owner_resumes_after_a_kill_and_each_step_runs_once(
    redis_standalone: RedisProcess, killed_after: int
) -> None:
    """SIGKILL after step k: the next owner gets checkpoint k, runs k+1..10 and completes; every step ran once."""
    client = redis_standalone.client()
    namespace, key = unique("cp-kill"), "job"
    ready = f"ready:{namespace}"
    first = f"first-{namespace}"
    victim = SPAWN.Process(
        target=run_steps, args=(redis_standalone.port, namespace, key, STEPS, killed_after, first, ready, 0.0)
    )
    victim.start()
    try:
        _until(lambda: client.get(ready) is not None, 60, "the first owner never reached its step")
        assert client.get(ready) == f"stopped:{killed_after}".encode()
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
    outcome, handle = _resume(client, namespace, key, "second")
    assert outcome.checkpoint == f"{killed_after}:{first}".encode()
    resumed_at = int(outcome.checkpoint.split(b":")[0])
    for step in range(resumed_at + 1, STEPS + 1):
        client.incr(step_key(namespace, key, step, "second"))
        handle.checkpoint(f"{step}:second")
    handle.complete(b"all ten steps")
    before = _counts(client, namespace, key, first)
    after = _counts(client, namespace, key, "second")
    assert before == {step: int(step <= killed_after) for step in range(1, STEPS + 1)}
    assert after == {step: int(step > killed_after) for step in range(1, STEPS + 1)}
    assert {step: before[step] + after[step] for step in before} == dict.fromkeys(range(1, STEPS + 1), 1)
    assert client.exists(checkpoint_key(handle)) == 0  # complete() cleared it
    assert Claim(client, key, namespace=namespace, checkpoints=True).acquire() == Completed(
        key=key, value=b"all ten steps"
    )
    client.close()


@pytest.mark.slow
def test_a_stale_owner_woken_past_its_lease_never_overwrites_the_next_owners_checkpoint(
    redis_standalone: RedisProcess,
) -> None:
    """SIGSTOP after step 4 past the lease, a takeover, SIGCONT: the stale checkpoint() is refused, nothing lost."""
    client = redis_standalone.client()
    namespace, key = unique("cp-stop"), "job"
    ready = f"ready:{namespace}"
    first = f"first-{namespace}"
    stale = SPAWN.Process(
        target=run_steps, args=(redis_standalone.port, namespace, key, STEPS, None, first, ready, 0.3)
    )
    probe = Claim(client, key, namespace=namespace, checkpoints=True)
    stale.start()
    try:
        _until(lambda: client.get(checkpoint_key(probe)) == f"4:{first}".encode(), 60, "never reached step 4")
        assert stale.pid is not None
        os.kill(stale.pid, signal.SIGSTOP)  # in its pause after step 4's checkpoint, its keep-alive with it
        outcome, handle = _resume(client, namespace, key, "second")
        assert outcome.checkpoint == f"4:{first}".encode()
        client.incr(step_key(namespace, key, 5, "second"))
        handle.checkpoint(b"5:second")
        os.kill(stale.pid, signal.SIGCONT)
        _until(lambda: client.get(ready) is not None, 30, "the stale owner never reported")
        assert client.get(ready) == b"lost:5"  # its checkpoint() after its step 5 raised ClaimLostError
        stale.join(10)
        assert stale.exitcode == 0
    finally:
        if stale.is_alive():
            os.kill(stale.pid, signal.SIGCONT)  # type: ignore[arg-type]
            stale.kill()
    assert client.get(checkpoint_key(probe)) == b"5:second"
    for step in range(6, STEPS + 1):
        client.incr(step_key(namespace, key, step, "second"))
        handle.checkpoint(f"{step}:second")
    handle.complete(b"done by second")
    first_runs, second_runs = _counts(client, namespace, key, first), _counts(client, namespace, key, "second")
    assert second_runs == {step: int(step >= 5) for step in range(1, STEPS + 1)}
    # Steps 1-4 ran once, by the first owner. Its step 5 ran too, stale: what a fence handed to the
    # downstream store refuses (fencing=True); the checkpoint never let it overwrite anything.
    assert first_runs == {step: int(step <= 5) for step in range(1, STEPS + 1)}
    assert client.exists(checkpoint_key(probe)) == 0
    client.close()
