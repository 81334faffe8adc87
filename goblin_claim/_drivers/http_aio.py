"""The ASGI doors' claim path over ``AsyncClaim``: open a request's claim, store or mark its answer, give it back.

Of the two flavours the asyncio one is written, the sync one generated from it (``tools/unasync.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Literal

from .. import _events, _http
from .._clients.kinds import FACTORY, LazyClient, check_client
from .._clients.transport import to_the_end_async
from .._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    InterruptedWorkError,
    NotReplicatedError,
    ResultLostError,
    StillInFlightError,
)
from .._events import key_digest
from .._http import STORE_WINDOW, Answer, Options
from .._outcomes import Completed, InFlight
from ._aio_primitives import CANCELLED, CLIENT_KIND, OTHER_DOOR
from .aio import AsyncClaim, write_through

# The logger of a claim no door made (a door's claim logs on its door's: DoorClaim.log).
logger = logging.getLogger("goblin_claim.asgi")


class AsyncDoor:
    """The client a door claims through (made on first use by a factory), its options, its logger, and its claims.

    ``user`` is the door's public name, ``goblin_claim.<door>.<Name>``: a client of the
    wrong kind is told it, and the door's claims log on ``goblin_claim.<door>``.
    """

    def __init__(self, client: Any, options: Options, user: str) -> None:
        self.options = options
        self._client = LazyClient(client, functools.partial(_check_client, user))
        _, door, _ = user.split(".", 2)  # goblin_claim.<door>.<Name>
        self.log = logging.getLogger(f"goblin_claim.{door}")

    def claim(
        self, method: str, path: str, owner: str | None, key: str, fp: str, options: Options | None = None
    ) -> DoorClaim:
        """The claim for one request's key (under the door's options, or a route's own), its token carrying ``fp``."""
        o = self.options if options is None else options
        # The options were checked once, with the door: the handle checks only the request's key.
        claim = DoorClaim._settled(
            self._client.get(), _http.claim_name(method, path, owner, key), o.namespace, _http.claim_token(fp),
            o.lease, o.ttl, o.replicas, o.replica_timeout_ms, o.at_most_once,
        )  # fmt: skip
        claim.log = self.log
        return claim


class DoorClaim(AsyncClaim):
    """A request's claim, made by a door: what becomes of it is logged on that door's logger (``log``)."""

    __slots__ = ("log",)
    log: logging.Logger


# --------------------------------------------------------------------------- the claim's round trips


async def open_claim(
    options: Options, claim: AsyncClaim, fp: str, accept_encoding: bytes | None = None
) -> Answer | ConnectionFailedError | None:
    """Claim the key: ``None`` when this request runs, else the answer it gets (a replay or a problem).

    With ``fail_open``, a claim that could not reach the server gives its
    ``ConnectionFailedError`` back instead of a 503: the request runs without a claim
    (logged, and the observed request comes to ``failed_open``). A wait that loses
    the server after ``InFlight`` does not: someone holds the key.

    A claim whose round trip was cut short (``CANCELLED``) is given back before the
    interruption goes on.
    """
    try:
        try:
            outcome = await claim.acquire()
        except ConnectionFailedError as exc:  # ServerUnavailableError included
            if not options.fail_open:
                raise
            _events.failed_open(_log(claim), "request", claim, exc, _events.current_request())
            return exc
        if isinstance(outcome, InFlight):
            answer = _http.in_flight(options, claim._holder, fp)
            if answer is not None:
                if answer.code == "key-reused":
                    _mismatched()
                return answer
            outcome = await claim.wait(timeout=options.wait)
    except (StillInFlightError, InterruptedWorkError, ResultLostError) as exc:
        # Still running after the wait; at most once, an attempt that ended without a response (never run
        # again, so no Retry-After); done, but its answer gone.
        return _http.failure_answer(options, exc, options.wait)
    except NotReplicatedError as exc:
        # Taken, or read back, on a primary whose replicas did not acknowledge it in time (replicas=):
        # a failover could lose it, so the app does not run on it; what this token took is given back.
        _log(claim).warning("key %s: the claim was not acknowledged by enough replicas, answering 503", _digest(claim))
        await to_the_end_async(give_back(claim))
        return _http.failure_answer(options, exc)
    except GoblinClaimError as exc:  # Redis unreachable or refusing: never run the app unguarded
        failed = type(exc).__name__
        _log(claim).warning("key %s: the idempotency claim failed, answering 503: %s", _digest(claim), failed)
        return _http.failure_answer(options, exc)
    except CANCELLED:
        # The claim (or wait()'s takeover) may have landed with its reply lost to the
        # cancellation: give this token's claim back, or the key stays blocked by
        # nobody for the whole lease. Owner-checked, so a no-op when it never landed.
        await to_the_end_async(give_back(claim))
        raise
    if isinstance(outcome, Completed):
        answer = _http.replay(outcome.value, fp, accept_encoding)
        if answer.status == 500 and _http.REPLAYED_HEADER not in answer.headers:
            _log(claim).warning("key %s: a duplicate was answered %d", _digest(claim), answer.status)
        if answer.code == "key-reused":
            _mismatched()
        return answer
    return None


