"""Lease renewal while work runs, at no thread or task per claim.

Sync claims share one daemon thread per process that keeps a deadline heap of
the leases it renews; asyncio claims use their event loop's own timer heap
(``loop.call_at``), one timer per claim, and spend a task only while a renewal
is on the wire. Entering or leaving a keep-alive costs a few microseconds: a
heap push and a flag (sync), a timer scheduled and cancelled (asyncio).

Every ``interval`` seconds (a third of the lease by default) each claim is
extended. A renewal that finds the claim no longer held stops and sets ``lost``;
a transient failure (a dropped connection) is retried at the next tick rather
than raised into the void.

Sync ``@idempotent`` begins its keep-alive while the claim is still on the
wire, so the registration costs no time of its own; until the claim is known to
be held (armed), a renewal that finds another holder is no loss, only too early.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from ._core import renew_interval
from ._errors import ClaimLostError, GoblinClaimError

if TYPE_CHECKING:
    from ._async import AsyncClaim
    from ._sync import Claim

__all__ = ["AsyncKeepAlive", "KeepAlive"]


class _Renewal:
    """What both keep-alives share.

    Attributes:
        interval: Seconds between renewals.
        lost: Set when a renewal found the claim gone; ``complete()`` then stores
            the result only if nobody claimed the key since.
        renewals: How many renewals succeeded.
    """

    def __init__(self, claim: Claim | AsyncClaim, interval: float | None) -> None:
        self.interval = renew_interval(claim.lease, interval, claim.key)
        self.lost = False
        self.renewals = 0
        self._stopped = False


class KeepAlive(_Renewal):
    """Renews a ``Claim``'s lease from the process's renewer thread while the ``with`` block runs."""

    def __init__(self, claim: Claim, interval: float | None = None) -> None:
        super().__init__(claim, interval)
        self._claim = claim
        self._number = -1
        # False while the claim may not be held yet (``_early``): a renewal that
        # finds another holder then means nothing.
        self._armed = True

    def __enter__(self) -> KeepAlive:
        self._begin()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()

    def _begin(self, armed: bool = True) -> None:
        """Start renewing (once), counting a renewal that finds another holder as lost."""
        self._armed = armed
        if self._number < 0:
            _renewer().add(self)

    def _early(self) -> None:
        """Start renewing while the claim is on the wire, unarmed until ``_begin``.

        What @idempotent runs there: registering then costs the caller no time of its own.
        """
        self._begin(armed=False)

    def _end(self) -> None:
        """Stop renewing; harmless when never begun or already ended (a lost claim is)."""
        if not self._stopped:
            self._stopped = True
            if self._number >= 0:
                _renewer().discard(self)

    def _renew(self) -> bool:
        """One renewal, on the renewer thread; whether to renew again."""
        try:
            self._claim.extend()
        except ClaimLostError:
            if not self._armed:
                return True  # not this handle's claim yet: the next tick looks again
            self.lost = True
            return False
        except GoblinClaimError:
            return True  # transient: the next tick tries again while the lease lasts
        self.renewals += 1
        return True


class _Renewer:
    """One daemon thread renewing every registered ``KeepAlive`` at its deadline.

    The heap holds ``(deadline, number)`` pairs and ``live`` maps a number to its
    keep-alive. Leaving drops the keep-alive from ``live`` at once, so the claim
    and its handle die young (nothing for the garbage collector to promote); the
    pair left in the heap is skipped when it comes up, and the heap is rebuilt
    when such leftovers outnumber the live entries.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, KeepAlive] = {}
        self._numbers = itertools.count()
        self._wake = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        # The deadline the thread sleeps towards: it is woken only for an earlier
        # one, so a claim entering costs no thread switch (about once per interval).
        self._sleeping_until = float("inf")

    def add(self, keeper: KeepAlive) -> None:
        deadline = time.monotonic() + keeper.interval
        with self._wake:
            keeper._number = number = next(self._numbers)
            self._live[number] = keeper
            heapq.heappush(self._heap, (deadline, number))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="goblin-claim renewer", daemon=True)
                self._thread.start()
            elif deadline < self._sleeping_until:
                self._wake.notify()
            elif len(self._heap) > 64 and len(self._heap) > 2 * len(self._live):
                self._heap = [entry for entry in self._heap if entry[1] in self._live]
                heapq.heapify(self._heap)

    def discard(self, keeper: KeepAlive) -> None:
        keeper._stopped = True
        with self._wake:
            self._live.pop(keeper._number, None)

    def _next_due(self) -> KeepAlive:
        with self._wake:
            while True:
                if not self._heap:
                    self._sleeping_until = float("inf")
                    self._wake.wait()
                    continue
                deadline, number = self._heap[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    # Left-over pairs are not popped early: sleeping towards one costs
                    # nothing, while an empty heap would need a wake-up for the next claim.
                    self._sleeping_until = deadline
                    self._wake.wait(delay)
                    continue
                heapq.heappop(self._heap)
                keeper = self._live.get(number)
                if keeper is not None:
                    self._sleeping_until = float("-inf")  # awake: nobody needs to wake it
                    return keeper

    def _run(self) -> None:
        while True:
            keeper = self._next_due()
            # Outside the lock: a slow renewal must not block claims entering or leaving.
            if keeper._renew() and not keeper._stopped:
                with self._wake:
                    if keeper._number in self._live:
                        heapq.heappush(self._heap, (time.monotonic() + keeper.interval, keeper._number))
            elif not keeper._stopped:
                self.discard(keeper)  # lost: nothing more to renew


_RENEWER = _Renewer()


def _renewer() -> _Renewer:
    return _RENEWER


def _new_renewer() -> None:
    # A forked child has no renewer thread and must not share its parent's heap.
    global _RENEWER
    _RENEWER = _Renewer()


os.register_at_fork(after_in_child=_new_renewer)


class AsyncKeepAlive(_Renewal):
    """Renews an ``AsyncClaim``'s lease from its event loop's timers while the ``async with`` block runs."""

    def __init__(self, claim: AsyncClaim, interval: float | None = None) -> None:
        super().__init__(claim, interval)
        self._claim = claim
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncKeepAlive:
        self._begin()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end()
        task = self._task
        if task is not None and not task.done():
            # gather() reports the renewal's own cancellation as a value, while a
            # cancellation of the task running this block still propagates.
            await asyncio.gather(task, return_exceptions=True)

    # Nothing while the claim is on the wire: the event loop runs other tasks then,
    # so registering early would hide nothing; it begins once the claim is held,
    # and so never needs to be unarmed.
    _early = None

    def _begin(self) -> None:
        """Start renewing, once; runs in the event loop's thread."""
        if self._loop is None:
            self._loop = loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + self.interval, self._due)

    def _end(self) -> None:
        """Stop renewing without waiting: a renewal on the wire is cancelled (its connection is dropped)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    def _due(self) -> None:
        assert self._loop is not None
        self._task = self._loop.create_task(self._renew(), name=f"goblin-claim renewal {self._claim.key}")

    async def _renew(self) -> None:
        try:
            await self._claim.extend()
        except ClaimLostError:
            self.lost = True
            return
        except GoblinClaimError:
            pass  # transient: the next tick tries again while the lease lasts
        else:
            self.renewals += 1
        if not self._stopped and self._loop is not None:
            self._timer = self._loop.call_at(self._loop.time() + self.interval, self._due)
