"""How long after its claim is lost the work under ``@idempotent`` is stopped, in three situations.

Each run starts a call whose work would take a minute, loses its claim one way, and
records when the work was stopped: an ``async def`` when it sees its
``CancelledError``, a ``def`` when ``current_claim().ensure_held()``, which it calls
every 10 ms, first raises. The work's side effect comes after that point: the script
counts the runs in which it ran anyway (there should be none).

- stalled: the server stops answering (``CLIENT PAUSE ... ALL`` for the lease and a
  second) while a renewal is due. Measured from the lease's end by the owner's clock
  (its last successful renewal's send, plus the lease): negative is before it, as the
  keep-alive gives a renewal up a margin before the lease ends.
- gone: another token takes the key (a ``SET`` over the claim) at a random moment
  of the renewal interval. Measured from that ``SET``: the next renewal finds it.
- frozen: the owner's process is stopped (``SIGSTOP``) for twice the lease at a
  random moment, then continued (``SIGCONT``). Its lease ended while it was frozen,
  so it cannot be stopped before it runs again: measured from the ``SIGCONT``.

Prints the median and the largest of ``--runs`` runs per situation and flavour, in
seconds. Uses REDIS_URL, else starts a redis-server on a free port (the stalled runs
pause that server). ``docs/figures/stop-latency.txt`` is its output, the command first.

    python benchmarks/stop_latency.py [--runs 7] [--lease 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

import goblin_claim
from goblin_claim import ClaimLostError, idempotent

# Every run loses a lease on purpose: its warnings (here and in the owner processes) are not news.
logging.getLogger("goblin_claim").setLevel(logging.ERROR)

SITUATIONS = ("stalled", "gone", "frozen")
KINDS = ("async", "sync")
WORK = 60.0  # how long the work would run: far past every loss
POLL = 0.01  # how often sync work asks ensure_held()


@dataclass
class Stop:
    """What one run's work saw: when it was stopped, and the lease's end as its keep-alive knew it."""

    stopped_at: float | None = None
    lease_end: float | None = None
    effects: int = 0
    caller_got: str = ""
    started: threading.Event = field(default_factory=threading.Event)


# --------------------------------------------------------------------------- the work, in this process


def sync_work(client: redis.Redis, namespace: str, lease: int, stop: Stop) -> Callable[[str], Any]:
    """The decorated ``def``: asks ensure_held() every 10 ms, its side effect after that."""

    @idempotent(client, key="item", namespace=namespace, lease=lease, wait=0)
    def work(item: str) -> str:
        handle = goblin_claim.current_claim()
        stop.started.set()
        until = time.monotonic() + WORK
        while time.monotonic() < until:
            try:
                handle.ensure_held()
            except ClaimLostError:
                stop.stopped_at = time.monotonic()
                stop.lease_end = handle._keeper._deadline  # the keep-alive's: on the monotonic clock
                raise
            time.sleep(POLL)
        stop.effects += 1  # the irreversible step
        return item

    return work


def async_work(client: Any, namespace: str, lease: int, stop: Stop) -> Callable[[str], Any]:
    """The decorated ``async def``: one long await, its side effect after it."""

    @idempotent(client, key="item", namespace=namespace, lease=lease, wait=0)
    async def work(item: str) -> str:
        handle = goblin_claim.current_claim()
        stop.started.set()
        try:
            await asyncio.sleep(WORK)
        except asyncio.CancelledError:
            stop.stopped_at = time.monotonic()
            stop.lease_end = handle._keeper._deadline  # the loop's clock: the monotonic one (default loop)
            raise
        stop.effects += 1  # the irreversible step
        return item

    return work


def in_process(url: str, kind: str, lease: int, lose: Callable[[redis.Redis, str], float]) -> tuple[Stop, float]:
    """One run of ``kind``'s work in a thread of this process, its claim lost by ``lose``: (what it saw, the loss).

    ``lose(admin, claim_key)`` returns the moment it counts from (or NaN: count from the lease's end).
    """
    namespace = f"stop-{kind}-{time.time_ns()}"
    admin = redis.Redis.from_url(url)
    claim_key = goblin_claim.Claim(admin, "item", namespace=namespace).claim_key
    stop = Stop()

    def caller() -> None:
        try:
            if kind == "sync":
                client = redis.Redis.from_url(url)
                try:
                    sync_work(client, namespace, lease, stop)("item")
                finally:
                    client.close()
            else:

                async def call() -> None:
                    client = redis.asyncio.Redis.from_url(url)
                    try:
                        await async_work(client, namespace, lease, stop)("item")
                    finally:
                        await client.aclose()

                asyncio.run(call())
            stop.caller_got = "returned"
        except BaseException as exc:
            stop.caller_got = type(exc).__name__

    thread = threading.Thread(target=caller)
    thread.start()
    if not stop.started.wait(30):
        raise SystemExit("the work never started")
    lost_at = lose(admin, claim_key)
    thread.join(WORK + 30)
    admin.close()
    return stop, lost_at


def paused(lease: int) -> Callable[[redis.Redis, str], float]:
    """The server paused past the lease, from a random moment of the renewal interval."""

    def lose(admin: redis.Redis, claim_key: str) -> float:
        time.sleep(random.uniform(0, lease / 3))
        admin.execute_command("CLIENT", "PAUSE", int((lease + 1) * 1000), "ALL")
        return float("nan")  # counted from the lease's end the work knew

    return lose


def taken(lease: int) -> Callable[[redis.Redis, str], float]:
    """Another token takes the key, at a random moment of the renewal interval."""

    def lose(admin: redis.Redis, claim_key: str) -> float:
        time.sleep(random.uniform(0, lease / 3))
        at = time.monotonic()
        admin.set(claim_key, "another-owner", ex=60)
        return at

    return lose


def unpaused(admin: redis.Redis) -> None:
    """Wait out a CLIENT PAUSE (the next command answers once it is over)."""
    admin.ping()


# --------------------------------------------------------------------------- the frozen owner, a child process


def frozen_child(url: str, kind: str, lease: int, namespace: str) -> None:
    """The owner process: runs the work once, then writes what it saw under ``namespace``."""
    stop = Stop()
    try:
        if kind == "sync":
            client = redis.Redis.from_url(url)
            work = sync_work(client, namespace, lease, stop)
            threading.Thread(target=_mark_started, args=(url, namespace, stop), daemon=True).start()
            work("item")
        else:

            async def call() -> None:
                client = redis.asyncio.Redis.from_url(url)
                threading.Thread(target=_mark_started, args=(url, namespace, stop), daemon=True).start()
                try:
                    await async_work(client, namespace, lease, stop)("item")
                finally:
                    await client.aclose()

            asyncio.run(call())
        stop.caller_got = "returned"
    except BaseException as exc:
        stop.caller_got = type(exc).__name__
    report = {"stopped_at": stop.stopped_at, "effects": stop.effects, "caller_got": stop.caller_got}
    with redis.Redis.from_url(url) as admin:
        admin.set(f"{namespace}:report", json.dumps(report), ex=600)


def _mark_started(url: str, namespace: str, stop: Stop) -> None:
    stop.started.wait(30)
    with redis.Redis.from_url(url) as admin:
        admin.set(f"{namespace}:started", 1, ex=600)


def frozen(url: str, kind: str, lease: int) -> tuple[Stop, float]:
    """One run: the owner process frozen for twice the lease at a random moment, then continued."""
    namespace = f"stop-frozen-{kind}-{time.time_ns()}"
    child = multiprocessing.get_context("spawn").Process(target=frozen_child, args=(url, kind, lease, namespace))
    child.start()
    assert child.pid is not None
    admin = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 60
        while admin.get(f"{namespace}:started") is None:
            if time.monotonic() > deadline:
                raise SystemExit("the frozen owner never started")
            time.sleep(0.02)
        time.sleep(random.uniform(0, lease / 3))
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2 * lease)
        continued = time.monotonic()
        os.kill(child.pid, signal.SIGCONT)
        child.join(WORK + 30)
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
    report = json.loads(admin.get(f"{namespace}:report") or b"{}")
    admin.close()
    stop = Stop(stopped_at=report.get("stopped_at"), effects=report.get("effects", 0))
    stop.caller_got = report.get("caller_got", "no report")
    return stop, continued


# --------------------------------------------------------------------------- the runs


def measure(url: str, situation: str, kind: str, lease: int) -> tuple[float, Stop]:
    """Seconds from the loss to the work stopped, for one run."""
    if situation == "frozen":
        stop, since = frozen(url, kind, lease)
    elif situation == "gone":
        stop, since = in_process(url, kind, lease, taken(lease))
    else:
        stop, since = in_process(url, kind, lease, paused(lease))
        with redis.Redis.from_url(url) as admin:
            unpaused(admin)
        assert stop.lease_end is not None or stop.stopped_at is None
        since = stop.lease_end if stop.lease_end is not None else since
    if stop.stopped_at is None:
        return float("nan"), stop
    return stop.stopped_at - since, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--lease", type=int, default=3)
    args = parser.parse_args()
    lease = args.lease
    figures: dict[tuple[str, str], list[float]] = {}
    effects = total = 0
    wrong: list[str] = []
    with server_url() as url:
        with redis.Redis.from_url(url) as admin:
            server = admin.info("server")["redis_version"]
        for situation in SITUATIONS:
            for kind in KINDS:
                values = figures[(situation, kind)] = []
                for _ in range(args.runs):
                    seconds, stop = measure(url, situation, kind, lease)
                    values.append(seconds)
                    effects += stop.effects
                    total += 1
                    if stop.caller_got != "ClaimLostError":
                        wrong.append(f"{situation}/{kind}: the caller got {stop.caller_got}")
    print(f"redis-server {server}, Python {platform.python_version()}, {os.cpu_count()} cores, {args.runs} runs a cell")
    print(f"Work stopped after its claim was lost, seconds: median / largest; lease {lease} s, renewals every")
    print(f"{lease / 3:.2f} s. async def: when it sees CancelledError; def: ensure_held() asked every 10 ms.")
    rows = {
        "stalled": "stalled renewal (server paused), from the lease's end",
        "gone": "claim gone (another token took it), from the takeover",
        "frozen": "owner frozen past its lease (SIGSTOP), from SIGCONT",
    }
    print(f"{'':56s} {'async def':>19s} {'def':>19s}")
    for situation in SITUATIONS:
        cells = []
        for kind in KINDS:
            values = [v for v in figures[(situation, kind)] if v == v]  # NaN: never stopped
            missed = len(figures[(situation, kind)]) - len(values)
            cell = f"{statistics.median(values):+.4f} / {max(values):+.4f}" if values else "never stopped"
            cells.append(cell + (f" ({missed} never)" if missed and values else ""))
        print(f"{rows[situation]:56s} {cells[0]:>19s} {cells[1]:>19s}")
    print(f"Side effects run after a loss: {effects} in {total} runs; every caller got ClaimLostError: {not wrong}")
    for line in wrong:
        print(f"  {line}")


if __name__ == "__main__":
    main()
