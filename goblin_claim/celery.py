"""Celery tasks that run once per key: ``@app.task(base=IdempotentTask, idempotency={...})``.

Install with ``pip install goblin-claim[celery]``. Example::

    from goblin_claim.celery import IdempotentTask

    @app.task(base=IdempotentTask, bind=True, acks_late=True, reject_on_worker_lost=True,
              idempotency={"client": lambda: redis.Redis(), "key": "event_id", "lease": 30, "ttl": 86400})
    def charge(self, event_id: str, amount: int) -> Receipt: ...

``idempotency`` takes ``@idempotent``'s options plus ``client`` (a client, or a
function of no arguments returning one, made in the worker on first use). The
namespace is the task's name; ``self`` (``bind=True``) never counts in the key's
arguments or the fingerprint.

In flight elsewhere (a duplicate message, or the redelivery of a task whose
worker was killed): the task waits in its pool slot for the first copy, woken by
its completion, at most ``wait`` seconds (default 10) and never past the holder's
lease left, and returns the stored result (or, the holder's lease lapsed, takes
the work over). Still running then, the message is sent again, same task id and
same retry count, to run once the holder's lease has lapsed (``retry_after``), and
this copy ends without a state (Celery's ``Ignore``): no FAILURE, no RETRY, no
spent ``max_retries``. When it runs again it returns the stored result, or takes
the work over from a crashed owner. ``"wait": 0`` skips the wait, holding
no slot. A task that raises releases its claim, so ``autoretry_for`` and
``self.retry()`` behave as without goblin-claim.

With ``"enqueue_once": True`` in ``idempotency``, ``apply_async``/``delay`` refuse to
send a duplicate whose key is already queued, running or done (celery-once's
habit) and return the first message's ``AsyncResult`` (celery-singleton's). The
first message's id is kept beside the claim for ``ttl``; a task that fails for good
clears it, and ``forget()`` does too. A queued message the broker loses keeps its
key refused until ``ttl`` or ``forget()``: the at-least-once settings make that rare.

With ``"at_most_once": True``, a message whose key's earlier attempt ended without a
result (its pool child was killed, or lost its lease) is acked without running the
task: it ends SUCCESS with the result ``None``, logged at WARNING on
``goblin_claim.celery``; called directly, the task raises ``InterruptedWorkError``.

A pydantic model (or dataclass) result is handed to Celery as its JSON form, as
Celery's own ``pydantic=True`` does, so the JSON result backend can store it.

Not guaranteed: a worker killed after the side effect and before the result is
stored runs the work again on redelivery; pass the key downstream (docs/guides/jobs/index.md).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore
from celery.utils import uuid

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, enqueue_marker, job_function, plain_result, retry_delay, split_options

__all__ = ["IdempotentTask"]

logger = logging.getLogger("goblin_claim.celery")


class IdempotentTask(Task):  # type: ignore[misc]  # Celery ships no type hints
    """A Celery task base whose task body runs once per idempotency key.

    Attributes:
        idempotency: ``@idempotent``'s options plus ``client`` (set through
            ``@app.task(idempotency={...})``); ``wait`` (default 10) bounds how long a
            duplicate waits in its slot for the first copy, never past its lease left.
    """

    idempotency: ClassVar[dict[str, Any] | None] = None

    def _goblin_job(self) -> Any:
        """The decorated task body, made once per task instance (one per worker process)."""
        job = self.__dict__.get("_goblin_claim_job")
        if job is None:
            client, key, options = split_options(self.idempotency or {}, f"task {self.name}")
            self.__dict__["_goblin_claim_once"] = bool(options.pop("enqueue_once", False))
            # self.run is bound for bind=True tasks: its signature already leaves self out.
            job = job_function(self.run, client, key, options, namespace=self.name)
            self.__dict__["_goblin_claim_job"] = job
            self.__dict__["_goblin_claim_lease"] = options.get("lease", LEASE)
        return job

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task body once per key; in flight elsewhere, wait for it, or come back after the holder's lease."""
        job = self._goblin_job()
        try:
            result = job(*args, **kwargs)
        except StillInFlightError as exc:
            request = self.request
            if request.called_directly or request.is_eager:
                raise  # no message to send again: the caller decides
            delay = retry_delay(exc, self.__dict__["_goblin_claim_lease"])
            # The same message again (same id, same retries), later; this copy leaves no state.
            self.signature_from_request(request, countdown=delay).apply_async()
            raise Ignore() from exc
        except InterruptedWorkError as exc:
            if self.request.called_directly or self.request.is_eager:
                raise  # no delivery to ack: the caller decides
            acked(logger, job, exc)  # at most once: this delivery ends, nothing runs
            return None
        return plain_result(result)

    def forget(self, *args: Any, **kwargs: Any) -> bool:
        """Reopen the key these arguments map to (delete its claim and result): an operator's redo."""
        job = self._goblin_job()
        if self.__dict__["_goblin_claim_once"]:
            job._goblin_spec.client.delete(self._enqueue_marker(args, kwargs))
        return bool(job.forget(*args, **kwargs))

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any) -> Any:
        """Send the task; with ``enqueue_once``, a key already queued, running or done is not sent again.

        Returns the first message's ``AsyncResult`` for such a duplicate (its id is kept
        beside the claim for ``ttl``), so ``.get()`` gives the first run's result.
        """
        job = self._goblin_job()
        if not self.__dict__["_goblin_claim_once"]:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        client = job._goblin_spec.client
        marker = self._enqueue_marker(tuple(args or ()), dict(kwargs or {}))
        task_id = task_id or uuid()
        if not client.set(marker, task_id, nx=True, ex=job._goblin_spec.ttl):
            first = client.get(marker)
            first = first.decode() if isinstance(first, bytes) else first
            # Our own message sent again (in flight elsewhere) carries the first id: it goes out.
            if first is not None and first != task_id:
                return self.AsyncResult(first)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """A task that failed for good gave its claim back: let the next enqueue through too."""
        if self.__dict__.get("_goblin_claim_once"):
            client = self._goblin_job()._goblin_spec.client
            marker = self._enqueue_marker(tuple(args or ()), dict(kwargs or {}))
            first = client.get(marker)
            # Only this message's marker; a newer one (set after it expired) stays.
            if first is not None and (first.decode() if isinstance(first, bytes) else first) == task_id:
                client.delete(marker)
        super().on_failure(exc, task_id, args, kwargs, einfo)

    def _enqueue_marker(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key holding the first message's task id, in the claim's slot and namespace."""
        return enqueue_marker(self._goblin_job(), args, kwargs)
