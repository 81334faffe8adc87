"""arq jobs that run once per key: ``@idempotent_job(key=..., **options)``.

Install with ``pip install goblin-claim[arq]``. Example::

    from goblin_claim.arq import idempotent_job

    @idempotent_job(key="event_id", lease=30, ttl=86400)
    async def charge(ctx, event_id: str, amount: int) -> Receipt: ...

    class WorkerSettings:
        functions = [charge]

``ctx`` (arq's per-job context: the pool, ``job_id``, ``job_try``) is passed through
but never part of the key's arguments, the fingerprint or ``charge.forget(event_id,
amount)``. The client is ``ctx["redis"]`` (the worker's pool) unless ``client=`` names
one; options are ``@idempotent``'s.

In flight elsewhere (a duplicate job, or arq's re-run of a job whose worker died):
the job waits for the first copy (in one of the worker's ``max_jobs``), woken by its
completion, at most ``wait`` seconds (default 10) and never past the holder's
lease left, and returns the stored result (or, the holder's lease lapsed, takes
the work over). Still running then, it raises ``arq.worker.Retry(defer=...)`` for
when the holder's lease lapses (``retry_after``) and gives the try back, so it
never counts against ``max_tries``; ``wait=0`` skips the wait. arq re-runs a dead
worker's job once its in-progress key lapses (the job timeout plus 10 s).

With ``at_most_once=True``, a job whose key's earlier attempt ended without a result
(its worker died, or lost its lease) completes without running the work, its result
``None``, logged at WARNING on ``goblin_claim.arq``.

A model or dataclass result is handed to arq as its JSON form: configure arq's
``job_serializer``/``job_deserializer`` with JSON rather than its default pickle.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from arq.constants import retry_key_prefix
from arq.worker import Retry

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acall_with_first, acked, current_first, job_function, plain_result, retry_delay

__all__ = ["idempotent_job"]

logger = logging.getLogger("goblin_claim.arq")


def idempotent_job(*, key: Any, client: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Make an arq job function (``async def f(ctx, ...)``) run once per idempotency key.

    Args:
        key: A parameter name or a function of the job's own arguments (not ``ctx``).
        client: An asyncio client (redis-py's or valkey-py's), or a function of no arguments returning one;
            default: the worker's pool, ``ctx["redis"]``.
        **options: ``@idempotent``'s other options; ``wait`` (default 10) bounds how long a
            duplicate waits for the first copy, never past its lease left.

    Returns:
        A decorator; the decorated function keeps its name (arq runs it by name) and
        gains ``forget(*args, **kwargs)`` (a coroutine, without ``ctx``).
    """
    lease = options.get("lease", LEASE)

    def decorate(func: Callable[..., Any]) -> Any:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"arq runs coroutine functions: {func.__qualname__} is not an async def")
        # Made on the first call, inside a job, from that job's context.
        source = client if client is not None else (lambda: current_first()["redis"])
        job = job_function(func, source, key, options, skip_first=True)

        @functools.wraps(func)
        async def run(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            try:
                result = await acall_with_first(job, ctx, *args, **kwargs)
            except StillInFlightError as exc:
                if "job_id" in ctx:
                    # arq counted this try when it started the job: give it back.
                    await ctx["redis"].decr(retry_key_prefix + ctx["job_id"])
                raise Retry(defer=retry_delay(exc, lease)) from exc
            except InterruptedWorkError as exc:
                if "job_id" not in ctx:
                    raise  # not a worker's job: the caller decides
                acked(logger, job, exc)  # at most once: the job completes, nothing runs
                return None
            return plain_result(result)

        run.forget = job.forget  # type: ignore[attr-defined]
        return run

    return decorate
