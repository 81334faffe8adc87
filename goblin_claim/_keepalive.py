"""Lease renewal while work runs: a daemon thread (sync) or a task (asyncio).

Both renew every ``interval`` seconds (about a third of the lease by default),
stop when their block exits, and stop and set ``lost`` when a renewal finds the
claim no longer held; a transient failure (a dropped connection) is retried at
the next tick rather than raised into the void.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from ._core import renew_interval
from ._errors import ClaimLostError, GoblinClaimError

if TYPE_CHECKING:
    from ._async import AsyncClaim
    from ._sync import Claim

__all__ = ["AsyncKeepAlive", "KeepAlive"]


class _Renewer:
    """What both keep-alives share.

    Attributes:
        interval: Seconds between renewals.
        lost: Set when a renewal found the claim gone; ``complete()`` will then
            raise ``ClaimLostError``.
        renewals: How many renewals succeeded.
    """

    def __init__(self, claim: Claim | AsyncClaim, interval: float | None) -> None:
        self.interval = renew_interval(claim.lease, interval, claim.key)
        self.lost = False
        self.renewals = 0


class KeepAlive(_Renewer):
    """Renews a ``Claim``'s lease from a daemon thread while the ``with`` block runs."""

    def __init__(self, claim: Claim, interval: float | None = None) -> None:
        super().__init__(claim, interval)
        self._claim = claim
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> KeepAlive:
        self._thread = threading.Thread(
            target=self._run, name=f"goblin-claim keep-alive {self._claim.key}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._claim.extend()
            except ClaimLostError:
                self.lost = True
                return
            except GoblinClaimError:
                continue  # transient: the next tick tries again while the lease lasts
            self.renewals += 1


class AsyncKeepAlive(_Renewer):
    """Renews an ``AsyncClaim``'s lease from a task while the ``async with`` block runs."""

    def __init__(self, claim: AsyncClaim, interval: float | None = None) -> None:
        super().__init__(claim, interval)
        self._claim = claim
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncKeepAlive:
        self._task = asyncio.create_task(self._run(), name=f"goblin-claim keep-alive {self._claim.key}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            # gather() reports the task's own cancellation as a value, while a
            # cancellation of the task running this block still propagates.
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._claim.extend()
            except ClaimLostError:
                self.lost = True
                return
            except GoblinClaimError:
                continue
            self.renewals += 1
