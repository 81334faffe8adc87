"""Lease renewal while work runs: isolated per server, bounded by the lease, pipelined.

Every ``interval`` seconds (a third of the lease by default) each claim is
extended. Renewals due together on one client (on a cluster: one node) go out
as one pipeline, one round trip for all of them: ``SET claim_key token IFEQ token
EX lease`` each where the server has it built in (Valkey 9, Redis 8.4), else the
EXTEND script. A renewal
that hangs or is slow on one client or node never delays renewals on another:

- Sync claims share one scheduler thread per process that keeps a deadline heap
  and never touches the network. A keep-alive that begins is only queued for it
  (``_Renewer.add``); it takes the queue into its heap when it next wakes, so a
  call that ends before then never reaches the heap. It hands due renewals to a *lane*, one per
  client (per node on a cluster), whose own thread sends them; a lane with a
  round trip still out queues what comes due meanwhile and sends it as the
  next pipeline. Lanes are made on first use and end when idle.
- asyncio claims keep one timer each on their event loop (``loop.call_at``);
  the claims of one lane that come due in the same loop iteration share one
  task and one pipeline.

Each renewal is bounded by the lease it has left: the lease is known to last
until the last successful renewal was *sent* plus the lease (the server set it
later than that), less a small margin. A renewal still unanswered then is given
up and the claim marked ``lost``; so is a claim whose renewals keep failing
until then. A lost claim is renewed no more; its ``complete()`` raises
``ClaimLostError`` unless the handle is fenced and nobody claimed the key
meanwhile. A renewal that finds the claim no longer held also sets ``lost``; a
transient failure (a dropped connection) is retried sooner than a tick, while
the lease lasts.

Lost means stopped. The handle's ``ensure_held()`` reads what its keep-alive knows
(``_not_held``: lost, or past the lease by the clock when the renewer has not run
in time), with no round trip, for sync work to ask before an irreversible step. An
asyncio keep-alive armed with a task (``cancel_on_loss``, ``stop_on_loss``: what
``@idempotent`` and the ASGI door use) cancels it as it marks the claim lost, from
the renewal that finds it so or from a timer: its own, come late, or its batch's
give-up at the lease's end (one timer a batch, while the renewal is on the wire).
Those mark the loss in their own callbacks, so a loop that stalled past the lease
stops the work before its next step runs.

A sync lane stuck on a dead connection cannot be interrupted (redis-py's
default ``socket_timeout`` is ``None``); once it has cost a claim its lease, the
lane is set aside and the next renewals of its client go out on a new lane and
connection, so a single black-holed connection does not keep a client's claims
lost forever. At most one lane per client or node is set aside at a time.

Entering or leaving a keep-alive costs a microsecond or two: a dict entry put and
taken back, no lock and no thread switch (sync), a timer scheduled and cancelled
(asyncio). ``@idempotent`` begins
one only once the claim is the call's, so a duplicate pays nothing for it.

The lease counts from the moment the claim was sent (``lease_left``), however long
after the claim the ``with claim.keep_alive():`` block begins.

Not guaranteed: a renewal is "on schedule" to within the scheduler's coalescing of ``COALESCE``
seconds (it may come that much early, never late because of another server).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar, Union

from .. import _events
from .._clients.errors import failed, failed_async, translate
from .._clients.families import ASYNC_CLUSTERS, CLUSTERS, ERRORS, RESPONSE_ERRORS, node_client
from .._clients.transport import state_of
from .._errors import (
    ClaimLostError,
    GoblinClaimError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ServerUnavailableError,
)
from .._protocol.checks import describe
from .._protocol.refusals import COMMAND, GIVE_UP, RELOAD, RESEND, SCRIPT
from .._protocol.scripts import SET_IFEQ, Script, owner_check, owner_check_command, script_command
from .._protocol.timing import lease_margin, renew_interval, retry_delay
from .refused import refused

if TYPE_CHECKING:
    from typing import Protocol

    class _Held(Protocol):
        """A claim handle as a keep-alive reads it: ``Claim`` or ``AsyncClaim``, by what it has.

        So this module imports neither driver, not even for the type checker.
        """

        key: str
        claim_key: str
        token: str
        lease: int
        _client: Any
        _native: Any
        _mine_until: float
        _keeper: Any
        _path: str | None

        @property
        def _extend_script(self) -> Script: ...

        def _not_renewed(self, now: float) -> ClaimLostError | ServerUnavailableError: ...

        def _scripting_refused(self, script: Script, cause: BaseException, unprobed: bool) -> GoblinClaimError: ...

    class Renewable(_Held, Protocol):
        """A sync handle: ``Claim``, which renews with ``_extend``."""

        def _extend(self, lease: int | None, persist: bool = True) -> None: ...

    class AsyncRenewable(_Held, Protocol):
        """An asyncio handle: ``AsyncClaim``, which renews with ``await _extend``."""

        async def _extend(self, lease: int | None, persist: bool = True) -> None: ...

    # What one renewal came to: renewed (True), not held (False), or a failure.
    Outcome = Union[bool, GoblinClaimError]  # noqa: UP007 -- a run-time alias on 3.10

__all__ = ["COALESCE", "AsyncKeepAlive", "KeepAlive", "lease_left", "lease_margin", "retry_delay", "stop_on_loss"]

T = TypeVar("T")

# Renewals due within this many seconds of each other go out together: a claim
# may be renewed this much early, so claims that entered at different moments
# fall into one pipeline and then stay together (each is rescheduled from its
# batch's send time).
COALESCE: Final = 0.02
# A lane thread with nothing to send for this long ends (a new one is made on demand).
_IDLE: Final = 10.0
# Why a keep-alive marked its claim lost, as ``ensure_held()`` and a stopped call's error say it.
GONE: Final = "a renewal found it gone (expired, deleted, or held by another token)"
LAPSED: Final = "no renewal succeeded before the lease ran out"
OVER: Final = "the lease is over by this handle's own clock (no renewal came in time: the process or its loop stalled)"


def _renewed(claims: Sequence[Renewable | AsyncRenewable]) -> list[tuple[str | bytes | int, ...]]:
    """The commands that renew ``claims`` to their full lease: ``SET ... IFEQ`` where the server has it, else EXTEND."""
    commands = []
    for c in claims:
        args = (c.claim_key, c.token, c.lease)
        check = owner_check(c._native, state_of(c._client).native, c._extend_script)
        commands.append(owner_check_command(check, args) if check else script_command(c._extend_script, args))
    return commands


def _again(
    keepers: Sequence[KeepAlive | AsyncKeepAlive], sent: Sequence[tuple[object, ...]], replies: list[object]
) -> list[int]:
    """The renewals to send again as the script's text: refused unrun, by the rule every call follows (``refused``).

    NOSCRIPT, or a ``SET ... IFEQ`` this server or user cannot take, or one refused
    under maxmemory: the extend script instead, with the same notices as the
    drivers'. A refusal to run the script takes its reply's place as the claim's
    error. Each keep-alive records the path its renewal took, for its event.
    """
    again = []
    noticed: set[tuple[str, str]] = set()
    for i, reply in enumerate(replies):
        keeper = keepers[i]
        # Inline, not path_of_sent: this runs for every renewal of every claim.
        owned = sent[i][0] == "SET"
        path = COMMAND if owned else SCRIPT
        if isinstance(reply, BaseException) and isinstance(reply, RESPONSE_ERRORS):  # the first test is the cheap one
            claim = keeper._claim
            state = state_of(claim._client)
            decision = refused(claim, state, SET_IFEQ if owned else SCRIPT, reply, noticed)
            if decision.action == RESEND or decision.action == RELOAD:
                again.append(i)
                path = decision.path
            elif decision.action == GIVE_UP:
                replies[i] = claim._scripting_refused(claim._extend_script, reply, state.unprobed)
        keeper._path = path
    return again


def _read(claim: Renewable | AsyncRenewable, reply: object) -> Outcome:
    """One renewal's reply: 1 or OK renewed, 0 or nil not held; an error reply becomes the driver's error.

    "Not held" is the handle's to weigh (``_not_renewed``): with ``replicas`` it is
    transient while the handle's own clock says the lease lasts.
    """
    if isinstance(reply, GoblinClaimError):  # a script this user may not run (``_again``)
        return reply
    if isinstance(reply, ERRORS):
        return translate(reply, claim.key, claim.claim_key)
    if reply:
        return True
    refused = claim._not_renewed(time.monotonic())
    return False if isinstance(refused, ClaimLostError) else refused


def _first_error(replies: Sequence[object]) -> BaseException | None:
    """The first error reply of a pipeline (READONLY from a demoted primary, say), if any."""
    return next((r for r in replies if isinstance(r, ERRORS)), None)


def _batch_failed(claims: Sequence[Renewable | AsyncRenewable], exc: BaseException) -> list[Outcome]:
    """Every claim's outcome when the whole round trip failed (a dropped connection, a timeout)."""
    return [translate(exc, c.key, c.claim_key) for c in claims]


