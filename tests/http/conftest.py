"""Fixtures the HTTP doors' tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from goblin_claim._http import failures


@pytest.fixture
def fresh_log() -> Iterator[None]:
    """No failing scope or routes function logged yet: the log is once per process and cause."""
    failures._logged.clear()
    yield
    failures._logged.clear()
