"""A seeded, replayable nemesis: randomized faults over a real Redis Cluster, against the exactly-once promise.

A cluster of three primaries with replicas (``servers.cluster_with_replicas``) runs a
workload of ids, each asked for by three concurrent callers and one later retry, through
every path of the SDK (sync ``RedisCluster`` threads and asyncio ``RedisCluster`` tasks;
``Claim``, fenced ``Claim``, ``@idempotent`` and ``acquire_many`` as a stream consumer uses
it), while a nemesis composes faults drawn from ``random.Random(seed)``: SIGKILL of a
primary (restarted a few seconds later, to rejoin as a replica), SIGSTOP of a primary,
manual ``CLUSTER FAILOVER``, ``CLIENT KILL`` storms, live migration of a busy slot,
``SCRIPT FLUSH`` and ``DEBUG SLEEP``. The faults stop after ``seconds``, the cluster is
healed, and a checker reads every id's record a lease later:

- each id ran once, unless every extra run is explained: its caller was told its result
  was not stored (``ClaimLostError``, or a transient error carrying ``.result``) while a
  fault was on, or its claim or record was written around a failover of its slot that
  could drop unreplicated writes (the README's "Not guaranteed");
- every caller's answer is the stored record (or an explained loss of it);
- every exception a caller saw is a ``GoblinClaimError`` (the others are counted by type,
  with a traceback each: the main signal of a driver's untyped errors);
- no id is still in flight a lease after everything stopped; no caller ran past its deadline.

The seed is printed first (``NEMESIS_SEED=... to replay``) and read from the environment
when set: the same seed gives the same fault plan and the same workload (thread and
task timing differ). ``python -m tests.support.nemesis --seconds 85 --runs 8 --replicas 2 --recipe``
runs it by hand (``make chaos``); ``tests/deployment/test_nemesis.py`` runs a short schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import heapq
import itertools
import json
import logging
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    ConnectionFailedError,
    GoblinClaimError,
    InFlight,
    InvalidArgumentError,
    NotReplicatedError,
    StillInFlightError,
    idempotent,
)
from tests.support import servers

SYNC_PATHS = ("sync-claim", "sync-fenced", "sync-decorator", "sync-batch")
ASYNC_PATHS = ("async-claim", "async-fenced", "async-decorator", "async-batch")
ALL_PATHS = SYNC_PATHS + ASYNC_PATHS
FAULT_KINDS = ("kill", "stop", "failover", "client-kill", "migrate", "script-flush", "debug-sleep")
# Faults after which a replica may have been promoted without the writes its primary had
# acknowledged last: a claim or a record written then may be gone (README: "Not guaranteed").
LOSSY_KINDS = frozenset({"kill", "stop"})
# How long before a lossy fault a write may still have been unreplicated (loopback
# replication takes milliseconds; this allows for a loaded machine).
REPLICATION_LAG = 2.0
# A stream consumer reserves its batch this briefly (README: "Stream consumers").
RESERVE = 2
# The longest a duplicate waits for in-flight work in one attempt (wait() and @idempotent's wait=).
WAIT = 5.0
# The recipe's durability option, where the SDK takes it.
REPLICATED: dict[str, Any] = {"replicas": 1, "replica_timeout_ms": 500}
NONCE = re.compile(rb"\|([0-9a-f]{6}\.\d+)")
# What @idempotent's final write says when the client raised something that is not the SDK's own.
STORE_WRAPPER = "ran, but storing its result failed:"

_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("nemesis_caller")
_caller_serial = itertools.count()  # caller numbers, unique across threads and tasks


def now() -> float:
    """The monotonic clock every time in a run is read from."""
    return time.monotonic()


# --------------------------------------------------------------------------- settings and plans


@dataclass(frozen=True)
class Settings:
    """One nemesis run.

    Attributes:
        binary: The server binary (redis-server or valkey-server).
        seconds: How long faults are started for (the schedule's length).
        seed: The run's seed; ``None`` takes ``NEMESIS_SEED`` or a fresh one.
        replicas: Replicas per primary (1 or 2).
        recipe: The README's failover recipe: ``min-replicas-to-write 1`` (and
            ``min-replicas-max-lag 2``) on every node, its Retry, and ``replicas=1`` on every
            path whose client the SDK under test accepts it on (probed once per run: the
            asyncio cluster client and batches once refused it).
        rate: New ids per second, per path.
        lease: Every claim's lease, in seconds.
        deadline: Seconds each caller keeps trying for before it gives up.
        threads: The sync callers' thread pool.
        paths: The SDK paths the workload takes.
        faults: The fault kinds the nemesis draws from.
        log: Where progress lines go (``None``: nowhere).
    """

    binary: str
    seconds: float = 30.0
    seed: int | None = None
    replicas: int = 1
    recipe: bool = False
    rate: float = 1.0
    lease: int = 8
    deadline: float = 40.0
    threads: int = 96
    paths: tuple[str, ...] = ALL_PATHS
    faults: tuple[str, ...] = FAULT_KINDS
    log: Callable[[str], None] | None = print

    @property
    def margin(self) -> float:
        """How far past its deadline a caller may end: one attempt's last command, or a final write's lease."""
        return self.lease + 6.0


def replay_command(settings: Settings, seed: int) -> str:
    """The command that replays a run: its seed and every setting its plan and its callers depend on."""
    server = "valkey" if "valkey" in os.path.basename(settings.binary) else "redis"
    words = [
        f"NEMESIS_SEED={seed} python -m tests.support.nemesis --runs 1",
        f"--seconds {settings.seconds:g} --rate {settings.rate:g} --lease {settings.lease}",
        f"--deadline {settings.deadline:g} --replicas {settings.replicas} --server {server}",
    ]
    if settings.recipe:
        words.append("--recipe")
    if tuple(settings.faults) != FAULT_KINDS:
        words.append("--faults " + ",".join(settings.faults))
    if tuple(settings.paths) != ALL_PATHS:
        words.append("--paths " + ",".join(settings.paths))
    return " ".join(words)


def seed_from_env(seed: int | None = None) -> int:
    """``seed``, else ``NEMESIS_SEED`` from the environment, else a fresh random one."""
    if seed is not None:
        return seed
    text = os.environ.get("NEMESIS_SEED")
    return int(text) if text else random.SystemRandom().randrange(1, 2**31)


@dataclass(frozen=True)
class FaultPlan:
    """One planned fault: when (seconds from the start, at the earliest), what, and its random picks.

    A heavy fault may have a light companion (a storm, a flush, a sleep) that starts
    ``companion_delay`` seconds into it, on a thread of its own: faults composed.
    """

    at: float
    kind: str
    length: float  # seconds: a stop, a storm, a kill's downtime, a DEBUG SLEEP, a migration's first pause
    pick: float  # which node (or slot) among those that fit, as a fraction
    pick2: float  # a second choice (a replica, a target primary)
    companion: FaultPlan | None = None
    companion_delay: float = 0.0


HEAVY_KINDS = ("kill", "stop", "failover", "migrate")
LIGHT_KINDS = ("client-kill", "script-flush", "debug-sleep")


def plan_faults(rng: random.Random, seconds: float, kinds: Sequence[str]) -> list[FaultPlan]:
    """The fault schedule: faults one after another over ``seconds``, with random gaps, some composed."""
    lengths: dict[str, Callable[[], float]] = {
        "kill": lambda: rng.uniform(3.0, 6.0),
        "stop": lambda: rng.uniform(1.0, 4.0),
        "failover": lambda: 0.0,
        "client-kill": lambda: rng.uniform(1.0, 3.0),
        "migrate": lambda: rng.uniform(0.3, 1.5),
        "script-flush": lambda: float(rng.randint(1, 5)),
        "debug-sleep": lambda: rng.uniform(0.5, 1.0),
    }
    light = [kind for kind in LIGHT_KINDS if kind in kinds]
    plans, at = [], rng.uniform(1.0, 3.0)
    while at < seconds:
        kind = rng.choice(list(kinds))
        length = round(lengths[kind](), 3)
        companion, delay = None, 0.0
        if kind in HEAVY_KINDS and light and rng.random() < 0.35:
            other = rng.choice(light)
            companion = FaultPlan(round(at, 3), other, round(lengths[other](), 3), rng.random(), rng.random())
            delay = round(rng.uniform(0.0, max(length, 1.0)), 3)
        plan = FaultPlan(round(at, 3), kind, length, rng.random(), rng.random(), companion, delay)
        plans.append(plan)
        at += plan.length + rng.uniform(1.0, 3.0)
    return plans


@dataclass(frozen=True)
class Job:
    """The callers of one id (or, for a batch path, of one batch of ids): three at once, one retry later."""

    path: str
    idents: tuple[str, ...]
    at: float  # when the three callers start, seconds from the start
    work: float  # seconds each run of the work takes
    retry_after: float  # the later retry starts this long after the three have ended
    give_back_after: tuple[int | None, ...]  # per caller of a batch: give back the rest after this many


def plan_workload(rng: random.Random, seconds: float, rate: float, paths: Sequence[str]) -> list[Job]:
    """The workload: per path, ``rate`` new ids a second over ``seconds`` (batches of 3-6 on batch paths)."""
    jobs: list[Job] = []
    for path in paths:
        count, serial = max(1, int(seconds * rate)), 0
        while serial < count:
            size = rng.randint(3, 6) if path.endswith("batch") else 1
            idents = tuple(f"{path}-{serial + i}" for i in range(size))
            at = rng.uniform(0.0, seconds)
            give_back = tuple(rng.randint(0, size - 1) if rng.random() < 0.3 else None for _ in range(4))
            jobs.append(
                Job(path, idents, round(at, 3), round(rng.uniform(0.05, 0.5), 3), rng.uniform(0.2, 2.0), give_back)
            )
            serial += size
    jobs.sort(key=lambda job: job.at)
    return jobs


# --------------------------------------------------------------------------- what happened


@dataclass
class SeenError:
    """An exception a caller saw."""

    at: float
    type_name: str
    goblin: bool
    text: str
    result: object
    trace: str
    cause: str = ""  # the redis-py exception a GoblinClaimError was raised from


@dataclass
class Caller:
    """One caller: an id (or a batch) asked for once, retried until an answer or its deadline."""

    index: int
    job: Job
    role: str  # "first" (one of three at once) or "retry" (the later one)
    give_back_after: int | None = None
    start: float = 0.0
    end: float = 0.0
    deadline: float = 0.0
    answers: dict[str, str] = field(default_factory=dict)
    errors: list[SeenError] = field(default_factory=list)
    gave_up: str | None = None
    attempt_at: float = 0.0  # when the current attempt began: no claim it takes is older

    def note(self, exc: BaseException) -> None:
        """Record an exception this caller saw (the traceback kept for the first few)."""
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if len(self.errors) < 3 else ""
        self.errors.append(
            SeenError(
                now(),
                f"{type(exc).__module__}.{type(exc).__qualname__}",
                isinstance(exc, GoblinClaimError),
                str(exc)[:300],
                getattr(exc, "result", None),
                trace,
                f"{type(exc.__cause__).__qualname__}: {str(exc.__cause__)[:200]}" if exc.__cause__ else "",
            )
        )

    def left(self) -> float:
        """Seconds until this caller's deadline."""
        return self.deadline - now()


