"""``@idempotent``: run a function once per key; duplicates get the first result.

``_Spec`` holds every decision (keys, fingerprints, encoding, what a stored value
means); ``_call_sync`` and ``_call_async`` are the two mirrored I/O flows::

    acquire ──Claimed──────────────────────────────► run (lease kept alive) ─► complete
       │                                                 └─ raised: release (or store a replayable error)
       ├─Completed──► decode: value, stored error, or PayloadMismatchError
       └─InFlight───► compare fingerprints (one GET) ─► wait ─► Completed / Claimed (lease lapsed)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from ._async import AsyncClaim
from ._core import DONE_PREFIX, NativeMode, check_namespace, check_native, check_seconds, check_timeout, new_token
from ._envelope import Codec, ErrorEnvelope, fingerprint_of, replayed
from ._errors import (
    ClaimLostError,
    GoblinClaimError,
    InvalidArgumentTypeError,
    PayloadMismatchError,
    ResultNotSerializableError,
    StillInFlightError,
)
from ._outcomes import Completed, InFlight
from ._sync import Claim

__all__ = ["idempotent"]

P = ParamSpec("P")
R = TypeVar("R")

_SYNC_CLIENTS = (redis.Redis, redis.cluster.RedisCluster)
_ASYNC_CLIENTS = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


class _DefaultFingerprint:
    """Marker for the default fingerprint: a hash of all bound arguments."""

    def __repr__(self) -> str:
        return "<all arguments>"


ALL_ARGUMENTS: Any = _DefaultFingerprint()


def idempotent(
    client: Any,
    *,
    key: Callable[..., str] | str,
    lease: int = 30,
    ttl: int = 86400,
    wait: float = 10.0,
    namespace: str | None = None,
    fingerprint: Callable[..., str] | None = ALL_ARGUMENTS,
    replay_errors: tuple[type[BaseException], ...] = (),
    keep_alive: bool = True,
    native: NativeMode = "auto",
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function once per key; every duplicate gets an equal result.

    Works on ``def`` with a sync client (``redis.Redis``, ``RedisCluster``) and on
    ``async def`` with an asyncio one. The first caller runs the function while a
    keep-alive renews its lease, and stores the result as JSON (through pydantic,
    typed by the return annotation) for ``ttl`` seconds. Duplicates get the stored
    result back in one round trip; while the first call is in flight they wait up
    to ``wait`` seconds, taking the work over if its lease lapses.

    Args:
        client: The redis-py client (sync for ``def``, asyncio for ``async def``).
        key: A function of the decorated function's own arguments returning the
            idempotency key (a non-empty str), or the name of a parameter holding it.
        lease: Seconds a crashed caller's claim blocks the key.
        ttl: Seconds a result is kept and replayed.
        wait: Seconds a duplicate waits for in-flight work; ``0`` raises
            ``StillInFlightError`` at once.
        namespace: Key prefix; default ``<module>.<qualified name>`` of the
            function, so renaming or moving it starts afresh: pass a namespace to pin it.
        fingerprint: What identifies "the same call": by default all bound
            arguments; a function of the arguments returning a str; or ``None`` to
            not compare. A different fingerprint under the same key raises
            ``PayloadMismatchError``, in flight and after completion.
        replay_errors: Exception types that are terminal outcomes: stored as data
            (type, message, fields) and raised to duplicates as ``ReplayedError``.
            Any other exception releases the claim, so a retry runs at once.
        keep_alive: Renew the lease while the function runs (recommended).
        native: As for ``Claim``: ``"auto"``, ``"never"`` or ``"always"``.

    Example::

        @idempotent(client, key="order_id", ttl=86400)
        def charge(order_id: str, amount: int) -> Receipt: ...

    Not guaranteed: a function whose claim is lost (its lease lapsed without
    renewal) may have run twice; its late result raises ``ClaimLostError`` and is
    not stored. Results must be JSON-serializable for their annotation.
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        spec = _Spec(func, client, key, lease, ttl, wait, namespace, fingerprint, replay_errors, keep_alive, native)
        if spec.is_async:

            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await _call_async(spec, args, kwargs)

            return cast(Callable[P, R], functools.wraps(func)(run_async))

        def run_sync(*args: Any, **kwargs: Any) -> Any:
            return _call_sync(spec, args, kwargs)

        return cast(Callable[P, R], functools.wraps(func)(run_sync))

    return decorate


@dataclass(frozen=True)
class _Call:
    """One invocation: its key, fingerprint and the token that carries the fingerprint."""

    key: str
    fp: str | None
    token: str | None


class _Spec:
    """Everything ``@idempotent`` decides for one function, checked at decoration time."""

    def __init__(
        self,
        func: Callable[..., Any],
        client: Any,
        key: Callable[..., str] | str,
        lease: int,
        ttl: int,
        wait: float,
        namespace: str | None,
        fingerprint: Callable[..., str] | None,
        replay_errors: tuple[type[BaseException], ...],
        keep_alive: bool,
        native: NativeMode,
    ) -> None:
        self.func = func
        self.client = client
        self.is_async = inspect.iscoroutinefunction(func)
        _check_client(func, client, self.is_async)
        self.signature = inspect.signature(func)
        if isinstance(key, str):
            if key not in self.signature.parameters:
                raise InvalidArgumentTypeError(f"key={key!r} is not a parameter of {func.__qualname__}{self.signature}")
        elif not callable(key):
            raise InvalidArgumentTypeError(f"key must be a parameter name or a function of the arguments, not {key!r}")
        self.key = key
        self.lease = check_seconds("lease", lease)
        self.ttl = check_seconds("ttl", ttl)
        self.wait = check_timeout("wait", wait)
        self.namespace = check_namespace(namespace or f"{func.__module__}.{func.__qualname__}")
        if fingerprint is not None and fingerprint is not ALL_ARGUMENTS and not callable(fingerprint):
            raise InvalidArgumentTypeError(f"fingerprint must be a function, None or left out, not {fingerprint!r}")
        self.fingerprint = fingerprint
        if not isinstance(replay_errors, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in replay_errors
        ):
            raise InvalidArgumentTypeError(f"replay_errors must be a tuple of exception classes, not {replay_errors!r}")
        self.replay_errors = replay_errors
        self.keep_alive = bool(keep_alive)
        self.native = check_native(native)
        self.codec: Codec[Any] = Codec(_return_type(func))

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """The key, fingerprint and token of one call (no I/O)."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if isinstance(self.key, str):
            key = bound.arguments[self.key]
            if type(key) is int:  # an integer id is a fine key; bool is not
                key = str(key)
        else:
            key = self.key(*args, **kwargs)
        if type(key) is not str or not key:
            raise InvalidArgumentTypeError(f"the idempotency key must be a non-empty str, got {key!r}")
        if self.fingerprint is None:
            fp = None
        elif self.fingerprint is ALL_ARGUMENTS:
            fp = fingerprint_of(bound.arguments, key)
        else:
            custom = self.fingerprint(*args, **kwargs)
            if type(custom) is not str:
                raise InvalidArgumentTypeError(f"fingerprint must return a str, got {custom!r}", key=key)
            fp = hashlib.sha256(custom.encode()).hexdigest()[:32]
        # The fingerprint rides in the token, which the claim key stores: an
        # in-flight duplicate can compare it with one GET.
        return _Call(key, fp, f"{new_token()}.{fp}" if fp else None)

    def check_holder(self, holder: object, call: _Call) -> None:
        """Raise ``PayloadMismatchError`` if the claim's holder ran with other arguments."""
        if call.fp is None or holder is None:
            return
        text = holder.decode("utf-8", "replace") if isinstance(holder, bytes) else str(holder)
        text = text.removeprefix(DONE_PREFIX)
        if "." in text and text.rsplit(".", 1)[1] != call.fp:
            raise self.mismatch(call)

    def settle(self, stored: bytes | str, call: _Call) -> Any:
        """What a duplicate gets for a stored envelope: the value, or a raised error."""
        envelope = self.codec.decode(stored, call.key)
        if call.fp is not None and envelope.fp is not None and envelope.fp != call.fp:
            raise self.mismatch(call)
        if isinstance(envelope, ErrorEnvelope):
            raise replayed(envelope.error, call.key)
        return envelope.value

    def mismatch(self, call: _Call) -> PayloadMismatchError:
        """The error for a key reused with different arguments."""
        return PayloadMismatchError(
            f"{call.key!r} was first called with different arguments (fingerprints differ); "
            "use a new key for a new request",
            key=call.key,
        )

    def in_flight(self, call: _Call) -> StillInFlightError:
        """The error for ``wait=0`` on in-flight work."""
        return StillInFlightError(f"{call.key!r} is in flight (wait=0)", key=call.key)

    def lost(self, call: _Call, result: Any, cause: ClaimLostError) -> ClaimLostError:
        """The error for work that finished after its claim was lost; it carries the result."""
        return ClaimLostError(
            f"{call.key!r} finished after its claim was lost (lease lapsed); the result was not stored: {cause}",
            key=call.key,
            result=result,
        )


