"""Whether a client is sync or asyncio, and the message for a client of the wrong kind."""

from __future__ import annotations

import inspect
from typing import Final

from .._errors import (
    InvalidArgumentTypeError,
)

# Per client type: True when its commands are coroutines (asyncio), False when not.
# Judged by what the client does, so redis-py-compatible clients keep working.
# Bounded like _NAMESPACES_SEEN: types made at run time (a mock's class per
# instance) would otherwise be kept alive here for good.
_CLIENT_KINDS: dict[type, bool] = {}
CLIENT_KINDS_MAX: Final = 256
_CLIENT_METHODS: Final = ("execute_command", "evalsha", "eval")


def client_kind(client: object) -> bool | None:
    """Whether ``client`` is an asyncio client (``True``) or a sync one (``False``).

    ``None`` when it is no redis-py-like client at all (it lacks ``execute_command``,
    ``evalsha`` or ``eval``). The answer is cached per client type.
    """
    kind = _CLIENT_KINDS.get(type(client))
    if kind is None:
        if not all(callable(getattr(client, name, None)) for name in _CLIENT_METHODS):
            return None
        kind = inspect.iscoroutinefunction(client.execute_command)  # type: ignore[attr-defined]
        if len(_CLIENT_KINDS) >= CLIENT_KINDS_MAX:
            _CLIENT_KINDS.clear()
        _CLIENT_KINDS[type(client)] = kind
    return kind


# What a client of the wrong kind is told it needs (the families of ``_clients.families``).
SYNC_NEEDS: Final = (
    "a sync client (redis.Redis, redis.cluster.RedisCluster, valkey.Valkey, "
    "valkey.cluster.ValkeyCluster, or GLIDE's glide_sync.GlideClient)"
)
ASYNC_NEEDS: Final = (
    "an asyncio client (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster, valkey.asyncio.Valkey, "
    "valkey.asyncio.cluster.ValkeyCluster, or GLIDE's glide.GlideClient or glide.GlideClusterClient)"
)
ANY_CLIENT: Final = "pass a redis-py, valkey-py or GLIDE client"


def check_client(client: object, wants_async: bool | None, user: str) -> None:
    """Raise unless ``client`` is a client of the kind ``user`` needs (asyncio or sync).

    Args:
        client: The client passed in.
        wants_async: Whether ``user`` awaits the client's commands; ``None`` checks nothing.
        user: The handle class that needs the client, for the message.
    """
    if wants_async is None:
        return
    kind = client_kind(client)
    if kind is wants_async:
        return
    needs = ASYNC_NEEDS if wants_async else SYNC_NEEDS
    got = f"{type(client).__module__}.{type(client).__qualname__}"
    if kind is None:
        hint = ANY_CLIENT
    elif wants_async:
        hint = "use Claim for a sync client, or pass an asyncio one"
    else:
        hint = "use AsyncClaim (and await its methods) for an asyncio client, or pass a sync client"
    raise InvalidArgumentTypeError(f"{user} needs {needs}, not {got}; {hint}")
