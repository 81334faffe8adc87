"""The job-queue rule, written once for every queue integration.

A job queue delivers at least once: a duplicate message, a redelivery after a
crash, a visibility timeout. Each integration (Celery, RQ, Dramatiq, arq) wraps
the job's function in ``@idempotent`` through ``job_function`` and, when the
work is in flight elsewhere, asks ``retry_delay`` when to try again::

    run the job ──Claimed──► run the function, store its result
        ├─Completed──► return the stored result (nothing runs)
        └─InFlight───► StillInFlightError(retry_after) ─► the queue's own
                       "retry later" (a countdown, a defer, a re-enqueue),
                       never a failure, never a spent retry

A worker never waits for another worker's job (``wait=0`` by default): a waiting
copy would hold a pool slot and poll Redis, and a redelivery of a crashed owner's
job must outlast the dead owner's lease, which only a later retry can do.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import pydantic
import pydantic_core

from ._errors import InvalidArgumentError, InvalidArgumentTypeError, StillInFlightError
from ._idempotent import idempotent

__all__ = [
    "acall_with_first",
    "call_with_first",
    "current_first",
    "job_function",
    "plain_result",
    "retry_delay",
    "split_options",
]

# Past the lapse by this much, so the retry finds the dead owner's claim gone.
_MARGIN = 0.05
# When the lease left is unknown (the claim freed between two reads), retry soon.
_UNKNOWN = 1.0

_first_argument: contextvars.ContextVar[Any] = contextvars.ContextVar("goblin_claim_job_first_argument")


def retry_delay(exc: StillInFlightError, lease: int) -> float:
    """Seconds until a retry of in-flight work should run: just after the holder's lease lapses.

    A live owner keeps renewing its lease, so the retry comes back, finds the work
    completed (and returns its result) or still running (and retries again); a
    crashed owner's claim has lapsed by then, and the retry takes the work over.

    Args:
        exc: What the decorator raised for work in flight.
        lease: The job's lease, the bound for an unknown or odd lease left.
    """
    left = exc.retry_after
    if left is None:
        return min(_UNKNOWN, float(lease))
    return max(_MARGIN, left + _MARGIN)


def plain_result(result: Any) -> Any:
    """A result a queue's JSON serializer can carry: a model or dataclass as its JSON form.

    What the SDK stored and replays is the model itself (typed by the return
    annotation); the queue's own result store gets this plain form, as Celery's
    ``pydantic=True`` does.
    """
    if isinstance(result, pydantic.BaseModel) or (dataclasses.is_dataclass(result) and not isinstance(result, type)):
        return pydantic_core.to_jsonable_python(result)
    return result


def split_options(options: Mapping[str, Any], where: str) -> tuple[Any, Any, dict[str, Any]]:
    """The client, the key and ``@idempotent``'s other options from an integration's options dict.

    ``wait`` defaults to 0: a worker retries later instead of waiting (see the module docstring).

    Raises:
        InvalidArgumentTypeError: ``options`` is not a mapping.
        InvalidArgumentError: ``key`` is missing.
    """
    if not isinstance(options, Mapping):
        raise InvalidArgumentTypeError(f"{where}: idempotency options must be a dict, not {type(options).__name__}")
    rest = dict(options)
    client = rest.pop("client", None)
    if "key" not in rest:
        raise InvalidArgumentError(f"{where}: idempotency options need key= (a parameter name or a function)")
    key = rest.pop("key")
    rest.setdefault("wait", 0)
    return client, key, rest


def job_function(
    func: Callable[..., Any],
    client: Any,
    key: Any,
    options: Mapping[str, Any],
    *,
    namespace: str | None = None,
    skip_first: bool = False,
) -> Any:
    """``func`` under ``@idempotent``, for a job queue.

    Args:
        func: The job's function.
        client: A redis-py or valkey-py client, or a function of no arguments returning one.
        key: ``@idempotent``'s ``key``.
        options: ``@idempotent``'s other options (``wait`` defaults to 0).
        namespace: The namespace, when the queue names the job (Celery's task name).
        skip_first: The function's first parameter is the queue's context (arq's
            ``ctx``): it is left out of the key's arguments, the fingerprint and
            ``forget()``, and passed through ``call_with_first``/``acall_with_first``.

    Returns:
        The decorated function; with ``skip_first``, call it through ``call_with_first``
        (``acall_with_first`` for an ``async def``).
    """
    options = dict(options)
    options.setdefault("wait", 0)
    if namespace is not None:
        options.setdefault("namespace", namespace)
    target = _without_first(func) if skip_first else func
    return idempotent(client, key=key, **options)(target)


def call_with_first(decorated: Callable[..., Any], first: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a sync ``skip_first`` job function with its first argument."""
    token = _first_argument.set(first)
    try:
        return decorated(*args, **kwargs)
    finally:
        _first_argument.reset(token)


async def acall_with_first(decorated: Callable[..., Any], first: Any, *args: Any, **kwargs: Any) -> Any:
    """Await an ``async def`` ``skip_first`` job function with its first argument."""
    # A coroutine runs in the context of the task awaiting it: set it here, for this await.
    token = _first_argument.set(first)
    try:
        return await decorated(*args, **kwargs)
    finally:
        _first_argument.reset(token)


def current_first() -> Any:
    """The first argument of the ``skip_first`` job running now (arq's ``ctx``)."""
    return _first_argument.get()


def _without_first(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with its first parameter taken from the job's context, not from its arguments."""
    signature = inspect.signature(func)
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise InvalidArgumentTypeError(f"{func.__qualname__} must take the job's context as its first parameter")
    annotations = {name: hint for name, hint in getattr(func, "__annotations__", {}).items() if name != params[0].name}
    if inspect.iscoroutinefunction(func):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return await func(_first_argument.get(), *args, **kwargs)

        wrapper: Any = run_async
    else:

        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return func(_first_argument.get(), *args, **kwargs)

        wrapper = run_sync
    # __wrapped__ stays, for the return annotation's globals; __signature__ wins over it.
    functools.update_wrapper(wrapper, func, updated=())
    wrapper.__signature__ = signature.replace(parameters=params[1:])
    wrapper.__annotations__ = annotations
    return wrapper  # type: ignore[no-any-return]
