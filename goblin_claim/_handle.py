"""``ClaimBase``: a claim handle's settings, keys, ownership clock and reading of replies, with no client calls."""

from __future__ import annotations

import datetime
import inspect
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final, Generic, TypeVar, cast

from ._clients.families import adapt
from ._clients.kinds import _CLIENT_KINDS, check_client
from ._defaults import CHECKPOINT_MAX_BYTES, DEFAULT_NAMESPACE, LEASE, REPLICA_TIMEOUT_MS, REPLICAS, TTL
from ._errors import (
    ClaimLostError,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NotReplicatedError,
    ResultLostError,
    ServerError,
    ServerUnavailableError,
)
from ._outcomes import Claimed, Completed, InFlight, Outcome
from ._protocol.checks import (
    _NAMESPACES_SEEN,
    MAX_SECONDS,
    NativeMode,
    _check_text,
    _remember_namespace,
    check_namespace,
    check_native,
    check_replicas,
    check_seconds,
    check_token,
    check_value,
    describe,
)
from ._protocol.record import (
    _CLAIMED_REPLIES,
    _DONE_PREFIXES,
    CLAIMED,
    DONE_PREFIX,
    FENCE_SUFFIX,
    build_keys,
    new_token,
    split_done,
    split_token,
)
from ._protocol.scripts import (
    CHECKPOINT,
    CLAIM,
    CLAIM_FENCED,
    CLAIM_ONE_KEY,
    CLAIM_WAITED,
    COMPLETE,
    COMPLETE_FENCED,
    COMPLETE_ONE_KEY,
    DELEX,
    DELIFEQ,
    EXTEND,
    EXTEND_HELD,
    FORGET,
    RELEASE,
    RELEASE_HELD,
    SET_IFEQ,
    SET_NX_GET,
    Script,
    keyed,
    native_command,
    owner_check,
    owner_check_command,
    script_command,
)
from ._protocol.timing import WaitSchedule

# Outcomes from a dict of their fields, as Claimed(**fields) makes them (validated).
_claimed_outcome: Final[Callable[[dict[str, Any]], Claimed]] = Claimed.__pydantic_validator__.validate_python
_completed_outcome: Final[Callable[[dict[str, Any]], Completed]] = Completed.__pydantic_validator__.validate_python


