"""@idempotent on every backend, for def and async def.

Results and their types, keys, fingerprints, failure policy, waiting and lease renewal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import hashlib
import inspect
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from decimal import Decimal
from typing import Any, Optional, Union

import pydantic
import pytest
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from goblin_claim import (
    ClaimLostError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PayloadMismatchError,
    ReplayedError,
    ResultNotSerializableError,
    StillInFlightError,
    UnreadableResultError,
    idempotent,
)
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import ALL_BACKENDS, Backend, Deco, in_thread, record, unique, until, until_async

# Also on redis-server with the reference module loaded (the SDK takes the native path).
BACKENDS = ALL_BACKENDS


class Receipt(pydantic.BaseModel):
    """A pydantic result."""

    txn: str
    amount: Decimal
    at: datetime.datetime


@dataclasses.dataclass
class Point:
    """A dataclass result."""

    x: int
    y: int


class Movie(TypedDict):
    """A TypedDict result."""

    title: str
    year: int


class CardDeclined(Exception):
    """A business error worth replaying."""

    def __init__(self, code: str) -> None:
        super().__init__(f"card declined: {code}")
        self.code = code


def counter() -> tuple[list[Any], Callable[[Any], None]]:
    """A list of calls and a function recording one."""
    calls: list[Any] = []
    return calls, calls.append


# --------------------------------------------------------------------------- results and types


def test_first_call_runs_duplicates_replay(deco: Deco) -> None:
    """The first call runs the function; duplicates get an equal result without running it."""
    calls, record = counter()

    def charge(order_id: str, amount: int) -> dict[str, Any]:
        record(order_id)
        return {"order": order_id, "amount": amount}

    wrapped = deco(charge, key="order_id")
    first = wrapped("o-1", 5)
    assert [wrapped("o-1", 5) for _ in range(3)] == [first] * 3
    assert calls == ["o-1"]
    assert wrapped("o-2", 5) == {"order": "o-2", "amount": 5}
    assert calls == ["o-1", "o-2"]


def test_none_result_is_replayed_not_in_flight(deco: Deco) -> None:
    """A function returning None completes: duplicates get None at once instead of waiting."""
    calls, record = counter()

    def notify(event: str) -> None:
        record(event)

    wrapped = deco(notify, key="event", wait=0)
    assert wrapped("e") is None
    assert wrapped("e") is None
    assert calls == ["e"]


# Encoding and the round-trip check run in the caller's process before anything is written: the
# value matrices need one fake, one server and one cluster, not every tier (each tier's own
# store and replay of a record is the rest of this file's).
CODEC_BACKENDS = ("fake", "standalone", "cluster")

NOW = datetime.datetime(2026, 11, 29, 12, 30, tzinfo=datetime.timezone.utc)
TYPED_RESULTS: list[tuple[Any, Any]] = [
    (Receipt, Receipt(txn="txn_551", amount=Decimal("12.50"), at=NOW)),
    (Point, Point(1, 2)),
    (Movie, Movie(title="Brazil", year=1985)),
    (dict[str, int], {"a": 1}),
    (list[int], [1, 2, 3]),
    (int, 7),
    (float, 0.1),
    (str, "héllo"),
    (bool, False),
    (type(None), None),
    (datetime.datetime, NOW),
    (datetime.date, NOW.date()),
    (Decimal, Decimal("3.14159")),
    (uuid.UUID, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    (Optional[int], None),  # noqa: UP045 -- the Optional spelling is the point here
    (Optional[int], 5),  # noqa: UP045
    (Union[int, str], "x"),  # noqa: UP007
    (list[Receipt], [Receipt(txn="a", amount=Decimal(1), at=NOW)]),
]


@pytest.mark.parametrize("backend", CODEC_BACKENDS, indirect=True)
@pytest.mark.parametrize(("annotation", "value"), TYPED_RESULTS, ids=[repr(v)[:30] for _, v in TYPED_RESULTS])
def test_typed_results_round_trip(deco: Deco, annotation: Any, value: Any) -> None:
    """Every supported return type comes back equal (and of the same type) to duplicates."""

    def work(k: str) -> Any:
        return value

    work.__annotations__ = {"k": str, "return": annotation}
    wrapped = deco(work, key="k")
    assert wrapped("k") == value
    replayed = wrapped("k")
    assert replayed == value
    assert type(replayed) is type(value)


def test_unserializable_result_fails_closed(deco: Deco) -> None:
    """A result pydantic cannot store: the first caller gets it in .result, duplicates an error, nothing re-runs."""
    calls, record = counter()
    namespace = unique("ns")
    made = object()

    def work(k: str) -> Any:
        record(k)
        return made

    wrapped = deco(work, key="k", namespace=namespace)
    with pytest.raises(ResultNotSerializableError) as first:
        wrapped("k")
    assert first.value.result is made
    assert deco.raw.ttl(f"{namespace}:{{k}}") > 0  # the outcome is kept, as a record, for the ttl
    with pytest.raises(ResultNotSerializableError, match="could not be kept") as duplicate:
        wrapped("k")
    assert duplicate.value.result is None
    assert calls == ["k"]
    assert wrapped.forget("k") is True  # an operator reopens it: the next call runs again
    with pytest.raises(ResultNotSerializableError):
        wrapped("k")
    assert calls == ["k", "k"]


@pytest.mark.parametrize("backend", CODEC_BACKENDS, indirect=True)
@pytest.mark.parametrize(
    ("annotation", "value"),
    [(int, "not an int"), (Any, datetime.datetime(2026, 11, 30)), (Any, Decimal("1.5")), (Any, (1, 2)),
     (Any, {1: "a"}), (Any, Point(1, 2)), (float, 3), (bytes, "text"),
     # Annotations of Any all the way down are serialized without warnings="error":
     # the round trip alone must refuse what would come back different.
     (dict[str, Any], [1]), (dict[str, Any], {1: "x"}), (dict[str, Any], {"a": (1, 2)}),
     (dict[str, Any], {"a": {1: 2}}), (dict[str, Any], "text"), (list[Any], [1, (2, 3)]),
     (dict, {"a": float("nan")}), (list, [datetime.date(2026, 11, 30)])],
    ids=["str-for-int", "any-datetime", "any-decimal", "any-tuple", "any-int-keys", "any-dataclass", "int-for-float",
         "str-for-bytes", "dict-any-given-list", "dict-any-int-keys", "dict-any-tuple-inside",
         "dict-any-int-keys-inside", "dict-any-given-str", "list-any-tuple-inside", "dict-nan", "list-date"],
)  # fmt: skip
def test_results_that_would_replay_differently_fail_closed(deco: Deco, annotation: Any, value: Any) -> None:
    """A result that would come back unequal or of another type is not stored as a value; the work is not re-run."""
    calls, record = counter()

    def work(k: str) -> Any:
        record(k)
        return value

    work.__annotations__["return"] = annotation
    wrapped = deco(work, key="k")
    with pytest.raises(ResultNotSerializableError) as info:
        wrapped("k")
    assert info.value.result == value
    with pytest.raises(ResultNotSerializableError):
        wrapped("k")
    assert calls == ["k"]


@pytest.mark.parametrize("value", [b"", b"\x00\xff\xfe binary", bytes(range(256))])
def test_bytes_results_round_trip_exactly(deco: Deco, value: bytes) -> None:
    """-> bytes results, UTF-8 or not, come back as the same bytes."""

    def work(k: str) -> bytes:
        return value

    wrapped = deco(work, key="k")
    assert wrapped("k") == value
    replay = wrapped("k")
    assert replay == value
    assert type(replay) is bytes


def test_foreign_value_at_result_key_is_a_clear_error(deco: Deco) -> None:
    """A record whose value someone else wrote raises UnreadableResultError, never crashes, and is left as it is."""
    namespace = unique("ns")
    deco.raw.set(f"{namespace}:{{k}}", record("someone", "plain text"), ex=30)
    calls, note = counter()

    def work(k: str) -> str:
        note(k)
        return "mine"

    with pytest.raises(UnreadableResultError):
        deco(work, key="k", namespace=namespace)("k")
    assert calls == []
    assert deco.raw.get(f"{namespace}:{{k}}") == record("someone", "plain text")


# --------------------------------------------------------------------------- keys and namespaces


def test_key_callable_receives_the_arguments(deco: Deco) -> None:
    """key= as a function of the arguments picks the idempotency key."""
    calls, record = counter()

    def work(user: str, request_id: str) -> str:
        record(request_id)
        return f"{user}:{request_id}"

    wrapped = deco(work, key=lambda user, request_id: f"{user}/{request_id}")
    assert wrapped("ann", "r1") == "ann:r1"
    assert wrapped(user="ann", request_id="r1") == "ann:r1"
    assert calls == ["r1"]


def test_integer_key_parameter_is_accepted(deco: Deco) -> None:
    """key= naming an int parameter uses its decimal form."""
    calls, record = counter()

    def work(order_id: int) -> int:
        record(order_id)
        return order_id * 2

    wrapped = deco(work, key="order_id")
    assert wrapped(21) == wrapped(21) == 42
    assert calls == [21]


@pytest.mark.parametrize("bad", ["", None, 3.5])
def test_bad_key_values_are_refused_before_io(deco: Deco, bad: Any) -> None:
    """A key function returning an empty or non-str key raises before anything runs."""
    calls, record = counter()

    def work(k: Any) -> None:
        record(k)

    with pytest.raises((ValueError, TypeError)):
        deco(work, key=lambda k: bad)("x")
    assert calls == []


def test_default_namespace_is_module_and_qualname(backend: Backend) -> None:
    """Without namespace=, keys start with the function's module and qualified name."""
    client = backend.sync()

    def work(k: str) -> str:
        return k

    idempotent(client, key="k")(work)("abc")
    prefix = f"{work.__module__}.{work.__qualname__}:"
    assert client.get(prefix + "{abc}") is not None


