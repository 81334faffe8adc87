"""What the sync and asyncio GLIDE adapters share: errors as redis-py's, commands shaped for GLIDE, batches."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from redis._parsers.base import BaseParser
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import InvalidArgumentError
from .._protocol.probe import PROBE_COMMAND

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS", "PROBE", "Base", "as_arg", "checked", "confirm_ms", "probe_reply", "redis_error",
    "shaped", "text",
]  # fmt: skip

# GLIDE's default request timeout (ms), used when the configuration leaves it unset.
DEFAULT_REQUEST_TIMEOUT_MS = 250
# How GLIDE words a server error it recognised: "<prefix><Kind>: <detail>".
_SIGNALLED = "An error was signalled by the server: - "
# GLIDE's names for the error codes it recognises, and the codes servers send.
_CODES = {
    "ResponseError": "ERR",
    "NoScriptError": "NOSCRIPT",
    "PermissionDenied": "NOPERM",
    "BusyLoadingError": "LOADING",
    "MasterDown": "MASTERDOWN",
    "TryAgain": "TRYAGAIN",
    "ClusterDown": "CLUSTERDOWN",
    "Moved": "MOVED",
    "Ask": "ASK",
    "CrossSlot": "CROSSSLOT",
    "ExecAbortError": "EXECABORT",
    "ReadOnly": "READONLY",
    "NotBusy": "NOTBUSY",
    "AuthenticationFailed": "WRONGPASS",
}
# How GLIDE words a failure of its own link to a node ("<Kind>: <detail>", no server
# prefix): an I/O kind, or its cluster layer losing a node's reply. Nothing was
# answered, so it is a connection error, as redis-py raises for a broken socket.
_LINK_FAILURES = frozenset({
    "BrokenPipe", "ConnectionReset", "ConnectionAborted", "ConnectionRefused", "NotConnected",
    "UnexpectedEof", "IoError", "FatalSendError", "FatalReceiveError",
})  # fmt: skip
# Commands whose arguments hold no key: routed by GLIDE's own rules (or as a batch's WAIT).
_KEYLESS = frozenset({"WAIT", "COMMAND", "SCRIPT", "PUBLISH", "PING", "INFO", "CLIENT", "FUNCTION"})
# The native probe, as GLIDE can read it under both protocols.
# Every command's name (a few kB, once per client): the probe asks about module
# commands (goblin.*) and built-in ones (delifeq, delex) alike.
PROBE = ("COMMAND", "LIST")


def redis_error(exc: BaseException) -> BaseException:
    """The redis-py exception for what GLIDE raised (``exc`` itself when it is not GLIDE's).

    A server's error reply becomes what redis-py's parser makes of the same reply;
    GLIDE's timeout and connection errors become redis-py's, and so do a closed client
    and a request whose link to its node broke.
    """
    from glide_shared.exceptions import ClosingError, RequestError
    from glide_shared.exceptions import ConnectionError as GlideConnectionError
    from glide_shared.exceptions import TimeoutError as GlideTimeoutError

    if isinstance(exc, GlideTimeoutError):
        return RedisTimeoutError(f"GLIDE: {exc}")
    if isinstance(exc, (GlideConnectionError, ClosingError)):
        return RedisConnectionError(f"GLIDE: {exc}")
    if not isinstance(exc, RequestError):
        return exc
    text = str(exc)
    if text.startswith(_SIGNALLED):
        kind, _, detail = text[len(_SIGNALLED) :].partition(": ")
        code = _CODES.get(kind)
        reply = f"{code} {detail}" if code is not None else text
    else:
        code, separator, detail = text.partition(": ")  # "WRONGTYPE: Operation ...", "UNBLOCKED: ..."
        if separator and code in _LINK_FAILURES:
            return RedisConnectionError(f"GLIDE: {text}")
        reply = f"{code} {detail}" if separator and code.isupper() and " " not in code else text
    return BaseParser.parse_error(reply.rstrip())  # type: ignore[no-untyped-call, no-any-return]


def as_arg(value: object) -> str | bytes:
    """One argument as GLIDE takes it (it has no int arguments)."""
    return value if isinstance(value, (str, bytes)) else str(value)


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _key_of(command: Sequence[object]) -> str | bytes | None:
    """The key a command is routed by on a cluster, ``None`` for a keyless one."""
    name = text(command[0]).upper()
    if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"):
        return as_arg(command[3]) if len(command) > 3 and int(str(command[2])) > 0 else None
    if name in _KEYLESS or " " in name or len(command) < 2:
        return None
    return as_arg(command[1])


def probe_reply(names: Sequence[object], reply: object) -> object:
    """``COMMAND LIST``'s answer as ``COMMAND INFO names`` gives it: an entry or nil per name."""
    if not isinstance(reply, list):
        return reply  # an error (NOPERM, a server without COMMAND LIST): no native commands
    found = {text(name).lower() for name in reply}
    return [[text(name)] if text(name).lower() in found else None for name in names]


def _timeout_with(client: Any, commands: Sequence[Sequence[object]]) -> int | None:
    """A batch's timeout: the client's, plus the longest WAIT it holds; ``None`` without a WAIT."""
    waits = [int(str(c[2])) for c in commands if text(c[0]).upper() == "WAIT" and len(c) > 2]
    if not waits:
        return None
    configured = getattr(getattr(client, "config", None), "request_timeout", None)
    return (configured or DEFAULT_REQUEST_TIMEOUT_MS) + max(waits)


class Base:
    """What the sync and asyncio adapters share: the client, its kind, and how commands are shaped."""

    def __init__(self, client: Any, cluster: bool) -> None:
        self.glide = client
        self.cluster = cluster

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.glide).__module__}.{type(self.glide).__qualname__})"

    def _route(self, command: Sequence[object]) -> Any:
        """The route of one command on a cluster: the primary of its key's slot, else GLIDE's choice."""
        if not self.cluster:
            return None
        from glide_shared.routes import AllPrimaries, SlotKeyRoute, SlotType

        if text(command[0]).upper() == "SCRIPT":
            return AllPrimaries()  # a script is loaded on every primary, as RedisCluster does
        key = _key_of(command)
        return None if key is None else SlotKeyRoute(SlotType.PRIMARY, text(key))

    def _batch(self, commands: Sequence[Sequence[object]]) -> tuple[Any, Any]:
        """A non-atomic batch of ``commands`` and its options."""
        timeout = _timeout_with(self.glide, commands)
        if not self.cluster:
            from glide_shared.commands.batch import Batch
            from glide_shared.commands.batch_options import BatchOptions

            batch: Any = Batch(is_atomic=False)
            options: Any = BatchOptions(timeout=timeout) if timeout is not None else None
        else:
            from glide_shared.commands.batch import ClusterBatch
            from glide_shared.commands.batch_options import ClusterBatchOptions
            from glide_shared.routes import SlotKeyRoute, SlotType

            batch = ClusterBatch(is_atomic=False)
            route = None
            if timeout is not None:
                # WAIT counts the writes of its own connection: the whole batch goes to one primary.
                keys = [text(key) for key in map(_key_of, commands) if key is not None]
                if len({key_slot(key.encode()) for key in keys}) > 1:
                    raise InvalidArgumentError("acquire_many(replicas=...) needs a standalone client")
                route = SlotKeyRoute(SlotType.PRIMARY, keys[0]) if keys else None
            options = ClusterBatchOptions(timeout=timeout, route=route) if timeout is not None else None
        for command in commands:
            batch.custom_command([as_arg(arg) for arg in command])
        return batch, options

    def _subscriber_config(self) -> Any:
        """The configuration of a subscriber client: the user's, without its subscriptions, on RESP3."""
        from glide_shared.config import ProtocolVersion

        config = copy.copy(self.glide.config)
        config.pubsub_subscriptions = None
        config.protocol = ProtocolVersion.RESP3
        return config


def confirm_ms(client: Any) -> int:
    """How long a (un)subscribe waits for its confirmation: a few request timeouts."""
    configured = getattr(getattr(client, "config", None), "request_timeout", None)
    return 4 * (configured or DEFAULT_REQUEST_TIMEOUT_MS)


def shaped(commands: Sequence[Sequence[object]], replies: Sequence[object] | None) -> list[object]:
    """A batch's replies as redis-py's pipeline gives them: errors as redis-py's, the probe reshaped."""
    shaped: list[object] = []
    for command, reply in zip(commands, replies or [None] * len(commands), strict=True):
        if isinstance(reply, Exception):
            reply = redis_error(reply)
        if command[0] == PROBE_COMMAND:
            reply = probe_reply(command[1:], reply)
        shaped.append(reply)
    return shaped


def checked(replies: list[object], raise_on_error: bool) -> list[object]:
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, RedisError):
                raise reply
    return replies
