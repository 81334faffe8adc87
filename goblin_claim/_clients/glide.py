"""GLIDE clients behind the part of redis-py's client API the drivers use.

``adapter_for(client)`` gives one adapter per GLIDE client (``glide.GlideClient``,
``glide.GlideClusterClient``, ``glide_sync.GlideClient``,
``glide_sync.GlideClusterClient``). It speaks GLIDE's own API: every command goes
through ``custom_command`` (routed by its key on a cluster), a pipeline is a
non-atomic ``Batch`` / ``ClusterBatch`` run with ``raise_on_error=False``, and
``wait()``'s wake-ups come through GLIDE's pub/sub. What GLIDE raises comes back
as the redis-py exception the same server reply gives there (``NoScriptError``,
``ReadOnlyError``, ``ResponseError`` with its code, ``ConnectionError``,
``TimeoutError``), so the drivers' error handling (translation, transient
answers, the NOSCRIPT reload, the native fallback) reads it unchanged.

Where GLIDE differs, and what is done about it:

- GLIDE has no ``decode_responses``: its replies are bytes, and so is ``Completed.value``.
- GLIDE 2.6 cannot parse a RESP3 ``COMMAND INFO`` reply for a command the server
  has; the native probe is sent as ``COMMAND LIST`` (the same ACL permission,
  ``+command``) and its answer reshaped to COMMAND INFO's.
- A pipeline holding a ``WAIT`` (``replicas=``) is given the client's request
  timeout plus WAIT's own, so GLIDE's default 250 ms never cuts a WAIT short; on
  a cluster it goes whole to the primary of its keys' slot, where WAIT counts (a
  batch of claims on several slots with ``replicas=`` is refused, as on redis-py's
  cluster client).
- A cluster adapter is not a redis-py cluster client (the drivers never see
  ``RedisCluster``'s node API): GLIDE follows the cluster's redirections itself,
  scripts are loaded on every primary, and the wake-ups are plain ``PUBLISH``.
- ``wait()``'s subscriber is a second GLIDE client made from the user's client's
  configuration (its own subscriptions and callback left out, RESP3, which GLIDE's
  pub/sub needs); it subscribes and unsubscribes as waiters come and go.

GLIDE is imported here only, and only once a GLIDE client is passed in.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis._parsers.base import BaseParser
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import InvalidArgumentError
from .._protocol.probe import PROBE_COMMAND

__all__ = ["AsyncGlideAdapter", "GlideAdapter", "adapter_for", "redis_error"]

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
# Commands whose arguments hold no key: routed by GLIDE's own rules (or as a batch's WAIT).
_KEYLESS = frozenset({"WAIT", "COMMAND", "SCRIPT", "PUBLISH", "PING", "INFO", "CLIENT", "FUNCTION"})
# The native probe, as GLIDE can read it under both protocols.
# Every command's name (a few kB, once per client): the probe asks about module
# commands (goblin.*) and built-in ones (delifeq, delex) alike.
_PROBE = ("COMMAND", "LIST")


def redis_error(exc: BaseException) -> BaseException:
    """The redis-py exception for what GLIDE raised (``exc`` itself when it is not GLIDE's).

    A server's error reply becomes what redis-py's parser makes of the same reply;
    GLIDE's timeout and connection errors become redis-py's, and so does a closed client.
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
        reply = f"{code} {detail}" if separator and code.isupper() and " " not in code else text
    return BaseParser.parse_error(reply.rstrip())  # type: ignore[no-untyped-call, no-any-return]


def _arg(value: object) -> str | bytes:
    """One argument as GLIDE takes it (it has no int arguments)."""
    return value if isinstance(value, (str, bytes)) else str(value)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _key_of(command: Sequence[object]) -> str | bytes | None:
    """The key a command is routed by on a cluster, ``None`` for a keyless one."""
    name = _text(command[0]).upper()
    if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"):
        return _arg(command[3]) if len(command) > 3 and int(str(command[2])) > 0 else None
    if name in _KEYLESS or " " in name or len(command) < 2:
        return None
    return _arg(command[1])


def _probe_reply(names: Sequence[object], reply: object) -> object:
    """``COMMAND LIST``'s answer as ``COMMAND INFO names`` gives it: an entry or nil per name."""
    if not isinstance(reply, list):
        return reply  # an error (NOPERM, a server without COMMAND LIST): no native commands
    found = {_text(name).lower() for name in reply}
    return [[_text(name)] if _text(name).lower() in found else None for name in names]


def _timeout_with(client: Any, commands: Sequence[Sequence[object]]) -> int | None:
    """A batch's timeout: the client's, plus the longest WAIT it holds; ``None`` without a WAIT."""
    waits = [int(str(c[2])) for c in commands if _text(c[0]).upper() == "WAIT" and len(c) > 2]
    if not waits:
        return None
    configured = getattr(getattr(client, "config", None), "request_timeout", None)
    return (configured or DEFAULT_REQUEST_TIMEOUT_MS) + max(waits)


class _Base:
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

        if _text(command[0]).upper() == "SCRIPT":
            return AllPrimaries()  # a script is loaded on every primary, as RedisCluster does
        key = _key_of(command)
        return None if key is None else SlotKeyRoute(SlotType.PRIMARY, _text(key))

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
                keys = [_text(key) for key in map(_key_of, commands) if key is not None]
                if len({key_slot(key.encode()) for key in keys}) > 1:
                    raise InvalidArgumentError("acquire_many(replicas=...) needs a standalone client")
                route = SlotKeyRoute(SlotType.PRIMARY, keys[0]) if keys else None
            options = ClusterBatchOptions(timeout=timeout, route=route) if timeout is not None else None
        for command in commands:
            batch.custom_command([_arg(arg) for arg in command])
        return batch, options

    def _subscriber_config(self) -> Any:
        """The configuration of a subscriber client: the user's, without its subscriptions, on RESP3."""
        from glide_shared.config import ProtocolVersion

        config = copy.copy(self.glide.config)
        config.pubsub_subscriptions = None
        config.protocol = ProtocolVersion.RESP3
        return config


class GlideAdapter(_Base):
    """A sync GLIDE client (``glide_sync``) as the drivers use a ``redis.Redis``."""

    def execute_command(self, *command: object) -> object:
        """Send one command, its reply as GLIDE gives it; errors as redis-py's."""
        if command[0] == PROBE_COMMAND:
            return _probe_reply(command[1:], self.execute_command(*_PROBE))
        args = [_arg(arg) for arg in command]
        try:
            if self.cluster:
                return self.glide.custom_command(args, route=self._route(command))
            return self.glide.custom_command(args)
        except Exception as exc:
            raise redis_error(exc) from exc

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: object) -> object:
        """EVALSHA, as redis-py's."""
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def eval(self, script: str, numkeys: int, *keys_and_args: object) -> object:
        """EVAL, as redis-py's."""
        return self.execute_command("EVAL", script, numkeys, *keys_and_args)

    def script_load(self, source: str) -> object:
        """SCRIPT LOAD (on every primary of a cluster)."""
        return self.execute_command("SCRIPT", "LOAD", source)

    def publish(self, channel: str, message: str) -> object:
        """PUBLISH, in redis-py's argument order."""
        return self.execute_command("PUBLISH", channel, message)

    def pipeline(self, transaction: bool = False) -> GlidePipeline:
        """A non-atomic batch (``transaction`` is ignored: the drivers never ask for one)."""
        return GlidePipeline(self)

    def pubsub(self) -> GlidePubSub:
        """A subscriber of its own (a second GLIDE client, made on first subscribe)."""
        return GlidePubSub(self)