@dataclass
class Execution:
    """One run of the work: what "ran once" counts."""

    ident: str
    nonce: str
    caller: int
    start: float
    claimed_at: float  # the earliest its claim can have been written: its attempt's start
    end: float | None = None
    # completed: its complete() (or the decorator's store) returned; refused: ClaimLostError;
    # unstored: given up storing on a transient error; stopped: cancelled mid-work (an async def
    # whose claim was lost: its caller got ClaimLostError); running: none of these (yet).
    fate: str = "running"
    fate_at: float | None = None

    @property
    def value(self) -> str:
        """The result this run computes: deterministic per id, plus the run's own nonce."""
        return f"result-of-{self.ident}|{self.nonce}"


class Ledger:
    """The per-id execution counter, in the test process, under a lock."""

    def __init__(self, tag: str) -> None:
        self._lock = threading.Lock()
        self._tag = tag
        self._serial = 0
        self.runs: dict[str, list[Execution]] = collections.defaultdict(list)
        self.by_nonce: dict[str, Execution] = {}

    def begin(self, ident: str, caller: Caller) -> Execution:
        """Count one run of ``ident``'s work, by ``caller``."""
        with self._lock:
            self._serial += 1
            execution = Execution(ident, f"{self._tag}.{self._serial}", caller.index, now(), caller.attempt_at)
            self.runs[ident].append(execution)
            self.by_nonce[execution.nonce] = execution
            return execution

    def settle(self, value: object, fate: str) -> None:
        """Mark the run whose result is ``value`` (a str with its nonce) with ``fate``, unless settled already."""
        if not isinstance(value, str):
            return
        found = NONCE.search(value.encode())
        execution = self.by_nonce.get(found.group(1).decode()) if found else None
        if execution is not None and execution.fate == "running":
            execution.fate, execution.fate_at = fate, now()


@dataclass
class FaultEvent:
    """A fault as it happened."""

    kind: str
    start: float
    end: float = 0.0
    healed: float = 0.0
    target: int | None = None  # the node's port
    slots: frozenset[int] = frozenset()
    detail: str = ""
    demoted: bool = False  # the target primary lost its slots to a replica

    @property
    def lossy(self) -> bool:
        """Whether writes its target acknowledged may be gone: it was failed over without its consent."""
        return self.kind in LOSSY_KINDS and self.demoted


class _GiveUp(Exception):
    """A caller's deadline passed mid-attempt."""


# --------------------------------------------------------------------------- what both workloads' callers do

ClaimT = TypeVar("ClaimT", Claim, AsyncClaim)


@contextlib.contextmanager
def _calling(caller: Caller, deadline: float) -> Iterator[None]:
    """One caller's run, from its start to its end: a give-up, or an error of the harness, noted in it."""
    _caller.set(caller)
    caller.start = now()
    caller.deadline = caller.start + deadline
    try:
        yield
    except _GiveUp:
        caller.gave_up = caller.gave_up or "deadline"
    except Exception as exc:  # a bug of the harness: shown like any other error
        caller.note(exc)
        caller.gave_up = "harness"
    finally:
        caller.end = now()


def _attempt_failed(ledger: Ledger, caller: Caller, exc: Exception) -> bool:
    """Note an attempt's error and settle the result it carries; ``True`` when the caller gives up on it."""
    caller.note(exc)
    if isinstance(exc, ClaimLostError):
        ledger.settle(exc.result, "refused")
    elif isinstance(exc, GoblinClaimError) and exc.result is not None:
        ledger.settle(exc.result, "unstored")
    if isinstance(exc, GoblinClaimError) and not _retryable(exc):
        caller.gave_up = type(exc).__name__
        return True
    return False


def _complete_failed(caller: Caller, execution: Execution, exc: Exception) -> None:
    """Note a failed ``complete()`` (not a lost claim); raise ``_GiveUp`` unless it is sent again."""
    caller.note(exc)
    if (isinstance(exc, GoblinClaimError) and not _retryable(exc)) or caller.left() <= 0:
        execution.fate, execution.fate_at = "unstored", now()
        raise _GiveUp from exc