class _Renewal:
    """What both keep-alives share.

    Attributes:
        interval: Seconds between renewals.
        lost: Set when a renewal found the claim gone, or could not be made
            before the lease lapsed; ``complete()`` then stores the result only
            if nobody claimed the key since.
        renewals: How many renewals succeeded.
    """

    def __init__(self, claim: Renewable | AsyncRenewable, interval: float | None) -> None:
        # renew_interval's default, a third of the lease, without its call: every first call makes one.
        self.interval = claim.lease / 3 if interval is None else renew_interval(claim.lease, interval, claim.key)
        self.lost = False
        self.renewals = 0
        self._stopped = False
        self._lease = claim.lease
        # When the lease is known to lapse (monotonic clock); set when renewing begins.
        self._deadline = math.inf
        # The last failed renewal's error (translated), for a look while debugging.
        self._error: GoblinClaimError | None = None
        # The owning call's trace context, so the renewer's events join that call (None: unobserved).
        self._context = None
        if _events.enabled:
            self._context = _events.owner()
            _events.track(self)
        self._why = ""  # why the claim was lost, once ``lost``
        # How the last renewal went to the server (see ``_again``), for its events; None: none sent yet.
        self._path: str | None = None

    @property
    def _margin(self) -> float:
        """How long before the lease's estimated lapse a renewal is given up (read when renewing only)."""
        return lease_margin(self._lease)

    def _lapsed(self) -> str:
        """Why a claim whose renewals never succeeded in time is lost: the last failure, if any."""
        return LAPSED if self._error is None else f"{LAPSED} (last failure: {self._error})"

    def _now(self) -> float:
        """The clock ``_deadline`` is on."""
        return time.monotonic()

    def _not_held(self, mine_until: float) -> str | None:
        """Why the claim is not held, by what this keep-alive knows (no round trip); ``None`` while it is.

        Lost (a renewal found it gone, or none succeeded in time), or past the lease
        the last successful renewal (or the claim) began, by the clock: a renewer that
        did not run in time (a frozen process, a stalled event loop) has not marked it
        yet. The handle's own clock (``mine_until``, monotonic) counts too, for an
        ``extend()`` sent meanwhile.
        """
        if self.lost:
            return self._why
        if self._now() < self._deadline or time.monotonic() < mine_until:
            return None
        return OVER


