"""The CLI run in process, and a server's URL for it."""

from __future__ import annotations

import io
from typing import Any

from goblin_claim._cli.main import main
from tests.support import servers


def run(*argv: str, out: Any = None) -> tuple[int, str]:
    """``goblin-claim argv...`` in process: the exit status and what it printed (to ``out`` if given)."""
    out = out if out is not None else io.StringIO()
    status = main(list(argv), out=out)
    return status, out.getvalue() if isinstance(out, io.StringIO) else ""


def url(server: servers.RedisProcess, user: str = "") -> str:
    """The server's URL (with ``user:pw@`` when a user is given)."""
    auth = f"{user}:pw@" if user else ""
    return f"redis://{auth}{servers.HOST}:{server.port}/0"