def _mismatched() -> None:
    """The observed request (if any) comes to ``payload_mismatch``: its key was sent with another request."""
    op = _events.current_request()
    if op is not None:
        op.note("payload_mismatch")


def passing_unstored(door: str, claim: AsyncClaim, status: int, reason: str) -> None:
    """Say, on the door's logger, that an answer is passed through unkept: every door in the same words."""
    logging.getLogger(f"goblin_claim.{door}").warning(_http.UNSTORED_WARNING, _digest(claim), status, reason)


async def store(claim: AsyncClaim, payload: bytes, status: int, fp: str) -> Literal["stored", "lost", "failed"]:
    """Store a whole response; failing that, keep the key closed with a small marker (fail closed)."""
    try:
        await _complete(claim, payload)
        return "stored"
    except ClaimLostError:
        # Another request took the key over after this lease lapsed: the answer
        # that is (or will be) stored is theirs, so this one is not given out.
        _log(claim).warning("key %s: the claim was lost while the app ran; answering 503", _digest(claim))
        return "lost"
    except NotReplicatedError:
        # Stored on the primary alone: a failover now could lose it, and a retry then runs again.
        # The answer goes out marked unstored, as the client must not count on it being kept.
        _log(claim).warning(
            "key %s: the response was stored on the primary, but not acknowledged by enough replicas", _digest(claim)
        )
        return "failed"
    except GoblinClaimError as exc:
        # The app ran: its answer is sent all the same, marked unstored.
        _log(claim).warning(
            "key %s: the response could not be stored (%s); it will not be replayed", _digest(claim), type(exc).__name__
        )
        failure = exc
    if not isinstance(failure, ConnectionFailedError):
        # A refused write (maxmemory, a size limit) may still take a marker a few
        # bytes long; a connection that failed through the store window would not.
        await mark(claim, _http.unstored_payload(fp, status, f"it could not be stored: {str(failure)[:200]}"))
    return "failed"


async def _complete(claim: AsyncClaim, payload: bytes) -> None:
    # A dropped connection is retried for a while: the store window, at most the
    # lease (it also lands after the lease if nobody claimed the key since).
    await write_through(functools.partial(claim.complete, payload), min(float(claim.lease), STORE_WINDOW), claim.key)


async def mark(claim: AsyncClaim, marker: bytes) -> None:
    """Keep the key closed with ``marker``: duplicates are told, the request is not run again."""
    try:
        await _complete(claim, marker)
    except GoblinClaimError as exc:
        _log(claim).warning(
            "key %s: could not keep the key closed (%s); it frees itself after the lease and a retry runs again",
            _digest(claim), type(exc).__name__,
        )  # fmt: skip


async def abandon(claim: AsyncClaim, fp: str, reason: str) -> None:
    """Keep a request that began but ended without a whole response closed: duplicates get 422."""
    _log(claim).warning("key %s: %s; the key is kept closed, duplicates are answered 422", _digest(claim), reason)
    await mark(claim, _http.abandoned_payload(fp, reason))


async def give_back(claim: AsyncClaim) -> bool:
    """Release ``claim`` if this token holds it (owner-checked, so a no-op otherwise): whether it did."""
    with contextlib.suppress(GoblinClaimError):  # if Redis is gone, the claim frees itself after its lease
        return await claim.release()
    return False


async def app_raised(options: Options, claim: AsyncClaim, fp: str) -> None:
    """The app raised while its client waited: give the key back, or keep its 500 (``server_errors="store"``)."""
    kept = _http.raised(options)
    if kept is None:
        await give_back(claim)
        return
    payload = _http.stored_payload(fp, kept.status, kept.headers, options.keeps_header, kept.body)
    await store(claim, payload, kept.status, fp)


def _log(claim: AsyncClaim) -> logging.Logger:
    """The logger of the door that made ``claim``."""
    log: logging.Logger = getattr(claim, "log", logger)
    return log


def _digest(claim: AsyncClaim) -> str:
    return key_digest(claim.key)


def _check_client(user: str, client: object) -> None:
    check_client(client, CLIENT_KIND, user, OTHER_DOOR, also=FACTORY)