def lease_left(claim: Renewable | AsyncRenewable) -> float:
    """Seconds ``claim``'s lease has left, counted from before the claim was sent.

    Where the handle knows when that was (``_mine_until``, on the monotonic clock);
    else a whole lease.
    """
    held = claim._mine_until
    return min(claim.lease, held - time.monotonic()) if held > 0 else claim.lease


# --------------------------------------------------------------------------- sync


class KeepAlive(_Renewal):
    """Renews a ``Claim``'s lease from the process's renewer while the ``with`` block runs."""

    def __init__(self, claim: Renewable, interval: float | None = None, cancel_on_loss: bool = False) -> None:
        if type(cancel_on_loss) is not bool:
            raise InvalidArgumentTypeError(f"cancel_on_loss must be True or False, not {describe(cancel_on_loss)}")
        if cancel_on_loss:
            # A thread cannot be cancelled from outside: the work asks instead.
            raise InvalidArgumentError(
                "cancel_on_loss=True is for an asyncio handle's keep-alive (a task can be cancelled, a thread "
                "cannot): call claim.ensure_held() before each step that must not run without the claim",
                key=claim.key,
            )
        super().__init__(claim, interval)
        self._claim = claim
        self._number = -1
        # The heap time the scheduler acts on for this keep-alive; heap entries
        # with another time are stale and skipped.
        self._next = math.inf
        # True from hand-off to a lane until its reply is read: ``_next`` is then
        # the moment the renewal is given up.
        self._sending = False
        self._wire: _Lane | None = None  # the lane whose round trip carries this renewal

    def __enter__(self) -> KeepAlive:
        self._begin()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()

    def _begin(self) -> None:
        """Start renewing (once), counting a renewal that finds another holder as lost."""
        if self._number < 0:
            _RENEWER.add(self)
            self._claim._keeper = self  # what its ensure_held() goes by

    def _end(self) -> None:
        """Stop renewing; harmless when never begun or already ended (a lost claim is)."""
        if not self._stopped:
            self._stopped = True
            if self._number >= 0:
                _RENEWER.discard(self)


class _Lane:
    """One client's (or cluster node's) renewals: a thread sending them a pipeline at a time.

    Its fields are guarded by the renewer's lock, which its condition shares.
    """

    def __init__(self, key: tuple[int, str], client: Any, lock: threading.Lock) -> None:
        self.key = key
        self.client = client  # a standalone client, or a cluster node's connection
        self.wake = threading.Condition(lock)
        self.pending: list[KeepAlive] = []
        self.retired = False  # set aside, stuck on the wire; its thread ends when the reply comes


def _lane_target(claim: Renewable) -> tuple[tuple[int, str], Any]:
    """The lane ``claim``'s renewals take, and the client its pipelines go through.

    A cluster client's lanes are its nodes: a pipeline of keys on one node is one
    round trip, and a stalled node stalls only its own lane.
    """
    client = claim._client
    if isinstance(client, CLUSTERS):
        node = client.get_node_from_key(claim.claim_key)  # type: ignore[no-untyped-call, unused-ignore]
        connection = node_client(node)
        if connection is not None:
            return (id(client), node.name), connection
    return (id(client), ""), client


