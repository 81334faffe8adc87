"""Start and stop real worker processes for the job-queue tests, by PID, bounded in time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """A worker command running in its own process group, its output in a log file."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool children share the group, stopped with it
        )

    def text(self) -> str:
        """What the worker logged so far."""
        return self.log.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 30.0) -> None:
        """Wait until the log shows ``needle``; fail with the log otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"worker never logged {needle!r}:\n{self.text()[-4000:]}")

    def stop(self) -> None:
        """Stop the worker's process group (SIGTERM, then SIGKILL) by the worker's PID."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # any pool child left behind
        self._out.close()


class Workers:
    """The workers one test starts, each with the job apps' environment, all stopped by PID at its end."""

    def __init__(self, broker_port: int, lease: int, logs: Path) -> None:
        self.env = {"GC_JOBS_REDIS_URL": f"redis://127.0.0.1:{broker_port}/0", "GC_JOBS_LEASE": str(lease)}
        self.logs = logs
        self.started: list[Worker] = []

    def start(self, argv: Sequence[str], name: str, ready: str, **env: str) -> Worker:
        """Start ``argv`` (logging to ``name``.log, with ``env`` added) and wait until it logs ``ready``."""
        made = Worker(argv, {**self.env, **env}, self.logs / f"{name}.log")
        self.started.append(made)
        made.wait_for_log(ready)
        return made


@contextlib.contextmanager
def workers(broker_port: int, lease: int, logs: Path) -> Iterator[Workers]:
    """``Workers`` for a test's fixture: what it started is stopped when the fixture ends."""
    started = Workers(broker_port, lease, logs)
    yield started
    for made in started.started:
        made.stop()


def python(*args: str) -> list[str]:
    """A command line running this interpreter."""
    return [sys.executable, *args]


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def duplicate_waits(client: redis.Redis, event_id: str, timeout: float = 10) -> None:
    """Return once a copy of ``event_id``'s job waits for the first: it listens on the claim's wake-up channel.

    The copy that runs holds the claim and listens to nothing, so a subscriber on a
    channel naming the key is a duplicate that found the work in flight.
    """
    wait_until(lambda: client.pubsub_channels(f"*{event_id}*"), timeout, f"a duplicate of {event_id} to wait")


def first_pid(client: redis.Redis, event_id: str) -> int:
    """The process that ran the job first (its pool child), once it started."""
    pids = wait_until(lambda: client.lrange(f"pids:{event_id}", 0, 0), 30, f"{event_id} to start")
    return int(pids[0])


def charges(client: redis.Redis, event_id: str) -> int:
    """How many times the side effect ran."""
    return int(client.get(f"charges:{event_id}") or 0)


def held_until_started(client: redis.Redis, event_id: str, started: Callable[[], Any], what: str) -> None:
    """Hold the first copy of ``event_id`` (gated before its side effect) until ``started()``, then let it go.

    A duplicate is proven delivered mid-run by the queue's own record of its start,
    not by a pause long enough on an idle machine: the first copy waits for it, and
    half a second more, so that the duplicate is waiting on the claim when it ends.
    """
    wait_until(started, 30, what)
    time.sleep(0.5)
    client.set(f"gate:{event_id}", 1, ex=600)


def ran_once(client: redis.Redis, event_id: str) -> float:
    """Assert a job and its duplicate charged once, the first copy alone running the function; when it returned."""
    assert charges(client, event_id) == 1
    assert client.llen(f"pids:{event_id}") == 1  # only the first copy ran the function
    return float(client.lindex(f"returned:{event_id}", 0))  # type: ignore[arg-type]


def mid_run_line(queue: str, gap: float, own: float, answered_in: float, ended: str = "finished") -> str:
    """The figure of a duplicate delivered mid-run: seconds after the first copy's function returned."""
    return (
        f"{queue}: a duplicate delivered mid-run {ended} {gap * 1000:.0f} ms after the first copy's function returned "
        f"(the first copy itself {own * 1000:.0f} ms; answered {answered_in:.2f} s after it was sent; lease 30 s)"
    )
