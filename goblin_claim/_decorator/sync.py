# Generated from _decorator/aio.py by tools/unasync.py: edit _decorator/aio.py, then run that script.
"""The I/O flow of ``@idempotent`` over ``Claim``.

Of the two flavours the asyncio one is written, the sync one generated from it (``tools/unasync.py``).
Every decision lives in ``plan._Spec``::

    acquire ──Claimed──────────────────────────────► run (lease kept alive) ─► store
       │                                                 ├─ raised: release (or store a replayable error);
       │                                                 │  at_most_once and stopped from outside: kept
       │                                                 └─ claim lost: stopped, ClaimLostError, nothing stored
       ├─Completed──► decode: value, stored error, or PayloadMismatchError
       ├─InFlight───► compare fingerprints (from the claim's reply) ─► wait ─► Completed / Claimed (lease lapsed)
       └─unreachable► ConnectionFailedError; with fail_open: run unclaimed, nothing stored

Interrupted anywhere (a task's cancellation, a ``KeyboardInterrupt``), the flow
leaves no key claimed by nobody: a claim that may have been taken is given back,
and once the function has returned its result is stored before the interruption
goes on (``to_the_end``). Under ``at_most_once`` a function stopped mid-work keeps
its attempt instead (what it did is unknown): the key reads as interrupted once its
lease ends.

While the function runs, ``current_claim()`` names its handle. Under a keep-alive a
coroutine function is cancelled when the claim is lost (``until_lost``), and its caller
gets ``ClaimLostError``; a plain function asks, with ``current_claim().ensure_held()``.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .. import _events
from .._clients.transport import to_the_end
from .._drivers._sync_primitives import until_lost
from .._drivers.sync import Claim, write_through
from .._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    NotReplicatedError,
    ResultNotSerializableError,
    ServerError,
)
from .._handle import Stored
from .._outcomes import Completed, InFlight
from .current import CURRENT

if TYPE_CHECKING:
    from .._drivers.keepalive import KeepAlive
    from .plan import _Call, _Spec

__all__ = ["call"]


def call(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of the decorated function: run it once per key, or replay the first result."""
    call = spec.prepare(args, kwargs)
    claim = spec.handle(Claim, call)
    if _events.active(_events.CALL_LOG):
        with _events.Op("call", claim) as op:
            return _flow(spec, args, kwargs, call, claim, op)
    try:
        return _flow(spec, args, kwargs, call, claim, None)
    except GoblinClaimError as exc:
        _events.quiet_failure("call", claim, exc)  # unobserved: only what an operator must act on
        raise


def _flow(
    spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any], call: _Call, claim: Claim, op: _events.Op | None
) -> Any:
    """The call's I/O; each step's outcome is told to ``op`` when the call is observed."""
    # Made once the claim is this call's: a duplicate (the hot path) never starts one.
    keeper: KeepAlive | None = None
    try:
        try:
            try:
                # Unobserved, a completed record comes back bare: its value, no Completed to build.
                outcome = claim._acquire(None, op is None)
            except ConnectionFailedError as exc:  # ServerUnavailableError included
                if not spec.fail_open:
                    raise
                return _unclaimed(spec, args, kwargs, claim, op, exc)
            if op is not None:
                op.note(outcome)
            if isinstance(outcome, InFlight):
                spec.check_holder(claim._holder, call)
                timeout = spec.wait_for(outcome.retry_after)
                if timeout == 0:
                    raise spec.in_flight(call, outcome.retry_after)
                outcome = claim.wait(timeout=timeout)
                if op is not None:
                    op.note(outcome, waited=True)
        except NotReplicatedError:
            # Claimed on the primary only: give it back rather than run undurably.
            # (Interrupted while a claim is on the wire, acquire() gives it back itself.)
            _release_quietly(claim)
            raise
        if isinstance(outcome, (Stored, Completed)):
            spec.check_holder(claim._holder, call)  # the record's token carries the first call's fingerprint
            return spec.settle(outcome.value, call)
        if spec.keep_alive:
            try:
                keeper = claim.keep_alive()
                keeper._begin()  # renewing begins, and a lost renewal counts, from here
            except BaseException:
                # The function has not run: nothing to store, and the claim goes back.
                _release_quietly(claim)
                raise
        running = CURRENT.set(claim)  # current_claim(), while the function runs
        try:
            result = until_lost(keeper, spec.func(*args, **kwargs))
        except BaseException as exc:  # cancellation included: a retry must not wait for the lease
            CURRENT.reset(running)
            if keeper is not None:
                keeper._end()
            if isinstance(exc, ClaimLostError) and _lost(claim):
                # Stopped by the loss (cancelled, or its own ensure_held() raised): the claim
                # is not this call's to store under or to give back.
                if op is not None:
                    op.settle("lease_lost")
                raise
            if spec.at_most_once and not isinstance(exc, Exception):
                # Stopped from outside mid-work (a cancellation, SystemExit, KeyboardInterrupt): what it
                # did is unknown, so its attempt stands, and reads as interrupted once its lease ends.
                if op is not None:
                    op.settle("interrupted")
                raise
            if op is not None:  # the function's own error: the call ran (and stored it) or gave the claim back
                op.settle((op.outcome or "claimed") if isinstance(exc, spec.replay_errors) else "released")
            if isinstance(exc, spec.replay_errors):
                to_the_end(_keep_error(spec, claim, call, exc))
            else:
                _release_quietly(claim)
            raise
        CURRENT.reset(running)
        # The function has returned: from here an interruption waits for the store.
        return to_the_end(_finish(spec, claim, call, result, keeper))
    finally:
        if keeper is not None:
            keeper._end()