def _send_sync(client: Any, keepers: Sequence[KeepAlive]) -> list[Outcome]:
    """Renew the claims of ``keepers`` in one pipeline on ``client``, in order; nothing raised."""
    claims = [keeper._claim for keeper in keepers]
    try:
        commands = _renewed(claims)
        replies = _pipelined(client, commands)
        again = _again(keepers, commands, replies)
        if again:
            # A flushed or restarted server (or a refused SET): EVAL runs the script and caches it again.
            sources = [script_command(c._extend_script, (c.claim_key, c.token, c.lease), source=True) for c in claims]
            resent = _pipelined(client, [sources[i] for i in again])
            _again([keepers[i] for i in again], [sources[i] for i in again], resent)
            for i, reply in zip(again, resent, strict=True):
                replies[i] = reply
    except ERRORS as exc:
        failed(client, exc, claims[0].key, claims[0].claim_key)  # a demoted primary: reconnect for the next try
        return _batch_failed(claims, exc)
    except Exception as exc:  # a client of another make: still no reason to end the lane
        return [GoblinClaimError(f"cannot renew {c.key!r}: {exc!r}", key=c.key) for c in claims]
    error = _first_error(replies)
    if error is not None:
        failed(client, error, claims[0].key, claims[0].claim_key)
    outcomes = [_read(claim, reply) for claim, reply in zip(claims, replies, strict=True)]
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, GoblinClaimError) and isinstance(claims[i]._client, CLUSTERS):
            # MOVED, ASK (a slot migrating): the handle's own path follows redirections.
            outcomes[i] = _extend_one(claims[i])
            keepers[i]._path = claims[i]._path
    return outcomes


def _extend_one(claim: Renewable) -> Outcome:
    try:
        claim._extend(None, persist=False)  # once: this lane retries on its own clock
    except ClaimLostError:
        return False
    except GoblinClaimError as exc:
        return exc
    return True


def _pipelined(client: Any, commands: Sequence[tuple[str | bytes | int, ...]]) -> list[object]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[object] = pipe.execute(raise_on_error=False)
    return replies


