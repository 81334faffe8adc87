"""taskiq tasks that run once per key: ``@idempotent_task(client, key=..., **options)`` under ``@broker.task``.

Install with ``pip install goblin-claim[taskiq]``. Example::

    from goblin_claim.taskiq import idempotent_task

    broker = RedisStreamBroker(url, idle_timeout=60_000)  # a dead worker's messages come back after this

    @broker.task(task_name="charge")
    @idempotent_task(redis.asyncio.Redis(), key="event_id", lease=30, ttl=86400)
    async def charge(event_id: str, amount: int) -> Receipt: ...

Options are ``@idempotent``'s. Use ``RedisStreamBroker``: it hands a dead worker's unacked
messages on after ``idle_timeout`` (ms); ``ListQueueBroker`` loses a killed worker's task.

In flight elsewhere: the task waits for the first copy, woken by its completion, at most
``wait`` seconds (default 10) and never past the holder's lease left, and returns the stored
result (or takes the work over). Still running then, the copy sleeps until just past the
lease left (taskiq's Redis brokers deliver nothing later; its message stays unacked) and
sends its message again (``Context.requeue``: same task id), storing no result itself.

With ``at_most_once=True``, a task whose key's earlier attempt ended without a result
completes without running, its result ``None``, logged at WARNING on ``goblin_claim.taskiq``.
Called directly, it raises ``InterruptedWorkError`` (and ``StillInFlightError``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from taskiq import Context, TaskiqDepends

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, job_function, plain_result, retry_delay

__all__ = ["idempotent_task"]

logger = logging.getLogger("goblin_claim.taskiq")

# The keyword taskiq's dependency injection fills with the delivery's Context (never the key's or fingerprint's).
_CONTEXT = "goblin_claim_context"


def idempotent_task(client: Any, *, key: Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Make a taskiq task function (``async def``) run once per idempotency key; put ``@broker.task`` above it.

    Args:
        client: An asyncio client (redis-py's or valkey-py's), or a function of no arguments returning one.
        key: A parameter name or a function of the task's arguments returning the key.
        **options: ``@idempotent``'s other options; ``wait`` (default 10) bounds how long a
            duplicate waits for the first copy, never past its lease left.

    Returns:
        A decorator; the decorated function keeps its name and parameters (taskiq reads
        them) and gains ``forget(*args, **kwargs)`` (a coroutine).
    """
    lease = options.get("lease", LEASE)

    def decorate(func: Callable[..., Any]) -> Any:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"goblin_claim.taskiq runs coroutine functions: {func.__qualname__} is not an async def")
        job = job_function(func, client, key, options)

        @functools.wraps(func)
        async def run(*args: Any, **kwargs: Any) -> Any:
            context = kwargs.pop(_CONTEXT, None)
            delivered = isinstance(context, Context)
            try:
                result = await job(*args, **kwargs)
            except StillInFlightError as exc:
                if not delivered:
                    raise  # called directly: the caller decides
                await asyncio.sleep(retry_delay(exc, lease))
                await context.requeue()  # same message, later; raises NoResultError: this copy stores nothing
                raise  # not reached
            except InterruptedWorkError as exc:
                if not delivered:
                    raise  # no delivery to ack: the caller decides
                acked(logger, job, exc)  # at most once: the task completes, nothing runs
                return None
            # taskiq's result backend serializes what it gets: a model as its JSON form.
            return plain_result(result) if delivered else result

        signature = inspect.signature(func)
        params = list(signature.parameters.values())
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        params.insert(at, inspect.Parameter(_CONTEXT, inspect.Parameter.KEYWORD_ONLY, default=TaskiqDepends(),
                                            annotation=Context))  # fmt: skip
        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {**func.__annotations__, _CONTEXT: Context}
        run.forget = job.forget  # type: ignore[attr-defined]
        return run

    return decorate
