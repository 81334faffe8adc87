"""The exceptions goblin-claim raises.

Every error the SDK raises derives from ``GoblinClaimError`` and carries the
claim's ``key`` (``None`` only when the key itself was the bad argument)::

    GoblinClaimError
    ├── InvalidArgumentError      (also a ValueError)  bad lease, ttl, key, token, value
    ├── InvalidArgumentTypeError  (also a TypeError)   an argument of the wrong type
    ├── ClaimLostError            this token no longer holds the claim
    ├── InterruptedWorkError      at_most_once: an earlier attempt ended without a result
    ├── ResultLostError           done, but the value is gone (two keys: evicted, deleted)
    ├── StillInFlightError        wait() reached its deadline, the work is still running
    ├── PayloadMismatchError      same key, different arguments (the decorator)
    ├── ReplayedError             a duplicate of a call that failed with a stored error
    ├── ResultNotSerializableError (also a TypeError) a result pydantic cannot store
    ├── UnreadableResultError     result_key holds something the decorator did not write
    ├── NativeUnavailableError    native="always" on a server without GOBLIN.CLAIM
    ├── NoCurrentClaimError       (also a LookupError) current_claim() outside an @idempotent call
    └── ServerError               Redis refused or failed a command
        ├── WrongTypeError        a claim or result key holds a non-string value
        ├── ConnectionFailedError the server could not be reached (or timed out)
        │   └── ServerUnavailableError  it answered, but cannot take the command now
        └── NotReplicatedError    fewer replicas than ``replicas=`` acknowledged a write in time

Server errors keep the redis-py exception as ``__cause__``. "Someone else holds
the claim" is not an error: ``acquire()`` returns ``InFlight`` for it.
"""

from __future__ import annotations

import datetime

__all__ = [
    "ClaimLostError",
    "ConnectionFailedError",
    "GoblinClaimError",
    "InterruptedWorkError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "NativeUnavailableError",
    "NoCurrentClaimError",
    "NotReplicatedError",
    "PayloadMismatchError",
    "ReplayedError",
    "ResultLostError",
    "ResultNotSerializableError",
    "ServerError",
    "ServerUnavailableError",
    "StillInFlightError",
    "UnreadableResultError",
    "WrongTypeError",
]


