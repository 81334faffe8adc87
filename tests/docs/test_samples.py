"""Every Python sample on every page of the manual (docs/) and in the README runs, as written.

Sybil reads each page's ``python`` blocks, and the setup hidden in ``<!--
invisible-code-block: python -->`` comments (a stand-in for the reader's own
``charge_card``, an app to mount a door on), and runs them in order in one namespace
per page, as a reader pasting them one after the other would. Nothing on a page may be
skipped. Each page runs against a real redis-server the fixture starts: a client made
with redis-py's defaults (``redis.Redis()``, a pool made by hand) reaches it, and
``REDIS_URL`` names it. One test per page, parametrized, so ``pytest -n 2`` splits
the pages between its workers and collects each once.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from sybil import Document, Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from tests.support import servers
from tests.support.servers import RedisProcess

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"  # benchmark output the pages include, not pages
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if FIGURES not in p.parents)]
DB = 7  # the pages' own database on the session's server, emptied before each page
SYBIL = Sybil(parsers=[PythonCodeBlockParser()])


def _pointed(init: Callable[..., None], port: int) -> Callable[..., None]:
    """``init`` of a client or connection class whose defaults name the test server instead of localhost:6379."""

    @functools.wraps(init)
    def pointed(self: Any, *args: Any, **kwargs: Any) -> None:
        if not args and not {"connection_pool", "unix_socket_path", "path"} & kwargs.keys():
            kwargs.setdefault("host", servers.HOST)
            kwargs.setdefault("port", port)
            kwargs.setdefault("db", DB)
        init(self, *args, **kwargs)

    return pointed


@pytest.fixture
def page_server(redis_standalone: RedisProcess, monkeypatch: pytest.MonkeyPatch) -> str:
    """The server the samples reach, emptied, as ``redis.Redis()`` and ``REDIS_URL`` name it."""
    for cls in (redis.Redis, redis.asyncio.Redis, redis.connection.Connection, redis.asyncio.connection.Connection):
        monkeypatch.setattr(cls, "__init__", _pointed(cls.__init__, redis_standalone.port))
    url = f"redis://{servers.HOST}:{redis_standalone.port}/{DB}"
    monkeypatch.setenv("REDIS_URL", url)
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


def _module_for(page: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module for the page's samples to run in (frameworks and pydantic look classes up in sys.modules)."""
    name = "docs_sample_" + "_".join(page.relative_to(ROOT).with_suffix("").parts).replace("-", "_")
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _label(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_every_python_sample_on_the_page_runs(page: Path, page_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's Python samples run in order, as written, without an error."""
    document: Document = SYBIL.parse(page)
    module = _module_for(page, monkeypatch)
    document.namespace = module.__dict__
    for example in document:
        example.evaluate()


def test_no_sample_is_skipped_and_every_python_block_is_run() -> None:
    """No page skips a sample, and Sybil finds every fenced ``python`` block (none hides in another fence)."""
    for page in PAGES:
        text = page.read_text("utf-8")
        assert "skip:" not in text, page
        written = text.count("```python\n") + text.count("<!-- invisible-code-block: python")
        assert len(list(SYBIL.parse(page))) == written, page
