"""Push wake-up for ``wait()``: one pub/sub subscriber per client, shared by its waiters.

``complete()``, ``release()`` and ``forget()`` announce on a channel named after
the claim key (a sharded channel on a cluster, so it stays on the key's node). A
waiter registers its claim key with its client's subscriber and sleeps on an
event; a message wakes it to try again at once instead of at its next poll. The
subscriber is one connection and one daemon thread per sync client, or one task
per asyncio client and event loop; it listens only while someone waits.

Polling with backoff stays: it is the fallback where pub/sub is refused (ACL) or
unavailable (the asyncio cluster client has none), where the client's pool holds
a single connection (the subscriber would take the commands' only one), and the
deadline's guard. Nothing here is on the first-call or duplicate paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from typing import Any

from .. import _events
from .._clients.families import ASYNC_CLUSTERS, CLUSTERS, NO_PERMISSION, RESPONSE_ERRORS
from .._clients.transport import state_of

__all__ = ["AsyncWakeups", "Wakeups", "async_wakeups", "wake_kind", "wakeups"]

# How often the listener looks for new channels to (un)subscribe while it waits
# for messages; a waiter that registers meanwhile still polls on its own.
_TICK = 0.005
# After a lost connection, the listener tries again this much later.
_RECONNECT_DELAY = 0.5
# An idle listener waits this long for the next waiter before it ends.
_LINGER = 1.0
# Why a client's waiters poll when its pool holds a single connection (logged once).
_ONE_CONNECTION = "a pool of one connection, which the commands need"


# The server's confirmation of a subscription: pub/sub is permitted here.
_CONFIRMED = ("subscribe", "ssubscribe")


def wake_kind(client: object) -> str:
    """How the scripts announce on ``client``'s server: sharded on a cluster.

    Read once per client: isinstance against the cluster classes goes through
    typing's protocol check, microseconds on every ``complete()``.
    """
    state = state_of(client)
    kind = state.wake
    if kind is None:
        kind = state.wake = "spublish" if isinstance(client, (*CLUSTERS, *ASYNC_CLUSTERS)) else "publish"
    return kind


def _text(channel: object) -> str:
    return channel.decode("utf-8", "replace") if isinstance(channel, bytes) else str(channel)


class _Registry:
    """Which events wait on which channel, and the (un)subscriptions still to send."""

    def __init__(self) -> None:
        self.watchers: dict[str, set[Any]] = {}
        self.changes: dict[str, bool] = {}  # channel -> subscribe (True) or unsubscribe (False)
        self.refused = False  # pub/sub not permitted here: wait() polls

    def add(self, channel: str, event: Any) -> None:
        watchers = self.watchers.setdefault(channel, set())
        if not watchers:
            self.changes[channel] = True
        watchers.add(event)

    def remove(self, channel: str, event: Any) -> None:
        watchers = self.watchers.get(channel)
        if watchers is None:
            return
        watchers.discard(event)
        if not watchers:
            del self.watchers[channel]
            self.changes[channel] = False

    def take_changes(self) -> dict[str, bool]:
        changes, self.changes = self.changes, {}
        return changes

    def events_of(self, channel: object) -> list[Any]:
        return list(self.watchers.get(_text(channel), ()))

    def every_event(self) -> list[Any]:
        return [event for watchers in self.watchers.values() for event in watchers]


def _apply(pubsub: Any, sharded: bool, changes: dict[str, bool]) -> None:
    subscribe = [channel for channel, on in changes.items() if on]
    unsubscribe = [channel for channel, on in changes.items() if not on]
    if subscribe:
        (pubsub.ssubscribe if sharded else pubsub.subscribe)(*subscribe)
    if unsubscribe:
        (pubsub.sunsubscribe if sharded else pubsub.unsubscribe)(*unsubscribe)


def _read_each_node(pubsub: Any, ignore_subscribe_messages: bool, timeout: float) -> Any:
    """One round over a valkey-py cluster pub/sub's nodes: the first message found, or ``None``."""
    del timeout  # each node is asked without waiting; the caller waits between rounds
    for node in list(pubsub.node_pubsub_mapping.values()):
        message = node.get_message(ignore_subscribe_messages=ignore_subscribe_messages, timeout=0.0)
        if message is not None:
            return message
    return None


