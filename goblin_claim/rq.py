"""RQ jobs that run once per key: ``@idempotent_job(client, key=..., **options)``, and ``enqueue_once``.

Install with ``pip install goblin-claim[rq]`` (RQ 3). Example::

    from goblin_claim.rq import enqueue_once, idempotent_job

    @idempotent_job(redis.Redis(socket_timeout=5), key="event_id", lease=30, ttl=86400)
    def charge(event_id: str, amount: int) -> Receipt: ...

    queue.enqueue(charge, "evt_1", 500, retry=Retry(max=3))
    job = enqueue_once(queue, charge, "evt_1", 500, retry=Retry(max=3))  # one job per key

Options are ``@idempotent``'s. A job whose key is in flight elsewhere waits in its
work-horse for the first copy, woken by its completion, at most ``wait`` seconds
(default 10) and never past the holder's lease left, and returns the stored result
(or, the holder's lease lapsed, takes the work over). Still running then, it returns
RQ's ``Retry`` without an interval: RQ puts the same job (same id) back at the end of
its queue at once, the jobs queued behind it run first, and when it comes round it
waits again. No scheduler is involved, so a restarted worker whose scheduler has not
come back still takes over a dead holder's work once its lease lapses. That retry
never spends one of the job's own ``Retry`` attempts, never ends FAILED and logs no
traceback (RQ counts each round as a failed job of its worker's). ``wait=0`` holds no
worker at all: the retry is then scheduled for when the holder's lease lapses
(``retry_after``), which needs RQ's scheduler (``rq worker --with-scheduler``). RQ
re-runs a job whose work-horse was killed only through ``Retry``: enqueue with one for
at-least-once delivery.

``enqueue_once(queue, func, *args, **kwargs)`` enqueues a job only when its key has
none queued, running or done, and otherwise returns the first job.

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
import uuid
from collections.abc import Callable
from typing import Any

from rq import Queue, Retry, get_current_job
from rq.exceptions import DuplicateJobError, InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus

from ._defaults import LEASE
from ._errors import (
    GoblinClaimError,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    StillInFlightError,
)
from ._jobs import acked, enqueue_marker, job_function, plain_result, retry_delay

__all__ = ["enqueue_once", "idempotent_job"]

logger = logging.getLogger("goblin_claim.rq")

# job.meta of a job scheduled by an earlier release, which borrowed one of the job's own
# retries for its in-flight retry: put back when the job runs again.
_SAVED = "goblin_claim_retry"
# Queue.enqueue options enqueue_once cannot keep: RQ's unique enqueue refuses dependencies
# and rate limits, and a pipeline would leave the marker naming a job not yet written.
_REFUSED = ("depends_on", "rate_limit", "pipeline", "unique")
# How often enqueue_once starts over when the marker or the first job vanished under it.
_ROUNDS = 5


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
    scheduled = options.get("wait") == 0

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
                if current is None:
                    raise  # no job to retry: the caller decides
                return _again(current, retry_delay(exc, lease) if scheduled else 0.0)
            except InterruptedWorkError as exc:
                if current is None:
                    raise  # no job to finish: the caller decides
                acked(logger, job_fn, exc)  # at most once: the job finishes, nothing runs
                return None
            # In a worker, what RQ stores goes through its serializer: a model as its JSON form.
            return plain_result(result) if current is not None else result

        def forget(*args: Any, **kwargs: Any) -> bool:
            """Reopen the key these arguments map to (delete its claim, result and ``enqueue_once`` marker)."""
            job_fn._goblin_spec.client.delete(enqueue_marker(job_fn, args, kwargs))
            return bool(job_fn.forget(*args, **kwargs))

        run.forget = forget  # type: ignore[attr-defined]
        run._goblin_spec = job_fn._goblin_spec  # type: ignore[attr-defined]  # enqueue_once reads the key
        return run

    return decorate


def enqueue_once(queue: Queue, f: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
    """Enqueue ``f(*args, **kwargs)`` on ``queue`` unless a job for its key is already queued, running or done.

    Takes what ``Queue.enqueue`` takes (the function's arguments, and ``job_id``,
    ``retry``, ``job_timeout``, ``result_ttl``...), for a function under
    ``@idempotent_job``. The first job's id is kept beside the claim for the job's
    ``ttl`` (``<namespace>:{<key>}:task``), and RQ's unique enqueue writes one job per
    id, so concurrent callers for one key enqueue one job between them. Example::

        job = enqueue_once(queue, charge, "evt_1", 500, retry=Retry(max=3))
        again = enqueue_once(queue, charge, "evt_1", 500)   # again.id == job.id

    Returns:
        The job just enqueued; for a key already enqueued, the first job: as RQ still
        holds it (queued, started, scheduled, finished...), enqueued again under its id
        when RQ has let it go (its ``result_ttl`` passed: it then replays the stored
        result without running ``f``), or requeued when it FAILED (its claim was given
        back, so it runs ``f`` again). ``f.forget(*args)`` deletes the marker with the key.

    Not guaranteed: a duplicate with other arguments for the same key gets the first
    job, whose worker then raises ``PayloadMismatchError`` for nothing; a cancelled or
    stopped first job is returned as it is (``forget()`` lets the next call through).

    Raises:
        InvalidArgumentTypeError: ``f`` is not a function under ``@idempotent_job``.
        InvalidArgumentError: ``depends_on``, ``rate_limit``, ``pipeline`` or ``unique``
            is given (RQ's unique enqueue refuses the first two).
    """
    spec = getattr(f, "_goblin_spec", None)
    if spec is None or not callable(f):
        raise InvalidArgumentTypeError(
            f"enqueue_once takes a function under @idempotent_job, not {type(f).__name__} {f!r:.80}"
        )
    refused = [name for name in _REFUSED if kwargs.get(name) not in (None, False)]
    if refused:
        raise InvalidArgumentError(
            f"enqueue_once cannot take {', '.join(refused)}: one job per key is RQ's unique enqueue"
        )
    parsed = Queue.parse_args(f, *args, **kwargs)
    marker = enqueue_marker(f, tuple(parsed.args or ()), dict(parsed.kwargs or {}))  # checks the key first
    options = {name: value for name, value in kwargs.items() if name not in ("job_id", *_REFUSED)}
    client = spec.client
    mine = parsed.job_id or str(uuid.uuid4())
    for _ in range(_ROUNDS):
        if client.set(marker, mine, nx=True, ex=spec.ttl):
            first = mine
        else:
            stored = client.get(marker)
            if stored is None:
                continue  # expired (or forgotten) between the two calls: set it now
            first = stored.decode() if isinstance(stored, bytes) else stored
        try:
            # One job per id, whoever comes first: the marker's writer or a caller that
            # found the marker before the job was written (or after RQ let it go).
            return queue.enqueue(f, *args, job_id=first, unique=True, **options)
        except DuplicateJobError:
            pass
        try:
            job = queue.job_class.fetch(first, connection=queue.connection, serializer=queue.serializer)
        except NoSuchJobError:
            continue  # RQ let it go between the two calls: enqueue it again
        if job.get_status(refresh=False) == JobStatus.FAILED:
            try:
                return job.requeue()  # its claim was given back: run it again
            except InvalidJobOperation:
                pass  # another caller requeued it first
        return job
    raise GoblinClaimError(f"enqueue_once: the job for {marker} kept vanishing; try again")


def _again(job: Any, delay: float) -> Retry:
    """RQ's ``Retry`` for in-flight work: at the end of the queue now, or ``delay`` seconds away (the scheduler).

    A returned ``Retry`` counts on its own (``job.number_of_retries``), never the job's
    own ``Retry``: each one allows one more than the job has had, so it never fails.
    """
    interval = max(1, math.ceil(delay)) if delay > 0 else 0
    return Retry(max=(job.number_of_retries or 0) + 1, interval=interval)


def _restore(job: Any) -> None:
    """Put back the job's own retry settings after a retry an earlier release borrowed ran."""
    saved = job.meta.pop(_SAVED, None)
    if saved is not None:
        job.retries_left = saved["retries_left"]
        job.retry_intervals = saved["retry_intervals"]
        job.save_meta()
        job.save()
