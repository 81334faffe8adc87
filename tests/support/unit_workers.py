"""Owners of a unit of work run in child processes by the kill tests (importable for spawn).

Each side effect is an ``INCR`` of a key outside the SDK's namespace, so the tests count
how many times each piece of work (or each step) ran, whoever ran it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from goblin_claim import Claim, Claimed, ClaimLostError, GoblinClaimError, InterruptedWorkError
from tests.support.workers import connect

__all__ = [
    "claim_and_stay",
    "effect_key",
    "run_steps",
    "step_key",
    "try_every_key",
]


def effect_key(namespace: str, key: str) -> str:
    """Where the side effect of ``key``'s work is counted."""
    return f"effects:{namespace}:{{{key}}}"


def step_key(namespace: str, key: str, step: int, owner: str) -> str:
    """Where ``owner``'s side effect of ``step`` of ``key``'s work is counted."""
    return f"steps:{namespace}:{{{key}}}:{step}:{owner}"


def claim_and_stay(
    port: int, cluster: bool, namespace: str, keys: list[str], fencing: bool, token: str, ready: str
) -> None:
    """Claim every key at most once (one batch), do the side effect of every other one, say so, then hang.

    The test kills this process with SIGKILL while it hangs: half of its keys died
    after their side effect, half before theirs.
    """
    client = connect(port, cluster)
    outcomes = Claim.acquire_many(
        client, keys, namespace=namespace, lease=2, ttl=600, at_most_once=True, fencing=fencing, token=token
    )
    assert all(isinstance(outcome, Claimed) for _, outcome in outcomes), outcomes
    for index, key in enumerate(keys):
        if index % 2 == 0:
            client.incr(effect_key(namespace, key))
    client.set(ready, "1", ex=600)
    time.sleep(600)


def try_every_key(
    port: int, cluster: bool, namespace: str, keys: list[str], fencing: bool, how: str, out: str | None = None
) -> dict[str, Any]:
    """A later caller: try each key (``how``: acquire or wait); run the side effect only if Claimed.

    Returns (and with ``out``, writes as JSON) per key what it got: the interruption's
    holder and claim time, or the name of any other outcome.
    """
    client = connect(port, cluster)
    seen: dict[str, Any] = {}
    for key in keys:
        handle = Claim(client, key, namespace=namespace, lease=2, ttl=600, at_most_once=True, fencing=fencing)
        try:
            outcome = handle.acquire() if how == "acquire" else handle.wait(timeout=1)
        except InterruptedWorkError as exc:
            seen[key] = {"holder": exc.holder, "claimed_at": exc.claimed_at.timestamp()}
            continue
        except GoblinClaimError as exc:
            seen[key] = {"error": type(exc).__name__}
            continue
        if isinstance(outcome, Claimed):
            client.incr(effect_key(namespace, key))  # never expected: the work would run again
            handle.complete(b"ran again")
        seen[key] = {"outcome": type(outcome).__name__}
    if out is not None:
        with open(out, "w", encoding="utf-8") as file:
            json.dump(seen, file)
    client.close()
    return seen


def run_steps(
    port: int, namespace: str, key: str, steps: int, stop_after: int | None, token: str, ready: str, pause: float
) -> None:
    """Own ``key`` (checkpoints=True, lease 1 s, a keep-alive) and run its steps, checkpointing each.

    Resumes after the checkpoint its claim carries. Each step's side effect, then
    ``checkpoint("<step>:<token>")``, then ``pause`` seconds. After ``stop_after`` it
    says so (``ready``) and hangs, to be killed; a checkpoint refused (a stale owner,
    stopped past its lease and woken) ends it, reported under ``ready`` as
    ``lost:<step>``.
    """
    client = connect(port, False)
    handle = Claim(client, key, namespace=namespace, lease=1, ttl=600, checkpoints=True, token=token)
    outcome = handle.acquire()
    assert isinstance(outcome, Claimed), outcome
    start = int(outcome.checkpoint.split(b":")[0]) if isinstance(outcome.checkpoint, bytes) else 0
    with handle.keep_alive():
        for step in range(start + 1, steps + 1):
            client.incr(step_key(namespace, key, step, token))
            try:
                handle.checkpoint(f"{step}:{token}")
            except ClaimLostError:
                client.set(ready, f"lost:{step}", ex=600)
                return
            if step == stop_after:
                client.set(ready, f"stopped:{step}", ex=600)
                time.sleep(600)
            time.sleep(pause)
    handle.complete(f"done:{token}")
    client.set(ready, "completed", ex=600)
