"""The decision-table endpoint every door's test app serves at ``/answer``: it answers as its query string asks.

``status`` (201 when absent), ``cookie=1`` (a ``Set-Cookie``), ``size=N`` (a body of
``N`` bytes), ``stream=1`` (NDJSON, streamed where the framework streams); ``tag``
names the counter its runs go to, ``<namespace>:runs:answer:<tag>``, so each row of
a table counts its own runs. ``GOBLIN_TEST_LOG`` names a file the library's log
lines go to (``<logger> <LEVEL> <message>``), for a test to read while the server runs.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Asked:
    """What a request to ``/answer`` asked for."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stream: bool
    tag: str

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
    return Asked(int(fields.get("status", "201")), headers, body, stream, fields.get("tag", "untagged"))


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
