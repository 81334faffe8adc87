"""Per-client state and the direct round trip: what the sync and asyncio drivers share about talking to a server."""

from __future__ import annotations

import asyncio
import codecs
import copy
import math
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.asyncio.sentinel
import redis.sentinel

from .._protocol.scripts import SCRIPTS
from .families import (
    ASYNC_CLIENTS,
    RESPONSE_ERRORS,
    SYNC_CLIENTS,
)

try:
    import valkey
    import valkey.asyncio
except ImportError:  # valkey-py is optional
    valkey = None  # type: ignore[assignment]


T = TypeVar("T")


def _no_pool() -> None:
    return None


@dataclass
class ClientState:
    """What one client has learned about its server.

    Attributes:
        native: The native commands the server answers; ``None`` until probed.
        unprobed: The probe was refused (an ACL without COMMAND INFO): what the
            server has is unknown, and only the scripts run.
        ready: The probe ran and the scripts were offered to SCRIPT LOAD.
        text: The client's encoding and whether it decodes replies; ``None`` until read.
        wake: The command the scripts announce with (``publish``, ``spublish`` on
            a cluster); ``None`` until read.
        direct: The pool the SDK's round trips use directly (see the module
            docstring); ``None`` sends them through ``execute_command``.
    """

    native: frozenset[str] | None = None
    unprobed: bool = False
    ready: bool = False
    text: tuple[str, bool] | None = None
    wake: str | None = None
    # ``direct``, held weakly. _STATES keeps a state until its client's finalizer runs, and
    # a client the cycle collector frees (the frames of its exceptions' tracebacks refer to
    # it) runs that finalizer only during the collection that frees it: a pool held here
    # strongly was still reachable from _STATES then, and outlived the collection with all
    # its connections. The client holds its own pool: the reference lasts while it lives.
    _direct: Callable[[], Any] = field(default=_no_pool, repr=False)
    # When a cluster client's slot table was last refreshed by the SDK (``_clients.cluster``).
    refreshed: float = 0.0
    # One lock per world: threads of a sync client, tasks of an asyncio client.
    sync_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    async_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def direct(self) -> Any:
        return self._direct()

    @direct.setter
    def direct(self, pool: Any) -> None:
        try:
            self._direct = weakref.ref(pool) if pool is not None else _no_pool
        except TypeError:  # a pool class that takes no weak references
            self._direct = lambda: pool


# Keyed by id() for a cheap lookup on every call; the finalizer drops an entry
# while its client is being freed, before the id can belong to another object.
_STATES: dict[int, ClientState] = {}
_STATES_LOCK = threading.Lock()


def state_of(client: object) -> ClientState:
    """The state of ``client``, created on first use and dropped with the client."""
    state = _STATES.get(id(client))
    if state is None:
        with _STATES_LOCK:
            state = _STATES.get(id(client))
            if state is None:
                state = _STATES[id(client)] = ClientState()
                weakref.finalize(client, _STATES.pop, id(client), None)
    return state


def reply_encoding(client: object) -> tuple[str, bool]:
    """The encoding ``client`` uses both ways, and whether it decodes replies to str.

    Read once per client from its encoder (``decode_responses=True`` makes a
    client decode every reply, so a value it cannot decode must not be stored).
    A client without ``get_encoder()`` counts as UTF-8 returning bytes.
    """
    state = state_of(client)
    text = state.text
    if text is None:
        try:
            encoder = client.get_encoder()  # type: ignore[attr-defined]
            text = (codecs.lookup(encoder.encoding).name, bool(encoder.decode_responses))
        except (AttributeError, LookupError, TypeError):
            text = ("utf-8", False)
        state.text = text
    return text


