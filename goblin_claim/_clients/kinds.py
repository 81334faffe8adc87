"""Whether a client is sync or asyncio, the message for a client of the wrong kind, and a client made on first use."""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

from .._errors import (
    InvalidArgumentTypeError,
)
from .families import adapt

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


def check_client(
    client: object,
    wants_async: bool | None,
    user: str,
    hint: str | None = None,
    *,
    also: str = "",
    error: Callable[[str], Exception] = InvalidArgumentTypeError,
) -> None:
    """Raise unless ``client`` is a client of the kind ``user`` needs (asyncio or sync).

    One message for every user: ``<user> needs <clients><also>, not <type>; <hint>``.

    Args:
        client: The client passed in.
        wants_async: Whether ``user`` awaits the client's commands; ``None`` checks nothing.
        user: What needs the client (a handle class, ``@idempotent on def f``, a door), for the message.
        hint: What to do about a client of the other kind; ``None``: the handles' advice
            (``Claim`` for a sync client, ``AsyncClaim`` for an asyncio one).
        also: What else ``user`` accepts, after the clients (`` or a function of no arguments returning one``).
        error: The exception raised (``InvalidArgumentTypeError``; a framework's own configuration error).
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
    elif hint is None and wants_async:
        hint = "use Claim for a sync client, or pass an asyncio one"
    elif hint is None:
        hint = "use AsyncClaim (and await its methods) for an asyncio client, or pass a sync client"
    raise error(f"{user} needs {needs}{also}, not {got}; {hint}")


FACTORY: Final = " or a function of no arguments returning one"
"""What ``check_client``'s ``also`` says for a user that takes a factory (``LazyClient``)."""


class LazyClient:
    """A client given as it is, or made on first use by a function of no arguments: once per process, under a lock.

    A GLIDE client (given or made) is its adapter; ``check`` raises for a client of
    the wrong kind, at construction for a client given, on first use for one made.
    The client may not exist yet when the holder is made (an application's
    start-up, a test's fixture, a pre-forking server's worker). A client the
    factory made is never shared with a forked child: the child's first use calls
    the factory again (a client made in gunicorn's master before it forked, say
    with ``--preload``, stays the master's).

    Attributes:
        made: The client once it was given or made; ``None`` before (a hot path reads it, then calls ``get()``).
    """

    __slots__ = ("__weakref__", "_check", "_factory", "_lock", "made")

    def __init__(self, client: Any, check: Callable[[Any], None]) -> None:
        self._check = check
        self.made: Any = None
        self._factory: Callable[[], Any] | None = None
        self._lock = threading.Lock()
        client = adapt(client)  # a GLIDE client: its adapter
        if client_kind(client) is None and callable(client):
            self._factory = client
            _MADE_BY_FACTORIES.add(self)
        else:
            check(client)
            self.made = client

    def get(self) -> Any:
        """The client, made by the factory (and checked) on the first call when a factory was given."""
        client = self.made
        if client is None:
            with self._lock:
                if self.made is None:
                    assert self._factory is not None
                    made = adapt(self._factory())
                    self._check(made)
                    self.made = made
                client = self.made
        return client

    def _forget(self) -> None:
        """In a forked child: drop the parent's client (and a lock another thread may have held at the fork)."""
        self._lock = threading.Lock()
        self.made = None


# The holders whose client a factory makes: a forked child makes its own.
_MADE_BY_FACTORIES: weakref.WeakSet[LazyClient] = weakref.WeakSet()


def _forget_made() -> None:
    for holder in list(_MADE_BY_FACTORIES):
        holder._forget()


os.register_at_fork(after_in_child=_forget_made)
