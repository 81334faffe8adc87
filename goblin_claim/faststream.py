"""FastStream handlers that run once per key: ``@idempotent_handler(client, key=..., **options)``.

Install with ``pip install goblin-claim[faststream]``. Example::

    from goblin_claim.faststream import idempotent_handler

    @broker.subscriber(stream=StreamSub("charges", group="billing", consumer="c1"))
    @broker.publisher(stream="receipts")
    @idempotent_handler(redis.asyncio.Redis(), key="event_id", lease=30, ttl=86400)
    async def charge(event_id: str, amount: int) -> Receipt: ...

Innermost, under FastStream's decorators: the key and the fingerprint are read from the
handler's own arguments, as FastStream decoded and validated them (``fingerprint=`` names
the body's parameters when the handler also takes injected ones: a ``Logger``, the message).
Options are ``@idempotent``'s; a ``def`` handler takes a sync client. A duplicate returns the
stored result, which FastStream publishes (to ``@publisher``, to ``reply_to``) as it did the
first answer.

In flight elsewhere: the duplicate waits for the first copy in its subscriber, woken by its
completion, at most ``wait`` seconds (default 10) and never past the holder's lease left,
and returns the stored result (or, the holder's lease lapsed, takes the work over). Still
running then, it raises FastStream's ``NackMessage``: a stream entry read through a consumer
group stays pending, and a subscriber with ``min_idle_time`` (XAUTOCLAIM) delivers it again;
a list or pub/sub message, which FastStream removed as it read it, is dropped, the first copy
running the work. ``wait=0`` skips the wait.

With ``at_most_once=True``, a message whose key's earlier attempt ended without a result (its
process was killed, or lost its lease) is acked without running the handler and publishes
nothing (``AckMessage``), logged at WARNING on ``goblin_claim.faststream``.

Called outside a subscriber, the handler raises the same ``NackMessage``/``AckMessage``, whose
``__cause__`` is the ``StillInFlightError``/``InterruptedWorkError``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from faststream.exceptions import AckMessage, NackMessage

from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, job_function

__all__ = ["idempotent_handler"]

logger = logging.getLogger("goblin_claim.faststream")

_ANSWERED = (StillInFlightError, InterruptedWorkError)


def idempotent_handler(client: Any, *, key: Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Make a FastStream handler run once per idempotency key.

    Args:
        client: A redis-py or valkey-py client (asyncio for an ``async def`` handler), or a
            function of no arguments returning one.
        key: A parameter name or a function of the handler's arguments returning the key.
        **options: ``@idempotent``'s other options; ``wait`` (default 10) bounds how long a
            duplicate waits for the first copy, never past its lease left.

    Returns:
        A decorator, applied under ``@broker.subscriber``/``@broker.publisher``; the handler
        keeps its signature (FastStream injects by it) and gains ``forget(*args, **kwargs)``,
        which the subscriber's own wrapper does not carry: keep a name for it to reach ``forget``.
    """

    def decorate(func: Callable[..., Any]) -> Any:
        job = job_function(func, client, key, options)

        def settle(exc: Exception) -> NoReturn:
            if isinstance(exc, InterruptedWorkError):
                acked(logger, job, exc)  # at most once: the message is acked, nothing runs
                raise AckMessage() from exc
            raise NackMessage() from exc  # pending for a redelivery, where the subscriber kind has one

        if inspect.iscoroutinefunction(func):

            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await job(*args, **kwargs)
                except _ANSWERED as exc:
                    settle(exc)

            run: Any = run_async
        else:

            def run_sync(*args: Any, **kwargs: Any) -> Any:
                try:
                    return job(*args, **kwargs)
                except _ANSWERED as exc:
                    settle(exc)

            run = run_sync
        functools.update_wrapper(run, func)
        run.forget = job.forget
        return run

    return decorate