# The stock execute_command of each client class, as redis-py and valkey-py define
# it. A wrapper (wrapt keeps the original as __wrapped__) or an override differs.
_STOCK_EXECUTE: tuple[object, ...] = (
    redis.client.Redis.__dict__.get("execute_command"),
    redis.asyncio.client.Redis.__dict__.get("execute_command"),
)
# valkey-py's pools, which want a command name for a connection (as redis-py's did
# before 6), and whose execute_command retries only the errors a connection lists in
# retry_on_error, whatever its Retry supports.
_VALKEY_POOLS: tuple[type[Any], ...] = ()
if valkey is not None:
    _STOCK_EXECUTE += (
        valkey.client.Valkey.__dict__.get("execute_command"),
        valkey.asyncio.client.Valkey.__dict__.get("execute_command"),
    )
    _VALKEY_POOLS = (valkey.ConnectionPool, valkey.asyncio.ConnectionPool)
# From redis-py 6, pools hand out connections without a command name. From 7,
# a maintenance notice can ask a connection to reconnect once its command is done.
_DIRECT_REDIS = int(redis.__version__.split(".", 1)[0]) >= 6
_NOTICES = hasattr(redis.connection.AbstractConnection, "should_reconnect")
# The name a valkey-py pool is given for the connection (it only logs or ignores it).
_VALKEY_COMMAND = "EVALSHA"


def direct_pool(client: object) -> Any:
    """The pool ``client``'s round trips may use directly, or ``None`` for ``execute_command``.

    Decided once per client, when it is first used (see the module docstring): a
    wrapper installed later is not seen.
    """
    if not isinstance(client, (*SYNC_CLIENTS, *ASYNC_CLIENTS)):
        return None
    pool: Any = client.connection_pool  # type: ignore[attr-defined]  # every client of SYNC_CLIENTS has one
    valkey_py = isinstance(pool, _VALKEY_POOLS)
    if not valkey_py and not _DIRECT_REDIS:
        return None
    if valkey_py and pool.connection_kwargs.get("cache_enabled"):
        return None  # client-side caching: execute_command reads and fills the cache
    execute = getattr(type(client), "execute_command", None)
    if execute is None or execute not in _STOCK_EXECUTE or hasattr(execute, "__wrapped__"):
        return None
    if "execute_command" in vars(client):  # replaced on this client alone (a spy, a mock)
        return None
    single = (  # a sync client holds its one connection; an asyncio one makes it on first use
        getattr(client, "connection", None) is not None
        or getattr(client, "single_connection_client", False)
        or getattr(client, "_single_connection_client", False)
    )
    return None if single or _observed() else pool


def _observed() -> bool:
    """Whether redis-py records metrics of its commands (recent redis-py can, with OpenTelemetry)."""
    try:
        from redis.observability.providers import get_observability_instance
    except ImportError:
        return False
    try:
        return bool(get_observability_instance().is_enabled())
    except Exception:  # cannot tell: let redis-py record
        return True


def command_options(command: tuple[object, ...]) -> dict[str, object]:
    """What ``execute_command`` must be told of ``command`` for its reply to come back raw.

    redis-py (and valkey-py) reads SET's reply as a bool unless told that GET was
    given: SET ... NX GET's reply is the value the key held. The direct path reads
    every reply raw.
    """
    if command[0] == "SET" and "GET" in command:
        return _GET
    return _NONE


_GET: dict[str, object] = {"get": True}
_NONE: dict[str, object] = {}


# Values longer than this go out as their own buffer rather than being copied.
_JOIN_UP_TO = 6000


