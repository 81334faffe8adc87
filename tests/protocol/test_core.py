"""The pure core: validation, keys, replies, backoff and the wait schedule, with no Redis."""

from __future__ import annotations

import random
from typing import Any

import pytest
from redis.crc import key_slot

from goblin_claim import (
    Claimed,
    ClaimLostError,
    Completed,
    InFlight,
    InvalidArgumentError,
    NativeUnavailableError,
    NotReplicatedError,
    ResultLostError,
)
from goblin_claim._handle import ClaimBase
from goblin_claim._protocol.checks import NativeMode, check_seconds, check_token
from goblin_claim._protocol.record import build_keys
from goblin_claim._protocol.scripts import CLAIM, COMPLETE, NATIVE_COMMANDS, RELEASE, SCRIPTS, Script, native_command
from goblin_claim._protocol.timing import Backoff, WaitSchedule


@pytest.mark.parametrize("good", [1, 30, 86400, 2**31 - 1])
def test_check_seconds_accepts_positive_ints(good: int) -> None:
    """Positive ints up to 2**31-1 pass unchanged."""
    assert check_seconds("lease", good) == good


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (2**31, ValueError), (1.5, TypeError), (True, TypeError),
     ("30", TypeError), (None, TypeError), (30.0, TypeError)],
)  # fmt: skip
def test_check_seconds_refuses_everything_else(bad: object, error: type[Exception]) -> None:
    """0, negatives, floats, bools, strings and None are refused with a message naming the field."""
    with pytest.raises(error, match="lease"):
        check_seconds("lease", bad)


def test_tokens_may_not_contain_whitespace() -> None:
    """A token with a space could equal the 'done' marker, so it is refused."""
    assert check_token("worker-3") == "worker-3"
    with pytest.raises(ValueError, match="whitespace"):
        check_token("done worker-3")


ODD = ["evt88", "{", "}", "{}", "}x{", "%", "%7B", "{evt88}", "a}b{c", "ключ", "x" * 300]


@pytest.mark.parametrize("key", ODD, ids=range(len(ODD)))
def test_keys_share_one_non_empty_hash_tag(key: str) -> None:
    """Claim and result keys start with the namespace and hash to one slot through a non-empty tag."""
    claim_key, result_key = build_keys("goblin", key)
    assert claim_key.startswith("goblin:{")
    assert result_key.startswith("goblin:{")
    tag = claim_key[claim_key.index("{") + 1 : claim_key.index("}", claim_key.index("{"))]
    assert tag
    assert "{" not in tag
    assert key_slot(claim_key.encode()) == key_slot(result_key.encode()) == key_slot(tag.encode())


def test_distinct_keys_get_distinct_redis_keys() -> None:
    """Percent-escaping is injective: keys that differ never share Redis keys."""
    inputs = {*ODD, "%25", "%7D", "%257B", "%%"}
    assert len({build_keys("ns", key)[0] for key in inputs}) == len(inputs)


def test_claim_replies_decode_to_outcomes() -> None:
    """CLAIMED (bytes or str) is Claimed, nil is InFlight; a record is Completed, a bare value on two keys too."""
    handle = ClaimBase(None, "k", token="t", lease=5)
    claimed = Claimed(key="k", token="t", lease=5)
    assert handle._claim_outcome(b"CLAIMED") == (claimed, "t")
    assert handle._claim_outcome("CLAIMED") == (claimed, "t")
    fenced = ClaimBase(None, "k", token="t", lease=5, fencing=True)
    assert fenced._claim_outcome([b"CLAIMED", 7]) == (Claimed(key="k", token="t", lease=5, fence=7), "t")
    # Only a fenced claim wins with a list, of two entries: a holder reading CLAIMED is in flight.
    assert handle._claim_outcome([b"CLAIMED", 7]) == (InFlight(key="k"), b"CLAIMED")
    assert fenced._claim_outcome([b"CLAIMED", 7, 3]) == (InFlight(key="k"), b"CLAIMED")
    assert handle._claim_outcome(None) == (InFlight(key="k"), None)
    # The one key: a record names its writer and holds the value; anything else is a holder's token.
    assert handle._claim_outcome(b"done t ") == (Completed(key="k", value=b""), b"t")
    assert handle._claim_outcome("done other x y") == (Completed(key="k", value="x y"), "other")
    assert handle._claim_outcome(b"other") == (InFlight(key="k"), b"other")
    with pytest.raises(ResultLostError):
        handle._claim_outcome(b"done t")  # a marker without a value: not a record complete() wrote
    # Two keys (from_keys): the result key's value itself.
    two = ClaimBase._with_keys(None, "c", "r", 5, 86400, "t", "auto", 0, 500)
    assert two._claim_outcome(b"") == (Completed(key="c", value=b""), None)
    assert two._claim_outcome("x") == (Completed(key="c", value="x"), None)
    assert two._claim_outcome(b"done t x") == (Completed(key="c", value=b"done t x"), None)