class GoblinClaimError(Exception):
    """Root of every error goblin-claim raises.

    Args:
        message: What went wrong, for humans.
        key: The claim's key (the idempotency key, or the claim key of a
            ``from_keys`` handle); ``None`` when no valid key exists yet.
        result: For ``@idempotent``, the value the function computed when the
            error came after it returned (its result could not be stored); else ``None``.
    """

    def __init__(self, message: str, *, key: str | None = None, result: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.result = result


class InvalidArgumentError(GoblinClaimError, ValueError):
    """An argument has an invalid value (a lease of 0, an empty key, ...)."""


class InvalidArgumentTypeError(GoblinClaimError, TypeError):
    """An argument has the wrong type (a lease of ``"30"`` or ``True``, ...)."""


class ClaimLostError(GoblinClaimError):
    """This handle's token no longer holds the claim.

    Its lease lapsed and another token claimed the work, or it was completed
    (by another token, or by this one with another value). Nothing was written.
    ``ensure_held()`` raises it when the handle's keep-alive (or its own clock) says
    the claim is lost; an ``async def`` under ``@idempotent`` whose claim is lost
    while it runs is cancelled, and its caller gets this error instead.

    Attributes:
        result: For the ``@idempotent`` decorator, the value the function computed
            after its claim was lost; ``None`` otherwise (and when the work was cancelled).
        holder: The token that holds or completed the claim instead, when the server
            said (a refused ``complete()``); ``None`` when it did not, or nobody does.
    """

    def __init__(
        self, message: str, *, key: str | None = None, result: object = None, holder: str | None = None
    ) -> None:
        super().__init__(message, key=key, result=result)
        self.holder = holder


class InterruptedWorkError(GoblinClaimError):
    """An ``at_most_once`` claim's earlier attempt ended without a result, so the work is not run again.

    Its owner claimed the key and then stopped renewing before it stored a result
    (a crash, a kill, a lost lease): its side effects may or may not have happened,
    and at most once means nobody tries again on their own. Every caller gets this
    until an operator reopens the key (``goblin-claim forget``, ``forget()``) or the
    record's ``ttl`` ends. If the earlier owner was only late, its ``complete()`` still
    stores its result, and callers get that from then on.

    Attributes:
        holder: The earlier attempt's token (its owner's identity when one was set).
        claimed_at: When it claimed the key, by the server's clock (UTC).
    """

    def __init__(self, message: str, *, key: str | None = None, holder: str, claimed_at: datetime.datetime) -> None:
        super().__init__(message, key=key)
        self.holder = holder
        self.claimed_at = claimed_at


class ResultLostError(GoblinClaimError):
    """The claim says the work was completed, but its result is gone.

    On two keys (``Claim.from_keys``): Redis evicted ``result_key`` (a
    ``maxmemory-policy`` other than ``noeviction``) or someone deleted it, and the
    done marker stayed. On the one-key record it only arises from a done marker
    with no value after it, which this release never writes (an evicted record is
    gone whole, and the work is free again). The work is not run again on its own:
    that is for an operator to decide, with ``forget()`` (or after ``ttl``).
    """


class StillInFlightError(GoblinClaimError):
    """The work is still in flight after waiting until the deadline.

    Attributes:
        retry_after: Seconds the holder's lease had left at the last attempt (as
            ``InFlight.retry_after``): retry then to take over a crashed owner's
            work; ``None`` when unknown.
        holder: The token holding the claim at the last attempt (as ``InFlight.holder``);
            ``None`` when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        result: object = None,
        retry_after: float | None = None,
        holder: str | None = None,
    ) -> None:
        super().__init__(message, key=key, result=result)
        self.retry_after = retry_after
        self.holder = holder


class PayloadMismatchError(GoblinClaimError):
    """The same key was used with different arguments."""


class ReplayedError(GoblinClaimError):
    """The first call failed with an error the decorator stores (``replay_errors=``).

    Duplicates raise this instead of running the function again. The original
    exception is data here, never an unpickled object.

    Attributes:
        type_name: The original exception's qualified class name (``module.Class``).
        message: ``str()`` of the original exception.
        fields: Its JSON-serializable attributes.
    """

    def __init__(
        self, message: str, *, key: str | None = None, type_name: str, error_message: str, fields: dict[str, object]
    ) -> None:
        super().__init__(message, key=key)
        self.type_name = type_name
        self.message = error_message
        self.fields = fields


class ResultNotSerializableError(GoblinClaimError, TypeError):
    """The function's result cannot be stored so that duplicates get what ran.

    It does not serialize as its annotation says, would come back unequal or of
    another type anywhere inside (an int where a float is declared, a tuple as a
    list), or is too large. The function ran, so the key fails closed: the
    first caller gets this with the value in ``.result``; duplicates get it too
    (``.result`` is ``None``) until the ttl ends or the key is forgotten.
    """


class UnreadableResultError(GoblinClaimError):
    """``result_key`` holds a value that is not a goblin-claim result envelope.

    Another writer used the key, or the return annotation changed since the
    value was stored; nothing was run.
    """


class NativeUnavailableError(GoblinClaimError):
    """``native="always"`` was asked for, but the server lacks GOBLIN.CLAIM / GOBLIN.CAD."""


class NoCurrentClaimError(GoblinClaimError, LookupError):
    """``current_claim()`` was called outside the function of an ``@idempotent`` call.

    A ``LookupError`` too, as a ``ContextVar`` without a value raises one, so a helper
    used both inside and outside decorated calls can catch either.
    """


class ServerError(GoblinClaimError):
    """Redis answered with an error, or the command could not be delivered."""


class WrongTypeError(ServerError):
    """A claim key or result key holds a value that is not a string."""


class ConnectionFailedError(ServerError):
    """The server could not be reached, or did not answer in time, or the client broke under the command.

    The last is what a client library raises that is not one of its own classes
    (redis-py 8.1's asyncio cluster client writing on a connection another task
    closed raises ``AttributeError``): it is kept as ``__cause__``.

    Transient: ``wait()`` polls through it, and ``@idempotent`` retries its final
    write while the lease lasts (every command is safe to send twice).
    """


class ServerUnavailableError(ConnectionFailedError):
    """The server answered, but cannot take the command now; transient like a dropped connection.

    A primary demoted to a replica (``READONLY``), a ``WAIT`` cut short by a
    demotion or ``CLIENT UNBLOCK`` (``UNBLOCKED``), a server still loading its
    data (``LOADING``), a replica cut off from its primary (``MASTERDOWN``), a
    primary without the replicas ``min-replicas-to-write`` asks for
    (``NOREPLICAS``), a cluster moving slots or failing over (``TRYAGAIN``,
    ``CLUSTERDOWN``, ``ASK``/``MOVED`` left unfollowed, the cluster client's
    "TTL exhausted" after its redirections). The connection that answered is
    dropped, so the next try connects again (and follows a failover behind a
    proxy or a DNS name). A cluster moving the key's slot is sent again by the
    handle itself for up to ``lease`` seconds before this is raised.
    """


class NotReplicatedError(ServerError):
    """Fewer replicas than asked (``replicas=``) acknowledged a write within ``replica_timeout_ms``.

    The write happened on the primary: after ``acquire()`` this handle holds the
    claim (do the work, or ``release()`` it); after ``complete()`` the result is
    stored (calling ``complete()`` again with the same value is safe and waits
    again, on any connection). If the primary fails over before a replica has the
    write, the write is lost. After an ``acquire()`` that found the work completed,
    the result was read from the primary but too few replicas acknowledged having
    it (it may have been stored on a primary that is being deposed): try again.

    Attributes:
        acknowledged: How many replicas acknowledged it.
        replicas: How many were asked for.
    """

    def __init__(self, message: str, *, key: str | None = None, acknowledged: int, replicas: int) -> None:
        super().__init__(message, key=key)
        self.acknowledged = acknowledged
        self.replicas = replicas