class GlidePipeline:
    """Commands gathered for one non-atomic batch of a sync GLIDE client."""

    def __init__(self, adapter: GlideAdapter) -> None:
        self._adapter = adapter
        self._commands: list[tuple[object, ...]] = []

    def execute_command(self, *command: object) -> GlidePipeline:
        """Queue one command."""
        self._commands.append(command)
        return self

    def script_load(self, source: str) -> GlidePipeline:
        """Queue a SCRIPT LOAD."""
        return self.execute_command("SCRIPT", "LOAD", source)

    def execute(self, raise_on_error: bool = True) -> list[object]:
        """Send the batch; a command's error is its reply (``raise_on_error=False``) or raised."""
        commands, self._commands = self._commands, []
        adapter = self._adapter
        if adapter.cluster and any(_text(c[0]).upper() in ("SCRIPT", "COMMAND INFO") for c in commands):
            # The probe and the scripts (once per client): each where it belongs, one by one.
            replies = []
            for command in commands:
                try:
                    replies.append(adapter.execute_command(*command))
                except RedisError as exc:
                    replies.append(exc)
            return _checked(replies, raise_on_error)
        sent = [_PROBE if c[0] == PROBE_COMMAND else c for c in commands]
        batch, options = adapter._batch(sent)
        try:
            replies = adapter.glide.exec(batch, raise_on_error=False, **({"options": options} if options else {}))
        except Exception as exc:
            raise redis_error(exc) from exc
        return _checked(_shaped(commands, replies), raise_on_error)