def _to_start(
    caller: Caller, pairs: Sequence[tuple[ClaimT, object]], give_back_after: int | None, again: list[str]
) -> Iterator[ClaimT]:
    """A batch's claims to start, in turn; the others answered, or put in ``again`` to be redelivered."""
    started = 0
    for claim, outcome in pairs:
        if isinstance(outcome, Exception):
            caller.note(outcome)
            again.append(claim.key)
        elif isinstance(outcome, Completed):
            caller.answers[claim.key] = _text(outcome.value)  # acked at once
        elif isinstance(outcome, InFlight):
            again.append(claim.key)  # stays pending: redelivered later
        elif give_back_after is not None and started >= give_back_after:
            again.append(claim.key)  # shutting down: given back below, unstarted
        else:
            started += 1
            yield claim


def _backoff(tries: int) -> float:
    """Seconds to sleep before a caller's next try."""
    delay: float = min(0.05 * 2**tries, 1.0) * random.random()
    return delay


# --------------------------------------------------------------------------- the clients


def _retry_options(recipe: bool) -> dict[str, Any]:
    """The sync clients' Retry and timeouts: the README's recipe, or a shorter budget."""
    if recipe:
        return {"retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 8)}
    return {"retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3)}


def _async_retry_options(recipe: bool) -> dict[str, Any]:
    if recipe:
        return {"retry": AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 8)}
    return {"retry": AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3)}


TIMEOUTS = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}


def sync_cluster_client(port: int, recipe: bool) -> redis.cluster.RedisCluster:
    """A sync ``RedisCluster`` on the cluster a node of ``port`` belongs to, with retries and timeouts."""
    return redis.cluster.RedisCluster(host=servers.HOST, port=port, **TIMEOUTS, **_retry_options(recipe))


def async_cluster_client(port: int, recipe: bool) -> redis.asyncio.cluster.RedisCluster:
    """An asyncio ``RedisCluster`` (made inside its loop) with room for every task: it has no blocking pool."""
    return redis.asyncio.cluster.RedisCluster(
        host=servers.HOST, port=port, max_connections=1024, **TIMEOUTS, **_async_retry_options(recipe)
    )


def namespace(path: str) -> str:
    """The key prefix of a path's records."""
    return f"nem-{path}"


# --------------------------------------------------------------------------- the sync workload


class SyncPaths:
    """The sync callers, over one ``RedisCluster`` shared by every thread."""

    def __init__(
        self, settings: Settings, client: redis.cluster.RedisCluster, ledger: Ledger, replicated: frozenset[str]
    ) -> None:
        self.settings = settings
        self.client = client
        self.ledger = ledger
        self.options = REPLICATED if "sync-claim" in replicated else {}
        self.batch_options = REPLICATED if "sync-batch" in replicated else {}
        ledger_ = ledger

        def body(ident: str) -> str:
            caller = _caller.get()
            execution = ledger_.begin(ident, caller)
            time.sleep(caller.job.work)
            execution.end = now()
            return execution.value

        self.decorated = idempotent(
            client, key="ident", namespace=namespace("sync-decorator"), lease=settings.lease, wait=WAIT, **self.options
        )(body)

    def call(self, caller: Caller) -> None:
        """Run one caller to its answer, its deadline or an error it cannot retry."""
        with _calling(caller, self.settings.deadline):
            if caller.job.path == "sync-batch":
                self._consume(caller)
            else:
                self._retrying(caller, lambda: self._once(caller))

    def _retrying(self, caller: Caller, attempt: Callable[[], str | None]) -> None:
        tries = 0
        while caller.left() > 0:
            caller.attempt_at = now()
            try:
                answer = attempt()
            except _GiveUp:
                raise
            except Exception as exc:
                if _attempt_failed(self.ledger, caller, exc):
                    return
            else:
                if answer is not None:
                    caller.answers[caller.job.idents[0]] = answer
                    return
            tries += 1
            time.sleep(_backoff(tries))
        caller.gave_up = "deadline"

    def _once(self, caller: Caller) -> str | None:
        ident, path = caller.job.idents[0], caller.job.path
        if path == "sync-decorator":
            answer = self.decorated(ident)
            self.ledger.settle(answer, "completed")
            return answer
        claim = Claim(
            self.client,
            ident,
            lease=self.settings.lease,
            namespace=namespace(path),
            fencing=path == "sync-fenced",
            **self.options,
        )
        try:
            outcome = claim.acquire()
        except NotReplicatedError:
            _quietly(claim.release)  # held on the primary alone: give it back, as the decorator does
            raise
        if isinstance(outcome, InFlight):
            outcome = claim.wait(timeout=max(0.0, min(WAIT, caller.left())))
        if isinstance(outcome, Completed):
            return _text(outcome.value)
        return self._run(caller, claim)

    def _run(self, caller: Caller, claim: Claim) -> str:
        """Do the work under a keep-alive and complete it, retrying a transient failure until the deadline."""
        execution = self.ledger.begin(claim.key, caller)
        with claim.keep_alive():
            time.sleep(caller.job.work)
        execution.end = now()
        tries = 0
        while True:
            try:
                claim.complete(execution.value)
            except ClaimLostError:
                execution.fate, execution.fate_at = "refused", now()
                raise
            except Exception as exc:  # ConnectionFailedError, NotReplicatedError: safe to send again
                _complete_failed(caller, execution, exc)
                tries += 1
                time.sleep(_backoff(tries))
            else:
                execution.fate, execution.fate_at = "completed", now()
                return execution.value

    def _consume(self, caller: Caller) -> None:
        """A stream consumer's batch: reserve it briefly, take the full lease per message, complete, give back."""
        pending = list(caller.job.idents)
        give_back_after = caller.give_back_after
        tries = 0
        while pending:
            if caller.left() <= 0:
                caller.gave_up = "deadline"
                return
            again: list[str] = []
            unstarted: dict[str, Claim] = {}
            caller.attempt_at = now()
            try:
                pairs = Claim.acquire_many(
                    self.client, pending, lease=RESERVE, namespace=namespace("sync-batch"), **self.batch_options
                )
                unstarted = {claim.key: claim for claim, outcome in pairs if isinstance(outcome, Claimed)}
                for claim in _to_start(caller, pairs, give_back_after, again):
                    del unstarted[claim.key]
                    try:
                        if self._start(claim):
                            caller.answers[claim.key] = self._run(caller, claim)
                        else:
                            again.append(claim.key)
                    except ClaimLostError as exc:
                        caller.note(exc)
                        again.append(claim.key)
            except _GiveUp:
                raise
            except Exception as exc:
                caller.note(exc)
                again = [ident for ident in pending if ident not in caller.answers]
            finally:
                if unstarted:
                    try:
                        Claim.release_many(self.client, list(unstarted.values()))
                    except Exception as exc:
                        caller.note(exc)  # the reservations lapse by themselves
            give_back_after = None
            pending = again
            if pending:
                tries += 1
                time.sleep(0.1 + _backoff(tries))  # the redelivery

    def _start(self, claim: Claim) -> bool:
        """Take the full lease as a message starts; ``False`` when another consumer has it now."""
        try:
            claim.extend(lease=self.settings.lease)
            return True
        except ClaimLostError:
            pass
        if isinstance(claim.acquire(), Claimed):
            claim.extend(lease=self.settings.lease)
            return True
        return False


