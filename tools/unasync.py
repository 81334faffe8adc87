"""Generate the sync flavour from the asyncio one: each sync module from its asyncio source.

The asyncio modules are written; their sync twins are made from them by the
rules below, applied to the whole text of every source alike. No rule names a
line of a source: what the rules cannot make is a named primitive, in
``_drivers/_aio_primitives.py`` and its twin ``_drivers/_sync_primitives.py``.
Run ``python tools/unasync.py`` after editing a source; ``--check`` fails when a
generated module differs from what its source gives, or when a rule matches in
no source (``make typecheck`` and the test suite run it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "goblin_claim"

# (pattern, replacement), in order; re.MULTILINE.
RULES: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\bAwaitable\[(\w+)\]", r"\1"),
    (r"\bAwaitable, ", ""),
    (r"\baclose\b", "close"),
    (r"\bAsync(?=Client\b|Door\b)", "Sync"),  # the flavour's client type and door keep a prefix
    (r"\bAsync(?=[A-Z])", ""),  # AsyncClaim, AsyncKeepAlive, AsyncGlideAdapter...
    (r"\bASYNC_(?=[A-Z])", ""),  # ASYNC_CLUSTERS
    (r"(?<=[a-z])_async\b", ""),  # to_the_end_async, failed_async, node_round_async...
    (r"\basync_(?=[a-z])", "sync_"),  # ClientState.async_lock
    (r"(?<![A-Za-z0-9])aio(?![A-Za-z0-9])", "sync"),  # module names: .aio, http_aio, _aio_primitives
    (r"\b(redis|valkey)\.asyncio\b", r"\1"),
    (r"\b([Aa])n asyncio\b", r"\1 sync"),
    (r"^import asyncio\n", ""),
    (r"\basyncio\.sleep\(", "time.sleep("),
    (r"\bASGI\b", "WSGI"),
    (r"\basgi\b", "wsgi"),
]

# (asyncio source, sync module), under goblin_claim/.
JOBS: list[tuple[str, str]] = [
    ("_drivers/aio.py", "_drivers/sync.py"),
    ("_drivers/http_aio.py", "_drivers/http_sync.py"),
    ("_decorator/aio.py", "_decorator/sync.py"),
    ("_clients/glide_aio.py", "_clients/glide_sync.py"),
]

COMPILED = [(re.compile(pattern, re.MULTILINE), replacement) for pattern, replacement in RULES]


def generate(source: str, used: list[int]) -> str:
    """The text the sync twin of ``source`` must have; ``used`` counts each rule's matches."""
    text = (PACKAGE / source).read_text("utf-8")
    for i, (pattern, replacement) in enumerate(COMPILED):
        text, count = pattern.subn(replacement, text)
        used[i] += count
    return f"# Generated from {source} by tools/unasync.py: edit {source}, then run that script.\n" + text


def main(argv: list[str]) -> int:
    """Write the sync twins, or with ``--check`` report whether they are current and every rule is used."""
    check = "--check" in argv
    failed = 0
    used = [0] * len(RULES)
    for source, target in JOBS:
        text = generate(source, used)
        path = PACKAGE / target
        if not check:
            path.write_text(text, "utf-8")
        elif path.read_text("utf-8") != text:
            print(f"{target} differs from what {source} gives: run python tools/unasync.py", file=sys.stderr)
            failed = 1
    for (pattern, _), count in zip(RULES, used, strict=True):
        if not count:
            print(f"the rule {pattern!r} matches in no source: drop it", file=sys.stderr)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