class _Renewer:
    """One scheduler thread for every registered ``KeepAlive``, handing due renewals to lanes.

    The heap holds ``(time, number)`` pairs and ``live`` maps a number to its
    keep-alive; a pair acts only while its time is the keep-alive's ``_next``.
    At that time a keep-alive waiting for its tick is handed to its lane, and one
    whose renewal is still out (``_sending``) is lost. Leaving drops the
    keep-alive from ``live`` at once, so the claim and its handle die young;
    stale pairs are skipped when they come up, and the heap is rebuilt when they
    outnumber the live entries.

    A keep-alive begins in ``arrivals``, without the lock: the thread moves it to
    ``live`` and the heap when it next wakes, which it does before the keep-alive's
    first renewal is due (``add`` wakes it only when that is sooner than the time it
    sleeps to). One that ends first is taken back out of ``arrivals``: no lock, no
    heap entry, no thread switch. ``dict.popitem`` and ``dict.pop`` are atomic, so
    exactly one of the thread and ``discard`` takes each arrival.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, KeepAlive] = {}
        # Begun, not yet in the heap: written without the lock (see the class's docstring).
        self._arrivals: dict[int, KeepAlive] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._lanes: dict[tuple[int, str], _Lane] = {}
        # Lanes set aside while stuck on the wire, per lane key (at most one each).
        self._stuck: set[tuple[int, str]] = set()
        # The time the thread sleeps towards: it is woken only for an earlier
        # one, so a claim entering costs no thread switch (about once per interval).
        # -inf while it is awake (it takes every arrival before it sleeps again),
        # inf before it starts and while it sleeps with nothing to do.
        self._sleeping_until = math.inf

    def add(self, keeper: KeepAlive) -> None:
        """Begin renewing ``keeper``: its first renewal one interval from now."""
        now = time.monotonic()
        keeper._deadline = now + lease_left(keeper._claim)
        keeper._next = at = now + keeper.interval
        keeper._number = number = next(self._numbers)
        self._arrivals[number] = keeper  # put before the look at the thread's time: see _run
        if at < self._sleeping_until:
            try:
                self._rouse()
            except BaseException:
                self._arrivals.pop(number, None)
                raise

    def _rouse(self) -> None:
        """Start the thread, or wake it: an arrival is due before the time it sleeps to."""
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="goblin-claim renewer", daemon=True)
                thread.start()
                self._thread = thread
            self._sleeping_until = -math.inf  # woken: later arrivals need not wake it again
            self._wake.notify()

    def discard(self, keeper: KeepAlive) -> None:
        keeper._stopped = True
        if self._arrivals.pop(keeper._number, None) is None:  # taken into the heap meanwhile
            with self._lock:
                self._live.pop(keeper._number, None)

    def _take_arrivals(self) -> bool:
        """Move the keep-alives begun since the last look into ``live`` and the heap (lock held)."""
        arrivals = self._arrivals
        taken = False
        while arrivals:
            try:
                number, keeper = arrivals.popitem()
            except KeyError:  # ended meanwhile, taken back by discard()
                break
            taken = True
            self._live[number] = keeper
            heapq.heappush(self._heap, (keeper._next, number))
        if taken and len(self._heap) > 64 and len(self._heap) > 3 * len(self._live):
            self._heap = [e for e in self._heap if (k := self._live.get(e[1])) is not None and k._next == e[0]]
            heapq.heapify(self._heap)
        return taken

    def _push(self, keeper: KeepAlive, at: float) -> None:
        """Act on ``keeper`` at ``at`` (lock held), waking the scheduler if that is sooner."""
        keeper._next = at
        heapq.heappush(self._heap, (at, keeper._number))
        if at < self._sleeping_until:
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while True:
                self._sleeping_until = -math.inf  # awake: nobody needs to wake it
                now = time.monotonic()
                early: list[tuple[float, int]] = []
                while self._heap and self._heap[0][0] <= now + COALESCE:
                    at, number = heapq.heappop(self._heap)
                    keeper = self._live.get(number)
                    if keeper is None or keeper._next != at:
                        continue  # left or rescheduled
                    if not keeper._sending:
                        self._hand_off(keeper, now)
                    elif at > now:
                        early.append((at, number))  # a give-up is never brought forward
                    else:
                        self._give_up(keeper)
                for entry in early:
                    heapq.heappush(self._heap, entry)
                wake = self._heap[0][0] if self._heap else math.inf
                # An arrival that saw -inf was put before this line and is taken
                # just below; one that sees ``wake`` wakes the thread if sooner.
                self._sleeping_until = wake
                if self._take_arrivals():
                    continue  # their first renewals may come before ``wake``
                self._wake.wait(None if wake == math.inf else wake - now)

    def _hand_off(self, keeper: KeepAlive, now: float) -> None:
        """Queue ``keeper``'s renewal on its lane; give it up at its lease's end (lock held)."""
        claim = keeper._claim
        try:
            key, client = _lane_target(claim)
            lane = self._lanes.get(key)
            if lane is None:
                lane = _Lane(key, client, self._lock)
                thread = threading.Thread(target=self._work, args=(lane,), name="goblin-claim renewal lane")
                thread.daemon = True
                thread.start()
                self._lanes[key] = lane
        except ERRORS as exc:  # no node covers the slot now
            self._settle(keeper, translate(exc, claim.key, claim.claim_key), now, now)
            return
        except Exception as exc:  # no thread to be had: the scheduler must live on, and retry
            self._settle(keeper, GoblinClaimError(f"cannot renew {claim.key!r} now: {exc}", key=claim.key), now, now)
            return
        keeper._sending = True
        keeper._next = keeper._deadline - keeper._margin
        heapq.heappush(self._heap, (keeper._next, keeper._number))
        lane.pending.append(keeper)
        lane.wake.notify()

    def _give_up(self, keeper: KeepAlive) -> None:
        """The lease lapsed while ``keeper``'s renewal was still out: lost (lock held)."""
        self._lose(keeper, keeper._lapsed())
        lane = keeper._wire
        if lane is not None and not lane.retired and lane.key not in self._stuck:
            # Stuck on the wire for a whole lease: later renewals take a new connection.
            lane.retired = True
            self._stuck.add(lane.key)
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]
            for waiting in lane.pending:
                waiting._sending = False
                self._push(waiting, time.monotonic())
            lane.pending = []

    def _work(self, lane: _Lane) -> None:
        """A lane's thread: send what is pending, one pipeline at a time, until idle."""
        with self._wake:
            while True:
                while not lane.pending and not lane.retired:
                    if not lane.wake.wait(_IDLE) and not lane.pending:
                        if self._lanes.get(lane.key) is lane:
                            del self._lanes[lane.key]
                        return
                if lane.retired and not lane.pending:
                    return
                # Left or lost while queued: nothing to renew.
                batch = [k for k in lane.pending if k._sending and self._live.get(k._number) is k]
                lane.pending = []
                if not batch:
                    continue
                for keeper in batch:
                    keeper._wire = lane
                sent_at = time.monotonic()
                self._lock.release()
                try:
                    outcomes = _send_sync(lane.client, batch)
                finally:
                    self._lock.acquire()
                now = time.monotonic()
                for keeper, outcome in zip(batch, outcomes, strict=True):
                    keeper._wire = None
                    if keeper._sending and self._live.get(keeper._number) is keeper:
                        self._settle(keeper, outcome, sent_at, now)
                if lane.retired:
                    self._stuck.discard(lane.key)
                    for waiting in lane.pending:  # none expected: retiring moved them
                        waiting._sending = False
                        self._push(waiting, now)
                    return

    def _settle(self, keeper: KeepAlive, outcome: Outcome, sent_at: float, now: float) -> None:
        """Act on one renewal's outcome (lock held)."""
        keeper._sending = False
        if outcome is True:
            keeper.renewals += 1
            keeper._deadline = sent_at + keeper._claim.lease
            self._push(keeper, sent_at + keeper.interval)
            if _events.enabled:
                _events.renewal(keeper._claim, "claimed", now - sent_at, keeper._context, None, keeper._path)
        elif outcome is False:
            self._lose(keeper, GONE)
        else:
            keeper._error = outcome
            left = keeper._deadline - keeper._margin - now
            if left <= 0:
                self._lose(keeper, keeper._lapsed())  # failed until the lease ran out
            else:
                self._push(keeper, now + retry_delay(keeper.interval, left))
                _events.renewal(keeper._claim, "unavailable", now - sent_at, keeper._context, outcome, keeper._path)

    def _lose(self, keeper: KeepAlive, why: str) -> None:
        """Mark ``keeper`` lost (``why``) and renew it no more (lock held).

        The event goes out first: whoever sees ``lost`` finds the loss already reported.
        """
        keeper._stopped = True
        self._live.pop(keeper._number, None)
        _events.renewal(keeper._claim, "lease_lost", None, keeper._context, keeper._error, keeper._path)
        keeper._why = why
        keeper.lost = True