# --------------------------------------------------------------------------- fingerprints


def test_mismatch_after_completion(deco: Deco) -> None:
    """The same key with different arguments after completion raises PayloadMismatchError."""

    def charge(order_id: str, amount: int) -> int:
        return amount

    wrapped = deco(charge, key="order_id")
    assert wrapped("o", 5) == 5
    with pytest.raises(PayloadMismatchError) as info:
        wrapped("o", 6)
    assert info.value.key == "o"
    assert wrapped("o", 5) == 5


def test_the_record_carries_the_fingerprint_in_its_token(deco: Deco) -> None:
    """The record is ``done <token>.<fingerprint> <envelope>``; the envelope names neither kind nor fp."""

    def charge(order_id: str, amount: int) -> int:
        return amount

    assert deco(charge, key="order_id")("o", 5) == 5
    marker, token, envelope = deco.raw.get(f"{deco.namespace}:{{o}}").split(b" ", 2)
    assert marker == b"done"
    assert re.fullmatch(rb"[A-Za-z0-9_-]{16}-[0-9a-f]+\.[0-9a-f]{16}", token)
    assert json.loads(envelope) == {"goblin": 1, "value": 5}


def test_mismatch_after_a_wait_is_read_from_the_record(deco: Deco) -> None:
    """A duplicate that waited and then finds the record of other arguments raises PayloadMismatchError."""
    calls, record_call = counter()

    def charge(order_id: str, amount: int) -> int:
        record_call(amount)
        return amount

    wrapped = deco(charge, key="order_id", wait=10)
    assert wrapped("o", 5) == 5
    key = f"{deco.namespace}:{{o}}"
    first = deco.raw.get(key)
    for amount in (6, 5):
        # In flight under a token that carries no fingerprint: only the record can tell.
        deco.raw.set(key, "a-holder", ex=30)
        timer = threading.Timer(0.3, deco.raw.set, (key, first), {"ex": 600})
        started = time.monotonic()
        timer.start()
        try:
            if amount == 6:
                with pytest.raises(PayloadMismatchError):
                    wrapped("o", amount)
            else:
                assert wrapped("o", amount) == 5
        finally:
            timer.join()
        assert time.monotonic() - started >= 0.25  # it waited: the record came after the claim's reply
    assert calls == [5]


