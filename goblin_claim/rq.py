"""RQ jobs that run once per key: ``@idempotent_job(client, key=..., **options)``.

Install with ``pip install goblin-claim[rq]``. Example::

    from goblin_claim.rq import idempotent_job

    @idempotent_job(redis.Redis(), key="event_id", lease=30, ttl=86400)
    def charge(event_id: str, amount: int) -> Receipt: ...

    queue.enqueue(charge, "evt_1", 500, retry=Retry(max=3, interval=5))

Options are ``@idempotent``'s. A job whose key is in flight elsewhere waits in its
work-horse for the first copy, woken by its completion, at most ``wait`` seconds
(default 10) and never past the holder's lease left, and returns the stored result
(or, the holder's lease lapsed, takes the work over). Still running then, it is
scheduled again for when the holder's lease lapses (``retry_after``), the same job
id, so run workers with ``rq worker --with-scheduler``; that retry is given back,
so it never spends one of the job's own ``Retry`` attempts and never ends FAILED.
``wait=0`` skips the wait, holding no worker. RQ re-runs a job whose
work-horse was killed only through ``Retry``: enqueue with one for at-least-once
delivery.

With ``at_most_once=True``, a job whose key's earlier attempt ended without a result
(its work-horse was killed, or lost its lease) finishes without running the work,
its result ``None``, logged at WARNING on ``goblin_claim.rq``.

Called outside a worker, a key still in flight after that wait raises ``StillInFlightError``
(an interrupted key, ``InterruptedWorkError``).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from rq import get_current_job

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, job_function, plain_result, retry_delay

__all__ = ["idempotent_job"]

logger = logging.getLogger("goblin_claim.rq")

_SAVED = "goblin_claim_retry"  # job.meta: the job's own retry settings while an in-flight retry borrows them


def idempotent_job(client: Any, *, key: Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Make an RQ job function run once per idempotency key.

    Args:
        client: A redis-py or valkey-py client, or a function of no arguments returning one.
        key: A parameter name or a function of the job's arguments returning the key.
        **options: ``@idempotent``'s other options; ``wait`` (default 10) bounds how long a
            duplicate waits for the first copy, never past its lease left.

    Returns:
        A decorator; the decorated function keeps its import path (RQ enqueues it by
        name) and gains ``forget(*args, **kwargs)``.
    """
    lease = options.get("lease", LEASE)

    def decorate(func: Callable[..., Any]) -> Any:
        job_fn = job_function(func, client, key, options)

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            current = get_current_job()
            if current is not None:
                _restore(current)
            try:
                result = job_fn(*args, **kwargs)
            except StillInFlightError as exc:
                if current is not None:
                    _borrow_retry(current, retry_delay(exc, lease))
                raise
            except InterruptedWorkError as exc:
                if current is None:
                    raise  # no job to finish: the caller decides
                acked(logger, job_fn, exc)  # at most once: the job finishes, nothing runs
                return None
            # In a worker, what RQ stores goes through its serializer: a model as its JSON form.
            return plain_result(result) if current is not None else result

        run.forget = job_fn.forget  # type: ignore[attr-defined]
        return run

    return decorate


def _borrow_retry(job: Any, delay: float) -> None:
    """Give the job one retry, ``delay`` seconds away, that RQ spends instead of one of the job's own."""
    saved = job.meta.get(_SAVED)
    if saved is None:
        saved = {"retries_left": job.retries_left, "retry_intervals": job.retry_intervals}
        job.meta[_SAVED] = saved
        job.save_meta()
    own = saved["retries_left"] or 0
    job.retries_left = own + 1
    # RQ picks the interval by how many retries are left: every slot holds this delay.
    job.retry_intervals = [max(1, math.ceil(delay))] * job.retries_left


def _restore(job: Any) -> None:
    """Put back the job's own retry settings after a borrowed retry ran."""
    saved = job.meta.pop(_SAVED, None)
    if saved is not None:
        job.retries_left = saved["retries_left"]
        job.retry_intervals = saved["retry_intervals"]
        job.save_meta()
        job.save()
