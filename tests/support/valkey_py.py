"""valkey-py clients for the client-kind axis of the backends (``valkey-py``, ``valkey-py-cluster``).

The suites pass redis-py's options (a ``Retry`` with its backoff, a pool class,
error classes); ``translate`` gives valkey-py the same, so one test runs on both
with identical outcomes and errors. A client made without a ``Retry`` gets the one
redis-py would have given it: valkey-py's own default retries nothing, so a lost
reply would end the call instead of being re-sent, and the fault suites' re-send
tests would test a different client setting rather than a different client.

valkey-py's execute_command retries only the errors its connection lists in
``retry_on_error`` (whatever the ``Retry`` supports), so a translated ``Retry`` comes
with the list of what it supports.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.exceptions
import redis.retry
import valkey
import valkey.asyncio
import valkey.asyncio.cluster
import valkey.asyncio.retry
import valkey.backoff
import valkey.cluster
import valkey.exceptions
import valkey.retry

__all__ = ["cluster_clients", "standalone_clients", "translate"]

# redis-py backoffs valkey-py names otherwise (the same formula).
_BACKOFF_NAMES = {"ExponentialWithJitterBackoff": "FullJitterBackoff"}


def _backoff(backoff: Any) -> Any:
    """valkey-py's twin of a redis-py backoff, with the same parameters."""
    name = type(backoff).__name__
    twin = getattr(valkey.backoff, _BACKOFF_NAMES.get(name, name))
    made = twin.__new__(twin)
    made.__dict__.update(vars(backoff))  # _cap, _base, _backoff: the same fields in both
    return made


def _error(kind: Any) -> Any:
    """valkey-py's exception class of a redis-py one (the same name, Redis spelled Valkey)."""
    if isinstance(kind, type) and kind.__module__.startswith("redis."):
        return getattr(valkey.exceptions, kind.__name__.replace("Redis", "Valkey"))
    return kind  # a builtin (socket.timeout, TimeoutError)


def _retry(retry: Any, asyncio: bool) -> Any:
    """valkey-py's twin of a redis-py ``Retry``."""
    twin = valkey.asyncio.retry.Retry if asyncio else valkey.retry.Retry
    supported = tuple(dict.fromkeys(_error(kind) for kind in retry._supported_errors))
    return twin(_backoff(retry._backoff), retry._retries, supported_errors=supported)


def _default_retry(asyncio: bool) -> Any:
    """The ``Retry`` a redis-py client gives its connections when given none."""
    client = redis.asyncio.Redis() if asyncio else redis.Redis()  # makes no connection
    return client.connection_pool.connection_kwargs["retry"]


def translate(options: dict[str, Any], asyncio: bool, cluster: bool = False) -> dict[str, Any]:
    """redis-py client options as valkey-py's.

    Args:
        options: Keyword arguments a test passes to a redis-py client.
        asyncio: For an asyncio client.
        cluster: For a cluster client. redis-py's cluster client takes its ``Retry``
            for the whole command (its nodes' connections retry nothing); valkey-py's
            counts those tries in ``cluster_error_retry_attempts`` and would hand a
            ``Retry`` to every node's connections.
    """
    made = {name: _value(name, value, asyncio) for name, value in options.items()}
    if cluster:
        retry = made.pop("retry", None)
        if retry is not None:
            made["cluster_error_retry_attempts"] = retry._retries
        return made
    if "retry" not in made:
        made["retry"] = _retry(_default_retry(asyncio), asyncio)
    if "retry_on_error" not in made:
        # What the Retry supports is what execute_command may retry (see the module docstring).
        made["retry_on_error"] = list(made["retry"]._supported_errors)
    return made


def _value(name: str, value: Any, asyncio: bool) -> Any:
    """One redis-py option's value as valkey-py's."""
    if isinstance(value, (redis.retry.Retry, redis.asyncio.retry.Retry)):
        return _retry(value, asyncio)
    if isinstance(value, redis.backoff.AbstractBackoff):
        return _backoff(value)
    if isinstance(value, type) and value.__module__.startswith("redis."):  # a pool or connection class
        family = valkey.asyncio if value.__module__.startswith("redis.asyncio") else valkey
        return getattr(family, value.__name__) if hasattr(family, value.__name__) else _error(value)
    if name == "retry_on_error":
        return [_error(kind) for kind in value]
    return value


def standalone_clients(host: str, port: int) -> tuple[Any, Any]:
    """Makers of sync and asyncio ``Valkey`` clients of one server, as the ``standalone`` backend makes redis-py's."""

    def make_sync(**kw: Any) -> Any:
        return valkey.Valkey(host=host, port=port, **translate(kw, asyncio=False))

    def make_async(**kw: Any) -> Any:
        # As the redis-py backend: a blocking pool, for many concurrent tasks.
        kw.setdefault("retry", redis.asyncio.retry.Retry(redis.backoff.ExponentialWithJitterBackoff(0.01, 0.5), 3))
        kw.setdefault("max_connections", 64)
        pool = valkey.asyncio.BlockingConnectionPool(host=host, port=port, timeout=30, **translate(kw, asyncio=True))
        return valkey.asyncio.Valkey.from_pool(pool)

    return make_sync, make_async


def cluster_clients(host: str, port: int) -> tuple[Any, Any]:
    """Makers of sync and asyncio ``ValkeyCluster`` clients, as the ``cluster`` backend makes redis-py's."""

    def make_sync(**kw: Any) -> Any:
        return valkey.cluster.ValkeyCluster(host=host, port=port, **translate(kw, asyncio=False, cluster=True))

    def make_async(**kw: Any) -> Any:
        options = translate(kw, asyncio=True, cluster=True)
        return valkey.asyncio.cluster.ValkeyCluster(host=host, port=port, max_connections=1024, **options)

    return make_sync, make_async
