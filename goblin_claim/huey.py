"""Huey tasks that run once per key: ``@idempotent_task(huey, key=..., **options)``.

Install with ``pip install goblin-claim[huey]``. Example::

    from goblin_claim.huey import idempotent_task

    huey = RedisHuey("shop", url=os.environ["REDIS_URL"], serializer=JSONSerializer())

    @idempotent_task(huey, key="event_id", lease=30, ttl=86400)
    def charge(event_id: str, amount: int) -> Receipt: ...

The door registers the task (``huey.task(context=True, **huey_options)``); options are
``@idempotent``'s; the client is the Huey's own connection unless ``client=`` names one.

Huey pops a task for good: a killed consumer loses it. So while a delivery runs, the door
keeps a copy of it (same task id) in Huey's schedule, due just past the lease, and takes it
out as the delivery ends; a killed consumer leaves it, and the copy takes the work over.

In flight elsewhere: the task waits for the first copy, at most ``wait`` seconds (default 10)
and never past the holder's lease left; still running then, it raises ``RetryTask`` for when
that lease lapses, same task id, spending none of the task's ``retries``. With
``at_most_once=True``, an interrupted key's task completes without running (``None``), logged
at WARNING on ``goblin_claim.huey``. ``call_local`` raises those errors instead.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from huey.exceptions import RetryTask
from huey.storage import RedisStorage
from huey.utils import normalize_time

from ._defaults import LEASE
from ._errors import InterruptedWorkError, StillInFlightError
from ._jobs import acked, job_function, lapse_delay, plain_result, retry_delay

__all__ = ["idempotent_task"]

logger = logging.getLogger("goblin_claim.huey")


def idempotent_task(
    huey: Any, *, key: Any, client: Any = None, huey_options: Mapping[str, Any] | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Any]:
    """Make a function a Huey task that runs once per idempotency key.

    Args:
        huey: A ``RedisHuey`` (its storage keeps the copy a killed consumer leaves).
        key: A parameter name or a function of the task's arguments returning the key.
        client: A redis-py or valkey-py client, or a function of no arguments returning one;
            default: the Huey's own connection.
        huey_options: ``huey.task``'s settings (``retries``, ``retry_delay``, ``name``, ...).
        **options: ``@idempotent``'s other options; ``wait`` (default 10) bounds how long a
            duplicate waits for the first copy, never past its lease left.

    Returns:
        A decorator returning Huey's task (call it to enqueue), with ``forget(*args, **kwargs)``.
    """
    if not isinstance(huey.storage, RedisStorage):
        raise TypeError(f"goblin_claim.huey needs a RedisHuey, not {type(huey).__name__}")
    lease = options.get("lease", LEASE)

    def decorate(func: Callable[..., Any]) -> Any:
        job = job_function(func, client if client is not None else huey.storage.conn, key, options)

        @functools.wraps(func)
        def run(*args: Any, task: Any = None, **kwargs: Any) -> Any:
            if task is None:
                return job(*args, **kwargs)  # call_local: the caller decides
            with _copy_while_running(huey, task, lapse_delay(lease)):
                try:
                    result = job(*args, **kwargs)
                except StillInFlightError as exc:
                    # The same task, later; Huey adds the retry it takes back, so none is spent.
                    raise RetryTask(delay=retry_delay(exc, lease)) from exc
                except InterruptedWorkError as exc:
                    acked(logger, job, exc)  # at most once: the task completes, nothing runs
                    return None
            return plain_result(result)  # what Huey's serializer stores: a model as its JSON form

        wrapper = huey.task(context=True, **(huey_options or {}))(run)
        wrapper.forget = job.forget
        return wrapper

    return decorate


@contextlib.contextmanager
def _copy_while_running(huey: Any, task: Any, delay: float) -> Iterator[None]:
    """Keep a copy of ``task`` in Huey's schedule, due ``delay`` seconds on, until the delivery ends."""
    later = copy.copy(task)
    later.eta = normalize_time(delay=delay, utc=huey.utc)
    data = huey.serialize_task(later)
    huey.storage.add_to_schedule(data, later.eta)
    try:
        yield
    except Exception:
        huey.storage.conn.zrem(huey.storage.schedule_key, data)
        raise
    # A consumer stopping mid-task (KeyboardInterrupt) keeps the copy, as a kill does.
    huey.storage.conn.zrem(huey.storage.schedule_key, data)