def test_in_flight_replies_name_the_holder() -> None:
    """A list reply names claim_key's holder: another token is InFlight, this one Claimed if its own, a marker lost."""
    handle = ClaimBase(None, "k", token="t", lease=5)
    assert handle._claim_outcome([b"other"]) == (InFlight(key="k"), b"other")
    assert handle._claim_outcome(["other"]) == (InFlight(key="k"), "other")
    assert handle._claim_outcome([]) == (InFlight(key="k"), None)
    assert handle._claim_outcome([None]) == (InFlight(key="k"), None)
    # This token, but no sign that this handle sent it: another handle given the same token.
    assert handle._claim_outcome([b"t", 4000]) == (InFlight(key="k"), b"t")
    # The driver re-sent this very claim: its own.
    assert handle._claim_outcome([b"t", 4000], resent=True) == (Claimed(key="k", token="t", lease=5), b"t")
    # A claim this handle took, its lease running by the handle's clock: its own; past the lease, not.
    assert handle._claim_outcome(b"CLAIMED", sent_at=100.0)[0] == Claimed(key="k", token="t", lease=5)
    assert handle._claim_outcome([b"t", 4000], now=104.9)[0] == Claimed(key="k", token="t", lease=5)
    assert handle._claim_outcome([b"t", 4000], now=105.0)[0] == InFlight(key="k")
    for marker in (b"done t", "done other"):
        with pytest.raises(ResultLostError):
            handle._claim_outcome([marker])


def test_complete_replies() -> None:
    """complete.lua's 1 is success, 0 and 2 are ClaimLostError (2 says another value), WAIT shortfalls raise."""
    handle = ClaimBase(None, "k", token="t", replicas=2)
    handle._completed(1, 2)
    with pytest.raises(ClaimLostError, match="no longer holds"):
        handle._completed(0)
    with pytest.raises(ClaimLostError, match="another value"):
        handle._completed(2)
    with pytest.raises(NotReplicatedError) as info:
        handle._completed(1, 1)
    assert (info.value.acknowledged, info.value.replicas) == (1, 2)


def test_scripts_have_headers_and_hashes() -> None:
    """Every script opens with KEYS/ARGV/returns lines and carries its SHA1."""
    for script in SCRIPTS:
        header = [line for line in script.source.splitlines() if line.startswith("--")]
        assert any(line.startswith("-- KEYS[1]") for line in header), script.name
        assert any(line.startswith("-- ARGV") for line in header), script.name
        assert any(line.startswith("-- returns") for line in header), script.name
        assert len(script.sha) == 40
    assert CLAIM.native == "GOBLIN.CLAIM"


def test_backoff_is_full_jitter_under_a_cap() -> None:
    """Delays stay within [floor, min(cap, first * 2**n)] and vary."""
    backoff = Backoff(first=0.02, cap=0.5, floor=0.005)
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(0.5, 0.02 * 2**attempt)
        delays = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(0.005 <= d <= max(0.005, ceiling) for d in delays)
        assert len(set(delays)) > 100
    assert backoff.delay(10_000, rng) <= 0.5


def test_wait_schedule_respects_the_deadline() -> None:
    """Delays never pass the deadline; after it, next_delay is None and expired() is StillInFlightError."""
    schedule = WaitSchedule(1.0, "k")
    schedule.start(100.0)
    delay = schedule.next_delay(100.9)
    assert delay is not None
    assert delay <= 0.1 + 1e-9
    assert schedule.next_delay(101.0) is None
    assert schedule.expired().key == "k"


def test_wait_schedule_zero_timeout_is_one_attempt() -> None:
    """timeout=0 gives no delay at all: one attempt, then expiry."""
    schedule = WaitSchedule(0, "k")
    schedule.start(5.0)
    assert schedule.next_delay(5.0) is None


@pytest.mark.parametrize(("timeout", "error"), [(-0.1, ValueError), (float("nan"), ValueError), ("1", TypeError)])
def test_wait_schedule_refuses_bad_timeouts(timeout: object, error: type[Exception]) -> None:
    """Negative, NaN and non-numeric timeouts are refused."""
    with pytest.raises(error):
        WaitSchedule(timeout, "k")  # type: ignore[arg-type]


ALL_NATIVE = frozenset(NATIVE_COMMANDS)