def test_an_envelope_of_the_previous_format_is_still_read(deco: Deco) -> None:
    """Envelopes naming their kind and the previous 32-digit fp replay to the same arguments, refuse others."""
    calls, record_call = counter()

    def charge(order_id: str, amount: int) -> int:
        record_call(amount)
        return amount

    wrapped = deco(
        charge, key="order_id", fingerprint=lambda order_id, amount: str(amount), replay_errors=(CardDeclined,)
    )
    earlier_fp = hashlib.sha256(b"5").hexdigest()[:32]  # what the previous format stored for amount=5
    result = {"goblin": 1, "kind": "result", "fp": earlier_fp, "value": 5}
    error = {"goblin": 1, "kind": "error", "fp": earlier_fp, "error": {"type": "shop.CardDeclined", "message": "no"}}
    deco.raw.set(f"{deco.namespace}:{{r}}", record("an-earlier-owner", json.dumps(result)), ex=600)
    deco.raw.set(f"{deco.namespace}:{{e}}", record("an-earlier-owner", json.dumps(error)), ex=600)
    assert wrapped("r", 5) == 5
    with pytest.raises(ReplayedError) as replayed:
        wrapped("e", 5)
    assert (replayed.value.type_name, replayed.value.message) == ("shop.CardDeclined", "no")
    for order_id in ("r", "e"):
        with pytest.raises(PayloadMismatchError):
            wrapped(order_id, 6)
    assert calls == []


def test_fingerprint_none_and_custom(deco: Deco) -> None:
    """fingerprint=None never compares; a custom fingerprint compares only what it returns."""

    def charge(order_id: str, amount: int, trace: str = "") -> int:
        return amount

    loose = deco(charge, key="order_id", fingerprint=None)
    assert loose("o", 5) == 5
    assert loose("o", 6) == 5
    by_amount = deco(charge, key="order_id", fingerprint=lambda order_id, amount, trace="": str(amount))
    assert by_amount("p", 5, trace="t1") == 5
    assert by_amount("p", 5, trace="t2") == 5
    with pytest.raises(PayloadMismatchError):
        by_amount("p", 7)