def _retryable(exc: GoblinClaimError) -> bool:
    """What a caller tries again: a transient failure, work still in flight, a lost claim, an unreplicated write."""
    return isinstance(exc, (ConnectionFailedError, StillInFlightError, ClaimLostError, NotReplicatedError))


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        call()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SyncWorkload:
    """Runs the sync jobs on a thread pool: three callers per job at its time, the retry after they end."""

    def __init__(
        self,
        settings: Settings,
        paths: SyncPaths,
        jobs: list[Job],
        callers: list[Caller],
        pool: concurrent.futures.ThreadPoolExecutor | None = None,
    ) -> None:
        self.settings = settings
        self.paths = paths
        self.jobs = jobs
        self.callers = callers
        # The callers' threads: its own pool, or one given (a partition's client group runs in its namespace).
        self.pool = pool or concurrent.futures.ThreadPoolExecutor(settings.threads, thread_name_prefix="nemesis-sync")
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._cond = threading.Condition()
        self._serial = 0
        self._open = 0
        self._done = threading.Event()

    def _at(self, when: float, action: Callable[[], None]) -> None:
        with self._cond:
            self._serial += 1
            heapq.heappush(self._heap, (when, self._serial, action))
            self._cond.notify()

    def _caller(self, job: Job, role: str, give_back: int | None) -> Caller:
        caller = Caller(next(_caller_serial), job, role, give_back)
        self.callers.append(caller)
        return caller

    def _start_job(self, job: Job) -> None:
        left = [3]
        lock = threading.Lock()

        def one_ended(_future: object) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                retry = self._caller(job, "retry", job.give_back_after[3])
                self._at(now() + job.retry_after, lambda: self._submit(retry))

        for index in range(3):
            caller = self._caller(job, "first", job.give_back_after[index])
            self.pool.submit(self.paths.call, caller).add_done_callback(one_ended)

    def _submit(self, caller: Caller) -> None:
        def ended(_future: object) -> None:
            with self._cond:
                self._open -= 1
                if self._open == 0:
                    self._done.set()

        self.pool.submit(self.paths.call, caller).add_done_callback(ended)

    def run(self, t0: float, timeout: float) -> bool:
        """Run every job; whether every caller ended within ``timeout`` seconds of ``t0``."""
        self._open = len(self.jobs)
        if not self.jobs:
            return True
        for job in self.jobs:
            self._at(t0 + job.at, lambda job=job: self._start_job(job))
        end = t0 + timeout
        while not self._done.is_set() and now() < end:
            with self._cond:
                while self._heap and self._heap[0][0] <= now():
                    _when, _serial, action = heapq.heappop(self._heap)
                    action()
                wait = min(0.2, self._heap[0][0] - now()) if self._heap else 0.2
                self._cond.wait(max(0.0, wait))
        finished = self._done.is_set()
        self.pool.shutdown(wait=finished, cancel_futures=True)
        return finished


# --------------------------------------------------------------------------- the asyncio workload


class AsyncPaths:
    """The asyncio callers, over one asyncio ``RedisCluster`` shared by every task."""

    def __init__(
        self,
        settings: Settings,
        client: redis.asyncio.cluster.RedisCluster,
        ledger: Ledger,
        replicated: frozenset[str],
    ) -> None:
        self.settings = settings
        self.client = client
        self.ledger = ledger
        self.options = REPLICATED if "async-claim" in replicated else {}
        self.batch_options = REPLICATED if "async-batch" in replicated else {}
        ledger_ = ledger

        async def body(ident: str) -> str:
            caller = _caller.get()
            execution = ledger_.begin(ident, caller)
            try:
                await asyncio.sleep(caller.job.work)
            except asyncio.CancelledError:  # its claim was lost (or its caller cancelled): it stops here
                execution.fate, execution.fate_at = "stopped", now()
                raise
            execution.end = now()
            return execution.value

        self.decorated = idempotent(
            client, key="ident", namespace=namespace("async-decorator"), lease=settings.lease, wait=WAIT, **self.options
        )(body)

    async def call(self, caller: Caller) -> None:
        """Run one caller to its answer, its deadline or an error it cannot retry."""
        with _calling(caller, self.settings.deadline):
            if caller.job.path == "async-batch":
                await self._consume(caller)
            else:
                await self._retrying(caller)

    async def _retrying(self, caller: Caller) -> None:
        tries = 0
        while caller.left() > 0:
            caller.attempt_at = now()
            try:
                answer = await self._once(caller)
            except _GiveUp:
                raise
            except Exception as exc:
                if _attempt_failed(self.ledger, caller, exc):
                    return
            else:
                if answer is not None:
                    caller.answers[caller.job.idents[0]] = answer
                    return
            tries += 1
            await asyncio.sleep(_backoff(tries))
        caller.gave_up = "deadline"

    async def _once(self, caller: Caller) -> str | None:
        ident, path = caller.job.idents[0], caller.job.path
        if path == "async-decorator":
            answer = await self.decorated(ident)
            self.ledger.settle(answer, "completed")
            return answer
        claim = AsyncClaim(
            self.client,
            ident,
            lease=self.settings.lease,
            namespace=namespace(path),
            fencing=path == "async-fenced",
            **self.options,
        )
        outcome = await claim.acquire()
        if isinstance(outcome, InFlight):
            outcome = await claim.wait(timeout=max(0.0, min(WAIT, caller.left())))
        if isinstance(outcome, Completed):
            return _text(outcome.value)
        return await self._run(caller, claim)

    async def _run(self, caller: Caller, claim: AsyncClaim) -> str:
        execution = self.ledger.begin(claim.key, caller)
        async with claim.keep_alive():
            await asyncio.sleep(caller.job.work)
        execution.end = now()
        tries = 0
        while True:
            try:
                await claim.complete(execution.value)
            except ClaimLostError:
                execution.fate, execution.fate_at = "refused", now()
                raise
            except Exception as exc:
                _complete_failed(caller, execution, exc)
                tries += 1
                await asyncio.sleep(_backoff(tries))
            else:
                execution.fate, execution.fate_at = "completed", now()
                return execution.value

    async def _consume(self, caller: Caller) -> None:
        pending = list(caller.job.idents)
        give_back_after = caller.give_back_after
        tries = 0
        while pending:
            if caller.left() <= 0:
                caller.gave_up = "deadline"
                return
            again: list[str] = []
            unstarted: dict[str, AsyncClaim] = {}
            caller.attempt_at = now()
            try:
                pairs = await AsyncClaim.acquire_many(
                    self.client, pending, lease=RESERVE, namespace=namespace("async-batch"), **self.batch_options
                )
                unstarted = {claim.key: claim for claim, outcome in pairs if isinstance(outcome, Claimed)}
                for claim in _to_start(caller, pairs, give_back_after, again):
                    del unstarted[claim.key]
                    try:
                        if await self._start(claim):
                            caller.answers[claim.key] = await self._run(caller, claim)
                        else:
                            again.append(claim.key)
                    except ClaimLostError as exc:
                        caller.note(exc)
                        again.append(claim.key)
            except _GiveUp:
                raise
            except Exception as exc:
                caller.note(exc)
                again = [ident for ident in pending if ident not in caller.answers]
            finally:
                if unstarted:
                    try:
                        await AsyncClaim.release_many(self.client, list(unstarted.values()))
                    except Exception as exc:
                        caller.note(exc)
            give_back_after = None
            pending = again
            if pending:
                tries += 1
                await asyncio.sleep(0.1 + _backoff(tries))  # the redelivery

    async def _start(self, claim: AsyncClaim) -> bool:
        try:
            await claim.extend(lease=self.settings.lease)
            return True
        except ClaimLostError:
            pass
        if isinstance(await claim.acquire(), Claimed):
            await claim.extend(lease=self.settings.lease)
            return True
        return False


async def probe_async_replicas(client: redis.asyncio.cluster.RedisCluster) -> set[str]:
    """The asyncio paths whose calls the SDK under test takes ``replicas=`` on."""
    taken: set[str] = set()
    for path, attempt in (
        ("async-claim", lambda: AsyncClaim(client, "replicas", namespace="nem-probe", **REPLICATED).acquire()),
        ("async-batch", lambda: AsyncClaim.acquire_many(client, ["replicas-b"], namespace="nem-probe", **REPLICATED)),
    ):
        with contextlib.suppress(InvalidArgumentError):
            await attempt()
            taken.add(path)
    return taken