def pack(command: tuple[object, ...], encoder: Any) -> list[bytes]:
    """``command`` in RESP, as redis-py packs it, for the SDK's own arguments (str, bytes, int).

    The client's encoder gives the encoding for str; a long value is kept as its
    own buffer, so a large result is not copied into the command. What recurs is
    packed once: ``EVALSHA`` with one of the SDK's script SHAs, small ints (a
    lease, a key count), and the words of the server's own commands (``SET``,
    ``NX``, ``GET``, ``EX``...).
    """
    encoding, errors = encoder.encoding, encoder.encoding_errors
    words = _WORDS.get(encoding) or _packed_words(encoding, errors)
    buffers: list[bytes] = []
    args: Sequence[object] = command
    pending = [b"*%d\r\n" % len(command)]
    if command[0] == "EVALSHA" and len(command) > 1:
        head = _HEADS.get((command[1], encoding))
        if head is None and command[1] in _SHAS:
            sha = command[1].encode(encoding, errors)
            head = _HEADS[command[1], encoding] = b"$7\r\nEVALSHA\r\n$%d\r\n%b\r\n" % (len(sha), sha)
        if head is not None:
            pending.append(head)
            args = command[2:]
    for arg in args:
        kind = type(arg)
        if kind is str:
            word = words.get(arg)  # type: ignore[call-overload]
            if word is not None:
                pending.append(word)
                continue
            data = arg.encode(encoding, errors)  # type: ignore[attr-defined]
        elif kind is bytes:
            data = arg
        else:  # an int, the only other kind
            piece = _INTS.get(arg) if kind is int else None  # type: ignore[call-overload]
            if piece is None:
                data = b"%d" % arg  # type: ignore[str-format]
                piece = b"$%d\r\n%b\r\n" % (len(data), data)
                if kind is int and len(_INTS) < _INTS_KEPT:
                    _INTS[arg] = piece  # type: ignore[index]
            pending.append(piece)
            continue
        if len(data) > _JOIN_UP_TO:
            pending.append(b"$%d\r\n" % len(data))
            buffers += (b"".join(pending), data)
            pending = [b"\r\n"]
        else:
            pending.append(b"$%d\r\n%b\r\n" % (len(data), data))
    buffers.append(b"".join(pending))
    return buffers


# EVALSHA and the SHA of one of the SDK's scripts, packed, per encoding; and
# small ints as packed, kept up to _INTS_KEPT of them.
_SHAS = frozenset(script.sha for script in SCRIPTS)
_HEADS: dict[tuple[object, str], bytes] = {}
_INTS: dict[int, bytes] = {}
_INTS_KEPT = 512
# The fixed words of the commands the SDK sends (its own commands' options, the announcements),
# packed once per encoding.
_PROTOCOL_WORDS = (
    "SET", "NX", "GET", "EX", "IFEQ", "PTTL", "PEXPIRETIME", "DEL", "DELIFEQ", "publish", "spublish", "done", "free",
)  # fmt: skip
_WORDS: dict[str, dict[str, bytes]] = {}


def _packed_words(encoding: str, errors: str) -> dict[str, bytes]:
    packed = {}
    for word in _PROTOCOL_WORDS:
        data = word.encode(encoding, errors)
        packed[word] = b"$%d\r\n%b\r\n" % (len(data), data)
    _WORDS[encoding] = packed
    return packed