def _lost(claim: Claim) -> bool:
    """Whether the handle knows its claim is lost, as ``ensure_held()`` tells it (no round trip)."""
    try:
        claim.ensure_held()
    except ClaimLostError:
        return True
    return False


def _unclaimed(
    spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any], claim: Claim, op: _events.Op | None,
    unreachable: ConnectionFailedError,
) -> Any:  # fmt: skip
    """Run the function without a claim: the claim could not reach the server, and ``fail_open`` asks for the work.

    Only the claim's own round trip comes here: a server that answered (a stored
    result, work in flight) always decides, and a wait cut off from the server
    raises, as someone holds the key. The result goes to the caller and is not
    stored, as there is no claim to store it under. A claim whose reply was lost
    may have landed: nothing sends a release to the server just found out of
    reach, so it frees itself when its lease lapses. It runs inside the handler of
    ``unreachable``, so that no success path pays for it: an error it raises names
    ``unreachable`` as its context.
    """
    _events.failed_open(_events.CALL_LOG, "call", claim, unreachable, op)
    return spec.func(*args, **kwargs)


def _finish(spec: _Spec, claim: Claim, call: _Call, result: Any, keeper: KeepAlive | None) -> Any:
    """Store what the function returned (or, unstorable, fail closed) and return it."""
    try:
        payload = spec.codec.encode_result(result, None, call.key)  # the fingerprint rides in the token
    except ResultNotSerializableError as exc:
        # The function ran: fail closed. Duplicates are told, nothing runs again.
        store(spec, claim, call, spec.codec.encode_unstorable(exc, None), result, keeper)
        exc.result = result
        raise
    store(spec, claim, call, payload, result, keeper)
    return result


def _keep_error(spec: _Spec, claim: Claim, call: _Call, exc: BaseException) -> bool:
    """Store a replayable error as the key's outcome; whether it was stored (not if the claim was lost)."""
    try:
        claim.complete(spec.codec.encode_error(exc, None))
    except ClaimLostError:
        return False
    return True


def store(
    spec: _Spec, claim: Claim, call: _Call, payload: bytes, result: Any, keeper: KeepAlive | None
) -> None:  # fmt: skip
    """Write the outcome of a function that has run, retrying a transient failure while the lease lasts.

    Every error raised from here carries ``result``: the function has run, and its
    caller is the only one left who has what it returned.
    """
    # A dropped connection, a demoted primary (READONLY), a WAIT cut short
    # (UNBLOCKED), a restart (LOADING) is retried while the lease lasts
    # (write_through). The keep-alive stops while the first write is on the wire.
    end = None if keeper is None else keeper._end
    try:
        write_through(lambda: claim._complete(payload, end), spec.lease, call.key)
    except ClaimLostError as exc:
        raise spec.lost(call, result, exc) from exc
    except ConnectionFailedError as exc:  # ServerUnavailableError included, past the lease
        raise spec.unstored(call, result, exc) from exc
    except GoblinClaimError as exc:
        # NotReplicatedError: stored on the primary, and replayed from there. Any
        # other refusal (a size limit, OOM, a wrong type): nothing was stored.
        exc.result = result
        raise
    except Exception as exc:  # not one of ours (a broken client): still the caller's result
        raise ServerError(
            f"{call.key!r} ran, but storing its result failed: {exc!r}", key=call.key, result=result
        ) from exc


def _release_quietly(claim: Claim) -> None:
    """Give the claim back, whatever interrupts; a failure to is no error of the caller's."""
    # The original error matters more; if Redis is unreachable the claim frees
    # itself when its lease lapses.
    with contextlib.suppress(GoblinClaimError):
        to_the_end(claim.release())
