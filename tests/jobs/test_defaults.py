"""The job doors' default lease is the one default, read from ``_defaults``."""

from __future__ import annotations

import inspect

from goblin_claim._decorator.idempotent import idempotent
from goblin_claim._defaults import LEASE


def test_the_job_doors_retry_by_the_decorators_default_lease() -> None:
    """``@idempotent``'s default lease is ``_defaults.LEASE``, which the queue doors' retry delays are bounded by."""
    assert inspect.signature(idempotent).parameters["lease"].default == LEASE
