"""The one error boundary: a client library's exception becomes a goblin-claim error here, transient or not."""

from __future__ import annotations

import contextlib
from typing import Any

from .._errors import ConnectionFailedError, ServerError, ServerUnavailableError, WrongTypeError
from .families import (
    _CLIENT_PACKAGES,
    _OWN_PACKAGE,
    ASYNC_CLIENTS,
    CLUSTER_ERRORS,
    CONNECTION_ERRORS,
    ERRORS,
    MAX_CONNECTIONS,
    SLOT_MOVING,
    SYNC_CLIENTS,
    TRANSIENT_ERRORS,
)
from .transport import doubt_primary


def translate(exc: BaseException, key: str, keys: str) -> ServerError:
    """The goblin-claim error for a client's error; the caller raises it ``from exc``.

    Args:
        exc: What the client raised: redis-py's or valkey-py's classes, or any
            other exception from inside a client library (see ``raised_by_client``),
            which is a connection it broke under the command.
        key: The handle's key, carried by the error.
        keys: The Redis key(s) the command touched, for the message.
    """
    text = str(exc)
    if is_transient(exc):
        return ServerUnavailableError(
            f"Redis cannot take a command on {keys} now (a failover, a demotion, a restart, "
            f"slots moving): {_code(exc)}{text}",
            key=key,
        )
    if isinstance(exc, MAX_CONNECTIONS):
        return ConnectionFailedError(
            f"no free connection for {keys}: {text} (many concurrent tasks need a BlockingConnectionPool)",
            key=key,
        )
    if (
        isinstance(exc, CONNECTION_ERRORS)
        or (isinstance(exc, CLUSTER_ERRORS) and _UNREACHABLE in text)
        or text == _CLOSED_UNDER_READ
    ):
        return ConnectionFailedError(f"Redis unreachable while working on {keys}: {text}", key=key)
    if not isinstance(exc, ERRORS):
        return ConnectionFailedError(
            f"the client failed while working on {keys}, its connection closed under the command: "
            f"{type(exc).__name__}: {text}",
            key=key,
        )
    if "WRONGTYPE" in text or text.startswith(_NOT_A_STRING):
        return WrongTypeError(f"{keys} holds a value that is not a string: {text}", key=key)
    return ServerError(f"Redis refused a command on {keys}: {text}", key=key)


# Redis 8.4's DELEX with a condition (the SDK's owner-checked release) on a key that holds no
# string: what Redis 7.0's scripts, Valkey's DELIFEQ and every other command answer WRONGTYPE.
_NOT_A_STRING = "Key should be of string type"
# A cluster client that reached no node at all (redis-py and valkey-py say it so).
_UNREACHABLE = "cannot be connected"
# valkey-py's asyncio reader, closed under a read by another task (a cut connection
# torn down): its base error class, where redis-py raises OSError. Nothing was answered.
_CLOSED_UNDER_READ = "Buffer is closed."
# A cluster client's own words for a shape it is still learning: a slot no node
# covers, a node it knows of without a connection, nodes that disagree, a node
# gone from the cluster.
_RESHAPING = (
    "not covered",
    "has no redis_connection",
    "has no valkey_connection",
    "could not agree",
    "doesn't exist in the cluster",
)


