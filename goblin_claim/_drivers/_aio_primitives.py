"""What the asyncio flavour does that the generator cannot derive: its twin is ``_sync_primitives.py``.

``tools/unasync.py`` makes each sync module from its asyncio source by rules that
know no line of the source; what differs in more than a word lives here, under
the same names as in the sync flavour's module, so a source imports it from here
and its generated twin from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from .keepalive import AsyncKeepAlive, stop_on_loss
from .wakeup import async_wakeups as wakeups

__all__ = [
    "CANCELLED",
    "CLIENT_KIND",
    "OTHER_DOOR",
    "load_commands",
    "raise_if_cancelled",
    "sleep",
    "until_lost",
    "wakeups",
]

T = TypeVar("T")

# What a round trip cut short by the caller raises: an asyncio task's cancellation.
CANCELLED: tuple[type[BaseException], ...] = (asyncio.CancelledError,)
# What ``client_kind`` answers for a client of this flavour, and what its doors tell a client of the other kind.
CLIENT_KIND = True
OTHER_DOOR = "an HTTP door under ASGI awaits its client: pass an asyncio one (a sync client is for WSGI)"


async def sleep(woken: asyncio.Event | None, delay: float) -> None:
    """Sleep ``delay`` seconds, or until ``woken`` is set.

    ``asyncio.wait``, not ``wait_for``: before Python 3.12 a ``wait_for`` whose inner
    wait finishes just as the caller is cancelled returns, and the cancellation is lost.
    """
    if woken is None:
        await asyncio.sleep(delay)
    else:
        waiter = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait((waiter,), timeout=delay)
        finally:
            waiter.cancel()


def raise_if_cancelled() -> None:
    """Raise the cancellation a round trip swallowed: the task was cancelled and goes on.

    Before Python 3.12, a ``wait_for`` inside the client library (redis-py's send)
    whose inner read finishes just as the task is cancelled returns, and the
    cancellation is lost; the task still counts it (``cancelling()``, 3.11+). A loop
    that polls for seconds asks before it sleeps, so a cancelled ``wait()`` stops.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


async def load_commands(cluster: Any) -> None:
    """Load a cluster client's command table: the asyncio client reads it on first use."""
    await cluster.initialize()


def until_lost(keeper: AsyncKeepAlive | None, work: Awaitable[T]) -> Awaitable[T]:
    """``work``, cancelled when ``keeper``'s claim is lost (the caller then gets ``ClaimLostError``)."""
    return work if keeper is None else stop_on_loss(keeper, work)
