"""Points a test holds a process at, once per id, to kill it or the server under it there.

The test arms ``<point>`` for an id by creating ``<TRIAL_DIR>/<point>-<id>.armed``. The
first process to reach an armed point disarms it (a rename: one process wins), writes
its process id to ``<point>-<id>.pid``, and, at a point it holds, stays there until the
test creates ``<point>-<id>.go`` (or ``HOLD`` seconds pass, so a test that failed never
leaves it behind). An unarmed point costs one failed rename.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD = 60.0


def _base(point: str, key: str) -> str:
    return str(Path(os.environ["TRIAL_DIR"]) / f"{point}-{key}")


def reached(point: str, key: str) -> bool:
    """If ``point`` is armed for ``key``, disarm it and leave this process's id for the test; whether it was."""
    base = _base(point, key)
    try:
        os.rename(f"{base}.armed", f"{base}.taken")
    except FileNotFoundError:
        return False
    Path(f"{base}.tmp").write_text(str(os.getpid()))
    os.replace(f"{base}.tmp", f"{base}.pid")  # whole, or not there: the test never reads half an id
    return True


def hold(point: str, key: str) -> None:
    """At an armed ``point``: stay until the test lets the process go (``<point>-<id>.go``), or ``HOLD`` seconds."""
    if not reached(point, key):
        return
    go = Path(f"{_base(point, key)}.go")
    deadline = time.monotonic() + HOLD
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
