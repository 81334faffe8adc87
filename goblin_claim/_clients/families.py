"""Which clients the SDK takes, and the errors they raise.

Three families of client reach the drivers:

- redis-py (``redis.Redis``, ``redis.cluster.RedisCluster`` and their asyncio twins);
- valkey-py (``valkey.Valkey``, ``valkey.cluster.ValkeyCluster`` and their asyncio
  twins), the redis-py fork: the same API under other names, with exception
  classes of its own;
- GLIDE (``glide.GlideClient``, ``glide.GlideClusterClient``,
  ``glide_sync.GlideClient``), whose API is its own: ``adapt`` puts it behind the
  small part of redis-py's API the drivers use (``goblin_claim._clients.glide``).

The tuples here are what the drivers catch and test against, so one ``except``
or ``isinstance`` serves every family. valkey-py is looked for once, at import;
a program without it pays nothing.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions as _r


def _family(*names: str) -> tuple[type[BaseException], ...]:
    """The exception classes called ``names`` in redis-py and, when installed, valkey-py."""
    found: list[type[BaseException]] = [getattr(_r, name) for name in names]
    if _valkey_exceptions is not None:
        found += [getattr(_valkey_exceptions, name.replace("Redis", "Valkey")) for name in names]
    return tuple(found)


try:
    import valkey as _valkey
    import valkey.asyncio as _valkey_asyncio
    import valkey.asyncio.cluster as _valkey_async_cluster
    import valkey.cluster as _valkey_cluster
    import valkey.exceptions as _valkey_exceptions
except ImportError:  # valkey-py is optional
    _valkey_exceptions = None  # type: ignore[assignment]
    SYNC_CLIENTS: tuple[type[Any], ...] = (redis.Redis,)
    ASYNC_CLIENTS: tuple[type[Any], ...] = (redis.asyncio.Redis,)
    CLUSTERS: tuple[type[Any], ...] = (redis.cluster.RedisCluster,)
    ASYNC_CLUSTERS: tuple[type[Any], ...] = (redis.asyncio.cluster.RedisCluster,)
else:
    SYNC_CLIENTS = (redis.Redis, _valkey.Valkey)
    ASYNC_CLIENTS = (redis.asyncio.Redis, _valkey_asyncio.Valkey)
    CLUSTERS = (redis.cluster.RedisCluster, _valkey_cluster.ValkeyCluster)
    ASYNC_CLUSTERS = (redis.asyncio.cluster.RedisCluster, _valkey_async_cluster.ValkeyCluster)
# The sync twin of ASYNC_CLIENTS by name, as CLUSTERS is ASYNC_CLUSTERS' (tools/unasync.py).
CLIENTS = SYNC_CLIENTS

# Every error a client raises for a command (the server's answer, the connection, a
# cluster client's own bookkeeping).
ERRORS = _family("RedisError", "RedisClusterException")
CLUSTER_ERRORS = _family("RedisClusterException")
RESPONSE_ERRORS = _family("ResponseError")
NO_SCRIPT = _family("NoScriptError")
CONNECTION_ERRORS = _family("ConnectionError", "TimeoutError")
# The answers a client reads as "cannot take the command now" (READONLY, LOADING,
# TRYAGAIN, CLUSTERDOWN and MASTERDOWN); others of the kind keep their code in the text.
TRANSIENT_ERRORS = _family("ReadOnlyError", "BusyLoadingError", "TryAgainError", "ClusterDownError")
# A cluster whose slots are moving or whose shape is changing: a multi-key command
# on a slot migrating key by key (TRYAGAIN), a redirection the client did not
# follow (ASK, MOVED), the client's redirections used up ("TTL exhausted", after
# TRYAGAIN sixteen times), a shard without a primary (CLUSTERDOWN), a slot no node
# covers for a moment. Nothing ran; the cluster settles.
SLOT_MOVING = _family("AskError", "TryAgainError", "ClusterError", "SlotNotCoveredError")
# The pool had no connection to give (a ConnectionError, told apart for its advice).
MAX_CONNECTIONS = _family("MaxConnectionsError")
# NOPERM: the user's ACL refuses the command.
NO_PERMISSION = _family("NoPermissionError")


def node_client(node: Any) -> Any:
    """The client of one node of a sync cluster client, or ``None`` before it is made.

    redis-py calls it ``redis_connection``, valkey-py ``valkey_connection``.
    """
    found = getattr(node, "redis_connection", None)
    return found if found is not None else getattr(node, "valkey_connection", None)


def make_node_client(cluster: Any, node: Any) -> Any:
    """The client of ``node`` of a sync cluster client, made if need be (``get_redis_connection``)."""
    make = getattr(cluster, "get_redis_connection", None) or cluster.get_valkey_connection
    return make(node)


def is_glide(client: object) -> bool:
    """Whether ``client`` is one of GLIDE's (told by its class's module, without importing GLIDE)."""
    module = type(client).__module__
    return module.startswith(("glide.", "glide_sync.")) or module in ("glide", "glide_sync")


def adapt(client: Any) -> Any:
    """The client the drivers use for ``client``: itself, or the adapter of a GLIDE client.

    A GLIDE client always gets the same adapter, so state learned per client (the
    native probe, the loaded scripts) is learned once.
    """
    if is_glide(client):
        from .glide import adapter_for

        return adapter_for(client)
    return client


# The packages whose code talks to servers: a client library (redis-py, valkey-py,
# GLIDE) or this one.
_CLIENT_PACKAGES = frozenset(("redis", "valkey", "glide", "glide_sync", "glide_shared"))
_OWN_PACKAGE = __name__.partition(".")[0]
