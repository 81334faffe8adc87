"""The decision-table endpoint every door's test app serves at ``/answer``: it answers as its query string asks.

``status`` (201 when absent), ``cookie=1`` (a ``Set-Cookie``), ``size=N`` (a body of
``N`` bytes), ``stream=1`` (NDJSON, streamed where the framework streams), ``raise=1``
(the endpoint raises ``Failed`` once its run is counted: work committed, then a
failure); ``tag`` names the counter its runs go to, ``<namespace>:runs:answer:<tag>``, so each row of
a table counts its own runs. ``GOBLIN_TEST_LOG`` names a file the library's log
lines go to (``<logger> <LEVEL> <message>``), for a test to read while the server runs.
``GOBLIN_TEST_SERVER_ERRORS`` is the doors' ``server_errors`` option (``SERVER_ERRORS``).
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SERVER_ERRORS: Any = os.environ.get("GOBLIN_TEST_SERVER_ERRORS", "give back")
"""The doors' ``server_errors`` option, from the environment (every test app's door takes it)."""


class Failed(RuntimeError):
    """What ``/answer?raise=1`` raises after its run was counted."""


@dataclass(frozen=True)
class Asked:
    """What a request to ``/answer`` asked for."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stream: bool
    tag: str
    raises: bool = False

    def fail_if_asked(self) -> None:
        """Raise ``Failed`` when the request asked for it (called once the run is counted)."""
        if self.raises:
            raise Failed(f"asked to fail after run {self.tag}")

    def chunks(self) -> Iterator[bytes]:
        """The body in three pieces (as a streamed response sends it)."""
        third = max(1, len(self.body) // 3)
        for start in range(0, len(self.body), third):
            yield self.body[start : start + third]


def asked(query: str) -> Asked:
    """Read a request's query string."""
    fields = dict(urllib.parse.parse_qsl(query))
    stream = fields.get("stream") == "1"
    headers = [("Content-Type", "application/x-ndjson" if stream else "application/json")]
    if fields.get("cookie") == "1":
        headers.append(("Set-Cookie", "session=s3cret; HttpOnly"))
    size = int(fields.get("size", "0"))
    body = b"x" * size if size else b'{"line": 1}\n{"line": 2}\n{"line": 3}\n'
    status, tag = int(fields.get("status", "201")), fields.get("tag", "untagged")
    return Asked(status, headers, body, stream, tag, fields.get("raise") == "1")


def counter(namespace: str, tag: str) -> str:
    """The Redis key counting the runs of ``tag``."""
    return f"{namespace}:runs:answer:{tag}"


def log_to_file() -> None:
    """Send the library's log lines to ``GOBLIN_TEST_LOG``, when set (once per process)."""
    path = os.environ.get("GOBLIN_TEST_LOG")
    library = logging.getLogger("goblin_claim")
    if not path or any(getattr(handler, "_goblin_test", False) for handler in library.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    handler._goblin_test = True  # type: ignore[attr-defined]
    library.addHandler(handler)
