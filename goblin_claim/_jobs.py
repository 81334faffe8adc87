"""The job-queue rule, written once for every queue integration.

A job queue delivers at least once: a duplicate message, a redelivery after a
crash, a visibility timeout. Each integration (Celery, RQ, Dramatiq, arq, taskiq, Huey) wraps
the job's function in ``@idempotent`` through ``job_function``; a copy that finds
the work in flight elsewhere waits for it in its worker slot, woken by the first
copy's completion, but never past the holder's lease left (``wait_bound``), and
when the work is still running then, asks ``retry_delay`` when to try again::

    run the job ──Claimed──► run the function, store its result
        ├─Completed──► return the stored result (nothing runs)
        └─InFlight───► wait, at most ``wait`` seconds and the holder's lease left
              ├─completed──► return the stored result (nothing runs)
              ├─lapsed─────► the holder died: take the work over, run it here
              └─running────► StillInFlightError(retry_after) ─► the queue's own
                             "retry later" (a countdown, a defer, a re-enqueue),
                             never a failure, never a spent retry
        └─interrupted (at_most_once: an earlier attempt ended without a result)──►
                             acked without running anything, logged at WARNING (``acked``)

``wait`` defaults to ``WAIT`` (10 s, ``@idempotent``'s own default). Most
duplicates are of short work, and a waiting copy answers the moment the first
finishes instead of a lease later. The cost is the worker slot (a process, a
thread, an arq job) held meanwhile; the bounds keep it at ``wait`` seconds per
delivery. Past the holder's lease left the wait ends either way: a crashed
owner's claim has lapsed and is taken over, and a live owner has renewed it,
which means long work that a later retry answers with the slot given back.
``wait=0`` never waits.

Under ``at_most_once`` a delivery of a key whose earlier attempt ended without a
result (its worker was killed, or lost its lease) finishes without running the work
and without asking for a retry: the queue acks it, and the door logs it at WARNING
(``acked``), naming the key by its digest. The job function reaches its handle as a
decorated function does (``current_claim()``), to checkpoint its progress with
``checkpoints=True``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pydantic
import pydantic_core

from . import _events
from ._decorator.idempotent import idempotent
from ._defaults import WAIT
from ._errors import InterruptedWorkError, InvalidArgumentError, InvalidArgumentTypeError, StillInFlightError
from ._protocol.record import build_keys

__all__ = [
    "WAIT",
    "acall_with_first",
    "acked",
    "call_with_first",
    "current_first",
    "enqueue_marker",
    "job_function",
    "lapse_delay",
    "plain_result",
    "retry_delay",
    "split_options",
    "wait_bound",
]

# Past the lapse by this much, so the retry (or the waiter) finds the dead owner's claim gone.
_MARGIN = 0.05
# When the lease left is unknown (the claim freed between two reads), retry soon.
_UNKNOWN = 1.0
# enqueue_once's marker: beside the record, holding the first job's id.
ENQUEUE_MARKER_SUFFIX = ":task"

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
    return _past_the_lapse(exc.retry_after, lease)


def wait_bound(wait: float, retry_after: float | None, lease: int) -> float:
    """Seconds a duplicate job waits for in-flight work: at most ``wait``, and just past the holder's lease left.

    Waiting is woken by the first copy's completion, so a short job's duplicate is
    answered as it finishes. At the lease left the wait ends: a crashed holder's
    claim has lapsed and this copy takes the work over; a live one has renewed it,
    and this copy gives its slot back for the queue's retry (``retry_delay``).

    Args:
        wait: The job's ``wait`` option; 0 never waits.
        retry_after: The holder's lease left, from the in-flight reply (``None`` when unknown).
        lease: The job's lease, the bound for an unknown or odd lease left.
    """
    if wait == 0:
        return 0.0
    return min(wait, _past_the_lapse(retry_after, lease))


def lapse_delay(lease: int) -> float:
    """Seconds from a claim taken now until just past its lapse: when a crashed owner's claim is free.

    What a queue that never redelivers a killed worker's job waits before its own copy
    of the job runs (Huey's door keeps one in the queue's schedule while the job runs).
    """
    return _past_the_lapse(float(lease), lease)


def _past_the_lapse(left: float | None, lease: int) -> float:
    """Seconds until just after a holder's lease lapses (soon, when its lease left is unknown)."""
    if left is None:
        return min(_UNKNOWN, float(lease))
    return max(_MARGIN, left + _MARGIN)


def acked(log: logging.Logger, decorated: Any, exc: InterruptedWorkError) -> None:
    """Say on the door's ``log`` (WARNING) that a delivery of an interrupted key is acked without running the work.

    The key is named by its digest (as it is with ``GOBLIN_CLAIM_LOG_KEYS=1``), never the
    holder's token; the namespace (the task's name) and when the attempt claimed the key.
    """
    key = exc.key or ""
    namespace = decorated._goblin_spec.namespace
    fields: dict[str, object] = {
        "operation": "call", "outcome": "interrupted", "namespace": namespace, "key_digest": _events.key_digest(key),
        "error_type": type(exc).__name__,
    }  # fmt: skip
    if _events.LOG_KEYS:
        fields["key"] = key
    log.warning(
        "key %s of %s: an at-most-once attempt (claimed %s) ended without a result, so this delivery is acked "
        "without running the work; `goblin-claim inspect` shows the attempt, `goblin-claim forget` reopens the key",
        key if _events.LOG_KEYS else fields["key_digest"], namespace, exc.claimed_at.isoformat(timespec="seconds"),
        extra=fields,
    )  # fmt: skip


def enqueue_marker(decorated: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The key holding the id of the first job enqueued for the key these arguments map to (``enqueue_once``).

    It sits beside the record, as the fence counter does (``<namespace>:{<key>}:task``), in
    the claim's slot and namespace; Celery keeps its task id there and RQ its job id, and
    ``goblin-claim inspect`` / ``forget`` know it by that suffix.
    """
    spec = decorated._goblin_spec
    record, _ = build_keys(spec.namespace, spec.key_of(tuple(args), dict(kwargs)))
    return record + ENQUEUE_MARKER_SUFFIX


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
    """``func`` under ``@idempotent``, for a job queue: an in-flight duplicate waits by ``wait_bound``.

    Args:
        func: The job's function.
        client: A redis-py or valkey-py client, or a function of no arguments returning one.
        key: ``@idempotent``'s ``key``.
        options: ``@idempotent``'s other options (``wait`` defaults to ``WAIT``).
        namespace: The namespace, when the queue names the job (Celery's task name).
        skip_first: The function's first parameter is the queue's context (arq's
            ``ctx``): it is left out of the key's arguments, the fingerprint and
            ``forget()``, and passed through ``call_with_first``/``acall_with_first``.

    Returns:
        The decorated function; with ``skip_first``, call it through ``call_with_first``
        (``acall_with_first`` for an ``async def``).
    """
    options = dict(options)
    options.setdefault("wait", WAIT)
    if namespace is not None:
        options.setdefault("namespace", namespace)
    target = _without_first(func) if skip_first else func
    decorated = idempotent(client, key=key, **options)(target)
    decorated._goblin_spec.wait_bound = wait_bound
    return decorated


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
