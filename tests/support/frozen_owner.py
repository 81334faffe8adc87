"""An owner process the lost-means-stopped tests freeze (SIGSTOP) past its lease (importable for spawn).

``run`` calls an ``@idempotent`` function once, in this process: it counts its start,
waits ``work`` seconds (a sleep, ``time.sleep`` or ``asyncio.sleep``), asks
``current_claim().ensure_held()`` (sync) or simply goes on (asyncio: a loss cancels
it), then counts its side effect. What the caller got and when (the monotonic clock,
which all processes of the machine share) goes to Redis, under ``<namespace>:*``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import redis
import redis.asyncio

import goblin_claim
from goblin_claim import idempotent

HOST = "127.0.0.1"


def started_key(namespace: str) -> str:
    """Counts the work's starts."""
    return f"{namespace}:started"


def effects_key(namespace: str) -> str:
    """Counts the side effects that ran."""
    return f"{namespace}:effects"


def outcome_key(namespace: str) -> str:
    """What the caller got, as JSON: ``{"got": <error class or "returned">, "at": <monotonic>}``."""
    return f"{namespace}:outcome"


def stopped_key(namespace: str) -> str:
    """When the work itself saw it was stopped (asyncio: its CancelledError; sync: ensure_held's error)."""
    return f"{namespace}:stopped"


def run(port: int, namespace: str, kind: str, lease: int, work: float) -> None:
    """Call the decorated function for key ``"item"`` once; record what happened."""
    if kind == "sync":
        _run_sync(port, namespace, lease, work)
    else:
        asyncio.run(_run_async(port, namespace, lease, work))


def _run_sync(port: int, namespace: str, lease: int, work: float) -> None:
    client = redis.Redis(host=HOST, port=port)

    @idempotent(client, key="item", namespace=namespace, lease=lease, wait=0)
    def job(item: str) -> str:
        client.incr(started_key(namespace))
        until = time.monotonic() + work
        while time.monotonic() < until:  # frozen in here by the test; over once the clock is past
            time.sleep(0.02)
        try:
            goblin_claim.current_claim().ensure_held()  # before the irreversible step
        except goblin_claim.ClaimLostError:
            client.set(stopped_key(namespace), time.monotonic())
            raise
        client.incr(effects_key(namespace))
        return f"ran in {item}"

    _record(client, namespace, lambda: job("item"))
    client.close()


async def _run_async(port: int, namespace: str, lease: int, work: float) -> None:
    client = redis.asyncio.Redis(host=HOST, port=port)
    raw = redis.Redis(host=HOST, port=port)

    @idempotent(client, key="item", namespace=namespace, lease=lease, wait=0)
    async def job(item: str) -> str:
        await client.incr(started_key(namespace))
        try:
            await asyncio.sleep(work)  # frozen in here by the test
        except asyncio.CancelledError:
            raw.set(stopped_key(namespace), time.monotonic())
            raise
        await client.incr(effects_key(namespace))
        return f"ran in {item}"

    async def call() -> Any:
        return await job("item")

    try:
        got: Any = await call()
        outcome = {"got": "returned", "value": got}
    except BaseException as exc:
        outcome = {"got": type(exc).__name__, "message": str(exc)}
    raw.set(outcome_key(namespace), json.dumps({**outcome, "at": time.monotonic()}))
    raw.close()
    await client.aclose()


def _record(client: redis.Redis, namespace: str, call: Any) -> None:
    try:
        got: Any = call()
        outcome = {"got": "returned", "value": got}
    except BaseException as exc:
        outcome = {"got": type(exc).__name__, "message": str(exc)}
    client.set(outcome_key(namespace), json.dumps({**outcome, "at": time.monotonic()}))