_RENEWER = _Renewer()


def _renewer() -> _Renewer:
    return _RENEWER


def _new_renewer() -> None:
    # A forked child has no renewer or lane threads and must not share its parent's heap.
    global _RENEWER
    _RENEWER = _Renewer()
    _ASYNC_LANES.clear()


# --------------------------------------------------------------------------- asyncio


class _AsyncBatch:
    """The renewals of one lane due in one loop iteration: one task, one pipeline."""

    def __init__(self, keepers: list[AsyncKeepAlive]) -> None:
        self.keepers = keepers
        self.members = set(keepers)  # those still waiting for it
        self.task: asyncio.Task[None] | None = None
        self.guard: asyncio.TimerHandle | None = None  # the give-up at the earliest lease's end

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send it, and give each renewal up on time at its lease's end whatever the send does meanwhile.

        One timer for the batch, at the earliest lease's end: it marks lost, in the
        timer's own callback, those past theirs, so a loop that comes back from a stall
        runs it before the work's next step (the send's own timeout takes a turn more).
        """
        self.task = loop.create_task(self.run(loop), name=f"goblin-claim renewal of {len(self.keepers)} claims")
        self._guard_next(loop)

    def _guard_next(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = [k._deadline - k._margin for k in self.keepers if k._batch is self and not k._stopped]
        self.guard = loop.call_at(min(waiting), self._give_up, loop) if waiting else None

    def _give_up(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for keeper in self.keepers:
            if keeper._batch is self and not keeper._stopped and now >= keeper._deadline - keeper._margin:
                keeper._lose(keeper._lapsed(), None)
        self._guard_next(loop)

    async def run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await self._run(loop)
        finally:
            if self.guard is not None:
                self.guard.cancel()
                self.guard = None

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        keepers = [k for k in self.keepers if not k._stopped]
        for keeper in [k for k in keepers if now >= k._deadline - k._margin]:
            keeper._settle(None, now, now)  # no lease left to renew in
        keepers = [k for k in keepers if not k._stopped]
        if not keepers:
            return
        # Bounded by the shortest lease left in the batch: no renewal outlives its lease.
        budget = min(k._deadline - k._margin for k in keepers) - now
        outcomes: Sequence[Outcome | None]
        try:
            outcomes = await asyncio.wait_for(_send_async(keepers), budget)
        except asyncio.TimeoutError:
            # redis-py disconnects a connection whose read was cancelled, so the
            # late reply is never read as the answer to another command.
            outcomes = [None] * len(keepers)
        done = loop.time()
        for keeper, outcome in zip(keepers, outcomes, strict=True):
            keeper._settle(outcome, now, done)


async def _send_async(keepers: Sequence[AsyncKeepAlive]) -> list[Outcome]:
    """Renew the claims of ``keepers`` (all of one client, one node) in one pipeline, in order; nothing raised."""
    claims = [keeper._claim for keeper in keepers]
    client = claims[0]._client
    try:
        commands = _renewed(claims)
        replies = await _pipelined_async(client, commands)
        again = _again(keepers, commands, replies)
        if again:
            # A flushed or restarted server (or a refused SET): EVAL runs the script and caches it again.
            sources = [script_command(c._extend_script, (c.claim_key, c.token, c.lease), source=True) for c in claims]
            resent = await _pipelined_async(client, [sources[i] for i in again])
            _again([keepers[i] for i in again], [sources[i] for i in again], resent)
            for i, reply in zip(again, resent, strict=True):
                replies[i] = reply
    except ERRORS as exc:
        await failed_async(client, exc, claims[0].key, claims[0].claim_key)  # a demoted primary: reconnect
        return _batch_failed(claims, exc)
    except Exception as exc:  # a client of another make: the claims must still be rescheduled
        return [GoblinClaimError(f"cannot renew {c.key!r}: {exc!r}", key=c.key) for c in claims]
    error = _first_error(replies)
    if error is not None:
        await failed_async(client, error, claims[0].key, claims[0].claim_key)
    outcomes = [_read(claim, reply) for claim, reply in zip(claims, replies, strict=True)]
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, GoblinClaimError) and isinstance(client, ASYNC_CLUSTERS):
            # MOVED, ASK (a slot migrating): the handle's own path follows redirections.
            outcomes[i] = await _extend_one_async(claims[i])
            keepers[i]._path = claims[i]._path
    return outcomes


async def _extend_one_async(claim: AsyncRenewable) -> Outcome:
    try:
        await claim._extend(None, persist=False)
    except ClaimLostError:
        return False
    except GoblinClaimError as exc:
        return exc
    return True


async def _pipelined_async(client: Any, commands: Sequence[tuple[str | bytes | int, ...]]) -> list[object]:
    # On a cluster the pipeline routes each command by its key; a batch holds one node's keys.
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[object] = await pipe.execute(raise_on_error=False)
    return replies


def _async_lane_key(claim: AsyncRenewable) -> tuple[int, str]:
    client = claim._client
    if isinstance(client, ASYNC_CLUSTERS):
        try:
            node = client.get_node_from_key(claim.claim_key)
        except ERRORS:
            node = None
        if node is not None:
            return id(client), node.name
    return id(client), ""


class _AsyncLanes:
    """One event loop's renewals being gathered: per lane, the keep-alives due this iteration."""

    # No reference to the loop itself: the loop is this object's weak key.
    def __init__(self) -> None:
        self.gathering: dict[tuple[int, str], list[AsyncKeepAlive]] = {}

    def due(self, keeper: AsyncKeepAlive, loop: asyncio.AbstractEventLoop) -> None:
        key = _async_lane_key(keeper._claim)
        batch = self.gathering.get(key)
        if batch is None:
            # Timers due in this iteration all run before this callback does.
            self.gathering[key] = batch = []
            loop.call_soon(self.flush, key, loop)
        batch.append(keeper)

    def flush(self, key: tuple[int, str], loop: asyncio.AbstractEventLoop) -> None:
        keepers = [k for k in self.gathering.pop(key) if not k._stopped]
        if not keepers:
            return
        batch = _AsyncBatch(keepers)
        for keeper in keepers:
            keeper._batch = batch
        batch.start(loop)


