"""Round trips that must stay on one node of a cluster, following the cluster as it changes shape.

``replicas=`` sends a write and its ``WAIT`` on one connection (WAIT counts the
writes of its own connection), so on a cluster the SDK, not the cluster client,
picks the node: the primary the client's slot table names for the key. When the
slot has moved (a reshard, a failover), that node answers ``MOVED``: the slot
table is corrected and the round goes to the new owner. While the slot migrates,
a key already moved answers ``ASK``: the round goes to the importing node behind
``ASKING``. Every command the SDK sends is safe to send twice, so a round sent
again is a re-send, counted in its ``Sends``. A connection that fails has the
slot table refreshed before the error goes up, so the caller's next try reaches
the promoted replica. One refresh at a time per client: callers that fail while
one is under way (or just after it) leave it to that one, and an asyncio client's
is its own refresh, never one beside it.

This module imports no client library: it drives whichever cluster client it is
handed (redis-py's or valkey-py's, sync or asyncio) through the few methods both
have (``get_node_from_key``, ``nodes_manager``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .families import CONNECTION_ERRORS, RESPONSE_ERRORS, make_node_client
from .transport import Sends, packed_commands, read_replies, send_direct_many, state_of

__all__ = ["is_redirect", "node_round", "node_round_async", "resends"]

# Redirections followed in one call: a slot moves once; a second MOVED means the
# table was stale twice (a failover during a reshard); past that the cluster is
# still settling, and the caller's own retry (the lease's) takes over.
_REDIRECTS = 5


def resends(client: Any) -> int:
    """How many times ``client`` (a cluster client) sends a command again after its connection failed.

    valkey-py counts them in ``cluster_error_retry_attempts``, redis-py in its ``Retry``.
    """
    attempts = getattr(client, "cluster_error_retry_attempts", None)
    if isinstance(attempts, int):
        return attempts
    retries = getattr(getattr(client, "retry", None), "get_retries", None)
    return int(retries()) if callable(retries) else 0


# A slot table refreshed this recently is not refreshed again for another caller.
_REFRESH_EVERY = 0.1
# Held while a caller decides whether it refreshes a client's slot table (and marks it under way).
_REFRESH_LOCK = threading.Lock()


def _redirect(reply: object) -> tuple[str, str, int] | None:
    """``("MOVED" | "ASK", host, port)`` when ``reply`` is a redirection, else ``None``.

    Both clients parse one into ``MovedError`` / ``AskError`` (their text then
    lacks the code); a node connection whose parser leaves it a plain
    ``ResponseError`` keeps the server's words (``MOVED 3999 127.0.0.1:6381``).
    """
    if not isinstance(reply, RESPONSE_ERRORS):
        return None
    kinds = {kind.__name__ for kind in type(reply).__mro__}
    host, port = getattr(reply, "host", None), getattr(reply, "port", None)
    if "AskError" in kinds and isinstance(host, str) and isinstance(port, int):
        return ("MOVED" if "MovedError" in kinds else "ASK"), host, port
    words = str(reply).lstrip("-").split(" ")
    if len(words) != 3 or words[0] not in ("MOVED", "ASK"):
        return None
    host, _, number = words[2].rpartition(":")
    return (words[0], host, int(number)) if number.isdigit() else None


def is_redirect(reply: object) -> bool:
    """Whether ``reply`` sends its command elsewhere (``MOVED``, ``ASK``)."""
    return _redirect(reply) is not None


def _unrun(sends: Sends | None) -> None:
    """A redirected send ran nothing."""
    if sends is not None:
        sends.count -= 1


@contextlib.contextmanager
def _refreshing(cluster: Any) -> Iterator[bool]:
    """Whether the block may refresh ``cluster``'s slot table: no other caller's refresh under way or just ended.

    One refresh at a time per client, for all its threads or tasks, and none within
    ``_REFRESH_EVERY`` of the last one's end. A refresh asks the startup nodes in turn,
    each one cut off costing a connect timeout: across a partition it takes seconds,
    and callers failing meanwhile would start more, spaced by ``_REFRESH_EVERY`` only.
    valkey-py's asyncio refreshes do not coalesce: each makes every node anew and
    closes the connections of the ones it replaced, under every other caller's
    command, whose failures asked for more: across a flapping partition dozens ran
    at once, and single calls waited tens of seconds behind them.
    """
    state = state_of(cluster)
    with _REFRESH_LOCK:
        due = time.monotonic() - state.refreshed >= _REFRESH_EVERY
        if due:
            state.refreshed = math.inf  # under way: when it ends, it is stamped with its end
    try:
        yield due
    finally:
        if due:
            state.refreshed = time.monotonic()


def _moved(cluster: Any, reply: object) -> None:
    """Tell ``cluster``'s slot table that a slot moved: its own ``move_slot`` where it has one, else a refresh."""
    manager = cluster.nodes_manager
    move = getattr(manager, "move_slot", None)  # redis-py 6+; valkey-py refreshes instead
    if move is not None and hasattr(reply, "slot_id"):
        move(reply)
        return
    with _refreshing(cluster) as due:
        if due:
            manager.initialize()


