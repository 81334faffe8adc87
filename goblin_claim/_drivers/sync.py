# Generated from _drivers/aio.py by tools/unasync.py: edit _drivers/aio.py, then run that script.
"""``Claim``: the claim protocol over a sync redis-py client.

Of the two flavours the asyncio one is written, the sync one generated from it (``tools/unasync.py``), name for name.
The decisions live in ``_handle`` and ``_protocol``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union, overload

from .. import _events
from .._clients.cluster import is_redirect, node_round, resends
from .._clients.errors import distrust, failed, is_reshaping, raised_by_client, translate
from .._clients.families import (
    CLIENTS,
    CLUSTERS,
    CLUSTER_ERRORS,
    CONNECTION_ERRORS,
    ERRORS,
    NO_SCRIPT,
    RESPONSE_ERRORS,
    adapt,
)
from .._clients.transport import (
    ClientState,
    Sends,
    command_options,
    direct_pool,
    reply_encoding,
    run_meanwhile,
    send_direct,
    send_direct_group,
    send_direct_many,
    state_of,
    to_the_end,
)
from .._defaults import LEASE, REPLICA_TIMEOUT_MS, REPLICAS, TTL, WAIT
from .._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    InvalidArgumentError,
    ServerUnavailableError,
    UnreadableResultError,
)
from .._handle import _STORE_TRIES, ClaimBase, Stored, holder_name
from .._outcomes import Claimed, Completed, InFlight, Outcome
from .._protocol.checks import NativeMode
from .._protocol.probe import PROBE_ARGS, PROBE_COMMAND, native_from_command_table, native_from_probe
from .._protocol.refusals import (
    COMMAND,
    GIVE_UP,
    NATIVE,
    RELOAD,
    RESEND,
    SCRIPT,
    gives_up,
    path_of_sent,
)
from .._protocol.scripts import (
    NATIVE_COMMANDS,
    PEEK,
    SCRIPTS,
    SET_IFEQ,
    SET_NX_GET,
    Script,
    native_command,
    owner_check,
    owner_check_command,
    owner_check_reply,
    script_command,
)
from .._protocol.timing import WaitSchedule
from ._sync_primitives import load_commands, raise_if_cancelled, sleep, wakeups
from .keepalive import KeepAlive
from .refused import refused
from .wakeup import wake_kind

if TYPE_CHECKING:
    from redis import Redis
    from redis.cluster import RedisCluster

    SyncClient = Union[Redis, RedisCluster]  # noqa: UP007 -- a run-time alias on 3.10
    Args = tuple[Union[str, bytes, int], ...]  # noqa: UP007 -- the arguments of one command
    # Bookkeeping a caller runs while a round trip is on the wire rather than after it.
    Meanwhile = Union[Callable[[], object], None]  # noqa: UP007

__all__ = ["Claim", "write_through"]

T = TypeVar("T")


class Claim(ClaimBase["SyncClient"]):
    """One idempotency key, claimed by one token, over a sync redis-py client.

    A handle is cheap: make one per request. Its methods are owner-checked: they
    act only while this handle's token holds the claim.

    Args:
        client: A ``redis.Redis`` or ``redis.cluster.RedisCluster`` (or
            valkey-py's ``valkey.Valkey`` / ``valkey.cluster.ValkeyCluster``), with or without
            ``decode_responses``.
        key: The idempotency key (any non-empty str).
        lease: Seconds the claim is held before a crashed owner's work reopens.
        ttl: Seconds a completed result (and its claim) is kept.
        namespace: Prefix of every Redis key (``<namespace>:{<key>}:claim``); no braces.
        token: The owner's identity stored in the claim key; ``None`` makes a unique one.
        native: ``"auto"`` uses GOBLIN.CLAIM / GOBLIN.CAD where the server has them,
            and its built-in owner checks (``SET ... IFEQ``, ``DELIFEQ``: Valkey 9)
            for ``extend()``, renewals and ``release()``; ``"never"`` always uses the
            Lua scripts; ``"always"`` requires the GOBLIN commands (and takes the
            built-in checks too where there are some).
        fencing: Number the owners: every ``Claimed`` carries a ``fence`` that
            strictly increases per key (a counter under the same hash tag, set in the
            claim's round trip; the claim then always runs as a script).
        replicas: Send ``WAIT replicas replica_timeout_ms`` behind the claim and behind
            ``complete()``, in the same round trip, and raise ``NotReplicatedError`` when
            fewer replicas acknowledged the write; a ``Completed`` read back is checked
            the same way. ``0`` (the default) does not wait.
        replica_timeout_ms: How long WAIT waits for the acknowledgements.
        at_most_once: Never run the work again after an attempt that ended without a
            result: once an owner's lease lapses unrenewed, every caller gets
            ``InterruptedWorkError`` (holder and claim time) until an operator reopens
            the key or ``ttl`` ends. The record is kept past the lease for that (a few
            dozen bytes more); the claim always runs as a script.
        checkpoints: Let owners save progress (``checkpoint()``); the next owner after a
            lapse gets the last one with its ``Claimed``. The claim always runs as a script.

    Example::

        claim = Claim(redis.Redis(), "evt88", lease=30)
        match claim.acquire():
            case Claimed():
                claim.complete(charge_card())
            case Completed(value=value):
                reply(value)
            case InFlight():
                reply((claim.wait(timeout=10)).value)

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
        lease: int = LEASE,
        ttl: int = TTL,
        token: str | None = None,
        native: NativeMode = "auto",
        replicas: int = REPLICAS,
        replica_timeout_ms: int = REPLICA_TIMEOUT_MS,
    ) -> Claim:
        """A handle on two exact keys, to share them with users of the raw protocol.

        On a cluster the two keys must hash to one slot (give them one hash tag).
        The outcomes' ``key`` is ``claim_key``.
        """
        handle = cls._with_keys(client, claim_key, result_key, lease, ttl, token, native, replicas, replica_timeout_ms)
        assert isinstance(handle, cls)
        return handle

    @classmethod
    @_events.observe_batch
    def acquire_many(
        cls, client: SyncClient, keys: Iterable[str], **options: Any
    ) -> list[tuple[Claim, Claimed | Completed | InFlight | GoblinClaimError]]:
        """Claim many keys in one pipelined round trip, for a consumer that pulls a batch.

        Each key gets a handle made with ``options`` (the constructor's keywords)
        and the outcome ``acquire()`` would give it, in key order. On a cluster the
        pipeline goes out grouped by node. A key's own failure (a lost result, a
        key of the wrong type) takes its outcome's place as the error, so one bad
        key does not hide the claims the others took; a failure of the whole batch
        (Redis unreachable) raises. A server that lost its scripts, or a native
        nil, costs one more pipelined round trip for the keys concerned.

        Example::

            for claim, outcome in Claim.acquire_many(client, [m.id for m in messages], lease=60):
                if isinstance(outcome, Claimed):
                    claim.complete(handle(claim.key))

        With ``replicas`` on a cluster, each node's claims go in a round of their
        own with its WAIT behind them (WAIT counts one connection's writes), and a
        key whose slot moved is sent again on its new owner, alone.

        Raises:
            ConnectionFailedError: Redis could not be reached.
            InvalidArgumentError: Bad options (before any I/O).
        """
        client = adapt(client)  # a GLIDE client: its adapter, which the handles hold too
        handles = cls._many(client, keys, options)
        if not handles:
            return []
        first = handles[0]
        state = state_of(client)
        # One WAIT behind each round that wrote covers every claim of that round: a
        # pipeline is one connection. With replicas the claims are always scripts
        # (as in acquire()), so no native-nil round comes, and a read-back is rewritten
        # for the WAIT (claim.lua).
        wait = ("WAIT", first._replicas, first._replica_timeout_ms) if first._replicas else None
        sent_at = time.monotonic()
        try:
            replies, acknowledged, resent = _claim_rounds(client, state, handles, wait)
        except Exception as exc:
            if not raised_by_client(exc):
                raise
            error = failed(client, exc, first.key, f"a batch of {len(handles)} claims")
            if isinstance(error, ConnectionFailedError):
                for handle in handles:
                    handle._claim_unknown(sent_at)  # each claim may have been taken
            raise error from exc
        except BaseException:
            # Interrupted (a cancelled task) while claims were on the wire: any of them
            # may have been taken with its reply lost. Give them back.
            for handle in handles:
                handle._give_back()
            raise
        now = time.monotonic()
        outcomes = [
            (handle, _batch_outcome(handle, reply, waited, sent_at, now, again_sent))
            for handle, reply, waited, again_sent in zip(handles, replies, acknowledged, resent, strict=True)
        ]
        for i, reply in enumerate(replies):
            if is_reshaping(reply):  # its slot is moving: claimed alone, while the lease lasts
                outcomes[i] = (handles[i], handles[i]._acquire_alone())
        return outcomes

    @_events.observe("acquire")
    def acquire(self) -> Claimed | Completed | InFlight:
        """Try to claim the work, in one round trip.

        Safe to send twice: when this handle's own claim already holds the key
        (an earlier reply was lost and the claim sent again, or ``acquire()`` is
        called again while the lease lasts), the answer is ``Claimed`` again.
        Another handle given the same token gets ``InFlight``. Through
        ``execute_command`` (cluster clients, wrapped clients) redis-py's own
        re-send is identical to the first send, so a claim whose reply it lost
        answers ``InFlight``: ``wait()`` takes the work over once the lease lapses.

        Returns:
            ``Claimed`` when this handle now owns the work; ``Completed`` with the
            stored value when it was already done; ``InFlight`` while another owner
            works on it.

        Raises:
            ResultLostError: The work was completed, but its result is gone (evicted).
            InterruptedWorkError: With ``at_most_once`` (or on a key claimed with it): an
                earlier attempt's lease lapsed without a result; the work is not run again.
            WrongTypeError: ``result_key`` holds a non-string value.
            ConnectionFailedError: Redis could not be reached.
            NotReplicatedError: With ``replicas``: claimed, or a stored result read back,
                but not acknowledged in time.
        """
        return self._acquire(None)

    def _acquire_alone(self) -> Outcome | GoblinClaimError:
        """``acquire()`` for one key of a batch, its failure in its outcome's place."""
        try:
            return self._acquire(None)
        except GoblinClaimError as exc:
            return exc

    @overload
    def _acquire(
        self, meanwhile: Meanwhile, bare: Literal[False] = ..., *, lease_left: bool = ...
    ) -> Claimed | Completed | InFlight: ...
    @overload
    def _acquire(
        self, meanwhile: Meanwhile, bare: bool, *, lease_left: bool = ...
    ) -> Claimed | Completed | InFlight | Stored: ...
    def _acquire(
        self, meanwhile: Meanwhile, bare: bool = False, *, lease_left: bool = False
    ) -> Claimed | Completed | InFlight | Stored:
        """``acquire()``, running ``meanwhile`` (at most once) while the claim is on the wire.

        ``bare``: a completed record comes back as ``Stored``, its value alone.
        ``lease_left``: a claim by SET ... NX GET reads the lease left in the same round
        trip (a waiter's, whose next poll it times); without it, an in-flight reply
        costs one more read, and a duplicate of completed work nothing.
        """
        script, args = self._claim_call()
        sends = Sends()
        acknowledged = None
        sent_at = time.monotonic()
        try:
            if self._replicas:
                reply, acknowledged = self._call_and_wait(script, args, self.result_key, sends)
            else:
                reply = self._call(
                    script, args, self.result_key, meanwhile=meanwhile, sends=sends, reads=lease_left
                )
        except ConnectionFailedError:
            self._claim_unknown(sent_at)  # it may have taken the claim: the next one is a re-send
            raise
        except Exception:
            raise
        except BaseException:
            # Interrupted (a cancelled task) while the claim was on the wire: it may have
            # been taken with its reply lost, and nobody would hold it for the whole lease.
            self._give_back()
            raise
        if self._needs_peek(reply):
            # GOBLIN.CLAIM answers nil (a holder's token, on one key) both in flight and to a
            # re-send of our own claim (or a lost result); one read of holder and result,
            # together, tells them apart. SET ... NX GET answers the holder's token without
            # the lease it has left: the read adds it.
            try:
                reply = self._peek()
            except Exception:
                raise
            except BaseException:
                # Interrupted before the read told them apart: a re-sent claim's first send
                # may have taken it, and this handle would never hear of it. Give it back.
                if sends.count > 1:
                    self._give_back()
                raise
        if bare and (stored := self._stored_of(reply, acknowledged)) is not None:
            return stored
        resent = sends.count > 1
        outcome, self._holder = self._claim_outcome(
            reply, acknowledged, resent=resent, sent_at=sent_at, now=time.monotonic()
        )
        return outcome

    @_events.observe("complete")
    def complete(self, value: bytes | str) -> None:
        """Store the work's result for ``ttl`` seconds and mark the work done.

        Owner-checked and atomic: the result is written only while this token
        holds the claim; the claim is kept for ``ttl`` too, so the work stays
        completed as long as its result lives. Safe to send twice: completing
        again with the same value is a success that writes nothing.

        Once the claim is gone (the lease lapsed, or it was released or
        forgotten), nothing on the server shows whether another caller claimed
        and gave it up meanwhile, so ``complete()`` refuses, writing nothing.
        With ``fencing=True`` it can show it: the fence counter still at this
        handle's fence means nobody claimed since, and the late result is stored.
        With fencing, a counter that numbered a later owner refuses even while
        this token holds the claim.

        Raises:
            ValueError: ``value`` is the reserved reply ``CLAIMED``.
            TypeError: ``value`` is neither bytes nor str.
            ClaimLostError: Another token holds or completed the claim, this one
                completed it with another value, or the claim is gone and nobody
                claiming since cannot be shown; nothing written.
            NotReplicatedError: With ``replicas``: stored, but not acknowledged in time.
        """
        self._complete(value, None)

    def _complete(self, value: bytes | str, meanwhile: Meanwhile) -> None:
        """``complete()``, running ``meanwhile`` (at most once) while the write is on the wire."""
        wake = wake_kind(self._client)
        script, args = self._complete_call(value, *reply_encoding(self._client), wake)
        if self._replicas:
            reply, acknowledged = self._call_and_wait(script, args, self._both_keys)
            if self._unproven(reply, acknowledged):
                distrust(self._client)  # its next try goes to a node that can show it leads
            self._completed(reply, acknowledged)
        else:
            # The script announces the record itself; SET ... IFEQ has the announcement pipelined behind it.
            announce = (wake, self.claim_key, "done")
            reply = self._call(script, args, self._both_keys, meanwhile=meanwhile, announce=announce)
            if reply is None:  # SET ... IFEQ did not store: one read tells why, as complete.lua would
                reply = self._store_read(script, args, announce)
            self._completed(reply)
        self._let_go()

    def _store_read(self, script: Script, args: Args, announce: Args) -> object:
        """complete.lua's reply for a store by SET ... IFEQ that did not store, from one read of the record.

        The record may be this token's to complete after all (``ClaimBase._store_verdict``):
        the store goes again, owner-checked against what the read found.
        """
        command = owner_check_command(SET_IFEQ, args, script)
        encoding = reply_encoding(self._client)[0]
        for _ in range(_STORE_TRIES):
            (held,) = self._plain([("GET", self.claim_key)], self._both_keys)
            reply, expected = self._store_verdict(held, args[3], encoding)
            if expected is None:
                return reply
            again: Args = (*command[:4], expected, *command[5:])  # type: ignore[arg-type]  # the IFEQ operand
            if (self._plain([again, announce], self._both_keys))[0]:
                return 1
        raise self._store_missed()

    @_events.observe("extend")
    def extend(self, lease: int | None = None) -> None:
        """Renew the lease to ``lease`` seconds from now (default: the handle's lease).

        Owner-checked: ``SET claim_key token IFEQ token EX lease`` where the server
        has it built in (Valkey 9, Redis 8.4), else the extend script; both renew
        only while this token holds the claim. Safe to send twice.

        Raises:
            ClaimLostError: The claim lapsed or was already completed.
            ServerUnavailableError: With ``replicas``, a node answered "not held"
                while this handle's own clock says its lease lasts (see ``ClaimBase._not_renewed``).
        """
        self._extend(lease)

    def _extend(self, lease: int | None, persist: bool = True) -> None:
        """``extend()``; ``persist=False`` sends it once, slot moving or not (a keep-alive retries on its own clock)."""
        seconds = self._extend_lease(lease)
        sent_at = time.monotonic()
        args = (self.claim_key, self.token, seconds)
        if not self._call(self._extend_script, args, self.claim_key, persist=persist):
            refused = self._not_renewed(time.monotonic())
            if isinstance(refused, ClaimLostError):
                self._let_go()
            else:
                distrust(self._client)  # its next try goes to a node that can show it leads
            raise refused
        self._extended(sent_at, seconds)

    @_events.observe("release")
    def release(self) -> bool:
        """Give the claim up so the work can run again at once.

        Owner-checked: ``DELIFEQ`` (or ``DELEX ... IFEQ``) where the server has it
        built in, else ``GOBLIN.CAD`` where the module is loaded, else the release
        script. Waiters are woken in the same round trip: the script announces the
        free claim itself; a native delete goes out pipelined with the announcement
        (sent whether or not it deleted: a waiter woken for nothing polls once more).
        Safe to send twice: a re-send finds the claim gone and answers ``False``.

        Returns:
            ``True`` when this token held the claim and it was deleted; ``False``
            when it did not (lapsed, taken over, or completed: nothing reopens).
        """
        args = (self.claim_key, self.token)
        self._let_go()  # first: held or not, this handle no longer counts on the claim being its own
        wake = wake_kind(self._client)
        announce = (wake, self.claim_key, "free")
        script = self._release_script
        return bool(self._call(script, args, self.claim_key, script_only=(wake,), announce=announce))

    @classmethod
    def release_many(cls, client: SyncClient, handles: Iterable[Claim]) -> list[bool]:
        """Give many claims back in one pipelined round trip, such as a batch's unstarted messages.

        Each claim is deleted only while its own handle's token holds it (DELIFEQ or
        GOBLIN.CAD where native, else the release script, as ``release()`` chooses), so a claim
        that lapsed and was taken over, or one already completed, is left alone. On a
        cluster the pipeline goes out grouped by node. Safe to send twice: a re-sent
        release finds the claim gone or someone else's and deletes nothing. A server
        that lost its scripts, or a node without the module, costs one more pipelined
        round trip for the claims concerned. Each native delete has its waiters'
        wake-up pipelined right behind it, best effort (waiters poll anyway).

        The pattern for a stream consumer: ``acquire_many(client, ids, lease=5)``
        reserves a batch briefly, ``claim.extend(lease=60)`` takes the full lease as
        each message starts (``ClaimLostError``: the reservation lapsed and another
        consumer took it, skip it), and on shutdown ``release_many(client, handles)``
        gives the unstarted ones back at once (``examples/streams_consumer.py``).

        Returns:
            One bool per handle, in order, as ``release()`` answers: ``True`` when
            that handle's token held its claim and it was deleted.

        Raises:
            InvalidArgumentError: A handle made on another client (before any I/O).
            ConnectionFailedError: Redis could not be reached (any of the claims may
                have been released; the others free themselves after their lease).
            WrongTypeError: A claim key holds a non-string value (the other claims
                of the batch were released).
        """
        handles = list(handles)
        client = adapt(client)  # the handles of a GLIDE client hold its adapter
        for handle in handles:
            if handle._client is not client:
                raise InvalidArgumentError("release_many() needs handles made on its client", key=handle.key)
        if not handles:
            return []
        first = handles[0]
        state = state_of(client)
        wake = wake_kind(client)
        for handle in handles:
            handle._let_go()  # first, as in release(): held or not, it no longer counts on its claim
        try:
            replies = _release_rounds(client, state, handles, wake)
        except Exception as exc:
            if not raised_by_client(exc):
                raise
            raise failed(client, exc, first.key, f"a batch of {len(handles)} releases") from exc
        for i, reply in enumerate(replies):
            if is_reshaping(reply):  # its slot is moving: released alone, while the lease lasts
                replies[i] = handles[i].release()
        for handle, reply in zip(handles, replies, strict=True):
            if isinstance(reply, GoblinClaimError):  # a script this user may not run (_refused_in_batch)
                raise reply
            if isinstance(reply, ERRORS):
                raise translate(reply, handle.key, handle.claim_key) from reply
        return [bool(reply) for reply in replies]

    def _give_back(self) -> None:
        """Release quietly, to the end: after an interruption this handle may hold a claim it never heard of."""
        with contextlib.suppress(GoblinClaimError):  # unreachable: the claim frees itself after its lease
            to_the_end(self.release())

    @_events.observe("forget")
    def forget(self) -> bool:
        """Delete the claim and the result, whoever holds them, in one atomic step.

        For operators: it reopens the key, so the next caller runs the work again
        (a lost result, a bad stored value). An owner still working on it finds its
        claim gone: its ``complete()`` raises ``ClaimLostError`` and writes nothing,
        except with ``fencing=True`` while nobody claimed the key since (the fence
        counter outlives ``forget()``).

        Returns:
            ``True`` when there was a claim or a result to delete.
        """
        wake = wake_kind(self._client)
        script, args = self._forget_call(wake)
        self._let_go()
        # The script announces the free key itself; DEL has the announcement pipelined behind it.
        return bool(self._call(script, args, self._both_keys, announce=(wake, self.claim_key, "free")))

    @_events.observe("checkpoint")
    def checkpoint(self, value: bytes | str) -> None:
        """Save the work's progress, for the next owner to resume from if this one stops (``checkpoints=True``).

        Owner-checked like ``complete()`` (and fenced with ``fencing=True``): stored only
        while this token holds the claim, so a stale owner never overwrites a later
        owner's progress. The next owner's ``Claimed.checkpoint`` is the last value
        stored; ``complete()`` clears it. Kept for ``ttl`` seconds, at most 64 KiB. Safe
        to send twice.

        Raises:
            ClaimLostError: This token no longer holds the claim; nothing written.
            InvalidArgumentError: The handle was made without ``checkpoints=True``, or
                the value is larger than 64 KiB.
        """
        script, args = self._checkpoint_call(value, *reply_encoding(self._client))
        if not self._call(script, args, self.claim_key):
            raise self._lost("checkpoint")
        self.last_checkpoint = value

    @_events.observe("wait")
    def wait(self, timeout: float = WAIT) -> Claimed | Completed:
        """Poll until the work is completed, or taken over by this handle.

        Sleeps with exponential backoff and full jitter between attempts, up to a
        deadline ``timeout`` seconds away on a monotonic clock; ``timeout=0`` makes
        one attempt.

        Returns:
            ``Completed`` once a result is stored; ``Claimed`` when the owner's lease
            lapsed and this handle took the work over (do it, then ``complete``).

        Raises:
            StillInFlightError: Still in flight at the deadline.
            ConnectionFailedError: Redis unreachable through the deadline (a
                transient failure before it is polled through).
            ResultLostError: The work was completed, but its result is gone.
            InterruptedWorkError: The key is at most once, and its attempt ended without a result.
            ValueError: ``timeout`` is negative.
        """
        schedule = self._wait_schedule(timeout)
        schedule.start(time.monotonic())
        # Until when this handle held the claim before waiting: what the wait takes is
        # the part of _mine_until past this, and only that is given back when interrupted.
        held_until = self._mine_until
        # complete(), release() and forget() announce on the claim key's channel:
        # a wake-up cuts the sleep short. Polling stays, as the fallback and the guard.
        subscriber = wakeups(self._client)
        woken = subscriber.watch(self.claim_key) if subscriber is not None else None
        try:
            try:
                while True:
                    if woken is not None:
                        woken.clear()
                    failure = None
                    try:
                        # The wait's attempts, not acquire events; each reads the lease left, timing the next.
                        outcome = self._acquire(None, lease_left=True)
                    except ConnectionFailedError as exc:
                        failure = exc  # transient (a dropped connection, a timeout): poll on until the deadline
                    else:
                        if not isinstance(outcome, InFlight):
                            return outcome
                    delay = schedule.next_delay(time.monotonic(), self._lapse_ms)
                    if delay is None:
                        raise failure or schedule.expired(holder_name(self._holder))
                    raise_if_cancelled()
                    sleep(woken, delay)
                    if _events.enabled:
                        _events.notice(self, "wake", "push" if woken is not None and woken.is_set() else "poll")
            finally:
                if subscriber is not None and woken is not None:
                    subscriber.unwatch(self.claim_key, woken)
        except Exception:
            raise
        except BaseException:
            # Interrupted (a cancelled task) after this wait took the claim, or may have (a
            # failed attempt), but before its caller got the Claimed: while the listener
            # stops, or sleeping after a failure. Nobody would do the work, and the claim
            # would be held for the whole lease. Give it back. (An attempt interrupted on
            # the wire gave it back itself, and let go: nothing is sent twice.)
            if self._mine_until > held_until:
                self._give_back()
            raise

    def keep_alive(self, interval: float | None = None, *, cancel_on_loss: bool = False) -> KeepAlive:
        """Renew the lease in the background while a block runs.

        Renews every ``interval`` seconds (default: a third of the lease) from a
        task (a daemon thread for a sync client), and stops when the block exits.
        A renewal that finds the claim lost stops and sets ``lost``; so does a lease
        that ends with no renewal succeeding. ``complete()`` then raises
        ``ClaimLostError`` and writes nothing (with ``fencing=True`` it stores the
        result if nobody claimed the key since), and ``ensure_held()`` raises it at
        once, with no round trip.

        ``cancel_on_loss=True`` (for asyncio handles: a thread cannot be cancelled, so
        ``Claim`` refuses it and its work calls ``ensure_held()`` instead) cancels the
        task running the block when the claim is lost: the block's work sees
        ``CancelledError`` at its next await, and the block raises ``ClaimLostError``
        in its place. A cancellation from outside stays ``CancelledError``; on Python
        3.10 one that comes in the same loop turn as the loss cannot be told from it.
        Off by default: the block then runs on, and ``lost`` says what happened.

        Example::

            with claim.keep_alive():
                result = long_work()
            claim.complete(result)
        """
        return KeepAlive(self, interval, cancel_on_loss)

    def _peek(self) -> object:
        """What claim.lua would answer without claiming: the stored value, else the holder.

        After a claim by SET ... NX GET, without a script: GET, PTTL and PEXPIRETIME of
        the record in one round trip (``ClaimBase._by_command``); else peek.lua.
        """
        if self._claim_path == COMMAND:  # the claim went as SET ... NX GET (the claim's only owner check)
            read = self._plain(self._peek_commands(), self._both_keys)
            return self._by_command(read[0], read[1:], taken=False)
        return self._call(PEEK, (self.claim_key, self.result_key), self._both_keys)

    # -- the round trips

    def _persisting(
        self,
        attempt: Callable[[bool], T],
        persist: bool = True,
        failed: ServerUnavailableError | None = None,
    ) -> T:
        """``attempt(first)``, sent again while a cluster moves the key's slot, for up to ``lease`` seconds.

        A slot migrating key by key (``TRYAGAIN``), a redirection not followed, a
        shard between primaries (``CLUSTERDOWN``): nothing ran, and the cluster
        settles within moments (``is_reshaping``). Every command is safe to send
        twice. Past the lease, or with ``persist=False``, the caller gets the
        ``ServerUnavailableError``. ``failed``: the first try's error, where the
        caller made that try itself (``_call``); ``attempt`` is then never first.
        """
        schedule: WaitSchedule | None = None
        first = failed is None
        while True:
            if failed is not None:
                if not persist or not is_reshaping(failed.__cause__):
                    raise failed
                if schedule is None:
                    schedule = WaitSchedule(float(self.lease), self.key)
                    schedule.start(time.monotonic())
                delay = schedule.next_delay(time.monotonic())
                if delay is None:
                    raise failed
                sleep(None, delay)
            try:
                return attempt(first)
            except ServerUnavailableError as exc:
                failed = exc
            first = False

    def _call(
        self,
        script: Script,
        args: Args,
        keys: str,
        script_only: Args = (),
        meanwhile: Meanwhile = None,
        sends: Sends | None = None,
        announce: Args | None = None,
        persist: bool = True,
        reads: bool = False,
    ) -> object:
        """One round trip (``_call_once``), sent again while the cluster moves the key's slot (``_persisting``).

        The first try is made here, with no closure and no loop: that is every call's
        path but a slot's move.
        """
        try:
            return self._call_once(script, args, keys, script_only, meanwhile, sends, announce, reads)
        except ServerUnavailableError as exc:
            failed = exc
        return self._call_again(failed, persist, script, args, keys, script_only, sends, announce, reads)

    def _call_again(
        self, failed: ServerUnavailableError, persist: bool, script: Script, args: Args, keys: str,
        script_only: Args, sends: Sends | None, announce: Args | None, reads: bool,
    ) -> object:  # fmt: skip
        """``_call``'s later tries, after a first that ``failed`` (``_persisting``)."""
        return self._persisting(
            lambda _: self._call_once(script, args, keys, script_only, None, sends, announce, reads), persist, failed
        )

    def _call_once(
        self,
        script: Script,
        args: Args,
        keys: str,
        script_only: Args = (),
        meanwhile: Meanwhile = None,
        sends: Sends | None = None,
        announce: Args | None = None,
        reads: bool = False,
    ) -> object:
        """One round trip: the server's own command or the native command where chosen, else the script.

        ``sends`` counts the sends that may have reached the server: the direct
        path counts each of its retries, ``execute_command`` counts one (its
        re-sends are its own); a send the server refused unrun is taken back.
        ``announce`` (a PUBLISH) goes pipelined behind a native command or the
        server's own, in the same round trip, where the script (given
        ``script_only``) announces itself. ``reads``: a claim by SET ... NX GET reads
        the lease left behind it (``ClaimBase._by_command``). The reply is the
        script's, as ``owner_check_reply`` and ``_by_command`` read the server's own
        commands' replies (complete's ``None``: not stored, see ``_store_read``).
        """
        client = self._client
        state = state_of(client)
        try:
            if not state.ready:
                _prepare(client, state)
            native = native_command(self._native, state.native, script, self.key)
            check = owner_check(self._native, state.native, script)
            command = owner_check_command(check, args, script) if check else (native, *args) if native else None
            if command is not None:
                setattr(self, script.went, COMMAND if check else NATIVE)
                try:
                    if check == SET_NX_GET:
                        if not reads:
                            reply = _send(client, state.direct, command, meanwhile, sends)
                            return self._by_command(reply, None, taken=True)
                        run_meanwhile(meanwhile)
                        got = _behind(client, command, self._lease_reads(), sends)
                        return self._by_command(got[0], got[1:], taken=True)
                    if announce is None:
                        reply = _send(client, state.direct, command, meanwhile, sends)
                    else:
                        run_meanwhile(meanwhile)
                        reply = _announcing(client, command, announce)
                    return reply if check is None else owner_check_reply(check, script, reply)
                except (*RESPONSE_ERRORS, *CLUSTER_ERRORS) as exc:
                    if refused(self, state, check or NATIVE, exc).action != RESEND:
                        raise  # WRONGTYPE, a failover...: what the script would answer too
                    meanwhile = None  # it ran with the refused command
                    _unrun(sends)
            setattr(self, script.went, SCRIPT)
            args += script_only
            try:
                return _send(client, state.direct, script_command(script, args), meanwhile, sends)
            except NO_SCRIPT as exc:
                # A flushed or restarted server: EVAL runs the script and caches it
                # again, one extra round trip instead of SCRIPT LOAD plus EVALSHA.
                if refused(self, state, SCRIPT, exc).action != RELOAD:
                    raise
                _unrun(sends)
                return _send(client, state.direct, script_command(script, args, source=True), sends=sends)
        except UnicodeDecodeError as exc:
            # A decode_responses client reading bytes someone else stored.
            raise UnreadableResultError(f"{keys} holds bytes this client cannot decode: {exc}", key=self.key) from exc
        except Exception as exc:
            if not raised_by_client(exc):
                raise
            if gives_up(exc):
                raise self._scripting_refused(script, exc, state.unprobed) from exc
            raise failed(client, exc, self.key, keys) from exc

    def _plain(self, commands: Sequence[Args], keys: str) -> list[object]:
        """``commands`` (plain ones, on this key) in one round trip, sent again while the slot moves: their replies.

        The first command's error is raised; the others' come back as values (a
        PTTL an ACL refuses is only a hint).
        """
        return self._persisting(lambda _: self._plain_once(commands, keys))

    def _plain_once(self, commands: Sequence[Args], keys: str) -> list[object]:
        client = self._client
        try:
            if len(commands) == 1:
                return [_send(client, state_of(client).direct, commands[0])]
            return _behind(client, commands[0], commands[1:])
        except UnicodeDecodeError as exc:
            raise UnreadableResultError(f"{keys} holds bytes this client cannot decode: {exc}", key=self.key) from exc
        except Exception as exc:
            if not raised_by_client(exc):
                raise
            raise failed(client, exc, self.key, keys) from exc

    def _call_and_wait(
        self, script: Script, args: Args, keys: str, sends: Sends | None = None
    ) -> tuple[object, int]:  # fmt: skip
        """``_call_and_wait_once``, sent again while the cluster moves the key's slot (``_persisting``)."""
        return self._persisting(lambda _: self._call_and_wait_once(script, args, keys, sends))

    def _call_and_wait_once(
        self, script: Script, args: Args, keys: str, sends: Sends | None
    ) -> tuple[object, int]:  # fmt: skip
        """Run ``script`` and ``WAIT replicas timeout`` on one connection, in one round trip.

        Always the script: the reply and the WAIT must come from the same connection.
        On a cluster that is a connection to the key's primary, followed through
        ``MOVED`` and ``ASK`` (``_clients.cluster``); ``sends`` then counts the sends that
        may have run (see ``_call``).
        """
        client = self._client
        state = state_of(client)
        try:
            if not state.ready:
                _prepare(client, state)
            wait = ("WAIT", self._replicas, self._replica_timeout_ms)
            command = script_command(script, args)
            setattr(self, script.went, SCRIPT)
            reply, acknowledged = _waited(client, self.claim_key, [command, wait], sends)
            if isinstance(reply, NO_SCRIPT) and refused(self, state, SCRIPT, reply).action == RELOAD:
                # Nothing ran, so nothing was waited for: both again, with the source.
                _unrun(sends)
                command = script_command(script, args, source=True)
                reply, acknowledged = _waited(client, self.claim_key, [command, wait], sends)
            for item in (reply, acknowledged):
                if isinstance(item, Exception):
                    raise item
        except Exception as exc:
            if not raised_by_client(exc):
                raise
            if gives_up(exc):
                raise self._scripting_refused(script, exc, state.unprobed) from exc
            raise failed(client, exc, self.key, keys) from exc
        return reply, int(acknowledged)  # type: ignore[call-overload]  # WAIT replies an int


def write_through(write: Callable[[], None], seconds: float, key: str) -> None:
    """``write()``, sent again after a failed connection for up to ``seconds``: a result's last write.

    A dropped connection, a demoted primary (``READONLY``), a restart (``LOADING``):
    none may drop a result that ran. The write is owner-checked, so it is safe to
    send twice, on a new connection. Past ``seconds`` from the first send the
    ``ConnectionFailedError`` goes on; any other error goes on at once. The schedule
    is made on the first failure only, so a write that lands costs a clock read.
    """
    first_sent = time.monotonic()
    schedule: WaitSchedule | None = None
    while True:
        try:
            return write()
        except ConnectionFailedError:  # ServerUnavailableError included
            if schedule is None:
                schedule = WaitSchedule(seconds, key)
                schedule.start(first_sent)
            delay = schedule.next_delay(time.monotonic())
            if delay is None:
                raise
        sleep(None, delay)


def _send(
    client: SyncClient, pool: Any, command: Args, meanwhile: Meanwhile = None, sends: Sends | None = None
) -> object:
    """One command's raw reply: straight through the pool where ``direct_pool`` allowed it.

    ``meanwhile`` runs once: while the command is on the wire, or before it is sent.
    ``sends`` counts the sends (see ``Claim._call``).
    """
    if pool is None:
        run_meanwhile(meanwhile)
        if sends is not None:
            sends.count += 1  # redis-py's re-sends, if any, are invisible from here
        # redis-py leaves execute_command untyped on some clients.
        return client.execute_command(*command, **command_options(command))  # type: ignore[no-untyped-call, unused-ignore]
    return send_direct(pool, command, meanwhile, sends)


def _behind(
    client: SyncClient, command: Args, behind: Sequence[Args], sends: Sends | None = None
) -> list[object]:
    """``command`` with ``behind`` pipelined after it, in one round trip: every reply, ``command``'s error raised.

    ``sends`` counts the sends of ``command`` (see ``_send``).
    """
    pool = state_of(client).direct
    if pool is not None:  # one round trip, shared with the loop's other tasks (a sync client's)
        replies = send_direct_group(pool, [command, *behind], sends)
    elif isinstance(client, CLIENTS):
        # A client whose execute_command is watched (a subclass, a wrapper, a spy): it sees
        # every command, one round trip each, as the manual's "how commands travel" promises.
        replies = [_send(client, None, command, sends=sends)]
        for read in behind:
            try:
                replies.append(_send(client, None, read))
            except RESPONSE_ERRORS as exc:
                replies.append(exc)
        return replies
    else:
        if sends is not None:
            sends.count += 1  # a pipeline's re-sends are redis-py's, unseen
        replies = _pipelined(client, [command, *behind])
        # A cluster pipeline whose connection failed answers so rather than sending again
        # (redis-py's asyncio one): sent again as the client's execute_command would.
        again = resends(client) if isinstance(replies[0], CONNECTION_ERRORS) else 0
        while again and isinstance(replies[0], CONNECTION_ERRORS):
            again -= 1
            if sends is not None:
                sends.count += 1
            replies = _pipelined(client, [command, *behind])
    if isinstance(replies[0], BaseException):
        raise replies[0]
    return replies


def _announcing(client: SyncClient, command: Args, announce: Args) -> object:
    """``command`` with ``announce`` pipelined behind it, in one round trip: ``command``'s reply.

    Its error reply is raised; the announcement's (an ACL without pub/sub) is
    ignored: waiters poll without it.
    """
    return (_behind(client, command, [announce]))[0]


def _unrun(sends: Sends | None) -> None:
    """The last send was refused unrun (an unknown command, NOSCRIPT): it claimed nothing."""
    if sends is not None:
        sends.count -= 1


def _waited(client: SyncClient, key: str, commands: Sequence[Args], sends: Sends | None = None) -> list[object]:
    """``commands`` (a write and its WAIT) on one connection: on a cluster, one of ``key``'s primary.

    Elsewhere as ``_pipelined`` sends them: over one pooled connection where
    ``direct_pool`` allowed it (``sends`` then counts the tries), else in a pipeline.
    """
    if isinstance(client, CLUSTERS):
        return node_round(client, key, commands, sends)
    return _pipelined(client, commands, sends=sends)


def _round(
    client: SyncClient, commands: Sequence[Args], wait: Args | None, routes: Sequence[str]
) -> tuple[list[object], list[int | None], list[bool]]:
    """One pipelined round of a batch, with ``wait`` (a WAIT) behind it if given.

    Returns each command's reply, the count WAIT gave it, and whether it may have
    been sent twice (the round re-sent whole by the connection's ``Retry``; a
    pipeline's re-send is redis-py's, unseen). On a cluster with ``wait``, each
    node's commands (``routes``: their keys) go in a round of their own, each with
    its WAIT; a command redirected there (its slot moved) goes again alone, on the
    new owner.
    """
    if wait is not None and isinstance(client, CLUSTERS):
        return _node_rounds(client, commands, wait, routes)
    sends = Sends()
    replies = _pipelined(client, commands if wait is None else [*commands, wait], sends=sends)
    resent = [sends.count > 1] * len(commands)
    if wait is None:
        return replies, [None] * len(commands), resent
    waited = replies.pop()
    if isinstance(waited, Exception):
        raise waited  # cut short (UNBLOCKED by a demotion): the whole batch is in doubt
    return replies, [int(waited)] * len(commands), resent  # type: ignore[call-overload]  # WAIT replies an int


def _claim_rounds(
    client: SyncClient, state: ClientState, handles: Sequence[Claim], wait: Args | None
) -> tuple[list[object], list[int | None], list[bool]]:
    """``acquire_many``'s claims on the wire: each claim's reply, its WAIT count, whether it may have been sent twice.

    A claim refused unrun (a lost script cache, a node without the module, a
    server that refuses SET ... NX GET) goes again as a script, in a round of its
    own; a native nil, and an in-flight reply of SET ... NX GET, is read back.
    Each reply is the script's (``ClaimBase._by_command``), or a key's own error.
    """
    if not state.ready:
        _prepare(client, state)
    commands = [handle._claim_command(state.native) for handle in handles]
    checks = [SET_NX_GET if command[0] == "SET" else None for command in commands]
    routes = [handle.claim_key for handle in handles]
    replies, acknowledged, resent = _round(client, commands, wait, routes)
    scripts = [handle._claim_call()[0] for handle in handles]
    again = _refused_in_batch(handles, scripts, state, [_sent(command) for command in commands], replies)
    if again:
        sources = [handles[i]._claim_command(state.native, source=True) for i in again]
        # The EVAL round wrote too (the first one's refused claims ran nothing): its own WAIT.
        # The EVAL round's own re-sends are not counted: the claims in it ran nothing before.
        sourced, waited, _ = _round(client, sources, wait, [routes[i] for i in again])
        scripted = [handles[i] for i in again]
        _refused_in_batch(scripted, [scripts[i] for i in again], state, [SCRIPT] * len(again), sourced)
        for i, reply, count in zip(again, sourced, waited, strict=True):
            replies[i], acknowledged[i], checks[i] = reply, count, None
    for i, check in enumerate(checks):
        if check is not None and not isinstance(replies[i], ERRORS):
            replies[i] = _read_as_script(handles[i], replies[i], None, taken=True)
    nils = [i for i, reply in enumerate(replies) if handles[i]._needs_peek(reply)]
    if nils:
        # GOBLIN.CLAIM's nil (a holder's token, on one key), or a token SET ... NX GET answered
        # without the lease it has left: one read of each record tells the outcomes apart.
        peeks: list[Args] = []
        for i in nils:
            if checks[i] is None:
                peeks.append(("EVAL", PEEK.source, 2, handles[i].claim_key, handles[i].result_key))
            else:
                peeks += handles[i]._peek_commands()
        read = iter(_pipelined(client, peeks))
        for i in nils:
            if checks[i] is None:
                replies[i] = next(read)
                continue
            value, *reads = (next(read) for _ in handles[i]._peek_commands())
            replies[i] = value if isinstance(value, ERRORS) else _read_as_script(handles[i], value, reads, taken=False)
    return replies, acknowledged, resent


def _read_as_script(handle: Claim, value: object, reads: list[object] | None, *, taken: bool) -> object:
    """``handle._by_command`` in a batch: a key's own failure takes its reply's place."""
    try:
        return handle._by_command(value, reads, taken=taken)
    except GoblinClaimError as exc:
        return exc


def _node_rounds(
    client: SyncClient, commands: Sequence[Args], wait: Args, routes: Sequence[str]
) -> tuple[list[object], list[int | None], list[bool]]:
    """``_round`` on a cluster with a WAIT: a round per node, each command's slot followed."""
    nodes: dict[str, list[int]] = {}
    for i, route in enumerate(routes):
        node: Any = client.get_node_from_key(route)  # type: ignore[union-attr, no-untyped-call, unused-ignore]
        nodes.setdefault(node.name, []).append(i)
    replies: list[object] = [None] * len(commands)
    acknowledged: list[int | None] = [None] * len(commands)
    resent = [False] * len(commands)
    pending = [(group, False) for group in nodes.values()]
    while pending:
        group, alone = pending.pop()
        sends = Sends()
        sent = [*(commands[i] for i in group), wait]
        got = node_round(client, routes[group[0]], sent, sends, follow=alone)
        waited = got.pop()
        ran = []
        for i, reply in zip(group, got, strict=True):
            if not alone and is_redirect(reply):
                pending.append(([i], True))  # its slot lives elsewhere now: alone, followed to its owner
            else:  # the first one's redirections node_round followed
                ran.append((i, reply))
        # A node demoted since the table was read redirects every claim and refuses the
        # WAIT ("cannot be used with replica instances"): nothing of it ran, nothing to wait for.
        if ran and isinstance(waited, Exception):
            raise waited  # cut short (UNBLOCKED by a demotion): the round's claims are in doubt
        for i, reply in ran:
            replies[i], acknowledged[i], resent[i] = reply, int(waited), sends.count > 1  # type: ignore[call-overload]
    return replies, acknowledged, resent


def _pipelined(
    client: SyncClient, commands: Sequence[Args], pipe: Any = None, sends: Sends | None = None
) -> list[object]:
    """Send ``commands`` in one pipeline (grouped by node on a cluster); errors come back as values.

    Where ``direct_pool`` allowed it (and no ``pipe`` is given), straight over one
    pooled connection, as one command goes (``send_direct_many``); ``sends`` then
    counts its tries. A pipeline's re-send is redis-py's, unseen.
    """
    if pipe is None:
        pool = state_of(client).direct
        if pool is not None:
            return send_direct_many(pool, commands, sends)
        pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, **command_options(command))  # type: ignore[no-untyped-call, unused-ignore]
    try:
        replies: list[object] = pipe.execute(raise_on_error=False)
    except UnboundLocalError:
        # valkey-py 6.2's asyncio cluster pipeline with cluster_error_retry_attempts=0 tries
        # nothing and raises this before sending a byte: the commands go one by one instead.
        replies = []
        for command in commands:
            try:
                replies.append(client.execute_command(*command, **command_options(command)))  # type: ignore[no-untyped-call, unused-ignore]
            except RESPONSE_ERRORS as exc:
                replies.append(exc)
    return replies


