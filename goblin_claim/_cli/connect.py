"""Connecting the command line to a server or cluster from a URL, and its exit statuses."""

from __future__ import annotations

import urllib.parse
from typing import Any

import redis
import redis.cluster

from .._clients.families import (
    ERRORS,
    RESPONSE_ERRORS,
    make_node_client,
)

DEFAULT_URL = "redis://localhost:6379/0"
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
# Stopped by the reader (`| head`) or by Ctrl-C: what a shell shows for SIGPIPE and SIGINT.
EXIT_PIPE, EXIT_INTERRUPTED = 128 + 13, 128 + 2
Client = Any  # a standalone or cluster client of redis-py or valkey-py: both type them loosely


# --------------------------------------------------------------------------- connecting


# URL schemes that valkey-py's clients take; every other goes to redis-py's.
_VALKEY_SCHEMES = ("valkey://", "valkeys://")
# What connecting can raise: the client's errors, or a URL it cannot take.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*ERRORS, ValueError)


def _client_classes(url: str) -> tuple[Any, Any]:
    """The standalone and cluster client classes for ``url``: valkey-py's for ``valkey://``.

    Raises:
        ValueError: A ``valkey://`` or ``valkeys://`` URL without valkey-py installed.
    """
    if not url.lower().startswith(_VALKEY_SCHEMES):
        return redis.Redis, redis.cluster.RedisCluster
    try:
        import valkey
        import valkey.cluster
    except ImportError:
        raise ValueError(
            f"{url.split('://', 1)[0]}:// URLs need valkey-py: pip install 'goblin-claim[valkey]' "
            "(or give a redis:// URL: a Valkey server takes those too)"
        ) from None
    return valkey.Valkey, valkey.cluster.ValkeyCluster


def connect(url: str) -> tuple[Client, bool]:
    """A client for ``url``, and whether the server is a cluster node (then a cluster client).

    ``redis://``, ``rediss://`` and ``unix://`` URLs get redis-py's clients;
    ``valkey://`` and ``valkeys://`` get valkey-py's.

    Raises:
        redis.RedisError: The server cannot be reached or refuses the connection
            (``valkey.ValkeyError`` with valkey-py's clients).
        ValueError: A URL the client cannot parse, or a ``valkey://`` one without valkey-py.
    """
    standalone, cluster_class = _client_classes(url)
    client = standalone.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
        try:
            cluster = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
        except RESPONSE_ERRORS:  # INFO refused by the ACL: try the cluster command itself
            try:
                client.execute_command("CLUSTER MYID")  # type: ignore[no-untyped-call, unused-ignore]
                cluster = True
            except RESPONSE_ERRORS:
                cluster = False
    except BaseException:
        client.close()
        raise
    if not cluster:
        return client, False
    client.close()
    return cluster_class.from_url(url, socket_timeout=5, socket_connect_timeout=5), True


def _primaries(client: Client, cluster: bool) -> list[tuple[str, Any]]:
    """(name, plain client) for every primary: the one server, or each cluster primary."""
    if not cluster:
        kwargs = client.connection_pool.connection_kwargs
        return [(f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}", client)]
    return [(node.name, make_node_client(client, node)) for node in client.get_primaries()]


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # not a URL urllib can take apart: show its scheme only
        return url.split("://", 1)[0] + "://..." if "://" in url else "..."
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
