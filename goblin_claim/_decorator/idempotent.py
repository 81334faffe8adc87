"""``@idempotent``: run a function once per key; duplicates get the first result.

``_Spec`` (``plan.py``) holds every decision (keys, fingerprints, encoding, what a
stored value means); the I/O flow is written once, in ``_decorator/aio.py``, and its
sync twin ``_decorator/sync.py`` is generated from it (``tools/unasync.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from .._defaults import LEASE, REPLICA_TIMEOUT_MS, REPLICAS, TTL, WAIT
from .._drivers.aio import AsyncClaim
from .._drivers.sync import Claim
from .._protocol.checks import (
    NativeMode,
)
from . import aio as _idempotent_async
from . import sync as _idempotent_sync
from .plan import ALL_ARGUMENTS, AsyncIdempotentFunction, IdempotentFunction, _Spec

P = ParamSpec("P")
R = TypeVar("R")


class Decorator(Protocol):
    """What ``idempotent(...)`` returns: applied to a ``def`` or an ``async def``."""

    @overload
    def __call__(  # type: ignore[overload-overlap]  # a coroutine function is a callable too: first match wins
        self, func: Callable[P, Coroutine[Any, Any, R]]
    ) -> AsyncIdempotentFunction[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> IdempotentFunction[P, R]: ...


def idempotent(
    client: Any,
    *,
    key: Callable[..., str] | str,
    lease: int = LEASE,
    ttl: int = TTL,
    wait: float = WAIT,
    namespace: str | None = None,
    fingerprint: Callable[..., str] | tuple[str, ...] | None = ALL_ARGUMENTS,
    replay_errors: tuple[type[BaseException], ...] = (),
    keep_alive: bool = True,
    native: NativeMode = "auto",
    replicas: int = REPLICAS,
    replica_timeout_ms: int = REPLICA_TIMEOUT_MS,
    fail_open: bool = False,
    at_most_once: bool = False,
    checkpoints: bool = False,
) -> Decorator:
    """Run the decorated function once per key; every duplicate gets an equal result.

    Works on ``def`` with a sync client (``redis.Redis``, ``RedisCluster``) and on
    ``async def`` with an asyncio one. The first caller runs the function while a
    keep-alive renews its lease, and stores the result as JSON (through pydantic,
    typed by the return annotation) for ``ttl`` seconds. Duplicates get the stored
    result back in one round trip; while the first call is in flight they wait up
    to ``wait`` seconds, taking the work over if its lease lapses.

    Args:
        client: The redis-py client (sync for ``def``, asyncio for ``async def``), or a
            function of no arguments returning it, called on the first call.
        key: A function of the decorated function's own arguments returning the
            idempotency key, or the name of a parameter holding it: a non-empty str,
            an int or a UUID.
        lease: Seconds a crashed caller's claim blocks the key.
        ttl: Seconds a result is kept and replayed.
        wait: Seconds a duplicate waits for in-flight work; ``0`` raises
            ``StillInFlightError`` at once.
        namespace: Key prefix; default ``<module>.<qualified name>`` of the
            function, the module as ``import`` names it (also when run as a script),
            so renaming or moving it starts afresh: pass a namespace to pin it.
            Required for partials and callable objects.
        fingerprint: What identifies "the same call": by default every argument
            but a method's ``self``/``cls`` and those left at their default (secrets
            and bytes by a hash of their value); a tuple of parameter names to count
            only those; a function of the arguments returning a str; or ``None`` to
            not compare. A different fingerprint under the same key raises
            ``PayloadMismatchError``, in flight and after completion.
        replay_errors: Exception types that are terminal outcomes: stored as data
            (type, message, fields) and raised to duplicates as ``ReplayedError``.
            Any other exception releases the claim, so a retry runs at once.
        keep_alive: Renew the lease while the function runs (recommended).
        native: As for ``Claim``: ``"auto"``, ``"never"`` or ``"always"``.
        replicas: As for ``Claim``: wait for this many replicas to acknowledge the
            claim and the stored result (``NotReplicatedError`` otherwise).
        replica_timeout_ms: How long to wait for them.
        fail_open: Run the function anyway when the claim's round trip cannot reach
            the server (``ConnectionFailedError``, ``ServerUnavailableError`` included):
            its result is returned and not stored, and the guarantee becomes
            at-least-once while the server is unreachable. Each such run is logged at
            WARNING and ends in a ``failed_open`` event. A server that answers always
            wins: a stored result is replayed, work in flight is waited for. Off by
            default: for work that is harmless to repeat (a cache warm-up, a
            notification deduplicated downstream), never for payments.
        at_most_once: Never run the function twice for a key, even after a call that
            ended without a result: once a caller's lease ends unrenewed (its process
            crashed or was killed, or Redis was out of reach for the lease), every caller
            gets ``InterruptedWorkError`` (the holder, when it claimed) until the key is
            forgotten or ``ttl`` ends. An exception the function raises still gives the
            claim back, so a retry runs (the exception is its own answer: retry or not as
            for any failure); a cancellation, ``KeyboardInterrupt`` or ``SystemExit``
            while it runs keeps it, as a crash would.
        checkpoints: Let the function save its progress for whoever takes the key over
            after a crash: ``current_claim().checkpoint(value)`` (bytes or str, at most
            64 KiB) while it runs, ``current_claim().last_checkpoint`` to resume from
            (``None`` on a fresh start). A stored result clears it.

    Example::

        @idempotent(client, key="order_id", ttl=86400)
        def charge(order_id: str, amount: int) -> Receipt: ...

    Once the function has returned, nothing runs it again: a result that cannot
    be stored (it would not come back equal and of the same type) is kept as a
    terminal ``ResultNotSerializableError`` for duplicates, the first caller's
    carrying ``.result``. Generators and iterator results are refused.

    Not guaranteed: a function whose claim is lost (its lease lapsed without
    renewal and another caller took it) may have run twice; its late result raises
    ``ClaimLostError`` and is not stored. Under the keep-alive an ``async def`` is
    cancelled once the loss is seen (its caller gets ``ClaimLostError``), and a
    ``def`` stops where it calls ``current_claim().ensure_held()``. With ``at_most_once`` nobody takes it: its
    late result is stored, and the callers in between got ``InterruptedWorkError``.
    """

    def decorate(func: Callable[..., Any]) -> Any:
        spec = _Spec(
            func, client, key, lease, ttl, wait, namespace, fingerprint, replay_errors, keep_alive, native,
            replicas, replica_timeout_ms, fail_open, at_most_once, checkpoints,
        )  # fmt: skip
        if spec.is_async:

            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await _idempotent_async.call(spec, args, kwargs)

            async def forget_async(*args: Any, **kwargs: Any) -> bool:
                return await AsyncClaim(spec.client, spec.key_of(args, kwargs), namespace=spec.namespace).forget()

            wrapped: Any = functools.wraps(func)(run_async)
            wrapped.forget = forget_async
            wrapped._goblin_spec = spec
            return wrapped

        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return _idempotent_sync.call(spec, args, kwargs)

        def forget_sync(*args: Any, **kwargs: Any) -> bool:
            return Claim(spec.client, spec.key_of(args, kwargs), namespace=spec.namespace).forget()

        wrapped = functools.wraps(func)(run_sync)
        wrapped.forget = forget_sync
        wrapped._goblin_spec = spec  # for integrations that need the key before a call (goblin_claim._jobs)
        return wrapped

    return cast(Decorator, decorate)