def _release_rounds(
    client: SyncClient, state: ClientState, handles: Sequence[Claim], wake: str
) -> list[object]:
    """``release_many``'s releases on the wire: each handle's reply, in order.

    A release refused unrun (a lost script cache, a node without the module, an
    owner check the server cannot use) goes again as the script, in one more round.
    """
    if not state.ready:
        _prepare(client, state)
    checks = [owner_check(handle._native, state.native, handle._release_script) for handle in handles]
    commands, at = _release_commands(handles, checks, state.native, wake)
    pipelined = _pipelined(client, commands)
    replies = [pipelined[i] for i in at]
    scripts = [handle._release_script for handle in handles]
    again = _refused_in_batch(handles, scripts, state, [_sent(commands[i]) for i in at], replies)
    if again:
        # Refused unrun (NOSCRIPT, unknown command, ...): each runs once, as a script.
        sources = [
            script_command(scripts[i], (handles[i].claim_key, handles[i].token, wake), source=True) for i in again
        ]
        resent = _pipelined(client, sources)
        scripted = [handles[i] for i in again]
        _refused_in_batch(scripted, [scripts[i] for i in again], state, [SCRIPT] * len(again), resent)
        for i, reply in zip(again, resent, strict=True):
            replies[i] = reply
    return replies