class Stored:
    """A completed record's stored value, without the ``Completed`` model around it.

    For a caller that only reads the value and never hands the outcome on (the
    decorator's duplicate): validating a ``Completed`` is most of what reading a
    short record costs.
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes | str) -> None:
        self.value = value


# What the checkpoint key adds to the record's (checkpoints=True).
CHECKPOINT_SUFFIX: Final = ":checkpoint"
_HELD_PREFIX: Final = b"held "
# An at-most-once record, as complete.lua and claim.lua match it: deadline, claim time, token.
_HELD: Final = re.compile(rb"held ([0-9]+) ([0-9]+) (.+)", re.DOTALL)
_HELD_TEXT: Final = re.compile(r"held ([0-9]+) ([0-9]+) (.+)", re.DOTALL)
# How many times a store by SET ... IFEQ may find the record changed under it before it gives up.
_STORE_TRIES: Final = 8
# The server's own commands, as an error names them.
_BUILTIN_NAMES: Final = {
    SET_NX_GET: "SET ... NX GET (Redis 7.0 and later, Valkey)",
    SET_IFEQ: "SET ... IFEQ (Valkey 8.1 and later, Redis 8.4 and later)",
    DELIFEQ: "DELIFEQ (Valkey 9.0 and later)",
    DELEX: "DELEX (Valkey 9.2, Redis 8.4 and later)",
}

# complete.lua's replies.
_STORED: Final = 1
_COMPLETED_OTHERWISE: Final = 2
_UNPROVEN: Final = 3  # claim_key empty, and nothing shows that nobody claimed it since
# What each refusal says of the claim, as a message names it.
_VERDICTS: Final[dict[object, str]] = {
    _COMPLETED_OTHERWISE: "completed with another value",
    _UNPROVEN: "gone",
    0: "held or completed by another token",
}


# --------------------------------------------------------------------------- the shared handle


ClientT = TypeVar("ClientT")
HandleT = TypeVar("HandleT", bound="ClaimBase[Any]")


class ClaimBase(Generic[ClientT]):
    """What ``Claim`` and ``AsyncClaim`` share: validated settings and derived keys.

    Handles are made once per request, so construction stays cheap: plain type
    and range checks, no pydantic, namespaces validated once per process.
    """

    __slots__ = (
        "_checkpoint_key",
        "_claim_path",
        "_client",
        "_fence",
        "_fence_key",
        "_holder",
        "_keep",
        "_keeper",
        "_lapse_ms",
        "_made_token",
        "_mine_until",
        "_native",
        "_path",
        "_replica_timeout_ms",
        "_replicas",
        "claim_key",
        "key",
        "last_checkpoint",
        "lease",
        "result_key",
        "token",
        "ttl",
    )

    # Whether the handle awaits its client's commands; None (ClaimBase itself): no client check.
    _wants_async: ClassVar[bool | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Judged once per class from what it does (an awaitable acquire), so the
        # drivers need no marker of their own.
        super().__init_subclass__(**kwargs)
        acquire = getattr(cls, "acquire", None)
        if acquire is not None:
            cls._wants_async = inspect.iscoroutinefunction(acquire)

    def __init__(
        self,
        client: ClientT,
        key: str,
        *,
        lease: int = LEASE,
        ttl: int = TTL,
        namespace: str = DEFAULT_NAMESPACE,
        token: str | None = None,
        native: NativeMode = "auto",
        fencing: bool = False,
        replicas: int = REPLICAS,
        replica_timeout_ms: int = REPLICA_TIMEOUT_MS,
        at_most_once: bool = False,
        checkpoints: bool = False,
    ) -> None:
        # Each check takes its fast path inline for the valid, common case and
        # calls the full checker (which raises with a clear message) otherwise.
        if _CLIENT_KINDS.get(type(client)) is not self._wants_async:
            client = adapt(client)
            check_client(client, self._wants_async, type(self).__name__)
        if type(key) is not str or not key or not key.isascii():
            _check_text("key", key)
        if type(namespace) is not str or namespace not in _NAMESPACES_SEEN:
            _remember_namespace(check_namespace(namespace))
        if type(lease) is not int or not 0 < lease <= MAX_SECONDS:
            lease = check_seconds("lease", lease)
        if type(ttl) is not int or not 0 < ttl <= MAX_SECONDS:
            ttl = check_seconds("ttl", ttl)
        made = token is None  # a token made here is unique to this handle: no other handle can hold it
        token = new_token() if made else check_token(token)
        if type(native) is not str or native != "auto":
            native = check_native(native)
        if fencing is not False and fencing is not True:
            raise InvalidArgumentTypeError(f"fencing must be True or False, not {describe(fencing)}", key=key)
        # The default, no WAIT; exact types first, so False or 0.0 are refused below like any bad value.
        if not (
            type(replicas) is int
            and replicas == REPLICAS
            and type(replica_timeout_ms) is int
            and replica_timeout_ms == REPLICA_TIMEOUT_MS
        ):
            replicas, replica_timeout_ms = check_replicas(replicas, replica_timeout_ms)
        if at_most_once is not False or checkpoints is not False:
            at_most_once = _check_flag("at_most_once", at_most_once, key)
            checkpoints = _check_flag("checkpoints", checkpoints, key)
        self._settle(
            client, key, namespace, token, made,
            lease, ttl, native, fencing, replicas, replica_timeout_ms, at_most_once, checkpoints,
        )  # fmt: skip

    def _settle(
        self: HandleT,
        client: Any,
        key: str,
        namespace: str,
        token: str,
        made_token: bool,
        lease: int,
        ttl: int,
        native: NativeMode,
        fencing: bool,
        replicas: int,
        replica_timeout_ms: int,
        at_most_once: bool,
        checkpoints: bool,
    ) -> HandleT:
        """Every slot of a handle, from settings already checked: the one place a handle is made; the handle.

        ``__init__`` checks what a caller gave; the decorator and a batch check their
        settings once and make each call's handle as ``cls.__new__(cls)._settle(...)``,
        without checking again on every call (a test compares every slot). The
        decorator's and a batch's tokens are made for their handle (``made_token``).
        At most once keeps the record past the lease, for as long as a result would
        be kept (and never less than the lease), so an interrupted attempt stays known.
        """
        self._client = client
        self.key = key
        self.claim_key, self.result_key = build_keys(namespace, key)
        self.lease, self.ttl, self.token, self._native = lease, ttl, token, native
        self._made_token = made_token
        self._fence_key: str | None = self.claim_key + FENCE_SUFFIX if fencing else None
        self._replicas, self._replica_timeout_ms = replicas, replica_timeout_ms
        self._keep: int | None = max(lease, ttl) if at_most_once else None
        self._checkpoint_key: str | None = self.claim_key + CHECKPOINT_SUFFIX if checkpoints else None
        self._lapse_ms: int | None = None  # what the last in-flight reply said the lease has left
        self._holder: object = None  # what the last claim reply said claim_key holds, when it said
        self._mine_until = 0.0  # see _owns: until when a claim holding this token is this handle's own
        self._fence: int | None = None  # the fence of the claim this handle holds or last held
        self._keeper: Any = None  # the keep-alive renewing this handle's claim, for ensure_held()
        # How the last claim, and the last other call, went to the server (``Script.went``); None: not yet.
        self._claim_path: str | None = None
        self._path: str | None = None
        self.last_checkpoint: bytes | str | None = None
        return self

    @classmethod
    def _settled(
        cls: type[HandleT], client: Any, key: str, namespace: str, token: str, lease: int, ttl: int,
        replicas: int, replica_timeout_ms: int, at_most_once: bool,
    ) -> HandleT:  # fmt: skip
        """A handle of settings checked once where they were given (a door's ``Options``): one per request.

        Only what comes with the request is checked here, as ``__init__`` checks it:
        the client's kind and the key. The token is the caller's (``made_token``
        false, as when ``__init__`` is given one).
        """
        if _CLIENT_KINDS.get(type(client)) is not cls._wants_async:
            client = adapt(client)
            check_client(client, cls._wants_async, cls.__name__)
        if type(key) is not str or not key or not key.isascii():
            _check_text("key", key)
        return cls.__new__(cls)._settle(
            client, key, namespace, token, False, lease, ttl, "auto", False, replicas, replica_timeout_ms,
            at_most_once, False,
        )  # fmt: skip

    @classmethod
    def _many(cls: type[HandleT], client: Any, keys: Iterable[str], options: dict[str, Any]) -> list[HandleT]:
        """The handles of a batch: ``cls(client, key, **options)`` for each key, the options checked once.

        The first handle is made by the constructor; the others take its checked
        settings and check only their own key. Each draws its own token unless the
        options give one, which they share (as the constructor would give it each).
        """
        keys = list(keys)
        if not keys:
            return []
        first = cls(client, keys[0], **options)
        namespace = options.get("namespace", DEFAULT_NAMESPACE)  # the first handle checked it
        handles = [first]
        for key in keys[1:]:
            if type(key) is not str or not key or not key.isascii():
                _check_text("key", key)
            handle = cls.__new__(cls)._settle(
                first._client, key, namespace, new_token() if first._made_token else first.token,
                first._made_token, first.lease, first.ttl, first._native, first._fence_key is not None,
                first._replicas, first._replica_timeout_ms, first._keep is not None, first._checkpoint_key is not None,
            )  # fmt: skip
            handles.append(handle)
        return handles

    @classmethod
    def _with_keys(
        cls,
        client: ClientT,
        claim_key: str,
        result_key: str,
        lease: int,
        ttl: int,
        token: str | None,
        native: NativeMode,
        replicas: int,
        replica_timeout_ms: int,
    ) -> ClaimBase[ClientT]:
        _check_text("claim_key", claim_key)
        _check_text("result_key", result_key)
        if claim_key == result_key:
            raise InvalidArgumentError(f"claim_key and result_key must differ: {claim_key!r}")
        # The usual construction checks everything else; then the exact keys replace the derived ones.
        self = cls(
            client, claim_key, lease=lease, ttl=ttl, token=token, native=native,
            replicas=replicas, replica_timeout_ms=replica_timeout_ms,
        )  # fmt: skip
        self.claim_key, self.result_key = claim_key, result_key
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, token={self.token!r}, lease={self.lease}, ttl={self.ttl})"

    # -- what to send, and what the replies mean

    @property
    def _both_keys(self) -> str:
        """Both keys (the one key of the record), as errors about a command on both name them."""
        if self.claim_key == self.result_key:
            return self.claim_key
        return f"{self.claim_key} / {self.result_key}"

    def _claim_call(self) -> tuple[Script, tuple[str | int, ...]]:
        if self._keep is not None or self._checkpoint_key is not None:
            return self._unit_claim_call()
        if self._fence_key is None:
            if self._replicas:  # "wait": a read-back is rewritten for the WAIT behind it (claim.lua)
                return CLAIM_WAITED, (self.claim_key, self.result_key, self.token, self.lease, 0, "wait")
            # The one-key record: SET ... NX GET may take the claim (CLAIM_ONE_KEY), as GOBLIN.CLAIM may two keys.
            script = CLAIM_ONE_KEY if self.claim_key is self.result_key or self.claim_key == self.result_key else CLAIM
            return script, (self.claim_key, self.result_key, self.token, self.lease)
        # The counter outlives the claim and its result; past that, the clock takes over.
        keep = max(self.lease, self.ttl)
        fenced = (self.claim_key, self.result_key, self._fence_key, self.token, self.lease, keep)
        return CLAIM_FENCED, (*fenced, "wait") if self._replicas else fenced

    def _unit_claim_call(self) -> tuple[Script, tuple[str | int, ...]]:
        """claim.lua for an at-most-once or checkpointed claim: always the script (claim.lua's header)."""
        keys: tuple[str, ...] = (self.claim_key, self.result_key)
        if self._fence_key is not None:
            keys += (self._fence_key,)
        if self._checkpoint_key is not None:
            keys += (self._checkpoint_key,)
        keep_fence = max(self.lease, self.ttl) if self._fence_key is not None else 0
        args = (
            *keys, self.token, self.lease, keep_fence, "wait" if self._replicas else "",
            "" if self._keep is None else self._keep, "" if self._checkpoint_key is None else "checkpoint",
        )  # fmt: skip
        return keyed(CLAIM, len(keys) - 2), args

    def _claim_command(
        self, available: frozenset[str] | None, *, source: bool = False
    ) -> tuple[str | bytes | int, ...]:
        """The claim as one command for a pipeline: SET ... NX GET or GOBLIN.CLAIM where chosen, else the script.

        ``source`` sends the script's text (EVAL), for a server that lost its cache
        (or one that refused its SET ... NX GET).
        """
        script, args = self._claim_call()
        if source:
            return script_command(script, args, source=True)
        # With replicas, always the script, as acquire() sends it: only it rewrites a read-back for the WAIT.
        check = None if self._replicas else owner_check(self._native, available, script)
        if check is not None:
            return owner_check_command(check, args, script)
        native = None if self._replicas else native_command(self._native, available, script, self.key)
        return (native, *args) if native is not None else script_command(script, args)

    def _claim_outcome(
        self,
        reply: object,
        acknowledged: int | None = None,
        *,
        resent: bool = False,
        sent_at: float = 0.0,
        now: float = 0.0,
    ) -> tuple[Outcome, object]:
        """The outcome of a claim reply, and what claim_key holds when that is known.

        ``reply`` is GOBLIN.CLAIM's or claim.lua's: ``CLAIMED``, the stored value,
        or (in flight) a list holding claim_key's value; the driver answers the native
        command's nil with one read (``peek.lua``) that replies as claim.lua would.

        A holder equal to this handle's token is ``Claimed`` only when it is this
        handle's own claim (see ``_owns``); another handle given the same token
        looks the same on the server, and is ``InFlight``.

        Args:
            reply: The server's reply.
            acknowledged: WAIT's count, with ``replicas``.
            resent: The driver sent this claim more than once (its retry, after a
                failure that may have left the first send applied).
            sent_at: The monotonic clock before the claim was first sent.
            now: The monotonic clock once the reply was read.

        Raises:
            ResultLostError: claim_key says done, but the result is gone.
            NotReplicatedError: This handle took the claim, but too few replicas acknowledged it.
        """
        # Validated, not model_construct (slower); the two hot outcomes straight
        # through their validators, which is what __init__ does, less its wrapper.
        if type(reply) is list:
            holder = reply[0] if reply else None
            if self._fence_key is not None and len(reply) == 2 and holder in _CLAIMED_REPLIES:
                # A fenced win has two entries; a fenced in-flight reply three.
                return self._claimed(reply[1], acknowledged, sent_at), self.token
            if len(reply) == 3 and type(reply[2]) is list and holder in _CLAIMED_REPLIES:
                # A checkpointed win: the fence (or nil), then the checkpoint in a list of its own.
                return self._claimed(reply[1], acknowledged, sent_at, checkpoint=reply[2]), self.token
            if holder is None:
                # Free meanwhile (the next attempt may take it), or a non-string: in flight, as natively.
                self._mine_until = 0.0
                return InFlight(key=self.key), None
            checkpoint = None
            if len(reply) == 5 and type(reply[4]) is list:
                # This token's claim read back with the checkpoint (a checkpointed claim sent again).
                checkpoint, reply = reply[4], reply[:4]
            if len(reply) == 4 and type(reply[1]) is int and reply[1] <= 0 and type(reply[3]) is int:
                # An at-most-once record whose deadline passed without a result.
                self._mine_until = 0.0
                raise self._interrupted(holder, reply[3])
            lapse = None
            if len(reply) > 1 and type(reply[1]) is int:
                self._lapse_ms = reply[1]
                # PTTL: -1 is a raw writer's claim without an expiry, so no time is known.
                lapse = reply[1] / 1000 if reply[1] >= 0 else None
            if holder == self.token or holder == self.token.encode():
                fence = reply[2] if len(reply) > 2 else None
                if self._owns(resent, now, fence):
                    return self._claimed(fence, acknowledged, sent_at, held=True, checkpoint=checkpoint), holder
                self._mine_until = 0.0
                # another handle with this token holds it
                return InFlight(key=self.key, retry_after=lapse, holder=holder_name(holder)), holder
            self._mine_until = 0.0
            if holder.startswith(_DONE_PREFIXES[0] if type(holder) is bytes else DONE_PREFIX):
                raise ResultLostError(
                    f"{self.key!r} was completed, but its result ({self.result_key!r}) is gone: evicted by a "
                    "maxmemory-policy other than noeviction, or deleted; forget() reopens the work",
                    key=self.key,
                )
            return InFlight(key=self.key, retry_after=lapse, holder=holder_name(holder)), holder
        if reply in _CLAIMED_REPLIES:
            return self._claimed(None, acknowledged, sent_at), self.token
        self._mine_until = 0.0
        if reply is None:
            return InFlight(key=self.key), None
        holder = None
        if self.claim_key is self.result_key or self.claim_key == self.result_key:
            holder, reply = self._read_record(reply)
            if holder is None:  # a token, not a record: in flight (the driver peeks first)
                return InFlight(key=self.key, holder=holder_name(reply)), reply
        if acknowledged is not None and acknowledged < self._replicas:
            # Read back from the primary alone: a failover now could lose it.
            raise self._not_replicated("read", acknowledged)
        return _completed_outcome({"key": self.key, "value": reply}), holder

    def _stored_of(self, reply: object, acknowledged: int | None) -> Stored | None:
        """A claim reply that is a one-key record, as ``Stored`` (its holder kept); else ``None``.

        What ``_claim_outcome`` answers a record with, less the ``Completed``. With
        ``replicas`` (an acknowledgement to check) it leaves the reply to ``_claim_outcome``.
        """
        if acknowledged is not None or self.claim_key != self.result_key:
            return None
        holder, value = self._read_record(reply)
        if holder is None:
            return None
        self._mine_until = 0.0
        self._holder = holder
        return Stored(cast("bytes | str", value))  # a slice of the reply, which was one of them

    def _read_record(self, reply: object) -> tuple[object, object]:
        """``(holder, value)`` of a one-key record ``done <token> <value>``; ``(None, reply)`` for a token."""
        if type(reply) is bytes:
            if not reply.startswith(_DONE_PREFIXES[0]):
                return None, reply
            cut = reply.find(b" ", len(DONE_PREFIX))
        elif type(reply) is str:
            if not reply.startswith(DONE_PREFIX):
                return None, reply
            cut = reply.find(" ", len(DONE_PREFIX))
        else:
            return None, reply
        if cut < 0:
            raise ResultLostError(
                f"{self.key!r} ({self.claim_key!r}) holds a done marker without a value: not written by this "
                "release's complete(); forget() reopens the work",
                key=self.key,
            )
        return reply[len(DONE_PREFIX) : cut], reply[cut + 1 :]

    def _needs_peek(self, reply: object) -> bool:
        """Whether a claim reply needs one read (peek.lua) to be told apart.

        GOBLIN.CLAIM answers nil in flight on two keys, and on the one-key record
        the holder's token itself; claim.lua answers neither.
        """
        if reply is None:
            return True
        if type(reply) is bytes:
            return self.claim_key == self.result_key and not reply.startswith(_DONE_PREFIXES[0]) and reply != b"CLAIMED"
        if type(reply) is str:
            return self.claim_key == self.result_key and not reply.startswith(DONE_PREFIX) and reply != CLAIMED
        return False

    # -- the one-key record through the server's own commands (SET ... NX GET, SET ... IFEQ)

    def _lease_reads(self) -> tuple[tuple[str, str], ...]:
        """What a SET ... NX GET claim reads right behind it when it wants the lease left (see ``_by_command``)."""
        return (("PTTL", self.claim_key), ("PEXPIRETIME", self.claim_key))

    def _peek_commands(self) -> tuple[tuple[str, str], ...]:
        """peek.lua without a script: the record, the lease it has left, and when it expires."""
        return (("GET", self.claim_key), *self._lease_reads())

    def _by_command(self, value: object, reads: list[object] | None, *, taken: bool) -> object:
        """claim.lua's reply, from what the server's own commands read of the one-key record.

        ``value`` is SET ... NX GET's reply (``taken``: its nil took the claim) or
        GET's (nil: free, as peek.lua's ``{}``); ``reads`` the PTTL and PEXPIRETIME
        read right behind it in the same round trip, ``None`` when they were not sent.
        A token or an at-most-once record read without them is answered as is, and
        needs one more read (``_needs_peek``). PEXPIRETIME less PTTL is the server's
        clock, which an at-most-once record's deadline is read against, as claim.lua
        reads it against TIME; a PTTL refused (an ACL) leaves the lease left unknown,
        as in the scripts.
        """
        if value is None:
            return CLAIMED if taken else []
        held: re.Match[bytes] | re.Match[str] | None
        if type(value) is bytes:
            if value.startswith(_DONE_PREFIXES[0]):  # a completed record: the duplicate's answer, first
                return value
            held = _HELD.fullmatch(value)
        elif type(value) is str:
            if value.startswith(DONE_PREFIX):
                return value
            held = _HELD_TEXT.fullmatch(value)
        else:
            return value
        if value in _CLAIMED_REPLIES:
            # A raw holder named CLAIMED (no token the SDK gives): never a win here, but a holder
            # beside the lease it has left; without that, None asks for the read, as GOBLIN.CLAIM's nil.
            if reads is None:
                return None
            return [value, reads[0] if type(reads[0]) is int else False]
        if reads is None:
            return value
        left, expiry = reads
        if type(left) is not int:
            left = False  # PTTL refused: the lease left is unknown
        if held is None:
            return [value, left]
        if left is False or type(expiry) is not int or left == -1 or expiry == -1:
            raise ServerError(
                f"{self.key!r} holds an at-most-once record, whose deadline is read against the server's clock; "
                "without a script that takes PTTL and PEXPIRETIME on the key (this user may not run them, or the "
                "record has no expiry: not written by goblin-claim): grant +pttl +pexpiretime, or +@scripting",
                key=self.key,
            )
        if left < 0 or expiry < 0:
            return []  # gone between the reads: free
        return [held.group(3), int(held.group(1)) - (expiry - left), False, int(held.group(2))]

    @property
    def _store_script(self) -> Script:
        """complete()'s script where it has no fence, WAIT or checkpoint: COMPLETE_ONE_KEY may be SET ... IFEQ.

        Not for an at-most-once record (``SET ... IFEQ token`` cannot match its
        ``held ...`` value, which complete.lua completes), nor for two keys, nor with a
        token that is not ASCII (the record's head is then encoded as the client
        encodes it, in the script's arguments).
        """
        plain = self._fence_key is None and not self._replicas and self._keep is None and self._checkpoint_key is None
        one_key = self.claim_key is self.result_key or self.claim_key == self.result_key
        return COMPLETE_ONE_KEY if plain and one_key and self.token.isascii() else COMPLETE

    def _store_verdict(self, raw: object, stored: object, encoding: str) -> tuple[object, object]:
        """complete.lua's verdict on a one-key record holding ``raw``, read after its SET ... IFEQ did not store.

        Returns ``(reply, None)``: complete.lua's reply (1 when this token's record of
        this value is there already: a re-send; 2 another value; 3 gone; ``[0,
        raw]`` another owner's). Or ``(None, expected)``: the record is this token's
        to complete after all (it holds the token again, or this token's at-most-once
        record, which complete.lua completes), so ``SET ... IFEQ expected`` goes again.
        """
        if raw is None:
            return _UNPROVEN, None
        value = raw if type(raw) is bytes else str(raw).encode(encoding)
        token = self.token.encode(encoding)
        if value == token:
            return None, raw
        held = _HELD.fullmatch(value)
        if held is not None and held.group(3) == token:
            return None, raw
        mine = _DONE_PREFIXES[0] + token + b" "
        if not value.startswith(mine):
            return [0, raw], None
        wanted = stored if isinstance(stored, bytes) else str(stored).encode(encoding)
        return (_STORED if value[len(mine) :] == wanted else _COMPLETED_OTHERWISE), None

    def _store_missed(self) -> ServerUnavailableError:
        """The error once the record kept changing under a store by SET ... IFEQ (``_STORE_TRIES`` reads)."""
        return ServerUnavailableError(
            f"cannot complete {self.key!r} now: {self.claim_key!r} changed between each store and the read "
            f"behind it, {_STORE_TRIES} times; nothing was written by this call; send it again",
            key=self.key,
        )

    def _scripting_refused(self, script: Script, cause: BaseException, unprobed: bool) -> ServerError:
        """The error for a script this user's ACL refuses: what it needs, and why this call needs a script here."""
        if self._native == "never":
            why = 'the handle was made with native="never", which asks for the scripts'
        elif script.name in ("claim", "complete", "extend", "release", "checkpoint") and (
            self._keep is not None or self._checkpoint_key is not None
        ):
            why = "at_most_once=True and checkpoints=True keep their records with the scripts"
        elif self._fence_key is not None and script.name in ("claim", "complete", "checkpoint"):
            why = "fencing=True numbers the owners inside the scripts"
        elif self._replicas and script.name in ("claim", "complete"):
            why = "replicas= rewrites what it reads for the WAIT, inside the scripts"
        elif self.claim_key != self.result_key and script.name in ("claim", "complete"):
            why = "a handle on two keys (from_keys) runs the scripts"
        elif unprobed:
            why = (
                "the SDK could not ask this server which commands it has (COMMAND INFO is refused too): grant "
                "+command|info, and the server's own commands serve what they can"
            )
        elif script.owner_checks:
            why = "this server has no " + " or ".join(_BUILTIN_NAMES.get(name, name) for name in script.owner_checks)
        else:
            why = f"{script.name}.lua has no form without a script"
        return ServerError(
            f"{script.name} of {self.key!r} needs a Lua script ({script.name}.lua, sent as EVALSHA or EVAL), "
            f"which this user's ACL refuses ({cause}): grant +@scripting (or +evalsha +eval); {why}",
            key=self.key,
        )

    def _owns(self, resent: bool, now: float, fence: object) -> bool:
        """Whether a claim holding this handle's token is this handle's own.

        The token is stored verbatim, so the server cannot tell this handle's
        re-sent claim from another handle given the same token (a worker id).
        The handle can: it is its own when the driver re-sent this very claim,
        or while the lease of a claim this handle took (or sent without learning
        the outcome) has not run out by its own clock, measured from before that
        send, which is never later than the server's expiry. With fencing, a
        counter that moved on since this handle's fence means another owner.

        Not told apart (and so taken as its own): a first send that never reached
        the server, then another handle with this token claiming before the
        re-send arrives, or deleting this handle's live claim (``forget()``, a raw
        ``GOBLIN.CAD``) and claiming within its lease.
        """
        if resent:
            return True
        if self._keep is not None and self._made_token:
            # At most once, a token this handle made holds the claim only if this handle took
            # it: a claim re-sent by the client library itself (a cluster's, a wrapper's), whose
            # first reply was lost, is its own, or nobody would run the work and it would read
            # as interrupted once the lease ended.
            return True
        if now >= self._mine_until:
            return False
        return self._fence is None or type(fence) is not int or fence == self._fence

    def _claimed(
        self, fence: object, acknowledged: int | None, sent_at: float, *, held: bool = False, checkpoint: object = None
    ) -> Claimed:
        # A new claim lives at least lease seconds from before its send; a claim
        # this handle already held keeps the deadline it had.
        if not held or sent_at >= self._mine_until:
            self._mine_until = sent_at + self.lease
        if type(fence) is not int:
            fence = None
        elif fence != self._fence:
            self._fence = fence
        if acknowledged is not None and acknowledged < self._replicas:
            raise self._not_replicated("claim", acknowledged)
        if checkpoint is None:
            return _claimed_outcome({"key": self.key, "token": self.token, "lease": self.lease, "fence": fence})
        # checkpoint.lua's value, in a list of its own: empty when there is none.
        self.last_checkpoint = saved = checkpoint[0] if checkpoint else None  # type: ignore[index]
        fields = {"key": self.key, "token": self.token, "lease": self.lease, "fence": fence, "checkpoint": saved}
        return _claimed_outcome(fields)

    def _claim_unknown(self, sent_at: float) -> None:
        """A claim sent at ``sent_at`` failed without a reply: it may have taken the claim.

        The handle's next claim is then a re-send of this one.
        """
        if sent_at >= self._mine_until:
            self._mine_until = sent_at + self.lease
            self._fence = None

    def _extended(self, sent_at: float, seconds: int) -> None:
        """The lease was renewed by a call sent at ``sent_at``, while this handle held it."""
        if sent_at < self._mine_until:
            self._mine_until = sent_at + seconds

    def _let_go(self) -> None:
        """This handle no longer holds the claim: released, completed, or forgotten."""
        self._mine_until = 0.0
        self._keeper = None

    def ensure_held(self) -> None:
        """Raise ``ClaimLostError`` if this handle's claim is lost by what it knows, with no round trip.

        Call it before a step that must not run once the claim is lost (a charge, an
        email). It goes by the handle's keep-alive when one began (a renewal found the
        claim gone, or none succeeded before the lease ran out, or, when the renewer has
        not run in time, the lease is over by the clock), else by the handle's own clock
        since it took the claim. It reads no server: the claim may still be lost the
        moment after, so keep the step after it short beside the lease.

        A handle that never took the claim, or gave it up (``complete()``,
        ``release()``, ``forget()``), raises; so does a handle made with the token of a
        claim another handle took, which has no lease of its own to go by, unless a
        keep-alive of its own runs (its first renewal tells).

        Raises:
            ClaimLostError: Naming the key, the token and why.
        """
        keeper = self._keeper
        if keeper is not None:
            why = keeper._not_held(self._mine_until)
        elif time.monotonic() < self._mine_until:
            return
        elif self._mine_until:
            why = "the lease it took is over by this handle's own clock"
        else:
            why = (
                "this handle holds no claim of its own (it never took one, it completed, released or forgot it, "
                "or it was made with the token of a claim another handle took)"
            )
        if why is not None:
            raise ClaimLostError(f"token {self.token!r} no longer holds {self.key!r}: {why}", key=self.key)

    def _complete_call(
        self, value: object, encoding: str = "utf-8", text_only: bool = False, wake: str = ""
    ) -> tuple[Script, tuple[str | bytes | int, ...]]:
        """complete.lua and its arguments; with fencing, the counter and this handle's fence too."""
        stored = check_value(value, self.key, text_only=text_only, encoding=encoding)
        marker = DONE_PREFIX + self.token
        if self._checkpoint_key is not None:
            # The checkpoint goes with the store: the next claim after the record starts afresh.
            fence = "" if self._fence is None else self._fence
            keys: tuple[str, ...] = (self.claim_key, self.result_key)
            keys += (self._fence_key, self._checkpoint_key) if self._fence_key else (self._checkpoint_key,)
            args = (*keys, self.token, stored, self.ttl, marker, wake, fence, "wait" if self._replicas else "")
            return keyed(COMPLETE, len(keys) - 2), (*args, "checkpoint")
        if self._fence_key is None:
            args = (self.claim_key, self.result_key, self.token, stored, self.ttl, marker, wake)
            if not self._replicas:
                return self._store_script, args
            # "wait": a refusal writes too, so the WAIT behind it means something (complete.lua).
            return COMPLETE, (*args, "", "wait")
        fence = "" if self._fence is None else self._fence
        keys = (self.claim_key, self.result_key, self._fence_key)
        fenced = (*keys, self.token, stored, self.ttl, marker, wake, fence)
        return COMPLETE_FENCED, (*fenced, "wait") if self._replicas else fenced

    def _completed(self, reply: object, acknowledged: int | None = None) -> None:
        """Check complete.lua's reply.

        Raises:
            ClaimLostError: Another token holds or completed the claim, or this one
                completed it with another value; nothing was written.
            NotReplicatedError: Stored, but too few replicas acknowledged it.
            ServerUnavailableError: With ``replicas``, a refusal from a node whose WAIT
                showed fewer replicas than asked (see ``_unproven``); nothing changed.
        """
        holder = None
        if type(reply) is list:  # {0, what claim_key holds}: another owner's
            holder = holder_name(reply[1]) if len(reply) > 1 else None
            reply = 0
        if self._unproven(reply, acknowledged):
            raise ServerUnavailableError(
                f"cannot complete {self.key!r} yet: the node that answered found the claim of token "
                f"{self.token!r} {_VERDICTS.get(reply, 'not held')}, "
                f"but only {acknowledged} of {self._replicas} "
                f"replicas acknowledged within {self._replica_timeout_ms} ms, so it cannot show that it is the "
                "primary (a node cut off by a partition, or one being deposed, answers from what it had); "
                "nothing changed; send it again, to the primary",
                key=self.key,
            )
        if reply == _UNPROVEN:
            raise ClaimLostError(
                f"cannot complete {self.key!r}: the claim of token {self.token!r} is gone (its lease lapsed, or "
                "it was released or forgotten) and "
                + (
                    "its fence is unknown or the counter expired"
                    if self._fence_key is not None
                    else "without fencing=True nothing shows that nobody claimed the key since"
                )
                + "; nothing was written",
                key=self.key,
            )
        if reply == _COMPLETED_OTHERWISE:
            raise ClaimLostError(
                f"cannot complete {self.key!r}: token {self.token!r} already completed it with another value; "
                "the first value stays",
                key=self.key,
            )
        if reply != _STORED:
            raise self._lost("complete", holder)
        if acknowledged is not None and acknowledged < self._replicas:
            raise self._not_replicated("complete", acknowledged)

    def _unproven(self, reply: object, acknowledged: int | None) -> bool:
        """Whether complete.lua's refusal came from a node that cannot show it leads.

        With ``replicas=N``, only a node that N replicas acknowledge is the primary as
        far as anyone can tell: a primary cut off by a partition (or just deposed)
        still answers, from a data set the new primary has moved past. With a WAIT
        behind it the refusal rewrites what it read (complete.lua), so the WAIT
        counts only replicas that follow this node. Its "gone" or
        "another's" is not evidence that the claim was lost, only that this node
        cannot say; without ``replicas`` no verdict can be checked this way.

        Once the lease this handle took is over by its own clock, the claim is not its
        own any more, whichever node answered: the verdict stands (a renewal's is
        weighed the same way, ``_not_renewed``). A handle that never took the claim
        itself (adopted by token) has no such clock, and the verdict stays unproven.
        """
        if reply == _STORED or acknowledged is None or acknowledged >= self._replicas:
            return False
        return not self._mine_until or time.monotonic() < self._mine_until

    def _not_replicated(self, action: str, acknowledged: int) -> NotReplicatedError:
        held = {
            "claim": "this handle holds the claim",
            "read": "the result was read back (the work is completed)",
        }.get(action, "the result is stored")
        return NotReplicatedError(
            f"{action} of {self.key!r}: {acknowledged} of {self._replicas} replicas acknowledged within "
            f"{self._replica_timeout_ms} ms; {held} on the primary, but a failover now could lose it",
            key=self.key,
            acknowledged=acknowledged,
            replicas=self._replicas,
        )

    def _not_renewed(self, now: float) -> ClaimLostError | ServerUnavailableError:
        """The error for a renewal the server answered "not held" at ``now`` (monotonic).

        A renewal sends no WAIT, so with ``replicas`` its refusal is weighed by this
        handle's own clock instead: while the lease it took has not run out by that
        clock, the claim cannot have lapsed, and the answer came from a node that
        does not have it (a primary cut off by a partition, or one being deposed). It
        is then transient; once the lease is over by that clock, the claim is lost.
        Without ``replicas`` the refusal is taken as it comes.
        """
        if self._replicas and now < self._mine_until:
            return ServerUnavailableError(
                f"cannot renew {self.key!r} here: the node that answered does not hold token {self.token!r}'s "
                f"claim, which this handle took {self.lease} s ago at most, and a renewal has no WAIT to show "
                "that node is the primary; send it again, to the primary",
                key=self.key,
            )
        return self._lost("extend")

    def _extend_lease(self, lease: int | None) -> int:
        return self.lease if lease is None else check_seconds("lease", lease)

    def _lost(self, action: str, holder: str | None = None) -> ClaimLostError:
        held = f"; token {holder!r} holds or completed it" if holder is not None else ""
        return ClaimLostError(
            f"cannot {action} {self.key!r}: token {self.token!r} no longer holds {self.claim_key!r} "
            f"(its lease lapsed and another caller took it, or the work was completed){held}",
            key=self.key,
            holder=holder,
        )

    def _interrupted(self, holder: object, claimed_ms: object) -> InterruptedWorkError:
        """The error for an at-most-once record whose deadline passed without a result."""
        name = holder_name(holder) or ""
        at = datetime.datetime.fromtimestamp(
            (claimed_ms if type(claimed_ms) is int else 0) / 1000, tz=datetime.timezone.utc
        )
        return InterruptedWorkError(
            f"{self.key!r} is at most once, and the attempt of token {name!r} (claimed {at.isoformat()}) ended "
            "without a result: its lease lapsed, so its work may or may not have run. It is not run again; "
            "an operator reopens it (goblin-claim forget, forget()), or the record ends after its ttl",
            key=self.key,
            holder=name,
            claimed_at=at,
        )

    # -- what a unit of work is owed: the scripts of its renewals and releases, checkpoints

    @property
    def _extend_script(self) -> Script:
        """The renewal: an at-most-once record is the extend script's alone (scripts.py)."""
        return EXTEND if self._keep is None else EXTEND_HELD

    @property
    def _release_script(self) -> Script:
        """The owner-checked delete: an at-most-once record is the release script's alone."""
        return RELEASE if self._keep is None else RELEASE_HELD

    def _forget_call(self, wake: str) -> tuple[Script, tuple[str, ...]]:
        """forget.lua and its arguments: on the one-key record, the checkpoint key goes too."""
        if self.claim_key != self.result_key:
            return FORGET, (self.claim_key, self.result_key, wake)
        return keyed(FORGET, 1), (self.claim_key, self.result_key, self.claim_key + CHECKPOINT_SUFFIX, wake)

    def _checkpoint_call(
        self, value: object, encoding: str = "utf-8", text_only: bool = False
    ) -> tuple[Script, tuple[str | bytes | int, ...]]:
        """checkpoint.lua and its arguments, the value checked and bounded."""
        if self._checkpoint_key is None:
            raise InvalidArgumentError(
                f"checkpoint() of {self.key!r} needs a handle made with checkpoints=True: without it the next "
                "owner's claim does not read checkpoints and complete() does not clear them",
                key=self.key,
            )
        stored = check_value(value, self.key, text_only=text_only, encoding=encoding)
        size = len(stored) if type(stored) is bytes else len(cast("str", stored).encode(encoding, "surrogatepass"))
        if size > CHECKPOINT_MAX_BYTES:
            raise InvalidArgumentError(
                f"checkpoint of {self.key!r} is {size} bytes; at most {CHECKPOINT_MAX_BYTES} are kept (keep the "
                "progress itself elsewhere and checkpoint where it is)",
                key=self.key,
            )
        if self._fence_key is None:
            return CHECKPOINT, (self.claim_key, self._checkpoint_key, self.token, stored, self.ttl)
        fence = "" if self._fence is None else self._fence
        keys = (self.claim_key, self._checkpoint_key, self._fence_key)
        return keyed(CHECKPOINT, 1), (*keys, self.token, stored, self.ttl, fence)

    def _wait_schedule(self, timeout: float) -> WaitSchedule:
        return WaitSchedule(timeout, self.key)


def holder_name(holder: object) -> str | None:
    """The token in what claim_key holds, as outcomes and errors name it; ``None`` when it holds nothing.

    A bare token, an at-most-once record's (``held <deadline> <claimed> <token>``) or a
    completed record's (``done <token> <value>``), without the fingerprint ``@idempotent``
    and the HTTP doors add.
    """
    if holder is None or holder is False:
        return None
    raw = holder if type(holder) is bytes else str(holder).encode("utf-8", "surrogatepass")
    done = split_done(raw)
    if done is not None:
        raw = done[0]
    elif raw.startswith(_HELD_PREFIX):
        raw = raw.split(b" ", 3)[-1]
    return split_token(raw)[0].decode("utf-8", "replace")


def _check_flag(name: str, value: object, key: str) -> bool:
    if type(value) is not bool:
        raise InvalidArgumentTypeError(f"{name} must be True or False, not {describe(value)}", key=key)
    return value