def test_set_arguments_fingerprint_stably(deco: Deco) -> None:
    """Equal sets and dicts in another order count as the same arguments."""

    def tag(k: str, tags: set[str], meta: dict[str, int]) -> int:
        return len(tags)

    wrapped = deco(tag, key="k")
    assert wrapped("k", {"a", "b", "c"}, {"x": 1, "y": 2}) == 3
    assert wrapped("k", {"c", "b", "a"}, {"y": 2, "x": 1}) == 3


def test_unfingerprintable_arguments_are_a_clear_error(deco: Deco) -> None:
    """Arguments that cannot be turned into JSON ask for fingerprint=, before anything runs."""

    def work(k: str, thing: object) -> None:
        return None

    with pytest.raises(TypeError, match="fingerprint"):
        deco(work, key="k")("k", object())


# --------------------------------------------------------------------------- failures


def test_exception_releases_so_a_retry_runs_at_once(deco: Deco) -> None:
    """By default an exception releases the claim and re-raises; the next call runs again."""
    calls, record = counter()

    def flaky(k: str) -> str:
        record(k)
        if len(calls) == 1:
            raise RuntimeError("provider down")
        return "ok"

    wrapped = deco(flaky, key="k", wait=0)
    with pytest.raises(RuntimeError, match="provider down"):
        wrapped("k")
    assert wrapped("k") == "ok"
    assert wrapped("k") == "ok"
    assert calls == ["k", "k"]


def test_replayed_errors_are_stored_as_data(deco: Deco) -> None:
    """An exception listed in replay_errors is stored; duplicates get ReplayedError carrying it."""
    calls, record = counter()

    def charge(k: str) -> str:
        record(k)
        raise CardDeclined("insufficient_funds")

    wrapped = deco(charge, key="k", replay_errors=(CardDeclined,))
    with pytest.raises(CardDeclined):
        wrapped("k")
    with pytest.raises(ReplayedError) as info:
        wrapped("k")
    assert calls == ["k"]
    assert info.value.type_name == f"{__name__}.CardDeclined"
    assert info.value.message == "card declined: insufficient_funds"
    assert info.value.fields == {"code": "insufficient_funds"}


# --------------------------------------------------------------------------- decoration-time checks


def test_sync_async_mismatch_is_a_type_error_at_decoration() -> None:
    """A coroutine function with a sync client, or a def with an asyncio client, fails at decoration."""

    async def async_work(k: str) -> None:
        return None

    def sync_work(k: str) -> None:
        return None

    with pytest.raises(TypeError, match=r"asyncio client .*redis\.asyncio\.Redis"):
        idempotent(fake_redis(native=False), key="k")(async_work)
    with pytest.raises(TypeError, match="async def"):
        idempotent(fake_async_redis(native=False), key="k")(sync_work)


def test_generators_are_refused_at_decoration() -> None:
    """A generator or async generator function is refused with a message that fits each."""

    def numbers(k: str) -> Iterator[int]:
        yield 1

    async def async_numbers(k: str) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(InvalidArgumentTypeError, match=r"generator .*a def that returns a list"):
        idempotent(fake_redis(native=False), key="k")(numbers)
    with pytest.raises(InvalidArgumentTypeError, match=r"async generator .*an async def that returns a list"):
        idempotent(fake_async_redis(native=False), key="k")(async_numbers)


def test_iterator_annotations_are_refused_at_decoration() -> None:
    """A def annotated to return an iterator cannot replay it: refused when decorating."""

    def lazy(k: str) -> Iterator[int]:
        return iter([1])

    with pytest.raises(InvalidArgumentTypeError, match="cannot be replayed"):
        idempotent(fake_redis(native=False), key="k")(lazy)


def test_partials_and_callable_objects_can_be_decorated(backend: Backend) -> None:
    """functools.partial objects and callable instances work with namespace=; without it, a clear error."""
    calls: list[str] = []

    def charge(currency: str, order_id: str) -> str:
        calls.append(order_id)
        return f"{order_id} in {currency}"

    class Charger:
        def __call__(self, order_id: str) -> str:
            calls.append(order_id)
            return f"{order_id} charged"

    client = backend.sync()
    in_euros = idempotent(client, key="order_id", namespace=unique("ns"))(functools.partial(charge, "EUR"))
    assert in_euros("o1") == in_euros("o1") == "o1 in EUR"
    charger = idempotent(client, key="order_id", namespace=unique("ns"))(Charger())
    assert charger("o2") == charger("o2") == "o2 charged"
    assert calls == ["o1", "o2"]
    with pytest.raises(InvalidArgumentError, match="namespace="):
        idempotent(fake_redis(native=False), key="order_id")(functools.partial(charge, "EUR"))