async def _moved_async(cluster: Any, reply: object) -> None:
    """``_moved`` for an asyncio cluster client."""
    manager = cluster.nodes_manager
    move = getattr(manager, "move_slot", None)
    if move is not None and hasattr(reply, "slot_id"):
        await move(reply)
        return
    with _refreshing(cluster) as due:
        if due:
            await _refresh_async(cluster)


async def _refresh_async(cluster: Any) -> None:
    """Refresh an asyncio cluster client's slot table through its own refresh, where it has one.

    redis-py's and valkey-py's asyncio clients refresh under a lock of theirs, once,
    when a command finds their ``_initialize`` flag set (which a connection error of
    theirs sets): flagged the same way, the SDK's refresh waits for one under way and
    is that one, rather than running beside it. valkey-py's refresh makes every node
    anew and closes the connections of the ones it replaced: one running beside
    another fails it (its ``CLUSTER SLOTS`` cut under it), and every command waits for
    the next.
    """
    if isinstance(getattr(cluster, "_initialize", None), bool) and hasattr(cluster, "initialize"):
        cluster._initialize = True
        await cluster.initialize()
    else:
        await cluster.nodes_manager.initialize()


def _node(cluster: Any, key: str, asking: tuple[str, int] | None) -> Any:
    """The node a round goes to: the one ``ASK`` named, else the slot's primary in the client's table."""
    if asking is not None:
        node = cluster.nodes_manager.get_node(host=asking[0], port=asking[1])
        if node is not None:
            return node
    return cluster.get_node_from_key(key)


def _asking(commands: Sequence[tuple[object, ...]], asking: tuple[str, int] | None) -> list[tuple[object, ...]]:
    """The round to send: behind ``ASKING`` when it goes to the node an ``ASK`` named."""
    return [("ASKING",), *commands] if asking is not None else list(commands)


def _followed(
    replies: Sequence[object], follow: bool, sends: Sends | None
) -> tuple[bool, tuple[str, int] | None] | None:
    """Where a round goes next: ``None`` when it is done, else (``MOVED``?, the node an ``ASK`` named).

    Only the first command's redirection is followed (the round's own key; the
    others' are the caller's), and none with ``follow=False``; the redirected send
    ran nothing.
    """
    found = _redirect(replies[0]) if follow else None
    if found is None:
        return None
    _unrun(sends)
    kind, host, port = found
    return (True, None) if kind == "MOVED" else (False, (host, port))


def node_round(
    cluster: Any, key: str, commands: Sequence[tuple[object, ...]], sends: Sends | None = None, follow: bool = True
) -> list[object]:
    """``commands`` in one round trip on one connection of the primary of ``key``'s slot (a sync cluster client).

    Follows ``MOVED`` and ``ASK`` of the first command, the one for ``key`` (see
    the module docstring); error replies come back as values: a redirection of
    another command (a key of another slot in the round), of the first once the
    redirections are used up, or of any with ``follow=False`` (a round of many
    keys, whose redirected keys the caller sends again alone: the others ran).
    """
    asking: tuple[str, int] | None = None
    for _ in range(_REDIRECTS):
        node = _node(cluster, key, asking)
        sent = _asking(commands, asking)
        pool = make_node_client(cluster, node).connection_pool
        try:
            replies = send_direct_many(pool, sent, sends)[len(sent) - len(commands) :]
        except CONNECTION_ERRORS:
            with _refreshing(cluster) as due, contextlib.suppress(Exception):
                if due:  # the node may be gone: the next try learns who took its slots
                    cluster.nodes_manager.initialize()
            raise
        found = _followed(replies, follow, sends)
        if found is None:
            return replies
        asking = found[1]
        if found[0]:
            _moved(cluster, replies[0])
    return replies


async def node_round_async(
    cluster: Any, key: str, commands: Sequence[tuple[object, ...]], sends: Sends | None = None, follow: bool = True
) -> list[object]:
    """``node_round`` for an asyncio cluster client, on a connection its node hands out."""
    asking: tuple[str, int] | None = None
    for _ in range(_REDIRECTS):
        node = _node(cluster, key, asking)
        sent = _asking(commands, asking)
        try:
            replies = (await _on_node(node, sent, sends))[len(sent) - len(commands) :]
        except CONNECTION_ERRORS:
            with _refreshing(cluster) as due, contextlib.suppress(Exception):
                if due:
                    await _refresh_async(cluster)
            raise
        found = _followed(replies, follow, sends)
        if found is None:
            return replies
        asking = found[1]
        if found[0]:
            await _moved_async(cluster, replies[0])
    return replies


async def _on_node(node: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None) -> list[object]:
    """``commands`` over one connection of an asyncio cluster node, given back after.

    Not retried here: the node's connections retry nothing (the cluster client
    retries at its level), and so does this round; a connection whose round was
    cut short (an error, a cancellation) is closed before it is given back, so no
    reply is left unread on it.
    """
    conn = node.acquire_connection()
    try:
        if sends is not None:
            sends.count += 1
        await conn.send_packed_command(packed_commands(commands, conn.encoder))
        return await read_replies(conn, len(commands), None)
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        raise
    finally:
        release = getattr(node, "release", None)
        if release is not None:
            release(conn)
        else:  # valkey-py's asyncio node has no release(): its free list is where its own rounds put them
            node._free.append(conn)
