"""``Claim``: the claim protocol over a sync redis-py client.

The mirror of ``_async.py``, name for name; all decisions live in ``_core``.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Union

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from ._core import CLAIM, COMPLETE, EXTEND, PEEK, RELEASE, SCRIPTS, ClaimBase, NativeMode, Script, native_command
from ._keepalive import KeepAlive
from ._outcomes import Claimed, Completed, InFlight
from ._server import (
    PROBE_ARGS,
    PROBE_COMMAND,
    ClientState,
    is_unknown_command,
    native_from_command_table,
    native_from_probe,
    state_of,
    translate,
)

if TYPE_CHECKING:
    from redis import Redis

    SyncClient = Union[Redis, RedisCluster]  # noqa: UP007 -- a run-time alias on 3.10

__all__ = ["Claim"]


class Claim(ClaimBase["SyncClient"]):
    """One idempotency key, claimed by one token, over a sync redis-py client.

    A handle is cheap: make one per request. Its methods are owner-checked: they
    act only while this handle's token holds the claim.

    Args:
        client: A ``redis.Redis`` or ``redis.cluster.RedisCluster``, with or without
            ``decode_responses``.
        key: The idempotency key (any non-empty str).
        lease: Seconds the claim is held before a crashed owner's work reopens.
        ttl: Seconds a completed result (and its claim) is kept.
        namespace: Prefix of every Redis key (``<namespace>:{<key>}:claim``); no braces.
        token: The owner's identity stored in the claim key; ``None`` makes a unique one.
        native: ``"auto"`` uses GOBLIN.CLAIM / GOBLIN.CAD where the server has them,
            ``"never"`` always uses the Lua scripts, ``"always"`` requires the commands.

    Example::

        claim = Claim(redis.Redis(), "evt88", lease=30)
        match claim.acquire():
            case Claimed():
                claim.complete(charge_card())
            case Completed(value=value):
                reply(value)
            case InFlight():
                reply(claim.wait(timeout=10).value)

    Not guaranteed: a claim written to a primary that fails over before it
    replicated can be lost, and a second caller may then run the work too.
    """

    __slots__ = ()

    @classmethod
    def from_keys(
        cls,
        client: SyncClient,
        claim_key: str,
        result_key: str,
        *,
        lease: int = 30,
        ttl: int = 86400,
        token: str | None = None,
        native: NativeMode = "auto",
    ) -> Claim:
        """A handle on two exact keys, to share them with users of the raw protocol.

        On a cluster the two keys must hash to one slot (give them one hash tag).
        The outcomes' ``key`` is ``claim_key``.
        """
        handle = cls._with_keys(client, claim_key, result_key, lease, ttl, token, native)
        assert isinstance(handle, cls)
        return handle

    def acquire(self) -> Claimed | Completed | InFlight:
        """Try to claim the work, in one round trip.

        Returns:
            ``Claimed`` when this handle now owns the work; ``Completed`` with the
            stored value when it was already done; ``InFlight`` while another owner
            works on it.

        Raises:
            WrongTypeError: ``result_key`` holds a non-string value.
            ConnectionFailedError: Redis could not be reached.
        """
        args = (self.claim_key, self.result_key, self.token, self.lease)
        return self._claim_outcome(self._call(CLAIM, args, self.result_key))

    def complete(self, value: bytes | str) -> None:
        """Store the work's result for ``ttl`` seconds and mark the work done.

        Owner-checked and atomic: the result is written only while this token
        holds the claim, and the claim is kept for ``ttl`` too, so the work stays
        completed as long as its result lives.

        Raises:
            ValueError: ``value`` is the reserved reply ``CLAIMED``.
            TypeError: ``value`` is neither bytes nor str.
            ClaimLostError: The claim lapsed or was already completed; nothing written.
        """
        args = self._complete_args(value)
        if not self._call(COMPLETE, args, f"{self.claim_key} / {self.result_key}"):
            raise self._lost("complete")

    def extend(self, lease: int | None = None) -> None:
        """Renew the lease to ``lease`` seconds from now (default: the handle's lease).

        Raises:
            ClaimLostError: The claim lapsed or was already completed.
        """
        seconds = self._extend_lease(lease)
        if not self._call(EXTEND, (self.claim_key, self.token, seconds), self.claim_key):
            raise self._lost("extend")

    def release(self) -> bool:
        """Give the claim up so the work can run again at once (GOBLIN.CAD where native).

        Returns:
            ``True`` when this token held the claim and it was deleted; ``False``
            when it did not (lapsed, taken over, or completed: nothing reopens).
        """
        return bool(self._call(RELEASE, (self.claim_key, self.token), self.claim_key))

    def wait(self, timeout: float = 10.0) -> Claimed | Completed:
        """Poll until the work is completed, or taken over by this handle.

        Sleeps with exponential backoff and full jitter between attempts, up to a
        deadline ``timeout`` seconds away on a monotonic clock; ``timeout=0`` makes
        one attempt.

        Returns:
            ``Completed`` once a result is stored; ``Claimed`` when the owner's lease
            lapsed and this handle took the work over (do it, then ``complete``).

        Raises:
            StillInFlightError: Still in flight at the deadline.
            ValueError: ``timeout`` is negative.
        """
        schedule = self._wait_schedule(timeout)
        schedule.start(time.monotonic())
        while True:
            outcome = self.acquire()
            if not isinstance(outcome, InFlight):
                return outcome
            delay = schedule.next_delay(time.monotonic())
            if delay is None:
                raise schedule.expired()
            time.sleep(delay)

    def keep_alive(self, interval: float | None = None) -> KeepAlive:
        """Renew the lease in the background while a block runs.

        Renews every ``interval`` seconds (default: a third of the lease) from a
        daemon thread (``Claim``) or a task (``AsyncClaim``), and stops when the
        block exits. A renewal that finds the claim lost stops and sets
        ``lost``; ``complete()`` then raises ``ClaimLostError`` and writes nothing.

        Example::

            with claim.keep_alive():
                result = long_work()
            claim.complete(result)
        """
        return KeepAlive(self, interval)

    def _peek(self) -> object:
        """The claim key's current value (the holder's token), or ``None``."""
        return self._call(PEEK, (self.claim_key,), self.claim_key)

    # -- the one round trip

    def _call(self, script: Script, args: tuple[str | bytes | int, ...], keys: str) -> object:
        client = self._client
        state = state_of(client)
        try:
            if not state.ready:
                _prepare(client, state)
            native = native_command(self._native, state.native, script, self.key)
            if native is not None:
                try:
                    # redis-py leaves execute_command untyped on some clients.
                    return client.execute_command(native, *args)  # type: ignore[no-untyped-call, unused-ignore]
                except (ResponseError, RedisClusterException) as exc:
                    if self._native == "always" or not is_unknown_command(exc):
                        raise
                    # This node lacks the module after all: scripts from now on.
                    state.native = frozenset()
            try:
                return client.evalsha(script.sha, script.numkeys, *args)
            except NoScriptError:
                # A flushed or restarted server: EVAL runs the script and caches it
                # again, one extra round trip instead of SCRIPT LOAD plus EVALSHA.
                return client.eval(script.source, script.numkeys, *args)
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.key, keys) from exc


def _prepare(client: SyncClient, state: ClientState) -> None:
    """Probe for the native commands and SCRIPT LOAD the scripts, once per client."""
    with state.sync_lock:
        if state.ready:
            return
        if isinstance(client, RedisCluster):
            # The cluster client refuses commands missing from the table it loaded
            # at start, so that table is what decides; SCRIPT LOAD reaches every primary.
            state.native = native_from_command_table(client.commands_parser.commands)
            for script in SCRIPTS:
                # An ACL without +script refuses this; EVAL then recovers on first use.
                with contextlib.suppress(ResponseError):
                    client.script_load(script.source)
        else:
            pipe = client.pipeline(transaction=False)
            pipe.execute_command(PROBE_COMMAND, *PROBE_ARGS)  # type: ignore[no-untyped-call, unused-ignore]
            for script in SCRIPTS:
                pipe.script_load(script.source)
            # One round trip; an error entry (NOPERM for the probe) is data here.
            replies = pipe.execute(raise_on_error=False)
            state.native = native_from_probe(replies[0])
        state.ready = True