def test_async_callable_objects_and_partials_are_async() -> None:
    """A partial of an async def, or an object with an async __call__, needs an asyncio client."""

    async def charge(currency: str, order_id: str) -> str:
        return order_id

    class Charger:
        async def __call__(self, order_id: str) -> str:
            return order_id

    for func in (functools.partial(charge, "EUR"), Charger()):
        with pytest.raises(InvalidArgumentTypeError, match="asyncio client"):
            idempotent(fake_redis(native=False), key="order_id", namespace="ns")(func)
        decorated = idempotent(fake_async_redis(native=False), key="order_id", namespace="ns")(func)
        assert asyncio.run(decorated(order_id="o1")) == "o1"


def test_client_factory_is_resolved_on_the_first_call(backend: Backend) -> None:
    """A zero-argument callable gives the client on the first call, once; a wrong kind fails there."""
    made: list[Any] = []

    def factory() -> Any:
        made.append(backend.sync())
        return made[-1]

    @idempotent(factory, key="k", namespace=unique("ns"))
    def work(k: str) -> str:
        return k.upper()

    assert made == []  # nothing made at import time
    assert work("a") == work("a") == "A"
    assert len(made) == 1

    @idempotent(lambda: fake_async_redis(native=False), key="k", namespace=unique("ns"))
    def wrong_kind(k: str) -> str:
        return k

    with pytest.raises(InvalidArgumentTypeError, match="sync client"):
        wrong_kind("a")


def test_async_client_factory(backend: Backend) -> None:
    """An async def with a factory of asyncio clients, made inside the running loop."""

    async def scenario() -> None:
        clients: list[Any] = []

        def factory() -> Any:
            clients.append(backend.async_())
            return clients[-1]

        calls: list[str] = []

        @idempotent(factory, key="k", namespace=unique("ns"))
        async def work(k: str) -> str:
            calls.append(k)
            return k.upper()

        assert await work("a") == await work("a") == "A"
        assert await work.forget("a") is True
        assert await work("a") == "A"
        assert calls == ["a", "a"]
        await clients[0].aclose()

    asyncio.run(scenario())


def test_forget_reopens_the_key_of_these_arguments(deco: Deco) -> None:
    """decorated.forget(*args) deletes that key's claim and result; the next call runs again."""
    calls: list[str] = []

    def charge(order_id: str, amount: int) -> str:
        calls.append(order_id)
        return f"{order_id}:{amount}"

    wrapped = deco(charge, key="order_id")
    assert wrapped("o1", 5) == "o1:5"
    assert wrapped.forget("o2", 5) is False
    assert wrapped.forget("o1", 5) is True
    assert wrapped("o1", 6) == "o1:6"  # a new first call: no mismatch with the forgotten one
    assert calls == ["o1", "o1"]


@pytest.mark.parametrize(
    "options",
    [{"key": "missing"}, {"key": 5}, {"key": "k", "lease": 0}, {"key": "k", "ttl": "30"}, {"key": "k", "wait": -1},
     {"key": "k", "namespace": "a{b"}, {"key": "k", "replay_errors": ValueError}, {"key": "k", "native": "x"}],
    ids=str,
)  # fmt: skip
def test_bad_options_fail_at_decoration(options: dict[str, Any]) -> None:
    """Unknown parameters, bad leases, waits, namespaces and error lists fail when decorating."""

    def work(k: str) -> None:
        return None

    with pytest.raises((TypeError, ValueError)):
        idempotent(fake_redis(native=False), **options)(work)


def test_decorated_function_keeps_its_signature() -> None:
    """functools.wraps keeps the name, docstring and signature for tools and type checkers."""

    def charge(order_id: str, amount: int) -> int:
        """Charge a card."""
        return amount

    wrapped = idempotent(fake_redis(native=False), key="order_id")(charge)
    assert wrapped.__name__ == "charge"
    assert wrapped.__doc__ == "Charge a card."
    assert inspect.signature(wrapped) == inspect.signature(charge)


# --------------------------------------------------------------------------- in flight (threads / tasks)


def test_in_flight_duplicate_waits_and_gets_the_result(backend: Backend) -> None:
    """While the first call runs, a duplicate waits and gets its result; wait=0 raises at once."""
    client = backend.sync()
    started, release = threading.Event(), threading.Event()
    calls, record = counter()

    def slow(k: str) -> str:
        record(k)
        started.set()
        release.wait(10)
        return "slow-result"

    namespace = unique("ns")
    wrapped = idempotent(client, key="k", namespace=namespace, wait=10)(slow)
    impatient = idempotent(client, key="k", namespace=namespace, wait=0)(slow)
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(wrapped("k")))
    first.start()
    assert started.wait(10)
    with pytest.raises(StillInFlightError):
        impatient("k")
    second = threading.Thread(target=lambda: results.append(wrapped("k")))
    second.start()
    time.sleep(0.2)
    release.set()
    first.join()
    second.join()
    assert results == ["slow-result", "slow-result"]
    assert calls == ["k"]