def probe_sync_replicas(client: redis.cluster.RedisCluster) -> set[str]:
    """The sync paths whose calls the SDK under test takes ``replicas=`` on."""
    taken: set[str] = set()
    for path, attempt in (
        ("sync-claim", lambda: Claim(client, "replicas", namespace="nem-probe", **REPLICATED).acquire()),
        ("sync-batch", lambda: Claim.acquire_many(client, ["replicas-b"], namespace="nem-probe", **REPLICATED)),
    ):
        with contextlib.suppress(InvalidArgumentError):
            attempt()
            taken.add(path)
    return taken


async def run_async_workload(
    settings: Settings,
    port: int,
    ledger: Ledger,
    jobs: list[Job],
    callers: list[Caller],
    t0: float,
    timeout: float,
    replicated: set[str],
) -> bool:
    """Run the asyncio jobs on this loop; whether every caller ended within ``timeout`` seconds of ``t0``.

    With the recipe, the paths found to take ``replicas=`` are added to ``replicated``.
    """
    client = async_cluster_client(port, settings.recipe)
    if settings.recipe:
        replicated.update(await probe_async_replicas(client))
    paths = AsyncPaths(settings, client, ledger, frozenset(replicated))
    try:
        return await drive_async(paths, jobs, callers, t0, timeout)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.aclose(), 10)


async def drive_async(paths: AsyncPaths, jobs: list[Job], callers: list[Caller], t0: float, timeout: float) -> bool:
    """Each job's three callers at its time and its retry after them, as tasks on this loop.

    Returns whether every caller ended within ``timeout`` seconds of ``t0`` (the others are cancelled).
    """

    def made(job: Job, role: str, give_back: int | None) -> Caller:
        caller = Caller(next(_caller_serial), job, role, give_back)
        callers.append(caller)
        return caller

    async def one(job: Job) -> None:
        await asyncio.sleep(max(0.0, t0 + job.at - now()))
        await asyncio.gather(*(paths.call(made(job, "first", job.give_back_after[i])) for i in range(3)))
        await asyncio.sleep(job.retry_after)
        await paths.call(made(job, "retry", job.give_back_after[3]))

    tasks = [asyncio.ensure_future(one(job)) for job in jobs]
    if not tasks:
        return True
    _done, hung = await asyncio.wait(tasks, timeout=max(0.0, t0 + timeout - now()))
    for task in hung:
        task.cancel()
    if hung:
        await asyncio.wait(hung, timeout=10)
    return not hung


# --------------------------------------------------------------------------- the nemesis


class Nemesis:
    """Runs the fault plan against a cluster, one fault after another, each healed before the next."""

    def __init__(self, settings: Settings, cluster: servers.ReplicatedCluster, plans: list[FaultPlan], jobs: list[Job]):
        self.settings = settings
        self.cluster = cluster
        self.plans = plans
        self.jobs = jobs
        self.events: list[FaultEvent] = []
        self.failures: list[str] = []  # faults that could not be done or healed, in English
        self.stop = threading.Event()

    def log(self, line: str) -> None:
        """A progress line, with the time since the start."""
        if self.settings.log is not None:
            self.settings.log(f"[nemesis {now() - self.t0:6.1f}s] {line}")

    def run(self, t0: float) -> None:
        """Do every planned fault whose time comes within the schedule, then heal."""
        self.t0 = t0
        try:
            for plan in self.plans:
                if self.stop.is_set() or now() - t0 >= self.settings.seconds:
                    break
                if self.stop.wait(max(0.0, t0 + plan.at - now())):
                    break
                if now() - t0 >= self.settings.seconds:
                    break
                self._whole(30)
                side = None
                if plan.companion is not None:
                    side = threading.Thread(target=self._companion, args=(plan,), name="nemesis-companion")
                    side.start()
                event = self._do(plan)
                if side is not None:
                    side.join(60)
                self._heal_all()
                self._whole(60)
                event.healed = now()
                if event.target is not None and event.kind in ("kill", "stop"):
                    with contextlib.suppress(Exception):
                        event.demoted = event.target not in {node.port for node in self.cluster.primaries()}
                self.log(
                    f"{event.kind} {event.detail} (healed in {event.healed - event.end:.1f}s"
                    + (", demoted" if event.demoted else "")
                    + ")"
                )
        finally:
            self._heal_all()
            self._whole(90)

    def _do(self, plan: FaultPlan, strict: bool = True) -> FaultEvent:
        """Do one fault and note it (its end, not its healing); ``strict``: a failure to do it counts."""
        event = FaultEvent(plan.kind, now())
        self.events.append(event)
        try:
            getattr(self, "_" + plan.kind.replace("-", "_"))(plan, event)
        except Exception as exc:
            if strict:
                self.failures.append(f"{plan.kind} at {event.start - self.t0:.1f}s: {exc!r}")
            event.detail = event.detail or f"cut short: {exc!r}"  # a companion's target frozen or killed
            self.log(f"{plan.kind} failed: {exc!r}")
        event.end = now()
        return event

    def _companion(self, plan: FaultPlan) -> None:
        """The light fault composed with a heavy one, started partway through it."""
        assert plan.companion is not None
        if self.stop.wait(plan.companion_delay):
            return
        event = self._do(plan.companion, strict=False)
        event.healed = event.end
        self.log(f"{event.kind} {event.detail} (with {plan.kind})")

    def _whole(self, timeout: float) -> None:
        try:
            self.cluster.wait_healthy(timeout)
        except RuntimeError as exc:
            self.failures.append(f"at {now() - self.t0:.1f}s: {exc}")
            self.log(str(exc))

    def _heal_all(self) -> None:
        """Continue frozen nodes, restart killed ones, finish any migration left half done."""
        for node in self.cluster.nodes:
            if node.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.server.process.pid, signal.SIGCONT)
            else:
                try:
                    node.restart()
                except Exception as exc:
                    self.failures.append(f"restart of {node.port}: {exc!r}")
        with contextlib.suppress(Exception):
            self._finish_migrations()

    # -- choosing targets

    def _primaries(self) -> list[servers.ClusterNode]:
        return sorted(self.cluster.primaries(), key=lambda node: node.port)

    @staticmethod
    def _pick(items: Sequence[Any], fraction: float) -> Any:
        return items[min(int(fraction * len(items)), len(items) - 1)]

    def _slots_of(self, node: servers.ClusterNode) -> frozenset[int]:
        view = self.cluster.view()
        return view[node.node_id].slots if node.node_id in view else frozenset()

    # -- the faults

    def _kill(self, plan: FaultPlan, event: FaultEvent) -> None:
        node = self._pick(self._primaries(), plan.pick)
        event.target, event.slots = node.port, self._slots_of(node)
        node.kill()
        event.detail = f"SIGKILL primary {node.port}, restarted after {plan.length:.1f}s"
        self.stop.wait(plan.length)
        node.restart()

    def _stop(self, plan: FaultPlan, event: FaultEvent) -> None:
        node = self._pick(self._primaries(), plan.pick)
        event.target, event.slots = node.port, self._slots_of(node)
        node.server.process.send_signal(signal.SIGSTOP)
        try:
            self.stop.wait(plan.length)
        finally:
            node.server.process.send_signal(signal.SIGCONT)
        event.detail = f"SIGSTOP primary {node.port} for {plan.length:.1f}s"

    def _failover(self, plan: FaultPlan, event: FaultEvent) -> None:
        primary = self._pick(self._primaries(), plan.pick)
        replica = self._pick(sorted(self.cluster.replicas_of(primary), key=lambda node: node.port), plan.pick2)
        event.target, event.slots = primary.port, self._slots_of(primary)
        with contextlib.closing(replica.client()) as client:
            client.execute_command("CLUSTER FAILOVER")
        deadline = now() + 15
        while replica.node_id not in {node.node_id for node in self.cluster.primaries()}:
            if now() > deadline:
                raise RuntimeError(f"CLUSTER FAILOVER on {replica.port} did not promote it in 15 s")
            time.sleep(0.05)
        event.detail = f"CLUSTER FAILOVER: replica {replica.port} took over from {primary.port}"

    def _client_kill(self, plan: FaultPlan, event: FaultEvent) -> None:
        primaries = self._primaries()
        clients = [node.client() for node in primaries]
        killed, end = 0, now() + plan.length
        rng = random.Random(plan.pick)
        try:
            while now() < end and not self.stop.is_set():
                for client in clients:
                    with contextlib.suppress(redis.RedisError):
                        killed += int(client.execute_command("CLIENT KILL", "TYPE", "normal", "SKIPME", "yes"))
                time.sleep(rng.uniform(0.02, 0.1))
        finally:
            for client in clients:
                client.close()
        event.detail = (
            f"CLIENT KILL TYPE normal storm on {len(primaries)} primaries for {plan.length:.1f}s ({killed} killed)"
        )

    def _busy_slots(self, plan: FaultPlan, count: int) -> list[int]:
        """Slots the workload's keys use around now: ids whose callers start within a few seconds."""
        elapsed = now() - self.t0
        busy = [job for job in self.jobs if elapsed - 3.0 <= job.at <= elapsed + 3.0] or list(self.jobs)
        rng = random.Random(plan.pick2)
        slots: list[int] = []
        for job in rng.sample(busy, min(count, len(busy))):
            slots.append(key_slot(rng.choice(job.idents).encode()))
        return sorted(set(slots))

    def _migrate(self, plan: FaultPlan, event: FaultEvent) -> None:
        slots = self._busy_slots(plan, 1 + int(plan.pick * 3))
        moved = []
        for slot in slots:
            source = self.cluster.owner_of(slot)
            targets = [node for node in self._primaries() if node.node_id != source.node_id]
            target = self._pick(targets, plan.pick2)
            keys = self._move_slot(slot, source, target, plan.length)
            moved.append(f"{slot} ({keys} keys) {source.port}->{target.port}")
        event.slots = frozenset(slots)
        event.detail = "migrated slot " + ", ".join(moved)

    def _move_slot(self, slot: int, source: servers.ClusterNode, target: servers.ClusterNode, pause: float) -> int:
        """Move ``slot`` live: IMPORTING / MIGRATING, MIGRATE in small batches with pauses, SETSLOT NODE everywhere."""
        rng = random.Random(slot)
        with contextlib.closing(source.client(socket_timeout=10)) as src, contextlib.closing(target.client()) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)
            self.stop.wait(pause)  # meanwhile new keys of the slot go to the target (ASK)
            moved, deadline = 0, now() + 20
            while True:
                keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, rng.randint(1, 3))
                if not keys:
                    break
                if now() > deadline:
                    raise RuntimeError(f"slot {slot} still has keys on {source.port} after 20 s")
                with contextlib.suppress(redis.ResponseError):  # NOKEY: it expired meanwhile
                    src.execute_command("MIGRATE", servers.HOST, target.port, "", 0, 5000, "KEYS", *keys)
                    moved += len(keys)
                time.sleep(rng.uniform(0.05, 0.3))
        self._assign(slot, target, first=(target, source))
        return moved

    def _assign(self, slot: int, owner: servers.ClusterNode, first: Sequence[servers.ClusterNode] = ()) -> None:
        """``CLUSTER SETSLOT slot NODE owner`` on every node, ``first`` first (replicas learn it by gossip)."""
        order = list(first) + [node for node in self.cluster.nodes if node not in first]
        for node in order:
            if not node.alive:
                continue
            with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as client:
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", owner.node_id)

    def _finish_migrations(self) -> None:
        """Finish a migration a failure left half done: move the keys left, then give the slot to its importer."""
        view = self.cluster.view()
        for entry in (item for v in view.values() for item in v.moving):
            match = re.match(r"\[(\d+)-([<>])-([0-9a-f]+)\]", entry)
            if match is None:
                continue
            slot = int(match.group(1))
            owner = next(v for v in view.values() if slot in v.slots)
            source = self.cluster.by_id(owner.node_id)
            importer = [v for v in view.values() if any(f"[{slot}-<-" in item for item in v.moving)]
            target = self.cluster.by_id(importer[0].node_id if importer else match.group(3))
            if target.node_id == source.node_id:
                continue
            self.log(f"finishing the migration of slot {slot}: {source.port}->{target.port}")
            self._move_slot(slot, source, target, 0.0)

    def _script_flush(self, plan: FaultPlan, event: FaultEvent) -> None:
        primaries = self._primaries()
        times = int(plan.length)
        for _ in range(times):
            for node in primaries:
                with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as client:
                    client.execute_command("SCRIPT FLUSH")
            time.sleep(0.1)
        event.detail = f"SCRIPT FLUSH x{times} on {len(primaries)} primaries"

    def _debug_sleep(self, plan: FaultPlan, event: FaultEvent) -> None:
        node = self._pick(self._primaries(), plan.pick)
        event.target, event.slots = node.port, self._slots_of(node)
        with contextlib.closing(node.client(socket_timeout=plan.length + 5)) as client:
            client.execute_command("DEBUG", "SLEEP", f"{plan.length:.3f}")
        event.detail = f"DEBUG SLEEP {plan.length:.2f} on primary {node.port}"


