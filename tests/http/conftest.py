"""Fixtures the HTTP doors' tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from goblin_claim import _http


@pytest.fixture
def fresh_log() -> Iterator[None]:
    """No failing scope or routes function logged yet: the log is once per process and cause."""
    _http._logged.clear()
    yield
    _http._logged.clear()