def test_in_flight_mismatch_is_detected(backend: Backend) -> None:
    """A duplicate with different arguments while the first call runs raises PayloadMismatchError."""
    client = backend.sync()
    started, release = threading.Event(), threading.Event()

    def slow(k: str, amount: int) -> int:
        started.set()
        release.wait(10)
        return amount

    wrapped = idempotent(client, key="k", namespace=unique("ns"), wait=5)(slow)
    thread = threading.Thread(target=wrapped, args=("k", 1))
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(PayloadMismatchError):
            wrapped("k", 2)
    finally:
        release.set()
        thread.join()


def test_async_cancellation_releases_the_claim(backend: Backend) -> None:
    """A cancelled async call gives its claim back, so the next call runs at once."""

    async def scenario() -> list[str]:
        client = backend.async_()
        calls: list[str] = []
        started = asyncio.Event()

        async def work(k: str) -> str:
            calls.append(k)
            started.set()
            await asyncio.sleep(30 if len(calls) == 1 else 0)
            return "second"

        wrapped = idempotent(client, key="k", namespace=unique("ns"), wait=0)(work)
        task = asyncio.create_task(wrapped("k"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wrapped("k") == "second"
        await client.aclose()
        return calls

    assert asyncio.run(scenario()) == ["k", "k"]


def test_async_in_flight_duplicates_wait(backend: Backend) -> None:
    """Async duplicates arriving while the first call runs all get its result; it runs once."""

    async def scenario() -> tuple[list[str], list[str]]:
        client = backend.async_()
        calls: list[str] = []

        async def work(k: str) -> str:
            calls.append(k)
            await asyncio.sleep(0.3)
            return f"done:{k}"

        wrapped = idempotent(client, key="k", namespace=unique("ns"), wait=10)(work)
        results = await asyncio.gather(*(wrapped("k") for _ in range(20)))
        await client.aclose()
        return calls, list(results)

    calls, results = asyncio.run(scenario())
    assert calls == ["k"]
    assert results == ["done:k"] * 20


# --------------------------------------------------------------------------- leases


def test_keep_alive_carries_work_longer_than_the_lease(backend: Backend) -> None:
    """Work lasting four leases runs once while duplicates wait, thanks to renewal."""
    client = backend.sync()
    calls, record = counter()
    started = threading.Event()

    def long_work(k: str) -> str:
        record(k)
        started.set()
        time.sleep(4)
        return "long"

    wrapped = idempotent(client, key="k", namespace=unique("ns"), lease=1, wait=10)(long_work)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(wrapped("k")))]
    threads[0].start()
    assert started.wait(10)
    threads += [threading.Thread(target=lambda: results.append(wrapped("k"))) for _ in range(3)]
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["k"]
    assert results == ["long"] * 4


def test_without_keep_alive_the_stale_owner_loses(backend: Backend) -> None:
    """Renewal off: a waiter takes over after the lease; the stale owner gets ClaimLostError with its result."""
    client = backend.sync()
    calls, record = counter()
    started = threading.Event()

    def long_work(k: str) -> str:
        record(k)
        run = len(calls)
        started.set()
        time.sleep(3 if run == 1 else 0)
        return f"run-{run}"

    namespace = unique("ns")
    wrapped = idempotent(client, key="k", namespace=namespace, lease=1, wait=10, keep_alive=False)(long_work)
    errors: list[ClaimLostError] = []
    thread = in_thread(lambda: wrapped("k"), errors)
    assert started.wait(10)
    assert wrapped("k") == "run-2"  # waited past the lease, took over, ran
    thread.join()
    assert len(errors) == 1
    assert errors[0].result == "run-1"
    assert wrapped("k") == "run-2"  # the stale result overwrote nothing
    assert calls == ["k", "k"]


def test_keep_alive_marks_a_lost_claim(driver_kind: str, backend: Backend) -> None:
    """A renewal that finds the claim taken over stops, sets lost, and complete() then raises and writes nothing."""
    from goblin_claim import AsyncClaim, Claim

    if driver_kind == "sync":
        client = backend.sync()
        claim = Claim(client, unique(), lease=3)
        claim.acquire()
        with claim.keep_alive(interval=0.2) as keeper:
            client.set(claim.claim_key, "other-owner", ex=30)  # as if the lease had lapsed and been taken
            deadline = time.monotonic() + 10  # a renewal is due every 0.2 s; a loaded machine may take longer
            while not keeper.lost and time.monotonic() < deadline:
                time.sleep(0.02)
        assert keeper.lost
        with pytest.raises(ClaimLostError):
            claim.complete(b"late")
        assert client.get(claim.claim_key) == b"other-owner"  # owner-checked: no record written over it
        return

    async def scenario() -> None:
        client = backend.async_()
        claim = AsyncClaim(client, unique(), lease=3)
        await claim.acquire()
        async with claim.keep_alive(interval=0.2) as keeper:
            await client.set(claim.claim_key, "other-owner", ex=30)
            deadline = time.monotonic() + 10
            while not keeper.lost and time.monotonic() < deadline:  # noqa: ASYNC110 -- polls a flag the renewer sets; there is no event to wait for
                await asyncio.sleep(0.02)
        assert keeper.lost
        with pytest.raises(ClaimLostError):
            await claim.complete(b"late")
        assert await client.get(claim.claim_key) == b"other-owner"
        await client.aclose()

    asyncio.run(scenario())