def _release_commands(
    handles: Sequence[Claim], checks: Sequence[str | None], available: frozenset[str] | None, wake: str
) -> tuple[list[Args], list[int]]:
    """The pipeline of ``release_many``'s first round, and where each handle's reply sits in it."""
    commands: list[Args] = []
    at: list[int] = []
    for handle, check in zip(handles, checks, strict=True):
        args = (handle.claim_key, handle.token)
        script = handle._release_script
        native = native_command(handle._native, available, script, handle.key)
        at.append(len(commands))
        if check is not None:
            commands.append(owner_check_command(check, args))
        elif native is not None:
            commands.append((native, *args))
        else:
            commands.append(script_command(script, (*args, wake)))  # it announces itself
            continue
        # A native delete announces nothing: its announcement goes right behind it.
        commands.append((wake, handle.claim_key, "free"))
    return commands, at


def _sent(command: Args) -> str:
    """What a batch's command is, as ``after_refusal`` takes it: the script, a module command, or an owner check.

    A batch sends ``SET`` for a claim only (``SET ... NX GET``); its releases' owner
    checks are named by their commands (``DELIFEQ``, ``DELEX``).
    """
    name = command[0]
    if name == "EVALSHA" or name == "EVAL":
        return SCRIPT
    if name == "SET":
        return SET_NX_GET
    return NATIVE if name in NATIVE_COMMANDS else str(name)