class GlidePubSub:
    """redis-py's ``PubSub`` as ``wait()``'s subscriber uses it, over a sync GLIDE client of its own."""

    def __init__(self, adapter: GlideAdapter) -> None:
        self._adapter = adapter
        self._client: Any = None
        self._lock = threading.Lock()

    def _subscriber(self) -> Any:
        if self._client is None:
            try:
                self._client = type(self._adapter.glide).create(self._adapter._subscriber_config())
            except Exception as exc:
                raise redis_error(exc) from exc
        return self._client

    def subscribe(self, *channels: str) -> None:
        """Subscribe, waiting for the server's confirmation."""
        try:
            self._subscriber().subscribe(set(channels), timeout_ms=_confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc

    def unsubscribe(self, *channels: str) -> None:
        """Unsubscribe, waiting for the server's confirmation."""
        try:
            self._subscriber().unsubscribe(set(channels), timeout_ms=_confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc

    def get_message(self, ignore_subscribe_messages: bool = True, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout`` seconds; subscribe confirmations never come here."""
        client = self._subscriber()
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = client.try_get_pubsub_message()
            except Exception as exc:
                raise redis_error(exc) from exc
            if message is not None:
                return {"type": "message", "channel": message.channel, "data": message.message}
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(timeout, 0.005))

    get_sharded_message = get_message

    def close(self) -> None:
        """Close the subscriber's client."""
        client, self._client = self._client, None
        if client is not None:
            client.close()


class AsyncGlideAdapter(_Base):
    """An asyncio GLIDE client (``glide``) as the drivers use a ``redis.asyncio.Redis``."""

    async def execute_command(self, *command: object) -> object:
        """Send one command, its reply as GLIDE gives it; errors as redis-py's."""
        if command[0] == PROBE_COMMAND:
            return _probe_reply(command[1:], await self.execute_command(*_PROBE))
        args = [_arg(arg) for arg in command]
        try:
            if self.cluster:
                return await self.glide.custom_command(args, route=self._route(command))
            return await self.glide.custom_command(args)
        except Exception as exc:
            raise redis_error(exc) from exc

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: object) -> object:
        """EVALSHA, as redis-py's."""
        return await self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def eval(self, script: str, numkeys: int, *keys_and_args: object) -> object:
        """EVAL, as redis-py's."""
        return await self.execute_command("EVAL", script, numkeys, *keys_and_args)

    async def script_load(self, source: str) -> object:
        """SCRIPT LOAD (on every primary of a cluster)."""
        return await self.execute_command("SCRIPT", "LOAD", source)

    async def publish(self, channel: str, message: str) -> object:
        """PUBLISH, in redis-py's argument order."""
        return await self.execute_command("PUBLISH", channel, message)

    def pipeline(self, transaction: bool = False) -> AsyncGlidePipeline:
        """A non-atomic batch (``transaction`` is ignored: the drivers never ask for one)."""
        return AsyncGlidePipeline(self)

    def pubsub(self) -> AsyncGlidePubSub:
        """A subscriber of its own (a second GLIDE client, made on first subscribe)."""
        return AsyncGlidePubSub(self)


class AsyncGlidePipeline:
    """Commands gathered for one non-atomic batch of an asyncio GLIDE client."""

    def __init__(self, adapter: AsyncGlideAdapter) -> None:
        self._adapter = adapter
        self._commands: list[tuple[object, ...]] = []

    def execute_command(self, *command: object) -> AsyncGlidePipeline:
        """Queue one command."""
        self._commands.append(command)
        return self

    def script_load(self, source: str) -> AsyncGlidePipeline:
        """Queue a SCRIPT LOAD."""
        return self.execute_command("SCRIPT", "LOAD", source)

    async def execute(self, raise_on_error: bool = True) -> list[object]:
        """Send the batch; a command's error is its reply (``raise_on_error=False``) or raised."""
        commands, self._commands = self._commands, []
        adapter = self._adapter
        if adapter.cluster and any(_text(c[0]).upper() in ("SCRIPT", "COMMAND INFO") for c in commands):
            replies = []
            for command in commands:
                try:
                    replies.append(await adapter.execute_command(*command))
                except RedisError as exc:
                    replies.append(exc)
            return _checked(replies, raise_on_error)
        sent = [_PROBE if c[0] == PROBE_COMMAND else c for c in commands]
        batch, options = adapter._batch(sent)
        try:
            replies = await adapter.glide.exec(batch, raise_on_error=False, **({"options": options} if options else {}))
        except Exception as exc:
            raise redis_error(exc) from exc
        return _checked(_shaped(commands, replies), raise_on_error)


class AsyncGlidePubSub:
    """redis-py's asyncio ``PubSub`` as ``wait()``'s subscriber uses it, over a GLIDE client of its own."""

    def __init__(self, adapter: AsyncGlideAdapter) -> None:
        self._adapter = adapter
        self._client: Any = None
        self._channels: set[str] = set()

    @property
    def subscribed(self) -> bool:
        """Whether it listens on any channel."""
        return bool(self._channels)

    async def _subscriber(self) -> Any:
        if self._client is None:
            try:
                self._client = await type(self._adapter.glide).create(self._adapter._subscriber_config())
            except Exception as exc:
                raise redis_error(exc) from exc
        return self._client

    async def subscribe(self, *channels: str) -> None:
        """Subscribe, waiting for the server's confirmation."""
        client = await self._subscriber()
        try:
            await client.subscribe(set(channels), timeout_ms=_confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc
        self._channels.update(channels)

    async def unsubscribe(self, *channels: str) -> None:
        """Unsubscribe, waiting for the server's confirmation."""
        client = await self._subscriber()
        self._channels.difference_update(channels)
        try:
            await client.unsubscribe(set(channels), timeout_ms=_confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc

    async def get_message(self, ignore_subscribe_messages: bool = True, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout`` seconds.

        Polled rather than awaited: GLIDE hands a message to a waiting future from
        its own thread, so a wait cut short by its timeout can lose the message that
        arrived as it was cut.
        """
        client = await self._subscriber()
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = client.try_get_pubsub_message()
            except Exception as exc:
                raise redis_error(exc) from exc
            if message is not None:
                return {"type": "message", "channel": message.channel, "data": message.message}
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(timeout, 0.005))

    async def aclose(self) -> None:
        """Close the subscriber's client."""
        client, self._client = self._client, None
        self._channels.clear()
        if client is not None:
            await client.close()


def _confirm_ms(client: Any) -> int:
    """How long a (un)subscribe waits for its confirmation: a few request timeouts."""
    configured = getattr(getattr(client, "config", None), "request_timeout", None)
    return 4 * (configured or DEFAULT_REQUEST_TIMEOUT_MS)


def _shaped(commands: Sequence[Sequence[object]], replies: Sequence[object] | None) -> list[object]:
    """A batch's replies as redis-py's pipeline gives them: errors as redis-py's, the probe reshaped."""
    shaped: list[object] = []
    for command, reply in zip(commands, replies or [None] * len(commands), strict=True):
        if isinstance(reply, Exception):
            reply = redis_error(reply)
        if command[0] == PROBE_COMMAND:
            reply = _probe_reply(command[1:], reply)
        shaped.append(reply)
    return shaped


def _checked(replies: list[object], raise_on_error: bool) -> list[object]:
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, RedisError):
                raise reply
    return replies


# The adapter is kept on its client (a cycle the collector frees with both): a map
# holding adapters keyed weakly by client would keep every client alive through
# its adapter, and an adapter kept only by handles would be made again, probe and
# all, for each request's handle.
_ATTRIBUTE = "_goblin_claim_adapter"
_LOCK = threading.Lock()


def adapter_for(client: Any) -> GlideAdapter | AsyncGlideAdapter:
    """The one adapter of a GLIDE client, made on first use."""
    adapter: GlideAdapter | AsyncGlideAdapter | None = getattr(client, _ATTRIBUTE, None)
    if adapter is not None and adapter.glide is client:
        return adapter
    with _LOCK:
        adapter = getattr(client, _ATTRIBUTE, None)
        if adapter is None or adapter.glide is not client:
            cluster = any(kind.__name__ == "GlideClusterClient" for kind in type(client).__mro__)
            asyncio_client = inspect.iscoroutinefunction(getattr(client, "custom_command", None))
            adapter = AsyncGlideAdapter(client, cluster) if asyncio_client else GlideAdapter(client, cluster)
            setattr(client, _ATTRIBUTE, adapter)
    return adapter