def _pool_of_one(client: object) -> bool:
    """Whether ``client``'s connections are capped at one (a subscriber would hold the only one).

    The subscriber takes its connection from the client's pool, as redis-py's own
    ``pubsub()`` does, so it counts against the cap the user chose; that cap is kept
    (a connection made beside the pool would pass it). A pool that can hold two keeps
    one for the commands while the subscriber holds the other; a
    ``single_connection_client`` holds its own and leaves the pool to the subscriber.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        size = getattr(pool, "max_connections", None)
    else:  # the sync cluster client: each node's pool is made with the client's max_connections
        kwargs = getattr(client, "get_connection_kwargs", None)
        size = kwargs().get("max_connections") if callable(kwargs) else None
    return isinstance(size, int) and size < 2


def _is_refusal(exc: BaseException) -> bool:
    if isinstance(exc, NO_PERMISSION):
        return True
    text = str(exc).upper()
    return isinstance(exc, RESPONSE_ERRORS) and ("NOPERM" in text or "UNKNOWN COMMAND" in text)


class Wakeups:
    """The subscriber of one sync client: a daemon thread, started by the first waiter."""

    def __init__(self, client: Any) -> None:
        # Weak: the subscriber lives in a map keyed by its client and must not keep it alive.
        self._client = weakref.ref(client)
        self._sharded = isinstance(client, CLUSTERS)
        self._registry = _Registry()
        self._lock = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._told = False  # whether the INFO line on push or polling was logged
        if _pool_of_one(client):
            self._registry.refused = self._told = True
            _events.wakeups_found(client, False, _ONE_CONNECTION)

    def watch(self, channel: str) -> threading.Event | None:
        """An event set when ``channel`` announces; ``None`` where pub/sub is refused."""
        if self._registry.refused:
            return None
        event = threading.Event()
        with self._lock:
            self._registry.add(channel, event)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="goblin-claim wake-ups", daemon=True)
                self._thread.start()
            self._lock.notify()
        return event

    def unwatch(self, channel: str, event: threading.Event) -> None:
        with self._lock:
            self._registry.remove(channel, event)

    def _run(self) -> None:
        while True:
            pubsub = None
            try:
                client = self._client()
                if client is None:
                    return
                pubsub = client.pubsub()
                del client
                self._listen(pubsub)
                return  # nobody waits any more
            except Exception as exc:  # a lost connection, a closed client: the waiters poll meanwhile
                with self._lock:
                    self._registry.refused = self._registry.refused or _is_refusal(exc)
                    if self._registry.refused and not self._told:
                        self._told = True
                        _events.wakeups_found(self._client(), False, "pub/sub refused")
                    for event in self._registry.every_event():
                        event.set()
                    self._registry.changes = dict.fromkeys(self._registry.watchers, True)
                    if self._registry.refused or not self._registry.watchers:
                        self._thread = None
                        return
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
            time.sleep(_RECONNECT_DELAY)

    def _listen(self, pubsub: Any) -> None:
        read = pubsub.get_sharded_message if self._sharded else pubsub.get_message
        # valkey-py's cluster pub/sub (6.2) drops every message, not only the
        # confirmations, when asked to ignore subscribe messages, returns at once
        # whatever the timeout, and its round of the nodes breaks when a node joins
        # mid-round (a dict changed size while iterated): its nodes are read here, one
        # round each time, all messages asked for (only messages count below), and the
        # wait is made here.
        waits = not (self._sharded and type(pubsub).__module__.startswith("valkey"))
        if not waits:
            read = functools.partial(_read_each_node, pubsub)
        while True:
            with self._lock:
                if not self._registry.watchers and not self._registry.changes:
                    # Idle: linger a moment for the next waiter, else end, and let the
                    # client go (this thread is all that holds it).
                    self._lock.wait(_LINGER)
                    if not self._registry.watchers and not self._registry.changes:
                        self._thread = None
                        return
                changes = self._registry.take_changes()
            _apply(pubsub, self._sharded, changes)
            if not self._registry.watchers:
                continue
            # Until the server has confirmed a subscription, its confirmations are read
            # too: the subscribe call sends without reading, so a refusal (NOPERM) is
            # only seen here, and "woken by pub/sub" is logged once it is confirmed.
            message = read(ignore_subscribe_messages=waits and self._told, timeout=_TICK)
            if message is None and not waits:
                time.sleep(_TICK)
            kind = message.get("type") if message else None
            if kind in ("message", "smessage"):
                with self._lock:
                    events = self._registry.events_of(message["channel"])
                for event in events:
                    event.set()
            elif kind in _CONFIRMED and not self._told:
                self._told = True
                _events.wakeups_found(self._client(), True)


class AsyncWakeups:
    """The subscriber of one asyncio client on one event loop: a task, started by the first waiter."""

    def __init__(self, client: Any) -> None:
        self._client = weakref.ref(client)
        self._registry = _Registry()
        self._task: asyncio.Task[None] | None = None
        # The asyncio cluster client has no pub/sub, and a pool of one no connection to
        # spare: their waiters poll.
        self._registry.refused = isinstance(client, ASYNC_CLUSTERS) or _pool_of_one(client)
        self._told = self._registry.refused  # whether the INFO line on push or polling was logged
        if self._told:
            why = "the asyncio cluster client has no pub/sub" if isinstance(client, ASYNC_CLUSTERS) else _ONE_CONNECTION
            _events.wakeups_found(client, False, why)

    def watch(self, channel: str) -> asyncio.Event | None:
        """An event set when ``channel`` announces; ``None`` where pub/sub is refused."""
        if self._registry.refused:
            return None
        event = asyncio.Event()
        self._registry.add(channel, event)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="goblin-claim wake-ups")
        return event

    async def unwatch(self, channel: str, event: asyncio.Event) -> None:
        """Stop waking ``event``; the last waiter to leave also ends the listener, so no task outlives it."""
        self._registry.remove(channel, event)
        task = self._task
        if not self._registry.watchers and task is not None and not task.done():
            self._task = None  # a waiter arriving meanwhile starts a fresh listener
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        client = self._client()
        if client is None:
            return
        pubsub = client.pubsub()
        del client
        try:
            while self._registry.watchers or self._registry.changes:
                await _apply_async(pubsub, self._registry.take_changes())
                if not pubsub.subscribed:
                    await asyncio.sleep(_TICK)  # never spin the loop
                    continue
                # Confirmations are read until one came (see Wakeups._listen).
                message = await pubsub.get_message(ignore_subscribe_messages=self._told, timeout=_TICK)
                kind = message.get("type") if message else None
                if kind == "message":
                    for event in self._registry.events_of(message["channel"]):
                        event.set()
                elif kind in _CONFIRMED and not self._told:
                    self._told = True
                    _events.wakeups_found(self._client(), True)
        except Exception as exc:  # a lost connection, a closed client: the waiters poll meanwhile
            self._registry.refused = self._registry.refused or _is_refusal(exc)
            if self._registry.refused and not self._told:
                self._told = True
                _events.wakeups_found(self._client(), False, "pub/sub refused")
            for event in self._registry.every_event():
                event.set()  # they poll; the next waiter starts a fresh listener
            self._registry.changes = dict.fromkeys(self._registry.watchers, True)
        finally:
            # The listener ends with the last waiter, so no task outlives its loop.
            with contextlib.suppress(Exception):
                await pubsub.aclose()


async def _apply_async(pubsub: Any, changes: dict[str, bool]) -> None:
    subscribe = [channel for channel, on in changes.items() if on]
    unsubscribe = [channel for channel, on in changes.items() if not on]
    if subscribe:
        await pubsub.subscribe(*subscribe)
    if unsubscribe:
        await pubsub.unsubscribe(*unsubscribe)


# One subscriber per client (and per event loop for asyncio clients), dropped with the client.
_SYNC: weakref.WeakKeyDictionary[Any, Wakeups] = weakref.WeakKeyDictionary()
_ASYNC: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, AsyncWakeups]] = weakref.WeakKeyDictionary()
_SYNC_LOCK = threading.Lock()


def wakeups(client: Any) -> Wakeups | None:
    """The subscriber of a sync client, or ``None`` if it cannot have one."""
    found = _SYNC.get(client)
    if found is None:
        if not callable(getattr(client, "pubsub", None)):
            return None
        with _SYNC_LOCK:
            found = _SYNC.get(client)
            if found is None:
                found = _SYNC[client] = Wakeups(client)
    return found


def async_wakeups(client: Any) -> AsyncWakeups | None:
    """The subscriber of an asyncio client on the running loop, or ``None`` if it cannot have one."""
    if not callable(getattr(client, "pubsub", None)):
        return None
    loop = asyncio.get_running_loop()
    per_loop = _ASYNC.get(client)
    if per_loop is None:
        per_loop = _ASYNC[client] = weakref.WeakKeyDictionary()
    found = per_loop.get(loop)
    if found is None:
        found = per_loop[loop] = AsyncWakeups(client)
    return found