_ASYNC_LANES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncLanes] = weakref.WeakKeyDictionary()


def _async_lanes(loop: asyncio.AbstractEventLoop) -> _AsyncLanes:
    lanes = _ASYNC_LANES.get(loop)
    if lanes is None:
        lanes = _ASYNC_LANES[loop] = _AsyncLanes()
    return lanes


os.register_at_fork(after_in_child=_new_renewer)


def _on_grid(at: float) -> float:
    """``at`` brought forward to the coalescing grid, so timers due together fire together."""
    return math.floor(at / COALESCE) * COALESCE


class AsyncKeepAlive(_Renewal):
    """Renews an ``AsyncClaim``'s lease from its event loop while the ``async with`` block runs.

    With ``cancel_on_loss``, a loss cancels the task running the block, which then
    raises ``ClaimLostError`` instead of the ``CancelledError`` (``stop_on_loss`` does
    the same for one awaitable, telling a loss from an outside cancellation on every
    Python: see there).
    """

    def __init__(self, claim: AsyncRenewable, interval: float | None = None, cancel_on_loss: bool = False) -> None:
        if type(cancel_on_loss) is not bool:
            raise InvalidArgumentTypeError(f"cancel_on_loss must be True or False, not {describe(cancel_on_loss)}")
        super().__init__(claim, interval)
        self._claim = claim
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None  # the next renewal's
        self._batch: _AsyncBatch | None = None
        self._cancelled: asyncio.Task[None] | None = None  # a batch task this keep-alive ended
        self._cancel_on_loss = cancel_on_loss
        # The task a loss cancels while the work runs (armed), its count of cancellation
        # requests then (3.11+), and whether a loss cancelled it.
        self._work: asyncio.Task[Any] | None = None
        self._counted = 0
        self._sent = False
        # The work was stopped by a loss: its caller was given ClaimLostError for the CancelledError.
        self._stopped_work = False

    async def __aenter__(self) -> AsyncKeepAlive:
        self._begin()
        if self._cancel_on_loss:
            task = asyncio.current_task()
            if task is not None:
                self._arm(task)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()
        stopped = self._disarm(exc) if self._cancel_on_loss else None
        task = self._cancelled
        if task is not None and not task.done():
            # gather() reports the renewal's own cancellation as a value, while a
            # cancellation of the task running this block still propagates.
            await asyncio.gather(task, return_exceptions=True)
        if stopped is not None:
            raise stopped from exc

    def _begin(self) -> None:
        """Start renewing, once; runs in the event loop's thread."""
        if self._loop is None:
            self._loop = loop = asyncio.get_running_loop()
            now = loop.time()
            self._deadline = now + lease_left(self._claim)  # the loop's clock need not be the monotonic one
            self._timer = loop.call_at(_on_grid(now + self.interval), self._due)
            self._claim._keeper = self  # what its ensure_held() goes by

    def _end(self) -> None:
        """Stop renewing without waiting; a renewal on the wire for this claim alone is cancelled."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        batch = self._batch
        if batch is not None:
            batch.members.discard(self)
            task = batch.task
            if not batch.members and task is not None and not task.done():
                task.cancel()  # redis-py drops the connection of a cancelled read
                self._cancelled = task

    def _now(self) -> float:
        loop = self._loop
        return time.monotonic() if loop is None else loop.time()

    def _due(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        if self._stopped:
            return
        if loop.time() >= self._deadline - self._margin:
            # Come too late to renew in (the loop stalled, the process was frozen): lost now,
            # before the work's own callbacks of this turn run on.
            self._lose(self._lapsed(), None)
            return
        _async_lanes(loop).due(self, loop)  # its batch gives it up on time at the lease's end

    def _settle(self, outcome: Outcome | None, sent_at: float, now: float) -> None:
        """Act on one renewal's outcome; ``None``: given up, the lease left ran out."""
        self._batch = None
        if self._stopped or self._loop is None:
            return
        if outcome is True:
            self.renewals += 1
            self._deadline = sent_at + self._claim.lease
            at = sent_at + self.interval
            if _events.enabled:
                _events.renewal(self._claim, "claimed", now - sent_at, self._context, None, self._path)
        elif outcome is False:
            self._lose(GONE, now - sent_at)
            return
        else:
            if outcome is not None:
                self._error = outcome
            left = self._deadline - self._margin - now
            if left <= 0:
                self._lose(self._lapsed(), None)
                return
            at = now + retry_delay(self.interval, left)
            _events.renewal(self._claim, "unavailable", now - sent_at, self._context, self._error, self._path)
        self._timer = self._loop.call_at(_on_grid(at), self._due)

    def _lose(self, why: str, duration: float | None) -> None:
        """Mark the claim lost (``why``), renew it no more, and cancel the work armed, if any.

        The event goes out first: whoever sees ``lost`` finds the loss already reported.
        """
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # A renewal that found the claim gone reports no error; one given up, its last failure.
        error = None if why is GONE else self._error
        _events.renewal(self._claim, "lease_lost", duration, self._context, error, self._path)
        self._why = why
        self.lost = True
        self._cancel_work()

    # -- stopping the work

    def _arm(self, task: asyncio.Task[Any]) -> None:
        """From now on a loss cancels ``task`` (once)."""
        self._work = task
        if sys.version_info >= (3, 11):  # its count of cancellation requests (see stop_on_loss)
            self._counted = task.cancelling()
        self._sent = False
        if self.lost:
            self._cancel_work()

    def _cancel_work(self) -> None:
        task = self._work
        if task is not None and not self._sent and not task.done():
            self._sent = True
            task.cancel()

    def _disarm(self, exc: BaseException | None) -> ClaimLostError | None:
        """The work ended (raising ``exc``, or not): a loss cancels nothing more.

        Returns the error its caller gets instead of ``exc`` when a loss stopped it:
        ``None`` when no loss cancelled it, when it ended as if nothing happened (it
        caught the cancellation), or when a cancellation from outside came too, which
        wins (Python 3.11+: the task's count of requests, less this one, shows it;
        3.10 cannot tell within one loop turn, see ``stop_on_loss``).
        """
        task, sent = self._work, self._sent
        self._work, self._sent = None, False
        if task is None or not sent:
            return None
        if sys.version_info >= (3, 11):
            task.uncancel()
            if task.cancelling() > self._counted:
                return None
        if exc is None:
            return None
        self._stopped_work = True
        claim = self._claim
        return ClaimLostError(
            f"the work on {claim.key!r} was cancelled, token {claim.token!r} having lost its claim: {self._why}",
            key=claim.key,
        )