class Sends:
    """How many sends of one command may have reached the server.

    The direct path counts every try of redis-py's ``Retry``: a count above one
    means the command was sent again after a failure that may have left the
    first send applied, which a claim's reply must know (see ``ClaimBase._owns``).
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def to_the_end(value: T) -> T:
    """The sync mirror of ``to_the_end_async``: a sync call has already run to its end."""
    return value


async def to_the_end_async(work: Awaitable[T]) -> T:
    """Run ``work`` to its end in a task of its own, even when the caller is cancelled meanwhile.

    What must not be cut short once begun goes through here: a store of a result
    the function returned, the release of a claim a cancelled round trip may have
    taken, a marker. A cancellation that arrives meanwhile is raised once ``work``
    is done (its own error, if it failed, is raised instead: it says more, and
    carries the result where there is one). anyio re-delivers a cancel scope's
    cancellation at every step: each is absorbed the same way.
    """
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.cancelled():  # the work itself was cancelled (the loop is closing)
                raise
            cancelled = exc
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


def run_meanwhile(work: Callable[[], object] | None) -> None:
    """Run bookkeeping placed while a round trip is on the wire.

    Best effort: a failure here must not leave a reply unread on the connection,
    and every caller redoes its bookkeeping after the reply, where a failure counts.
    """
    if work is not None:
        # Not contextlib.suppress: this runs on every first call's final write, and
        # its three calls cost more than the keep-alive's end it runs.
        try:  # noqa: SIM105
            work()
        except Exception:
            pass


def _on_connection(pool: Any, attempt: Callable[[Any], T]) -> T:
    """``attempt(connection)`` on a connection of ``pool`` (a sync client's), given back after.

    Retried as ``execute_command`` retries: by the connection's ``Retry``, on the
    errors it retries (valkey-py: only those its ``retry_on_error`` lists),
    disconnecting before each new try; on a Sentinel primary's pool, each new try
    (and the first, while the pool is doubted) goes to the primary a majority of
    the sentinels name, once it says it is one (``_redials``, ``doubt_primary``).
    """
    valkey_py = isinstance(pool, _VALKEY_POOLS)
    conn = pool.get_connection(_VALKEY_COMMAND) if valkey_py else pool.get_connection()
    try:

        def fail(error: Exception) -> None:
            conn.disconnect()
            if valkey_py and not _listed(conn, error):
                raise error

        once = _redialing(pool, conn, attempt) if _redials(pool) else lambda: attempt(conn)
        result: T = conn.retry.call_with_retry(once, fail)
        return result
    finally:
        if not valkey_py and _NOTICES and conn.should_reconnect():
            # A maintenance notice asked for a new connection: the next use makes it.
            conn.disconnect()
        pool.release(conn)


async def _on_connection_async(pool: Any, attempt: Callable[[Any], Awaitable[T]]) -> T:
    """``_on_connection`` for an asyncio client's pool."""
    valkey_py = isinstance(pool, _VALKEY_POOLS)
    conn = await (pool.get_connection(_VALKEY_COMMAND) if valkey_py else pool.get_connection())
    try:

        async def fail(error: Exception) -> None:
            await conn.disconnect()
            if valkey_py and not _listed(conn, error):
                raise error

        once = _redialing_async(pool, conn, attempt) if _redials(pool) else lambda: attempt(conn)
        result: T = await conn.retry.call_with_retry(once, fail)
        return result
    finally:
        # No maintenance-notice reconnect here: redis-py's asyncio client makes one
        # only for single-connection clients, which never come this way.
        await pool.release(conn)


_SENTINEL_POOLS: tuple[type, ...] = (
    redis.sentinel.SentinelConnectionPool,
    redis.asyncio.sentinel.SentinelConnectionPool,
)
if valkey is not None:
    import valkey.asyncio.sentinel
    import valkey.sentinel

    _SENTINEL_POOLS += (valkey.sentinel.SentinelConnectionPool, valkey.asyncio.sentinel.SentinelConnectionPool)
# Whether each pool class is one of those, as redis-py's pools are ABCs: isinstance
# against them costs a first call more than a dict look-up does.
_SENTINEL_KINDS: dict[type, bool] = {}
# Sentinel primary pools whose next round trip must first find a primary it can trust
# (see doubt_primary); weak, so a pool is not kept alive by having been doubted.
_DOUBTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _redials(pool: Any) -> bool:
    """Whether a new try over ``pool`` must first find the primary through the sentinels.

    A redis-py connection reconnected for a retry dials the address it had (only a
    connection taken from the pool asks the sentinels; redis-py issue 3874), so
    after a failover every try of one command went to the old primary, and a
    result's last write could spend its whole lease there. Both redis-py and
    valkey-py ask only the first sentinel that answers, which, cut off from the
    others, names a primary that was deposed: the re-dial asks them all instead.
    """
    kind = type(pool)
    sentinel = _SENTINEL_KINDS.get(kind)
    if sentinel is None:
        sentinel = _SENTINEL_KINDS[kind] = issubclass(kind, _SENTINEL_POOLS)
    return sentinel and bool(pool.is_master)


def doubt_primary(pool: Any) -> None:
    """The node ``pool`` last reached could not show it leads: its next round trip re-dials first.

    Called after a transient answer (a demoted primary's ``READONLY``, ``NOREPLICAS``,
    a verdict that too few replicas acknowledged): the pool's connections may all
    point at a node that a partition cut off, which the sentinels on its side still name.
    """
    if _redials(pool):
        _DOUBTED.add(pool)


def _connection_error(pool: Any, message: str) -> Exception:
    """The client library's own ``ConnectionError``: what its ``Retry`` retries."""
    if valkey is not None and isinstance(pool, _VALKEY_POOLS):
        return valkey.exceptions.ConnectionError(message)
    return redis.exceptions.ConnectionError(message)


def _elected(pool: Any, states: Sequence[object]) -> tuple[str, int]:
    """The primary a majority of ``pool``'s sentinels name, from each one's ``SENTINEL MASTERS`` (or its error).

    A sentinel that cannot be reached, or that sees its primary down, names none.
    A majority of all the sentinels configured, not of those that answered: a
    minority cut off with a deposed primary keeps naming it.
    """
    manager = pool.sentinel_manager
    votes: dict[tuple[str, int], int] = {}
    for masters in states:
        state = masters.get(pool.service_name) if isinstance(masters, dict) else None
        if state and manager.check_master_state(state, pool.service_name):
            forced = getattr(manager, "_force_master_ip", None)
            address = (forced if forced is not None else state["ip"], int(state["port"]))
            votes[address] = votes.get(address, 0) + 1
    needed = len(manager.sentinels) // 2 + 1
    for address, count in votes.items():
        if count >= needed:
            return address
    raise _connection_error(
        pool, f"no {needed} of {len(manager.sentinels)} sentinels name one primary for {pool.service_name!r}: {votes}"
    )


def _check_leads(pool: Any, conn: Any, role: object) -> None:
    """Raise (a retryable ``ConnectionError``) unless ``ROLE`` said the node is a primary."""
    first = role[0] if isinstance(role, (list, tuple)) and role else role
    if first not in (b"master", "master"):
        conn.disconnect()
        raise _connection_error(pool, f"{conn.host}:{conn.port}, named by the sentinels, is not a primary: {first!r}")


def _trusted(pool: Any, address: tuple[str, int]) -> None:
    """Bookkeeping once ``address`` is a trusted primary: the pool's idle connections elsewhere go."""
    proxy = getattr(pool, "proxy", pool)  # redis-py's sync pool keeps the address on a proxy
    proxy.master_address = address
    _DOUBTED.discard(pool)


def _primary(pool: Any, conn: Any) -> None:
    """Connect ``conn`` to the primary a majority of the sentinels name, and check that it says it leads."""
    states: list[object] = []
    for sentinel in pool.sentinel_manager.sentinels:
        try:
            states.append(sentinel.sentinel_masters())
        except Exception as exc:  # unreachable or refusing: it names nothing
            states.append(exc)
    address = _elected(pool, states)
    conn.disconnect()
    conn.connect_to(address)
    conn.send_command("ROLE")
    _check_leads(pool, conn, conn.read_response())
    if pool.master_address != address:
        pool.disconnect(inuse_connections=False)
    _trusted(pool, address)


async def _primary_async(pool: Any, conn: Any) -> None:
    """``_primary`` for an asyncio client's pool."""
    states: list[object] = []
    for sentinel in pool.sentinel_manager.sentinels:
        try:
            states.append(await sentinel.sentinel_masters())
        except Exception as exc:
            states.append(exc)
    address = _elected(pool, states)
    await conn.disconnect()
    await conn.connect_to(address)
    await conn.send_command("ROLE")
    _check_leads(pool, conn, await conn.read_response())
    if pool.master_address != address:
        await pool.disconnect(inuse_connections=False)
    _trusted(pool, address)


def _redialing(pool: Any, conn: Any, attempt: Callable[[Any], T]) -> Callable[[], T]:
    """``attempt(conn)``, each try after the first (and the first, if doubted) made on a trusted primary."""
    tries = 0

    def once() -> T:
        nonlocal tries
        tries += 1
        if tries > 1 or pool in _DOUBTED:  # a failed try disconnected it
            _primary(pool, conn)
        return attempt(conn)

    return once


def _redialing_async(pool: Any, conn: Any, attempt: Callable[[Any], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """``_redialing`` for an asyncio client's pool."""
    tries = 0

    async def once() -> T:
        nonlocal tries
        tries += 1
        if tries > 1 or pool in _DOUBTED:
            await _primary_async(pool, conn)
        return await attempt(conn)

    return once


def send_direct(
    pool: Any,
    command: tuple[object, ...],
    meanwhile: Callable[[], object] | None = None,
    sends: Sends | None = None,
) -> object:
    """One command and its raw reply over a connection of ``pool`` (a sync client's).

    Retried as ``execute_command`` retries (``_on_connection``). ``meanwhile`` runs
    once (see ``run_meanwhile``), after the first send and before its reply is
    read: bookkeeping that would otherwise follow the round trip costs no time
    of its own. ``sends``, if given, counts the tries.
    """

    def attempt(conn: Any) -> object:
        nonlocal meanwhile
        if sends is not None:
            sends.count += 1
        conn.send_packed_command(pack(command, conn.encoder))
        run_meanwhile(meanwhile)
        meanwhile = None
        return conn.read_response()

    return _on_connection(pool, attempt)


async def send_direct_async(
    pool: Any,
    command: tuple[object, ...],
    meanwhile: Callable[[], object] | None = None,
    sends: Sends | None = None,
) -> object:
    """``send_direct`` for an asyncio client's pool, sharing round trips between tasks.

    A command sent while none of this loop's is on the wire over ``pool`` goes at
    once, alone: a lone caller waits for nothing. One sent while another is on the
    wire joins the round being gathered (see ``_Rounds``), and ``meanwhile`` runs
    before it is sent. Either way the reply, an error reply raised, is its own.
    """
    loop = asyncio.get_running_loop()
    rounds = _ROUNDS.get(pool)
    if rounds is None or rounds.loop is not loop:
        rounds = _ROUNDS[pool] = _Rounds(loop)
    if rounds.on_wire:
        return await rounds.join(pool, command, meanwhile, sends)
    rounds.on_wire += 1
    try:
        return await _send_alone_async(pool, command, meanwhile, sends)
    finally:
        rounds.on_wire -= 1


def send_direct_group(pool: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None = None) -> list[object]:
    """One caller's few commands in one round trip (``send_direct_many``: a sync client shares no round)."""
    return send_direct_many(pool, commands, sends)


async def send_direct_group_async(
    pool: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None = None
) -> list[object]:
    """One task's few commands (a claim and the reads behind it, a write and its announcement) in one round trip.

    As ``send_direct_async`` shares a lone command's round trip, this shares the
    group's: sent at once when none of this loop's is on the wire, else joined to
    the round being gathered, its commands consecutive there. Error replies come back
    as values, in order; a round that failed whole raises. ``sends`` counts the
    sends of the first command.
    """
    loop = asyncio.get_running_loop()
    rounds = _ROUNDS.get(pool)
    if rounds is None or rounds.loop is not loop:
        rounds = _ROUNDS[pool] = _Rounds(loop)
    if rounds.on_wire and len(commands) <= ROUND_LIMIT:
        return await rounds.join_group(pool, commands, sends)
    rounds.on_wire += 1
    try:
        return await send_direct_many_async(pool, commands, sends)
    finally:
        rounds.on_wire -= 1


# Commands in one shared round at most: a longer queue goes as several rounds.
ROUND_LIMIT = 128


class _Rounds:
    """The round trips the tasks of one event loop share over one pool.

    Under load the cost of an asyncio round trip is mostly per round trip, not per
    command: taking a connection from the pool and giving it back, the stream's
    write and wake-up, the read's timeout. So a command sent while another is on
    the wire waits for the loop's next turn, with every other command sent
    meanwhile, and they go as one write over one pooled connection, their replies
    read back in order: a pipeline of independent commands, as the client's own
    pipelines send them, retried whole by the connection's ``Retry`` (each
    command's ``Sends`` counts the tries). A task cancelled before its round is
    sent is left out of it; one cancelled after is not told its reply, as when it
    waits alone.
    """

    __slots__ = ("gathering", "loop", "on_wire", "sending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # not the pool: _ROUNDS holds its pools weakly
        self.on_wire = 0  # sends and rounds of this loop now between write and last reply
        self.gathering: list[_Joined] | None = None
        self.sending: set[asyncio.Task[None]] = set()  # the loop holds tasks weakly

    async def join(
        self, pool: Any, command: tuple[object, ...], meanwhile: Callable[[], object] | None, sends: Sends | None
    ) -> object:
        gathering = self.gathering
        if gathering is None or len(gathering) >= ROUND_LIMIT:
            gathering = self.gathering = []
            task = self.loop.create_task(self._send(pool, gathering))  # runs on the loop's next turn
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        joined = _Joined(command, self.loop.create_future(), sends)
        gathering.append(joined)
        run_meanwhile(meanwhile)
        return await joined.reply

    async def join_group(self, pool: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None) -> list[object]:
        gathering = self.gathering
        if gathering is None or len(gathering) + len(commands) > ROUND_LIMIT:
            gathering = self.gathering = []
            task = self.loop.create_task(self._send(pool, gathering))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
        # The first command's sends are counted (a claim's, read by ClaimBase._owns); those behind it ride along.
        joined = [_Joined(command, self.loop.create_future(), None) for command in commands]
        joined[0].sends = sends
        gathering += joined
        replies = await asyncio.gather(*(one.reply for one in joined), return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException) and not isinstance(reply, RESPONSE_ERRORS):
                raise reply  # the whole round failed (each command was told so)
        return replies

    async def _send(self, pool: Any, gathering: list[_Joined]) -> None:
        if self.gathering is gathering:
            self.gathering = None  # from here, a new command gathers the next round
        joined = [one for one in gathering if not one.reply.done()]  # cancelled unsent: left out
        if not joined:
            return
        tries = Sends()
        self.on_wire += 1
        try:
            replies = await send_direct_many_async(pool, [one.command for one in joined], tries)
        except BaseException as exc:
            for one in joined:
                one.tried(tries)
                if not one.reply.done():
                    one.reply.set_exception(_own_copy(exc) if isinstance(exc, Exception) else _interrupted(exc))
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self.on_wire -= 1
        for one, reply in zip(joined, replies, strict=True):
            one.tried(tries)
            if not one.reply.done():
                if isinstance(reply, BaseException):
                    one.reply.set_exception(reply)
                else:
                    one.reply.set_result(reply)


class _Joined:
    """One command of a shared round: what it sends, where its reply goes, and its count of sends."""

    __slots__ = ("command", "reply", "sends")

    def __init__(self, command: tuple[object, ...], reply: asyncio.Future[object], sends: Sends | None) -> None:
        self.command = command
        self.reply = reply
        self.sends = sends

    def tried(self, tries: Sends) -> None:
        if self.sends is not None:
            self.sends.count += tries.count


def _own_copy(exc: Exception) -> Exception:
    """``exc`` for one waiter of a round: each raises its own, with its own traceback."""
    try:
        copied = copy.copy(exc)
    except Exception:
        return exc
    copied.__cause__, copied.__context__ = exc.__cause__, exc.__context__
    return copied


def _interrupted(exc: BaseException) -> Exception:
    """What the waiters of a round are told when the round's task was cancelled (the loop closing)."""
    error = redis.exceptions.ConnectionError(f"the shared round trip was interrupted ({type(exc).__name__})")
    error.__cause__ = exc
    return error


# Per pool, the rounds of the loop that last used it (a pool's connections belong to one loop).
_ROUNDS: weakref.WeakKeyDictionary[Any, _Rounds] = weakref.WeakKeyDictionary()


async def _send_alone_async(
    pool: Any,
    command: tuple[object, ...],
    meanwhile: Callable[[], object] | None,
    sends: Sends | None,
) -> object:
    """One command over a connection of ``pool``, retried (``_on_connection_async``)."""

    async def attempt(conn: Any) -> object:
        nonlocal meanwhile
        if sends is not None:
            sends.count += 1
        await conn.send_packed_command(pack(command, conn.encoder))
        run_meanwhile(meanwhile)
        meanwhile = None
        return await conn.read_response()

    return await _on_connection_async(pool, attempt)


def packed_commands(commands: Sequence[tuple[object, ...]], encoder: Any) -> list[bytes]:
    """``commands`` as one buffer: a batch goes out in one write, not one per buffer."""
    packed: list[bytes] = []
    for command in commands:
        packed += pack(command, encoder)
    return [b"".join(packed)]


def send_direct_many(pool: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None = None) -> list[object]:
    """Many commands in one round trip over one connection of ``pool``; error replies come back as values.

    What a pipeline without a transaction does, less its per-command bookkeeping:
    the whole round is retried by the connection's ``Retry``, as redis-py's
    pipeline retries it (``_on_connection``). ``sends``, if given, counts the
    tries (a batch of claims re-sent is then known to be one).
    """

    def attempt(conn: Any) -> list[object]:
        if sends is not None:
            sends.count += 1
        conn.send_packed_command(packed_commands(commands, conn.encoder))
        replies: list[object] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except RESPONSE_ERRORS as exc:  # read whole: the connection stays in step
                replies.append(exc)
        return replies

    return _on_connection(pool, attempt)


async def send_direct_many_async(
    pool: Any, commands: Sequence[tuple[object, ...]], sends: Sends | None = None
) -> list[object]:
    """``send_direct_many`` for an asyncio client's pool."""

    async def attempt(conn: Any) -> list[object]:
        if sends is not None:
            sends.count += 1
        await conn.send_packed_command(packed_commands(commands, conn.encoder))
        timeout = conn.socket_timeout if _ONE_DEADLINE and len(commands) > 1 else None
        if timeout is None or not isinstance(conn, redis.asyncio.connection.AbstractConnection):
            return await read_replies(conn, len(commands), None)
        try:
            async with asyncio.timeout(timeout):  # type: ignore[attr-defined]  # _ONE_DEADLINE: 3.11+
                return await read_replies(conn, len(commands), math.inf)
        except TimeoutError as exc:  # the read, cut short, disconnected the connection
            raise redis.exceptions.TimeoutError(f"Timeout reading {len(commands)} replies") from exc

    return await _on_connection_async(pool, attempt)


# A round's replies are read under one deadline, the connection's read timeout,
# rather than under a timer each, which is most of what reading a short reply
# costs: redis-py (from 8.1) reads with no timer of its own when asked for
# math.inf, and asyncio.timeout is 3.11's. Elsewhere each reply has its own.
_ONE_DEADLINE = hasattr(asyncio, "timeout") and tuple(map(int, re.findall(r"\d+", redis.__version__)[:2])) >= (8, 1)


async def read_replies(conn: Any, count: int, timeout: float | None) -> list[object]:
    """``count`` replies read off ``conn``, error replies as values: read whole, the connection stays in step."""
    replies: list[object] = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response(timeout=timeout))
        except RESPONSE_ERRORS as exc:
            replies.append(exc)
    return replies


def _listed(conn: Any, error: Exception) -> bool:
    """Whether a valkey-py connection retries ``error``: only what its ``retry_on_error`` lists."""
    listed = conn.retry_on_error
    return listed is not None and isinstance(error, tuple(listed))
