"""What the sync and async drivers share about talking to a server.

Per-client state (which native commands the server has, whether the scripts
are loaded), reading the native probe's reply, and the single place where
redis-py errors become goblin-claim errors. State lives per client instance in
a weak map, never on a class, so two clients (two servers) never share it.
"""

from __future__ import annotations

import asyncio
import codecs
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    MaxConnectionsError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)

from ._core import NATIVE_COMMANDS
from ._errors import ConnectionFailedError, ServerError, WrongTypeError

__all__ = [
    "PROBE_ARGS",
    "PROBE_COMMAND",
    "ClientState",
    "is_unknown_command",
    "native_from_command_table",
    "native_from_probe",
    "reply_encoding",
    "state_of",
    "translate",
]

# Sent as one word so redis-py skips its COMMAND reply parser, which cannot read
# the nil entries that COMMAND INFO returns for commands the server lacks.
PROBE_COMMAND = "COMMAND INFO"
PROBE_ARGS = tuple(name.lower() for name in NATIVE_COMMANDS)


@dataclass
class ClientState:
    """What one client has learned about its server.

    Attributes:
        native: The native commands the server answers; ``None`` until probed.
        ready: The probe ran and the scripts were offered to SCRIPT LOAD.
        text: The client's encoding and whether it decodes replies; ``None`` until read.
    """

    native: frozenset[str] | None = None
    ready: bool = False
    text: tuple[str, bool] | None = None
    # One lock per world: threads of a sync client, tasks of an asyncio client.
    sync_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    async_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)


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


def native_from_probe(reply: object) -> frozenset[str]:
    """The native commands a ``COMMAND INFO`` reply lists.

    An error reply (NOPERM when the ACL lacks ``+command``, for one) means
    "no native commands", not a failure: the scripts always work.
    """
    if not isinstance(reply, list):
        return frozenset()
    return frozenset(name for name, entry in zip(NATIVE_COMMANDS, reply, strict=False) if entry)


def native_from_command_table(table: Mapping[str, object] | Iterable[str]) -> frozenset[str]:
    """The native commands in a cluster client's command table (lower-case names)."""
    return frozenset(name for name in NATIVE_COMMANDS if name.lower() in table)


def is_unknown_command(exc: BaseException) -> bool:
    """Whether ``exc`` says the server (or a cluster client's table) lacks the command."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text


def translate(exc: RedisError | RedisClusterException, key: str, keys: str) -> ServerError:
    """The goblin-claim error for a redis-py error; the caller raises it ``from exc``.

    Args:
        exc: What redis-py raised.
        key: The handle's key, carried by the error.
        keys: The Redis key(s) the command touched, for the message.
    """
    text = str(exc)
    if isinstance(exc, MaxConnectionsError):
        return ConnectionFailedError(
            f"no free connection for {keys}: {text} (many concurrent tasks need a BlockingConnectionPool)",
            key=key,
        )
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return ConnectionFailedError(f"Redis unreachable while working on {keys}: {text}", key=key)
    if "WRONGTYPE" in text:
        return WrongTypeError(f"{keys} holds a value that is not a string: {text}", key=key)
    return ServerError(f"Redis refused a command on {keys}: {text}", key=key)
