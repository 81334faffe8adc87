"""Dramatiq actors that run once per key: ``broker.add_middleware(Idempotency(client))``.

Install with ``pip install goblin-claim[dramatiq]``. Example::

    from goblin_claim.dramatiq import Idempotency

    broker.add_middleware(Idempotency(redis.Redis()))  # before declaring the actors

    @dramatiq.actor(idempotency={"key": "event_id", "lease": 30, "ttl": 86400})
    def charge(event_id: str, amount: int) -> None: ...

``idempotency`` takes ``@idempotent``'s options and may name its own ``client``;
the namespace is the actor's name. Actors without the option are left alone.

In flight elsewhere (a duplicate message, or the requeue of a dead worker's
message): the message waits in its worker thread for the first copy, woken by its
completion, at most ``wait`` seconds (default 10) and never past the holder's
lease left, and returns the stored result (or, the holder's lease lapsed, takes
the work over). Still running then, it is retried once the holder's lease has
lapsed (``retry_after``), through Dramatiq's ``Retry`` with that delay, logged at
INFO, and the retry does not count against ``max_retries``. ``"wait": 0`` skips
the wait, holding no thread. Dramatiq requeues a killed worker's messages after
the broker's ``heartbeat_timeout``.

With ``"at_most_once": True``, a message whose key's earlier attempt ended without a
result (its worker was killed, or lost its lease) is acked without running the
actor, logged at WARNING on ``goblin_claim.dramatiq``.

A model or dataclass result is handed to Dramatiq (its Results middleware) as its
JSON form.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import dramatiq
from dramatiq.errors import Retry

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, job_function, plain_result, retry_delay, split_options

__all__ = ["Idempotency"]

logger = logging.getLogger("goblin_claim.dramatiq")


class _InFlightRetry(Retry):
    """A retry for in-flight work: Dramatiq's own Retry (an INFO line), given back by the middleware."""


class Idempotency(dramatiq.Middleware):
    """Run the actors declared with ``idempotency={...}`` once per key.

    Args:
        client: The redis-py or valkey-py client (or a function of no arguments returning one)
            for actors whose options name none.
    """

    def __init__(self, client: Any = None) -> None:
        self.client = client

    @property
    def actor_options(self) -> set[str]:
        """The actor option this middleware adds."""
        return {"idempotency"}

    def after_declare_actor(self, broker: Any, actor: Any) -> None:
        """Wrap an actor declared with ``idempotency`` in the job-queue rule."""
        settings = actor.options.get("idempotency")
        if settings is None:
            return
        client, key, options = split_options(settings, f"actor {actor.actor_name}")
        job = job_function(actor.fn, client if client is not None else self.client, key, options,
                           namespace=actor.actor_name)  # fmt: skip
        lease = options.get("lease", LEASE)

        @functools.wraps(actor.fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                result = job(*args, **kwargs)
            except StillInFlightError as exc:
                delay_ms = max(1, round(retry_delay(exc, lease) * 1000))
                raise _InFlightRetry(f"{exc.key!r} is in flight; retried in {delay_ms} ms", delay=delay_ms) from exc
            except InterruptedWorkError as exc:
                acked(logger, job, exc)  # at most once: the message is acked, nothing runs
                return None
            return plain_result(result)

        run.forget = job.forget  # type: ignore[attr-defined]
        actor.fn = run
        actor.forget = job.forget

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        """Give back the retry an in-flight answer costs, so it never counts against ``max_retries``."""
        # after_* hooks run in reverse order of the middleware list: added after
        # Retries, this runs before it counts the retry, and cancels that count out.
        if isinstance(exception, _InFlightRetry):
            message.options["retries"] = message.options.get("retries", 0) - 1
