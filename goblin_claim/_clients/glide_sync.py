# Generated from _clients/glide_aio.py by tools/unasync.py: edit _clients/glide_aio.py, then run that script.
"""The GLIDE adapter of a sync client, its pipeline and its subscriber (``glide.py`` tells how GLIDE differs).

Of the two flavours the asyncio one is written, the sync one generated from it (``tools/unasync.py``).
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import RedisError

from .._protocol.probe import PROBE_COMMAND
from .glide_base import PROBE, Base, as_arg, checked, confirm_ms, probe_reply, redis_error, shaped, text

__all__ = ["GlideAdapter", "GlidePipeline", "GlidePubSub"]


class GlideAdapter(Base):
    """A sync GLIDE client as the drivers use a ``redis.Redis``."""

    def execute_command(self, *command: object, **options: object) -> object:
        """One command: its reply raw, as GLIDE gives it; errors as redis-py's (``options``: for redis-py's parsers)."""
        if command[0] == PROBE_COMMAND:
            return probe_reply(command[1:], self.execute_command(*PROBE))
        args = [as_arg(arg) for arg in command]
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

    def execute_command(self, *command: object, **options: object) -> GlidePipeline:
        """Queue one command (its replies are raw: ``options`` are redis-py's, for its parsers)."""
        self._commands.append(command)
        return self

    def script_load(self, source: str) -> GlidePipeline:
        """Queue a SCRIPT LOAD."""
        return self.execute_command("SCRIPT", "LOAD", source)

    def execute(self, raise_on_error: bool = True) -> list[object]:
        """Send the batch; a command's error is its reply (``raise_on_error=False``) or raised."""
        commands, self._commands = self._commands, []
        adapter = self._adapter
        if adapter.cluster and any(text(c[0]).upper() in ("SCRIPT", "COMMAND INFO") for c in commands):
            # The probe and the scripts (once per client): each where it belongs, one by one.
            replies = []
            for command in commands:
                try:
                    replies.append(adapter.execute_command(*command))
                except RedisError as exc:
                    replies.append(exc)
            return checked(replies, raise_on_error)
        sent = [PROBE if c[0] == PROBE_COMMAND else c for c in commands]
        batch, options = adapter._batch(sent)
        try:
            replies = adapter.glide.exec(batch, raise_on_error=False, **({"options": options} if options else {}))
        except Exception as exc:
            raise redis_error(exc) from exc
        return checked(shaped(commands, replies), raise_on_error)


class GlidePubSub:
    """redis-py's ``PubSub`` as ``wait()``'s subscriber uses it, over a sync GLIDE client of its own."""

    def __init__(self, adapter: GlideAdapter) -> None:
        self._adapter = adapter
        self._client: Any = None
        self._channels: set[str] = set()

    @property
    def subscribed(self) -> bool:
        """Whether it listens on any channel."""
        return bool(self._channels)

    def _subscriber(self) -> Any:
        if self._client is None:
            try:
                self._client = type(self._adapter.glide).create(self._adapter._subscriber_config())
            except Exception as exc:
                raise redis_error(exc) from exc
        return self._client

    def subscribe(self, *channels: str) -> None:
        """Subscribe, waiting for the server's confirmation."""
        client = self._subscriber()
        try:
            client.subscribe(set(channels), timeout_ms=confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc
        self._channels.update(channels)

    def unsubscribe(self, *channels: str) -> None:
        """Unsubscribe, waiting for the server's confirmation."""
        client = self._subscriber()
        self._channels.difference_update(channels)
        try:
            client.unsubscribe(set(channels), timeout_ms=confirm_ms(self._adapter.glide))
        except Exception as exc:
            raise redis_error(exc) from exc

    def get_message(self, ignore_subscribe_messages: bool = True, timeout: float = 0.0) -> dict[str, Any] | None:
        """The next message, waiting up to ``timeout`` seconds; subscribe confirmations never come here.

        Polled: GLIDE hands a message to a waiting future from its own thread, so
        a wait cut short by its timeout could lose the message that arrived as it was cut.
        """
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
        self._channels.clear()
        if client is not None:
            client.close()