async def stop_on_loss(keeper: AsyncKeepAlive, work: Awaitable[T]) -> T:
    """Await ``work`` while ``keeper`` renews its claim: a loss cancels it, and raises ``ClaimLostError``.

    The work sees ``CancelledError`` at the await it is suspended in; the caller gets
    ``ClaimLostError`` (``keeper._stopped_work`` says so). A cancellation from outside
    stays ``CancelledError``, also one that comes in the same loop turn as the loss:
    it wins. On Python 3.11+ the work runs in the caller's task, whose count of
    cancellation requests tells the two apart. Python 3.10 has no such count (two
    requests made before the task runs again reach it as one ``CancelledError``), so
    there the work runs in a task of its own, which only the loss cancels.
    """
    if sys.version_info < (3, 11):
        return await _in_a_task_of_its_own(keeper, work)
    task = asyncio.current_task()
    assert task is not None
    keeper._arm(task)
    try:
        result = await work
    except BaseException as exc:
        stopped = keeper._disarm(exc)
        if stopped is None:
            raise
        raise stopped from exc
    keeper._disarm(None)
    return result


async def _in_a_task_of_its_own(keeper: AsyncKeepAlive, work: Awaitable[T]) -> T:
    """``stop_on_loss`` on Python 3.10: the work in a task a loss cancels, the caller's cancellation kept apart.

    The task is made here, so it sees the caller's context variables (a copy, as
    every task does).
    """
    child = asyncio.ensure_future(work)
    keeper._arm(child)
    outside: asyncio.CancelledError | None = None
    while not child.done():
        try:
            await asyncio.wait((child,))
        except asyncio.CancelledError as exc:
            outside = exc  # the caller is cancelled: so is the work, waited for to its end
            child.cancel()
    try:
        result = child.result()
    except BaseException as exc:  # its own error, or its cancellation
        if outside is not None:
            keeper._disarm(None)
            raise outside from None
        stopped = keeper._disarm(exc)
        if stopped is not None:
            raise stopped from exc
        raise  # its own error, or a cancellation by someone else (itself): as in the caller's own task
    keeper._disarm(None)
    if outside is not None:
        # The work returned as its caller was cancelled: the result goes on to be kept, and the
        # cancellation is delivered again at the caller's next await, as in the caller's own task.
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
    return result
