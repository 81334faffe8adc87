"""What the sync flavour does that the generator cannot derive: its twin is ``_aio_primitives.py``.

The generated sync modules import from here what their asyncio sources import
from there, under the same names.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypeVar

from .keepalive import KeepAlive
from .wakeup import wakeups

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

# What a round trip cut short by the caller raises: nothing, a thread is not cancelled
# (a KeyboardInterrupt is the drivers' own to handle, as any BaseException).
CANCELLED: tuple[type[BaseException], ...] = ()
# What ``client_kind`` answers for a client of this flavour, and what its doors tell a client of the other kind.
CLIENT_KIND = False
OTHER_DOOR = "an HTTP door under WSGI calls its client in threads: pass a sync one (an asyncio client is for ASGI)"


def sleep(woken: threading.Event | None, delay: float) -> None:
    """Sleep ``delay`` seconds, or until ``woken`` is set."""
    if woken is None:
        time.sleep(delay)
    else:
        woken.wait(delay)


def raise_if_cancelled() -> None:
    """Nothing to raise: a thread is not cancelled."""


def load_commands(cluster: Any) -> None:
    """Load a cluster client's command table: the sync client read it when it was made."""


def until_lost(keeper: KeepAlive | None, result: T) -> T:
    """What the work returned: a thread is not cancelled when its claim is lost; it asks (``ensure_held()``)."""
    return result