def _refused_in_batch(
    handles: Sequence[Claim], scripts: Sequence[Script], state: ClientState, sent: Sequence[str],
    replies: list[object],
) -> list[int]:  # fmt: skip
    """The one rule (``refused``) on each error reply of a batch's round: the replies to send again as scripts.

    ``scripts`` are the scripts the handles' commands stand for. A refusal to run
    a script takes its reply's place as the handle's error; each notice goes out
    once for the round, on the first handle it concerned. Each handle records the
    path its call took (``Script.went``).
    """
    again: list[int] = []
    noticed: set[tuple[str, str]] = set()
    for i, reply in enumerate(replies):
        path = path_of_sent(sent[i])
        if isinstance(reply, RESPONSE_ERRORS):
            decision = refused(handles[i], state, sent[i], reply, noticed)
            if decision.action == RESEND or decision.action == RELOAD:
                again.append(i)
                path = decision.path
            elif decision.action == GIVE_UP:
                replies[i] = handles[i]._scripting_refused(scripts[i], reply, state.unprobed)
        setattr(handles[i], scripts[i].went, path)
    return again


def _batch_outcome(
    handle: Claim, reply: object, acknowledged: int | None, sent_at: float, now: float, resent: bool
) -> Outcome | GoblinClaimError:
    if isinstance(reply, GoblinClaimError):  # read as the script's reply and found wanting, or a script refused
        return reply
    if isinstance(reply, ERRORS):
        return translate(reply, handle.key, handle.result_key)
    try:
        # ``resent``: the direct round counted its re-send; a pipeline's is redis-py's, unseen.
        return handle._claim_outcome(reply, acknowledged, resent=resent, sent_at=sent_at, now=now)[0]
    except GoblinClaimError as exc:  # this key's own failure, in its place
        return exc


def _prepare(client: SyncClient, state: ClientState) -> None:
    """Probe for the native commands and SCRIPT LOAD the scripts, once per client."""
    with state.sync_lock:
        if state.ready:
            return
        if isinstance(client, CLUSTERS):
            # The cluster client refuses commands missing from the table it loaded
            # at start, so that table is what decides; SCRIPT LOAD reaches every primary.
            load_commands(client)
            state.native = native_from_command_table(client.commands_parser.commands)
            for script in SCRIPTS:
                # An ACL without +script refuses this; EVAL then recovers on first use.
                with contextlib.suppress(*RESPONSE_ERRORS):
                    client.script_load(script.source)
        else:
            pipe = client.pipeline(transaction=False)
            pipe.execute_command(PROBE_COMMAND, *PROBE_ARGS)  # type: ignore[no-untyped-call, unused-ignore]
            for script in SCRIPTS:
                pipe.script_load(script.source)
            # One round trip; an error entry (NOPERM for the probe) is data here.
            replies = pipe.execute(raise_on_error=False)
            state.native = native_from_probe(replies[0])
            state.unprobed = not isinstance(replies[0], list)
        state.direct = direct_pool(client)
        state.ready = True
        _events.probed(client, state.native, state.direct is not None)