def test_keep_alive_renews(driver_kind: str, backend: Backend) -> None:
    """The keep-alive renews every third of the lease (never sooner) and leaves the claim held.

    It waits on the renewals themselves rather than a window: a loaded machine may
    make them late, never early. A three-second lease leaves two seconds of slack.
    """
    from goblin_claim import AsyncClaim, Claim

    if driver_kind == "sync":
        client = backend.sync()
        claim = Claim(client, unique(), lease=3)
        began = time.monotonic()
        claim.acquire()
        with claim.keep_alive() as keeper:
            assert until(lambda: keeper.renewals >= 3 or keeper.lost, 30)
            took = time.monotonic() - began
        assert not keeper.lost
        assert took >= 2.9  # three renewals a second apart
        assert client.get(claim.claim_key) == claim.token.encode()
        return

    async def scenario() -> None:
        client = backend.async_()
        try:
            claim = AsyncClaim(client, unique(), lease=3)
            began = time.monotonic()
            await claim.acquire()
            async with claim.keep_alive() as keeper:
                assert await until_async(lambda: keeper.renewals >= 3 or keeper.lost, 30)
                took = time.monotonic() - began
            assert not keeper.lost
            assert took >= 2.9
            assert await client.get(claim.claim_key) == claim.token.encode()
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_many_sync_keep_alives_share_one_renewer_thread(backend: Backend) -> None:
    """Fifty claims kept alive at once, from fifty threads, are renewed by one renewer thread."""
    from goblin_claim import Claim

    client = backend.sync()
    claims = [Claim(client, unique(), lease=3) for _ in range(50)]
    for claim in claims:
        claim.acquire()
    keepers: list[Any] = []
    inside = threading.Barrier(51)

    def hold(claim: Claim) -> None:
        with claim.keep_alive() as keeper:
            keepers.append(keeper)
            inside.wait()
            inside.wait()

    threads = [threading.Thread(target=hold, args=(claim,)) for claim in claims]
    for thread in threads:
        thread.start()
    inside.wait()
    assert until(lambda: all(keeper.renewals >= 2 or keeper.lost for keeper in keepers), 30)
    renewers = [t for t in threading.enumerate() if t.name == "goblin-claim renewer"]
    inside.wait()
    for thread in threads:
        thread.join()
    assert len(renewers) == 1
    assert all(keeper.renewals >= 2 and not keeper.lost for keeper in keepers)
    assert all(client.get(claim.claim_key) == claim.token.encode() for claim in claims)


def test_async_keep_alives_start_no_task_until_a_renewal_is_due(backend: Backend) -> None:
    """Entering and leaving an async keep-alive schedules a timer, not a task; renewals still happen."""
    from goblin_claim import AsyncClaim

    async def scenario() -> None:
        client = backend.async_()
        claim = AsyncClaim(client, unique(), lease=3)
        await claim.acquire()
        before = len(asyncio.all_tasks())
        async with claim.keep_alive() as keeper:
            assert len(asyncio.all_tasks()) == before
            assert await until_async(lambda: keeper.renewals >= 1, 30)
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == before
        await client.aclose()

    asyncio.run(scenario())


def test_duplicates_leave_nothing_with_the_renewer(backend: Backend) -> None:
    """A duplicate starts no keep-alive: the renewer never holds one of this function's claims."""
    from goblin_claim._drivers.keepalive import _Renewer, _renewer

    added: list[str] = []
    real_add = _Renewer.add

    def counting_add(renewer: _Renewer, keeper: Any) -> None:
        added.append(keeper._claim.claim_key)
        real_add(renewer, keeper)

    client = backend.sync()
    calls: list[str] = []
    namespace = unique("dups")

    @idempotent(client, key=lambda k: k, namespace=namespace, lease=3)
    def work(k: str) -> str:
        calls.append(k)
        return "v"

    assert work("a") == "v"  # the first call: its keep-alive comes and goes
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Renewer, "add", counting_add)
        for _ in range(50):
            assert work("a") == "v"
    assert calls == ["a"]
    assert [key for key in added if key.startswith(f"{namespace}:")] == []
    # Other tests' keep-alives may come and go meanwhile: look for this function's only.
    assert [k for k in list(_renewer()._live.values()) if k._claim.claim_key.startswith(f"{namespace}:")] == []