def _check_client(func: Callable[..., Any], client: Any, is_async: bool) -> None:
    name = getattr(func, "__qualname__", repr(func))
    kind = type(client).__name__
    if is_async and not isinstance(client, _ASYNC_CLIENTS):
        raise InvalidArgumentTypeError(
            f"@idempotent on async def {name} needs an asyncio client (redis.asyncio.Redis or "
            f"redis.asyncio.cluster.RedisCluster), not {kind}; or make {name} a plain def"
        )
    if not is_async and not isinstance(client, _SYNC_CLIENTS):
        hint = f"make {name} an async def" if isinstance(client, _ASYNC_CLIENTS) else "pass a redis-py client"
        raise InvalidArgumentTypeError(
            f"@idempotent on def {name} needs a sync client (redis.Redis or redis.cluster.RedisCluster), "
            f"not {kind}; {hint}"
        )


def _return_type(func: Callable[..., Any]) -> Any:
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except (NameError, TypeError) as exc:
        raise InvalidArgumentTypeError(
            f"cannot resolve the return annotation of {func.__qualname__}: {exc}; "
            "define the return type at module level"
        ) from exc
    return hints.get("return", Any)


# --------------------------------------------------------------------------- the two flows


def _call_sync(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = spec.prepare(args, kwargs)
    claim = Claim(
        spec.client, call.key, lease=spec.lease, ttl=spec.ttl, namespace=spec.namespace,
        token=call.token, native=spec.native,
    )  # fmt: skip
    outcome = claim.acquire()
    if isinstance(outcome, InFlight):
        if call.fp is not None:
            spec.check_holder(claim._peek(), call)
        if spec.wait == 0:
            raise spec.in_flight(call)
        outcome = claim.wait(timeout=spec.wait)
    if isinstance(outcome, Completed):
        return spec.settle(outcome.value, call)
    try:
        with claim.keep_alive() if spec.keep_alive else contextlib.nullcontext():
            result = spec.func(*args, **kwargs)
    except BaseException as exc:
        if isinstance(exc, spec.replay_errors):
            with contextlib.suppress(ClaimLostError):
                claim.complete(spec.codec.encode_error(exc, call.fp))
        else:
            _release_quietly(claim)
        raise
    try:
        payload = spec.codec.encode_result(result, call.fp, call.key)
    except ResultNotSerializableError:
        _release_quietly(claim)
        raise
    try:
        claim.complete(payload)
    except ClaimLostError as exc:
        raise spec.lost(call, result, exc) from exc
    return result


def _release_quietly(claim: Claim) -> None:
    # The original error matters more; if Redis is unreachable the claim frees
    # itself when its lease lapses.
    with contextlib.suppress(GoblinClaimError):
        claim.release()


async def _call_async(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    call = spec.prepare(args, kwargs)
    claim = AsyncClaim(
        spec.client, call.key, lease=spec.lease, ttl=spec.ttl, namespace=spec.namespace,
        token=call.token, native=spec.native,
    )  # fmt: skip
    outcome = await claim.acquire()
    if isinstance(outcome, InFlight):
        if call.fp is not None:
            spec.check_holder(await claim._peek(), call)
        if spec.wait == 0:
            raise spec.in_flight(call)
        outcome = await claim.wait(timeout=spec.wait)
    if isinstance(outcome, Completed):
        return spec.settle(outcome.value, call)
    try:
        async with claim.keep_alive() if spec.keep_alive else contextlib.nullcontext():
            result = await spec.func(*args, **kwargs)
    except BaseException as exc:  # cancellation included: a retry must not wait for the lease
        if isinstance(exc, spec.replay_errors):
            with contextlib.suppress(ClaimLostError):
                await claim.complete(spec.codec.encode_error(exc, call.fp))
        else:
            await _release_quietly_async(claim)
        raise
    try:
        payload = spec.codec.encode_result(result, call.fp, call.key)
    except ResultNotSerializableError:
        await _release_quietly_async(claim)
        raise
    try:
        await claim.complete(payload)
    except ClaimLostError as exc:
        raise spec.lost(call, result, exc) from exc
    return result


async def _release_quietly_async(claim: AsyncClaim) -> None:
    # Shielded: a cancelled caller still gives its claim back.
    with contextlib.suppress(GoblinClaimError):
        await asyncio.shield(claim.release())