@pytest.mark.parametrize(
    ("mode", "available", "script", "expected"),
    [("auto", ALL_NATIVE, CLAIM, "GOBLIN.CLAIM"), ("auto", frozenset(), CLAIM, None), ("auto", None, CLAIM, None),
     ("auto", ALL_NATIVE, COMPLETE, None), ("never", ALL_NATIVE, CLAIM, None),
     ("always", ALL_NATIVE, CLAIM, "GOBLIN.CLAIM"), ("always", ALL_NATIVE, RELEASE, "GOBLIN.CAD"),
     ("always", ALL_NATIVE, COMPLETE, None)],
)  # fmt: skip
def test_native_command_choice(
    mode: NativeMode, available: frozenset[str] | None, script: Script, expected: str | None
) -> None:
    """Each mode picks the native command only where the server has it and the script has one."""
    assert native_command(mode, available, script, "k") == expected


@pytest.mark.parametrize("available", [None, frozenset(), frozenset({"GOBLIN.CLAIM"})])
def test_native_always_without_the_commands_raises(available: frozenset[str] | None) -> None:
    """native="always" on a server missing either command raises, naming what is missing."""
    with pytest.raises(NativeUnavailableError, match=r"GOBLIN\.CAD"):
        native_command("always", available, COMPLETE, "k")


def test_checked_handles_equal_constructed_ones() -> None:
    """_settle alone (the decorator's handle, settings checked once) sets every slot as __init__ does."""
    for kwargs in ({}, {"replicas": 1, "replica_timeout_ms": 250, "native": "never"}):
        made = ClaimBase(None, "evt88", lease=7, ttl=70, namespace="ns", token="t-1", **kwargs)  # type: ignore[arg-type]
        checked = ClaimBase.__new__(ClaimBase)._settle(
            None, "evt88", "ns", "t-1", True, 7, 70, kwargs.get("native", "auto"), False,  # type: ignore[arg-type]
            kwargs.get("replicas", 0), kwargs.get("replica_timeout_ms", 500), False, False,  # type: ignore[arg-type]
        )  # fmt: skip
        for slot in ClaimBase.__slots__:
            if slot != "_made_token":
                assert getattr(checked, slot) == getattr(made, slot), slot
        # The decorator always draws a fresh token for its handle; a token given to the constructor may be shared.
        assert (checked._made_token, made._made_token) == (True, False)


def test_a_doors_handles_equal_constructed_ones() -> None:
    """_settled (a door's handle, its options checked with the door) sets every slot as __init__ does."""
    for kwargs in ({}, {"replicas": 1, "replica_timeout_ms": 250, "at_most_once": True}):
        made = ClaimBase(None, '["POST","/pay",null,"k"]', lease=7, ttl=70, namespace="ns", token="t-1", **kwargs)  # type: ignore[arg-type]
        settled = ClaimBase._settled(
            None, '["POST","/pay",null,"k"]', "ns", "t-1", 7, 70, kwargs.get("replicas", 0),  # type: ignore[arg-type]
            kwargs.get("replica_timeout_ms", 500), kwargs.get("at_most_once", False),  # type: ignore[arg-type]
        )  # fmt: skip
        for slot in ClaimBase.__slots__:
            assert getattr(settled, slot) == getattr(made, slot), slot
    with pytest.raises(InvalidArgumentError):
        ClaimBase._settled(None, "", "ns", "t-1", 7, 70, 0, 500, False)


@pytest.mark.parametrize(
    "options",
    [{}, {"lease": 7, "ttl": 70, "namespace": "ns"}, {"native": "never", "replicas": 1, "replica_timeout_ms": 250},
     {"fencing": True}, {"token": "t-1"}, {"at_most_once": True, "lease": 9}, {"checkpoints": True, "fencing": True},
     {"token": "t-1", "at_most_once": True, "checkpoints": True}],
)  # fmt: skip
def test_a_batchs_handles_equal_constructed_ones(options: dict[str, Any]) -> None:
    """_many (acquire_many's handles, options checked once) sets every slot as __init__ does, each its own token."""
    keys = ["evt88", "évt-89", "a{b}c", "x" * 300]
    many = ClaimBase._many(None, keys, options)
    assert len({handle.token for handle in many}) == (1 if "token" in options else len(keys))
    for key, handle in zip(keys, many, strict=True):
        made = ClaimBase(None, key, **options)  # type: ignore[arg-type]
        for slot in ClaimBase.__slots__:
            if slot != "token" or "token" in options:
                assert getattr(handle, slot) == getattr(made, slot), (key, slot)


@pytest.mark.parametrize("bad", ["", 5, "\ud800", None])
@pytest.mark.parametrize("at", [0, 2])
def test_a_bad_key_anywhere_in_a_batch_is_refused_as_the_constructor_refuses_it(bad: Any, at: int) -> None:
    """A bad key first or later in the batch raises what ``Claim(client, bad)`` raises."""
    keys: list[Any] = ["a", "b", "c"]
    keys.insert(at, bad)
    with pytest.raises((TypeError, ValueError)) as constructed:  # the SDK's errors are both
        ClaimBase(None, bad)  # type: ignore[arg-type]
    with pytest.raises(type(constructed.value)):
        ClaimBase._many(None, keys, {})