# Error replies of a server that cannot take the command now but will (or whose
# successor will): a failover, a demotion, a restart. A command refused with one
# of these did not run, except UNBLOCKED, which cuts a WAIT short after its write
# ran; every command the SDK sends is safe to send twice, so both are retried.
# A WAIT sent to a primary demoted since (a replica now refuses it): a failover, as READONLY is.
_DEMOTED_WAIT = "WAIT cannot be used with replica instances"
_TRANSIENT_CODES = ("READONLY", "UNBLOCKED", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")


def _code(exc: BaseException) -> str:
    """The error code the client took off the reply's text (``READONLY`` and the like), with a space."""
    code = getattr(exc, "status_code", None)
    return f"{code} " if isinstance(code, str) and code and not str(exc).startswith(code) else ""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's answer that it cannot take the command now (see ``_TRANSIENT_CODES``).

    A cluster moving slots or changing shape is one too (``SLOT_MOVING``, and the
    cluster client's own words for it: ``is_reshaping``).

    redis-py and valkey-py take the code off the text of the replies they know (``READONLY``,
    ``LOADING``, ...), and leaves it on the others (``UNBLOCKED``, ``NOREPLICAS``);
    a script's error keeps it too.
    """
    if isinstance(exc, TRANSIENT_ERRORS) or is_reshaping(exc):
        return True
    if not isinstance(exc, ERRORS) or isinstance(exc, CONNECTION_ERRORS):
        return False
    text = str(exc).lstrip("-")
    return text.startswith(_TRANSIENT_CODES) or _DEMOTED_WAIT in text


def is_reshaping(exc: object) -> bool:
    """Whether ``exc`` says a cluster is moving the slot or changing shape (``SLOT_MOVING``, ``_RESHAPING``).

    Nothing ran, and the cluster settles within moments (a migration's next key,
    a failover's promotion): the drivers send the command again while the lease
    lasts rather than give their caller an error it can do nothing about.
    """
    if isinstance(exc, SLOT_MOVING):
        return True
    return isinstance(exc, CLUSTER_ERRORS) and any(words in str(exc) for words in _RESHAPING)


def _reconnect_target(client: object) -> tuple[Any, bool]:
    """What to disconnect after a transient answer, and whether it is a pool (else one connection)."""
    if isinstance(client, (*SYNC_CLIENTS, *ASYNC_CLIENTS)):
        single = getattr(client, "connection", None)
        return (single, False) if single is not None else (getattr(client, "connection_pool", None), True)
    return None, False  # a cluster client follows the cluster's own redirections and failovers


def failed(client: object, exc: BaseException, key: str, keys: str) -> ServerError:
    """``translate``, and after a transient answer ``distrust`` the client's connections.

    Every idle connection of the pool points where the one that answered did, so
    all of them go (connections in use are left to their users).
    """
    error = translate(exc, key, keys)
    if isinstance(error, ServerUnavailableError):
        distrust(client)
    return error


def distrust(client: object) -> None:
    """After a transient answer: drop ``client``'s idle connections, and on Sentinel re-dial a trusted primary.

    A demoted primary keeps answering READONLY on the connections already open to
    it; behind a proxy, a virtual IP or a DNS name only a new connection reaches
    the new primary; a primary cut off by a partition is still named by the
    sentinels on its side (``doubt_primary``).
    """
    target, pool = _reconnect_target(client)
    # Best effort: a connection that stays open answers the same again, and goes then.
    with contextlib.suppress(Exception):
        if pool:
            doubt_primary(target)
            target.disconnect(inuse_connections=False)
        elif target is not None:
            target.disconnect()


async def failed_async(client: object, exc: BaseException, key: str, keys: str) -> ServerError:
    """``failed`` for an asyncio client."""
    error = translate(exc, key, keys)
    if isinstance(error, ServerUnavailableError):
        await distrust_async(client)
    return error


async def distrust_async(client: object) -> None:
    """``distrust`` for an asyncio client."""
    target, pool = _reconnect_target(client)
    with contextlib.suppress(Exception):
        if pool:
            doubt_primary(target)
            await target.disconnect(inuse_connections=False)
        elif target is not None:
            await target.disconnect()


def raised_by_client(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a client library rather than out of this package's own code.

    One of the library's exception classes always does. Any other ``Exception``
    does when the innermost frame it passed through, of the client's code and
    ours, is the client's: redis-py 8.1's asyncio cluster client, closing a node's
    connections while other tasks write on them, raises ``AttributeError``
    (a writer already gone) from inside its connection. A bug of ours (its
    innermost such frame is ours) is not a server's failure, and stays what it is.
    """
    if isinstance(exc, ERRORS):
        return True
    if not isinstance(exc, Exception):
        return False
    innermost = None
    trace = exc.__traceback__
    while trace is not None:
        package = str(trace.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
        if package == _OWN_PACKAGE or package in _CLIENT_PACKAGES:
            innermost = package
        trace = trace.tb_next
    return innermost is not None and innermost != _OWN_PACKAGE