class RenewerDown(RuntimeError):
    """What a keep-alive that cannot start raises here (as a thread that cannot start would)."""


def test_a_keep_alive_that_cannot_start_stores_nothing_and_gives_the_claim_back(
    driver_kind: str, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keep-alive that fails to start after the claim stores nothing and releases the claim.

    The function never ran, so even an error of a type in ``replay_errors`` is not
    stored as its outcome; the next call runs the function, once.
    """
    from goblin_claim._drivers.keepalive import AsyncKeepAlive, _Renewer

    def refuse(*_: object) -> None:
        raise RenewerDown("cannot start renewing")

    if driver_kind == "sync":
        monkeypatch.setattr(_Renewer, "add", refuse)
    else:
        monkeypatch.setattr(AsyncKeepAlive, "_begin", refuse)
    runs: list[str] = []
    namespace = unique("keeper-down")
    options: dict[str, Any] = {"key": "k", "namespace": namespace, "replay_errors": (RuntimeError,)}

    def body(k: str) -> str:
        runs.append(k)
        return f"done {k}"

    if driver_kind == "sync":
        client = backend.sync()
        work = idempotent(client, **options)(body)
        with pytest.raises(RenewerDown):
            work("a")
        assert runs == []
        assert client.exists(f"{namespace}:{{a}}") == 0
        monkeypatch.undo()
        assert [work("a"), work("a")] == ["done a", "done a"]
        assert runs == ["a"]
        return

    async def async_body(k: str) -> str:
        return body(k)

    async def scenario() -> None:
        client = backend.async_()
        async_work = idempotent(client, **options)(async_body)
        results: list[Any] = []

        async def attempt() -> None:
            results.append(await async_work("a"))

        with pytest.raises(RenewerDown):
            await attempt()
        assert runs == []
        assert await client.exists(f"{namespace}:{{a}}") == 0
        monkeypatch.undo()
        await attempt()
        await attempt()
        assert results == ["done a", "done a"]
        assert runs == ["a"]
        await client.aclose()

    asyncio.run(scenario())


@pytest.fixture(params=["sync", "async"])
def driver_kind(request: pytest.FixtureRequest) -> str:
    """The driver kind: "sync" or "async"."""
    return str(request.param)


@pytest.mark.parametrize("server", ["redis", "valkey"])
def test_round_trips_counted_on_real_redis(request: pytest.FixtureRequest, server: str) -> None:
    """MONITOR shows a first call sending 2 commands (claim, complete) and a completed duplicate exactly 1.

    On Redis 7 the claim is its SET ... NX GET and the store the script; on Valkey 9 the
    store is SET ... IFEQ too, its waiters' PUBLISH pipelined behind it (one round trip).
    """
    process = request.getfixturevalue(f"{server}_standalone")
    client = process.client()

    def work(k: str) -> str:
        return "v"

    wrapped = idempotent(client, key="k", namespace=unique("ns"))(work)
    wrapped("warm-up")  # the client's one-time probe and SCRIPT LOAD
    first = monitored(process, lambda: wrapped("first"))
    duplicate = monitored(process, lambda: wrapped("first"))
    scripted = idempotent(client, key="k", namespace=unique("ns"), native="never")(work)
    scripted("warm-up")
    by_script = monitored(process, lambda: scripted("first"))
    client.close()
    store = ["SET", "PUBLISH"] if server == "valkey" else ["EVALSHA"]
    assert [name for name, _ in first] == ["SET", *store]
    assert " NX GET EX " in first[0][1].upper()
    assert [name for name, _ in duplicate] == ["SET"]
    assert [name for name, _ in by_script] == ["EVALSHA", "EVALSHA"]


def monitored(server: Any, action: Callable[[], Any]) -> list[tuple[str, str]]:
    """The commands clients sent while ``action`` ran (scripts' inner commands excluded), via MONITOR."""
    sentinel = f"end-{unique()}"
    admin = server.client()
    admin.ping()  # connected before MONITOR starts, so its handshake is not counted
    seen: list[tuple[str, str]] = []
    ready = threading.Event()
    watcher = server.client()

    def watch() -> None:
        with watcher.monitor() as monitor:
            ready.set()
            for entry in monitor.listen():
                if sentinel in entry["command"]:
                    return
                if entry.get("client_type") != "lua":
                    seen.append((entry["command"].split()[0].upper(), entry["command"]))

    thread = threading.Thread(target=watch)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.1)  # MONITOR is registered once its OK was read
    action()
    admin.echo(sentinel)
    thread.join(10)
    admin.close()
    watcher.close()
    return seen