# --------------------------------------------------------------------------- availability


class Probe:
    """Writes to one key per starting primary every 100 ms: the seconds some slot could not take a write."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.intervals: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.keys = _probe_keys()

    def run(self) -> None:
        """Probe until ``stop`` is set."""
        client = redis.cluster.RedisCluster(
            host=servers.HOST,
            port=self.port,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while not self.stop.wait(0.1):
                for key in self.keys:
                    started = now()
                    try:
                        client.set(key, b"x", ex=60)
                        ok = True
                    except Exception:
                        ok = False
                    ended = now()
                    if not ok or ended - started > 0.3:
                        self.intervals.append((started, ended if ok else max(ended, started + 0.1)))
        finally:
            client.close()

    def unavailable_seconds(self) -> float:
        """The length of the union of the intervals some probe failed or stalled in."""
        total, last = 0.0, -1.0
        for start, end in sorted(self.intervals):
            start = max(start, last)
            if end > start:
                total += end - start
                last = end
        return total


def _probe_keys() -> list[str]:
    """One key in each third of the slots (each starting primary's range)."""
    keys: dict[int, str] = {}
    serial = 0
    while len(keys) < 3:
        key = f"nem-probe:{{p{serial}}}"
        keys.setdefault(key_slot(key.encode()) * 3 // 16384, key)
        serial += 1
    return [keys[third] for third in sorted(keys)]


class LogCounter(logging.Handler):
    """Counts the warnings (and worse) the SDK and redis-py log during a run, by logger and level."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()
        self.first: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        """Count ``record``; keep the first message of each logger and level."""
        name = f"{record.name} {record.levelname}"
        self.counts[name] += 1
        if name not in self.first:
            with contextlib.suppress(Exception):
                self.first[name] = record.getMessage()[:300]

    @contextlib.contextmanager
    def attached(self) -> Iterator[LogCounter]:
        """Count on the root logger while the block runs (so nothing reaches stderr's last-resort handler)."""
        root = logging.getLogger()
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)


# --------------------------------------------------------------------------- the checker


@dataclass
class Report:
    """What a run found: the summary figures, the invariants broken, the details behind them."""

    summary: dict[str, Any]
    broken: list[str]
    details: list[str]
    samples: dict[str, str]  # a traceback per non-Goblin exception type
    replay: str = ""  # the command that replays the run

    def figures(self) -> str:
        """The summary on one line."""
        return json.dumps(self.summary, sort_keys=False, default=str)


def _nonce_of(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    found = NONCE.search(value.encode() if isinstance(value, str) else value)
    return found.group(1).decode() if found else None


def check(
    settings: Settings,
    seed: int,
    ledger: Ledger,
    callers: list[Caller],
    events: list[FaultEvent],
    records: dict[str, bytes | None],
    finished: bool,
    unavailable: float,
    failures: list[str],
    t0: float,
    untimed: Sequence[str] = (),
) -> Report:
    """Hold what happened to the exactly-once promise: runs, answers, errors, stuck ids, deadlines."""
    lossy = [event for event in events if event.lossy]

    def exposed(ident: str, start: float, end: float | None) -> bool:
        slot = key_slot(ident.encode())
        stop = end if end is not None else start
        return any(
            slot in event.slots and start <= event.healed and stop >= event.start - REPLICATION_LAG for event in lossy
        )

    def outlived(run: Execution) -> bool:
        # Its claim was held a lease or more: cut off (a frozen or failed-over primary, renewals
        # that could not get through), it may have lapsed for another caller to take.
        return (run.fate_at or run.end or run.start) - run.claimed_at >= settings.lease - 0.5

    idents = sorted({ident for caller in callers for ident in caller.job.idents})
    details: list[str] = []
    explained = unexplained = mismatched = stuck = unfinished = 0
    stuck_ids: list[str] = []
    unexplained_ids: list[str] = []
    for ident in idents:
        runs = ledger.runs.get(ident, [])
        record = records.get(ident)
        in_flight = record is not None and not record.startswith(b"done ")
        if in_flight:
            stuck += 1
            stuck_ids.append(ident)
            details.append(f"stuck: {ident} still holds {record[:60]!r} a lease after the faults stopped")
        final = _nonce_of(record) if record is not None and not in_flight else None
        answers = [
            (caller, caller.answers[ident])
            for caller in callers
            if ident in caller.job.idents and ident in caller.answers
        ]
        if record is not None and not in_flight and final not in ledger.by_nonce:
            unexplained += 1
            unexplained_ids.append(ident)
            details.append(f"foreign record: {ident} holds {record[:80]!r}, no run of this test wrote it")
            continue
        reasons: list[str] = []
        for run in runs:
            if run.nonce == final:
                continue
            if run.fate in ("refused", "unstored", "stopped") and outlived(run):
                continue  # its caller was told, cut off past its lease (ClaimLostError, with .result or stopped)
            if exposed(ident, run.claimed_at, run.fate_at or run.end):
                continue  # its claim or record was written around a failover that can drop it
            held = (run.fate_at or run.end or run.start) - run.claimed_at
            reasons.append(
                f"run {run.nonce} by caller {run.caller} at {run.start - t0:.1f}s ({run.fate}, claim held "
                f"{held:.1f}s) is neither stored, nor refused past its lease, nor exposed to a lossy failover"
            )
        for caller, answer in answers:
            nonce = _nonce_of(answer)
            if nonce == final:
                continue
            mismatched += 1
            run = ledger.by_nonce.get(nonce or "")
            if run is not None and exposed(ident, run.claimed_at, caller.end):
                continue  # answered from a record a failover then lost
            reasons.append(f"caller {caller.index} ({caller.role}) answered {answer!r}, the record holds {final!r}")
        if record is None and not in_flight and runs and not answers:
            unfinished += 1
        if len(runs) > 1 or reasons:
            if reasons:
                unexplained += 1
                unexplained_ids.append(ident)
                details.append(f"unexplained: {ident} ran {len(runs)}x: " + "; ".join(reasons))
            else:
                explained += 1
                details.append(
                    f"explained: {ident} ran {len(runs)}x: "
                    + ", ".join(f"{run.nonce}({run.fate})" for run in runs)
                    + f", stored {final}"
                )
    errors: collections.Counter[str] = collections.Counter()
    foreign: collections.Counter[str] = collections.Counter()
    wrapped: collections.Counter[str] = collections.Counter()  # foreign exceptions the decorator wrapped
    samples: dict[str, str] = {}
    messages: dict[str, str] = {}
    for caller in callers:
        for error in caller.errors:
            name = error.type_name
            if name == "goblin_claim.ServerError" and error.cause:
                name += f"({error.cause.split(':')[0]})"  # what the server or the client failed with
                if STORE_WRAPPER in error.text:  # @idempotent's store met an exception that is not the SDK's
                    wrapped[name] += 1
                    if name not in samples and error.trace:
                        samples[name] = f"[{caller.job.path}] " + error.trace
            errors[name] += 1
            if name not in messages:
                cause = f" (from {error.cause})" if error.cause else ""
                messages[name] = f"[{caller.job.path}] {error.text}{cause}"
            if not error.goblin:
                foreign[error.type_name] += 1
                if error.type_name not in samples and error.trace:
                    samples[error.type_name] = f"[{caller.job.path}] " + error.trace
    latencies = [caller.end - caller.start for caller in callers if caller.end]
    late = [caller for caller in callers if caller.end - caller.start > settings.deadline + settings.margin]
    never = [caller for caller in callers if not caller.end]
    gave_up = collections.Counter(caller.gave_up for caller in callers if caller.gave_up)
    details.extend(f"first {name}: {text}" for name, text in messages.items())
    for caller in late:
        details.append(
            f"late: caller {caller.index} ({caller.job.path}) took {caller.end - caller.start:.1f}s "
            f"(deadline {settings.deadline:.0f}s + margin {settings.margin:.0f}s)"
        )
    summary: dict[str, Any] = {
        "seed": seed,
        "server": os.path.basename(settings.binary),
        "replicas": settings.replicas,
        "recipe": settings.recipe,
        "seconds": settings.seconds,
        "ids": len(idents),
        "callers": len(callers),
        "runs": sum(len(runs) for runs in ledger.runs.values()),
        "double_runs": {"explained": explained, "unexplained": unexplained},
        "answer_mismatches": mismatched,
        "errors": dict(errors.most_common()),
        "non_goblin_errors": dict(foreign.most_common()),
        "wrapped_non_goblin": dict(wrapped.most_common()),
        "keys_without_ttl": len(untimed),
        "stuck_ids": stuck_ids,
        "unfinished_ids": unfinished,
        "gave_up": dict(gave_up),
        "max_latency_s": round(max(latencies, default=0.0), 2),
        "past_deadline": len(late) + len(never),
        "unavailable_s": round(unavailable, 1),
        "faults": dict(collections.Counter(event.kind for event in events)),
        "lossy_failovers": len(lossy),
        "nemesis_failures": len(failures),
    }
    broken: list[str] = []
    if foreign:
        broken.append(f"exceptions that are not GoblinClaimError: {dict(foreign)}")
    if wrapped:
        broken.append(f"exceptions not of redis-py that @idempotent's store wrapped in a ServerError: {dict(wrapped)}")
    if untimed:
        broken.append(f"{len(untimed)} keys the SDK wrote have no TTL: {untimed[:5]}")
    if unexplained:
        broken.append(
            f"{unexplained} ids ran more than once (or answered otherwise) unexplained: {unexplained_ids[:10]}"
        )
    if stuck:
        broken.append(f"{stuck} ids still in flight a lease after the faults stopped: {stuck_ids[:10]}")
    if late or never or not finished:
        broken.append(f"{len(late) + len(never)} callers ran past their deadline (+{settings.margin:.0f}s)")
    if failures:
        broken.append("the nemesis could not do or heal a fault: " + "; ".join(failures[:5]))
    return Report(summary, broken, details, samples)


def server_errors(cluster: servers.ReplicatedCluster) -> dict[str, int]:
    """The error replies every node has sent since it (last) started, by code (``INFO errorstats``), summed.

    On Redis 7.0 most ``ERR`` replies answer redis-py's ``CLIENT SETINFO`` (new in 7.2), sent as
    each connection opens: there, ``ERR`` counts reconnections more than failures.
    """
    totals: collections.Counter[str] = collections.Counter()
    for node in cluster.nodes:
        with contextlib.suppress(redis.RedisError, OSError), contextlib.closing(node.client()) as client:
            for name, entry in client.info("errorstats").items():
                if name.startswith("errorstat_") and isinstance(entry, dict):
                    totals[name.removeprefix("errorstat_")] += int(entry.get("count", 0))
    return dict(totals.most_common())


def keys_without_ttl(cluster: servers.ReplicatedCluster) -> list[str]:
    """The workload's keys (``nem-*``, the probe's aside) that have no TTL, on every primary."""
    found: list[str] = []
    for node in cluster.primaries():
        with contextlib.closing(node.client(socket_timeout=10)) as client:
            for key in client.scan_iter(match="nem-*", count=1000):
                if not key.startswith(b"nem-probe:") and client.pttl(key) == -1:
                    found.append(key.decode(errors="replace"))
    return sorted(found)


def read_records(port: int, idents_by_path: dict[str, list[str]]) -> dict[str, bytes | None]:
    """Every id's record, read through a fresh sync cluster client."""
    client = redis.cluster.RedisCluster(
        host=servers.HOST, port=port, socket_timeout=5.0, retry=Retry(ExponentialWithJitterBackoff(0.1, 1.0), 5)
    )
    try:
        records: dict[str, bytes | None] = {}
        for path, idents in idents_by_path.items():
            for ident in idents:
                records[ident] = client.get(f"{namespace(path)}:{{{ident}}}")
        return records
    finally:
        client.close()


# --------------------------------------------------------------------------- one run


def run(settings: Settings) -> Report:
    """One nemesis run on a cluster of its own: plan, faults and workload at once, heal, check."""
    seed = seed_from_env(settings.seed)
    log = settings.log or (lambda line: None)
    replay = replay_command(settings, seed)
    log(f"NEMESIS_SEED={seed} to replay: {replay}")
    plans = plan_faults(random.Random(f"faults-{seed}"), settings.seconds, settings.faults)
    jobs = plan_workload(random.Random(f"workload-{seed}"), settings.seconds, settings.rate, settings.paths)
    log(
        "fault plan: "
        + ", ".join(
            f"{plan.at:.1f}s {plan.kind}" + (f"+{plan.companion.kind}" if plan.companion else "") for plan in plans
        )
    )
    ledger = Ledger(f"{random.Random(seed).getrandbits(24):06x}")
    extra: list[str] = ["--enable-debug-command", "local"]
    if settings.recipe:
        extra += ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"]
    logs = LogCounter()
    with servers.cluster_with_replicas(settings.binary, 3, settings.replicas, extra) as cluster, logs.attached():
        port = cluster.nodes[0].port
        sync_client = sync_cluster_client(port, settings.recipe)
        replicated: set[str] = probe_sync_replicas(sync_client) if settings.recipe else set()
        sync_jobs = [job for job in jobs if job.path in SYNC_PATHS]
        async_jobs = [job for job in jobs if job.path in ASYNC_PATHS]
        sync_callers: list[Caller] = []
        async_callers: list[Caller] = []
        nemesis = Nemesis(settings, cluster, plans, jobs)
        probe = Probe(port)
        timeout = settings.seconds + 2 * settings.deadline + settings.margin + 30
        outcome: dict[str, bool] = {}
        t0 = now() + 0.5

        def sync_side() -> None:
            paths = SyncPaths(settings, sync_client, ledger, frozenset(replicated))
            workload = SyncWorkload(settings, paths, sync_jobs, sync_callers)
            outcome["sync"] = workload.run(t0, timeout)

        def async_side() -> None:
            outcome["async"] = asyncio.run(
                run_async_workload(settings, port, ledger, async_jobs, async_callers, t0, timeout, replicated)
            )

        threads = [
            threading.Thread(target=nemesis.run, args=(t0,), name="nemesis"),
            threading.Thread(target=probe.run, name="nemesis-probe", daemon=True),
            threading.Thread(target=sync_side, name="nemesis-sync-workload"),
            threading.Thread(target=async_side, name="nemesis-async-workload"),
        ]
        try:
            for thread in threads:
                thread.start()
            threads[0].join(settings.seconds + 300)
            faults_stopped = now()
            log(f"faults stopped and healed at {faults_stopped - t0:.1f}s")
            for thread in threads[2:]:
                thread.join(max(1.0, t0 + timeout + 30 - now()))
            workload_done = now()
            log(f"workload done at {workload_done - t0:.1f}s")
        finally:
            nemesis.stop.set()
            probe.stop.set()
            threads[0].join(120)
            threads[1].join(10)
        # A lease after everything stopped: nothing may still be in flight.
        time.sleep(max(0.0, max(faults_stopped, workload_done) + settings.lease + 1.0 - now()))
        idents_by_path: dict[str, list[str]] = collections.defaultdict(list)
        for job in jobs:
            idents_by_path[job.path].extend(job.idents)
        records = read_records(port, idents_by_path)
        answered = server_errors(cluster)
        untimed = keys_without_ttl(cluster)
        sync_client.close()
        finished = outcome.get("sync", False) and outcome.get("async", False)
        report = check(
            settings,
            seed,
            ledger,
            sync_callers + async_callers,
            nemesis.events,
            records,
            finished,
            probe.unavailable_seconds(),
            nemesis.failures,
            t0,
            untimed,
        )
        report.replay = replay
        # The paths that sent WAIT behind their writes: a path's claims, fenced claims and decorator share it.
        report.summary["replicas_on"] = sorted(
            path
            for path in ALL_PATHS
            if path in replicated
            or path.replace("-fenced", "-claim") in replicated
            or path.replace("-decorator", "-claim") in replicated
        )
        report.summary["server_errors"] = answered
        report.summary["log_warnings"] = dict(logs.counts.most_common())
        report.details.extend(f"first log line of {name}: {line}" for name, line in logs.first.items())
    log("figures: " + report.figures())
    for line in report.details:
        if not line.startswith("explained"):
            log(line)
    for name, trace in report.samples.items():
        log(f"--- a {name}, first seen:\n{trace}")
    for line in report.broken:
        log("BROKEN: " + line)
    return report


# --------------------------------------------------------------------------- by hand: make chaos


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.support.nemesis``: nemesis runs, their figures printed; exit 1 if any broke an invariant."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.nemesis", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=85.0, help="seconds of faults per run")
    parser.add_argument("--runs", type=int, default=8, help="runs, each on a fresh cluster with its own seed")
    parser.add_argument("--replicas", type=int, default=1, choices=(1, 2), help="replicas per primary")
    parser.add_argument("--recipe", action="store_true", help="the README's failover recipe")
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument("--seed", type=int, default=None, help="the first run's seed (default NEMESIS_SEED, or fresh)")
    parser.add_argument("--rate", type=float, default=2.0, help="new ids per second per path")
    parser.add_argument("--lease", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=40.0)
    parser.add_argument("--faults", default=",".join(FAULT_KINDS), help="comma-separated fault kinds")
    parser.add_argument("--paths", default=",".join(ALL_PATHS), help="comma-separated workload paths")
    args = parser.parse_args(argv)
    binary = servers.valkey_server_binary() if args.server == "valkey" else servers.redis_server_binary()
    if binary is None:
        print(f"no {args.server}-server binary (make {args.server}-server)", file=sys.stderr)
        return 2
    first = seed_from_env(args.seed)
    reports = []
    for index in range(args.runs):
        settings = Settings(
            binary=binary,
            seconds=args.seconds,
            seed=first + index,
            replicas=args.replicas,
            recipe=args.recipe,
            rate=args.rate,
            lease=args.lease,
            deadline=args.deadline,
            faults=tuple(args.faults.split(",")),
            paths=tuple(args.paths.split(",")),
        )
        print(f"=== run {index + 1} of {args.runs}")
        reports.append(run(settings))
    print("=== figures per run")
    for report in reports:
        print(("BROKEN " if report.broken else "ok     ") + report.figures())
    return 1 if any(report.broken for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
