"""What ran is what replays, all the way down.

A result is stored only if, read back from its own JSON, it has the same types and
values everywhere inside: ``1 == 1.0 == True``, so ``==`` alone let ``{"amount": 25}``
under ``-> dict[str, float]`` replay as ``{"amount": 25.0}``. The codec's check runs
here without Redis over many annotated shapes (some drawn by hypothesis, judged by an
oracle of this file's own: exact types and reprs); then through ``@idempotent`` on
real redis-server processes, script path and native path, def and async def,
counting executions: refused values fail closed and nothing runs twice.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import enum
import json
import math
import threading
import uuid
import zoneinfo
from decimal import Decimal
from typing import Any, NamedTuple, Optional, Union

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from goblin_claim import ResultNotSerializableError, idempotent
from goblin_claim._decorator.codec import Codec, ResultEnvelope
from goblin_claim._decorator.replay import _MAX_DEPTH, _difference
from tests.conftest import Backend, Deco, unique

# Real servers on both paths: stock redis-server runs the scripts, the one with the
# reference module answers GOBLIN.CLAIM natively.
BACKENDS = ("standalone", "native")

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 29, 12, 30, tzinfo=UTC)


class Color(str, enum.Enum):
    """A str-valued enum: equal to its str, but not the same thing."""

    RED = "red"


class Size(enum.IntEnum):
    """An int-valued enum."""

    S = 1


class Line(pydantic.BaseModel):
    """A model with a float field."""

    sku: str
    price: float


class Order(pydantic.BaseModel):
    """A model holding models, containers and unions."""

    lines: list[Line]
    totals: dict[str, float]
    note: Optional[str] = None  # noqa: UP045 -- Optional is the spelling under test
    tags: frozenset[str] = frozenset()


class Loose(pydantic.BaseModel):
    """A model that keeps extra fields and a private attribute."""

    model_config = pydantic.ConfigDict(extra="allow")

    n: int
    _cache: int = pydantic.PrivateAttr(0)


class Base(pydantic.BaseModel):
    """A base model."""

    a: int


class Derived(Base):
    """A subclass: serialized under ``Base`` it comes back as a ``Base``."""

    b: int = 0


class KeepsNaN(pydantic.BaseModel):
    """A model whose JSON keeps NaN and infinities (as the non-standard constants)."""

    model_config = pydantic.ConfigDict(ser_json_inf_nan="constants")

    value: float


@dataclasses.dataclass
class Point:
    """A dataclass with float fields (dataclasses do not convert on construction)."""

    x: float
    y: float


@dataclasses.dataclass
class Box:
    """A dataclass holding a dataclass and a tuple."""

    corner: Point
    size: tuple[int, int]


class Pair(NamedTuple):
    """A NamedTuple with an int and a float."""

    count: int
    ratio: float


class Movie(TypedDict):
    """A TypedDict with a float."""

    title: str
    rating: float


class Weird:
    """A value whose ``==`` raises."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__


def stored_replay(annotation: Any, value: Any) -> Any:
    """Encode ``value`` under ``annotation`` and decode the envelope again: what a duplicate gets."""
    codec: Codec[Any] = Codec(annotation)
    raw = codec.encode_result(value, None, "k")
    assert raw.startswith(b'{"goblin":1,"value":')  # stored without "kind" and without "fp"
    envelope = codec.decode(raw, "k")
    assert isinstance(envelope, ResultEnvelope)
    return envelope.value


def shape(value: Any) -> str:
    """An oracle of this file's own: exact types and reprs all the way down (dict order aside)."""
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, pydantic.BaseModel):
        parts = [value.__dict__, value.__pydantic_extra__ or {}, value.__pydantic_private__ or {}]
        return f"{name}({', '.join(shape(part) for part in parts)})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"{name}({', '.join(shape(getattr(value, f.name)) for f in dataclasses.fields(value))})"
    if isinstance(value, enum.Enum):
        return f"{name}.{value.name}"
    if isinstance(value, dict):
        return f"{name}{{{', '.join(sorted(f'{shape(k)}: {shape(v)}' for k, v in value.items()))}}}"
    if isinstance(value, (list, tuple)):
        return f"{name}[{', '.join(shape(item) for item in value)}]"
    if isinstance(value, (set, frozenset)):
        return f"{name}{{{', '.join(sorted(shape(item) for item in value))}}}"
    if isinstance(value, (datetime.datetime, datetime.time)):  # a fixed offset's class is not what replays
        return f"{name}({value.isoformat()}, fold={value.fold})"
    return f"{name}({value!r})"


# --------------------------------------------------------------------------- the codec, no Redis

# Each value holds, somewhere inside, a part that would come back as another type
# (or another value of an equal-looking type): 25 as 25.0, True as 1, a tuple as a
# list, an Enum member as its str, a subclass as its base, a zone as an offset...
REFUSED: list[tuple[str, Any, Any]] = [
    ("int-in-dict-of-float", dict[str, float], {"amount": 25}),
    ("bool-in-list-of-int", list[int], [True]),
    ("bool-in-tuple-of-int", tuple[int, ...], (1, True)),
    ("int-in-set-of-float", set[float], {1}),
    ("bool-in-frozenset-of-int", frozenset[int], frozenset({True})),
    ("int-deep-in-nesting", list[dict[str, tuple[float, ...]]], [{"a": (1.0, 2)}]),
    ("int-in-optional-float", dict[str, Optional[float]], {"a": 1}),  # noqa: UP045
    ("bool-in-union", list[Union[int, str]], [True]),  # noqa: UP007
    ("int-in-typeddict", Movie, {"title": "Brazil", "rating": 8}),
    ("int-in-dataclass", Point, Point(1, 2.5)),
    ("int-in-nested-dataclass", Box, Box(Point(0.5, 3), (1, 2))),
    ("int-in-namedtuple", Pair, Pair(3, 1)),
    ("int-in-list-of-namedtuples", list[Pair], [Pair(3, 0.5), Pair(4, 2)]),
    ("unvalidated-model-field", Line, Line.model_construct(sku="a", price=3)),
    ("unvalidated-nested-model-field", Order, Order(lines=[Line.model_construct(sku="a", price=3)], totals={})),
    ("tuple-in-model-extra", Loose, Loose(n=1, note=(1, 2))),
    ("private-attribute-set", Loose, Loose(n=1)),  # _cache is set to 5 below
    ("subclass-in-dict-of-base", dict[str, Base], {"x": Derived(a=1, b=2)}),
    ("str-enum-under-any", dict[str, Any], {"c": Color.RED}),
    ("str-enum-in-list-of-str", list[str], [Color.RED]),
    ("int-enum-in-list-of-int", list[int], [Size.S]),
    ("tuple-under-any", list[Any], [1, (2, 3)]),
    ("uuid-under-any", dict[str, Any], {"id": uuid.UUID(int=7)}),
    ("decimal-under-any", list[Any], [Decimal("1.5")]),
    ("datetime-under-any", dict[str, Any], {"at": NOW}),
    ("zone-with-rules", list[datetime.datetime], [NOW.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))]),
    ("fold-of-a-repeated-hour", dict[str, datetime.datetime], {"at": datetime.datetime(2026, 10, 25, 2, 30, fold=1)}),
    ("nan-in-dict-of-float", dict[str, float], {"a": float("nan")}),
    ("infinity-in-list", list[float], [1.5, float("inf")]),
    ("maxlen-of-a-deque", collections.deque[int], collections.deque([1], maxlen=3)),
    ("ints-in-a-long-list-of-floats", list[float], [i + 0.5 for i in range(100)] + [7]),
    ("bool-in-a-long-list-of-ints", list[int], [*range(100), True]),
    ("int-in-a-long-dict-of-floats", dict[str, float], {**{f"k{i}": i + 0.5 for i in range(100)}, "z": 9}),
]


def _refused_value(case_id: str, value: Any) -> Any:
    if case_id == "private-attribute-set":
        value = Loose(n=1)
        value._cache = 5
    return value


@pytest.mark.parametrize(("case_id", "annotation", "value"), REFUSED, ids=[case[0] for case in REFUSED])
def test_values_that_would_replay_differently_inside_are_refused(case_id: str, annotation: Any, value: Any) -> None:
    """A part anywhere inside that would come back of another type or value makes the result unstorable."""
    value = _refused_value(case_id, value)
    with pytest.raises(ResultNotSerializableError):
        Codec(annotation).encode_result(value, None, "k")


# The same shapes, well typed: each is stored and comes back exactly.
REPLAYED: list[tuple[str, Any, Any]] = [
    ("dict-of-float", dict[str, float], {"amount": 25.0}),
    ("list-of-int", list[int], [1, 2, 3]),
    ("list-of-bool", list[bool], [True, False]),
    ("tuple-of-int", tuple[int, ...], (1, 2)),
    ("set-of-float", set[float], {1.0, 2.5}),
    ("frozenset-of-str", frozenset[str], frozenset({"a", "b"})),
    ("nested", list[dict[str, tuple[float, ...]]], [{"a": (1.0, 2.0)}]),
    ("optional-float-none", dict[str, Optional[float]], {"a": None, "b": 1.5}),  # noqa: UP045
    ("union-members", list[Union[int, str, float]], [1, "x", 2.5]),  # noqa: UP007
    ("typeddict-in-other-order", Movie, {"rating": 8.0, "title": "Brazil"}),
    ("dataclass", Box, Box(Point(0.5, 3.0), (1, 2))),
    ("namedtuple", list[Pair], [Pair(3, 0.5)]),
    (
        "model",
        Order,
        Order(lines=[Line(sku="a", price=3)], totals={"net": 3.0}, note="n", tags=frozenset({"x"})),
    ),
    ("model-extra", Loose, Loose(n=1, note="kept")),
    ("base-model-in-dict", dict[str, Base], {"x": Base(a=1)}),
    ("enums", dict[str, Union[Color, Size]], {"c": Color.RED, "s": Size.S}),  # noqa: UP007
    (
        "uuid-decimal-datetime-date",
        tuple[uuid.UUID, Decimal, datetime.datetime, datetime.date],
        (uuid.UUID(int=7), Decimal("1.50"), NOW, NOW.date()),
    ),
    ("fixed-offset", list[datetime.datetime], [NOW.astimezone(datetime.timezone(datetime.timedelta(hours=5)))]),
    (
        "time-and-delta",
        tuple[datetime.time, datetime.timedelta],
        (datetime.time(1, 2, tzinfo=UTC), datetime.timedelta(3)),
    ),
    ("bytes", dict[str, bytes], {"blob": b"\x00\xff"}),
    ("negative-zero", list[float], [-0.0, 0.0]),
    ("int-dict-keys", dict[int, str], {1: "a", 2: "b"}),
    ("ordered-dict", collections.OrderedDict[str, int], collections.OrderedDict([("b", 1), ("a", 2)])),
    ("defaultdict", collections.defaultdict[str, list[int]], collections.defaultdict(list, {"a": [1]})),
    ("deque", collections.deque[int], collections.deque([1, 2])),
    ("json-under-any", Any, {"a": 1, "b": [1.5, None, True, "x", {"c": -0.0}]}),
    ("long-list-of-floats", list[float], [i + 0.5 for i in range(100)]),
    ("long-dict-of-ints", dict[str, int], {f"k{i}": i for i in range(100)}),
]


@pytest.mark.parametrize(("annotation", "value"), [c[1:] for c in REPLAYED], ids=[c[0] for c in REPLAYED])
def test_well_typed_values_are_stored_and_replay_exactly(annotation: Any, value: Any) -> None:
    """A value of exactly its annotation's types is stored, and what comes back has its types and reprs throughout."""
    assert shape(stored_replay(annotation, value)) == shape(value)


def test_the_message_says_where_inside_and_what_would_come_back() -> None:
    """The refusal names the path to the part and both types, so the annotation can be fixed."""
    order = Order(lines=[Line(sku="a", price=1.5), Line.model_construct(sku="b", price=3)], totals={})
    with pytest.raises(ResultNotSerializableError) as info:
        Codec(Order).encode_result(order, None, "k")
    assert "result.lines[1].price would come back as float 3.0, not as the int 3" in str(info.value)
    with pytest.raises(ResultNotSerializableError, match=r"result\['amount'\] would come back as float 25\.0"):
        Codec(dict[str, float]).encode_result({"amount": 25}, None, "k")


def test_nan_replays_as_nan_where_the_json_keeps_it() -> None:
    """NaN counts as NaN: a model whose JSON keeps NaN stores it and replays NaN; standard JSON (null) refuses it."""
    replay = stored_replay(KeepsNaN, KeepsNaN(value=float("nan")))
    assert type(replay) is KeepsNaN
    assert math.isnan(replay.value)
    assert stored_replay(KeepsNaN, KeepsNaN(value=float("-inf"))).value == float("-inf")
    with pytest.raises(ResultNotSerializableError):
        Codec(float).encode_result(float("nan"), None, "k")
    with pytest.raises(ResultNotSerializableError):
        Codec(Any).encode_result([float("nan")], None, "k")


def test_the_walk_compares_nan_and_signed_zeros_deliberately() -> None:
    """NaN is the same as NaN; -0.0 differs from 0.0 though they are ==, also in a long list settled at once."""
    assert _difference([float("nan")], [float("nan")]) is None
    assert _difference([0.0], [-0.0]) is not None
    assert _difference([*[1.5] * 100, 0.0], [*[1.5] * 100, -0.0]) is not None
    assert _difference(Decimal("1.0"), Decimal("1.00")) is not None  # equal, yet they print differently
    assert _difference({"b": 1, "a": 2}, {"a": 2, "b": 1}) is None  # a plain dict's order is not compared
    ordered = collections.OrderedDict
    assert _difference(ordered([("b", 1), ("a", 2)]), ordered([("a", 2), ("b", 1)])) is not None


def test_circular_and_deep_results_fail_closed_with_a_clear_message() -> None:
    """A result that holds itself, or nests deeper than JSON goes, is refused with a message, never a RecursionError."""
    looped: list[Any] = [1]
    looped.append(looped)
    for annotation in (Any, list[Any]):
        with pytest.raises(ResultNotSerializableError, match="Circular reference"):
            Codec(annotation).encode_result(looped, None, "k")
    deep: Any = 0
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ResultNotSerializableError, match="depth"):
        Codec(Any).encode_result(deep, None, "k")


def test_the_walk_itself_never_recurses_and_stops_at_its_depth_bound() -> None:
    """Two values deeper than the walk's bound, or holding themselves, are a difference, not a RecursionError."""
    deep_a: Any = 0
    deep_b: Any = 0
    for _ in range(_MAX_DEPTH * 5):
        deep_a, deep_b = [deep_a], [deep_b]
    assert "nested more than" in str(_difference(deep_a, deep_b))
    loop_a: list[Any] = []
    loop_a.append(loop_a)
    loop_b: list[Any] = []
    loop_b.append(loop_b)
    assert "holds itself" in str(_difference(loop_a, loop_b))


def test_an_eq_that_raises_fails_closed() -> None:
    """A part whose == raises cannot vouch for the replay: a difference naming the error, never the error itself."""
    assert "no comparing me" in str(_difference([Weird()], [Weird()]))


# --------------------------------------------------------------------------- hypothesis

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.decimals(allow_nan=False, places=3),
    st.uuids(),
    st.dates(),
    st.binary(max_size=8),
)
_hashables = st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=3), st.floats(-2, 2))
_python_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-3, 3)), inner, max_size=4),
        st.frozensets(_hashables, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=_python_values)
def test_whatever_any_stores_replays_exactly(value: Any) -> None:
    """Under Any, any mix of Python values is either refused or replays with the same types and reprs throughout."""
    codec: Codec[Any] = Codec(Any)
    try:
        raw = codec.encode_result(value, None, "k")
    except ResultNotSerializableError:
        return
    assert raw.startswith(b'{"goblin":1,"value":')
    envelope = codec.decode(raw, "k")
    assert isinstance(envelope, ResultEnvelope)
    assert shape(envelope.value) == shape(value)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=_json)
def test_plain_json_values_are_always_stored_under_any(value: Any) -> None:
    """What JSON holds (str-keyed dicts, lists, str, finite numbers, bools, None) is stored under Any, exactly."""
    assert shape(stored_replay(Any, value)) == shape(value)


_finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=4), st.lists(_finite, min_size=1, max_size=6), min_size=1, max_size=4),
    data=st.data(),
)
def test_one_loose_number_anywhere_in_a_typed_value_is_refused(value: dict[str, list[float]], data: Any) -> None:
    """dict[str, list[float]] is stored when all floats; one int or bool put anywhere in it makes it refused."""
    assert shape(stored_replay(dict[str, list[float]], value)) == shape(value)
    key = data.draw(st.sampled_from(sorted(value)))
    index = data.draw(st.integers(0, len(value[key]) - 1))
    loose = data.draw(st.one_of(st.integers(-(10**6), 10**6), st.booleans()))
    value[key][index] = loose
    with pytest.raises(ResultNotSerializableError):
        Codec(dict[str, list[float]]).encode_result(value, None, "k")


# --------------------------------------------------------------------------- @idempotent on real servers

# What the issue names, and one of each kind of container: through the decorator.
THROUGH_THE_DECORATOR = [
    case
    for case in REFUSED
    if case[0]
    in {
        "int-in-dict-of-float",
        "bool-in-list-of-int",
        "int-in-nested-dataclass",
        "int-in-namedtuple",
        "unvalidated-nested-model-field",
        "int-in-typeddict",
        "str-enum-under-any",
        "int-in-set-of-float",
        "zone-with-rules",
        "int-in-a-long-dict-of-floats",
    }
]


def stored_envelope(deco: Deco, key: str) -> Any:
    """The envelope the decorator's record holds for ``key`` in the fixture's namespace (``done <token> <env>``)."""
    raw = deco.raw.get(f"{deco.namespace}:{{{key}}}")
    assert raw.startswith(b"done ")
    return json.loads(raw.split(b" ", 2)[2])


@pytest.mark.parametrize(
    ("case_id", "annotation", "value"), THROUGH_THE_DECORATOR, ids=[case[0] for case in THROUGH_THE_DECORATOR]
)
def test_decorated_results_that_would_replay_differently_inside_fail_closed(
    deco: Deco, case_id: str, annotation: Any, value: Any
) -> None:
    """The first call runs once and gets the error with its value; duplicates get the error and nothing runs again."""
    value = _refused_value(case_id, value)
    calls: list[str] = []

    def work(k: str) -> Any:
        calls.append(k)
        return value

    work.__annotations__ = {"k": str, "return": annotation}
    wrapped = deco(work, key="k", wait=0)
    with pytest.raises(ResultNotSerializableError, match="would not replay as it ran") as first:
        wrapped("k")
    assert first.value.result is value
    stored = stored_envelope(deco, "k")
    assert stored["kind"] == "unstorable"
    for _ in range(3):
        with pytest.raises(ResultNotSerializableError, match="could not be kept") as duplicate:
            wrapped("k")
        assert duplicate.value.result is None
    assert calls == ["k"]


@pytest.mark.parametrize(
    ("annotation", "value"),
    [(dict[str, float], {"amount": 25.0}), (Order, Order(lines=[Line(sku="a", price=3)], totals={"net": 3.0}))],
    ids=["dict-of-float", "model"],
)
def test_decorated_well_typed_results_replay_exactly(deco: Deco, annotation: Any, value: Any) -> None:
    """The well-typed twin of a refused value is stored: duplicates get its exact types back, and it ran once."""
    calls: list[str] = []

    def work(k: str) -> Any:
        calls.append(k)
        return value

    work.__annotations__ = {"k": str, "return": annotation}
    wrapped = deco(work, key="k")
    assert wrapped("k") is value
    assert set(stored_envelope(deco, "k")) == {"goblin", "value"}  # no "kind", no "fp": the token carries it
    replays = [wrapped("k") for _ in range(3)]
    assert [shape(replay) for replay in replays] == [shape(value)] * 3
    assert calls == ["k"]


@pytest.mark.slow
def test_concurrent_threads_run_a_refused_result_once(backend: Backend) -> None:
    """Eight threads race on one key whose result would replay differently: it runs once, every caller is told."""
    client = backend.sync()
    calls: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    @idempotent(client, key=lambda order_id: order_id, namespace=unique("ns"), wait=30)
    def charge(order_id: str) -> dict[str, float]:
        with lock:
            calls.append(1)
        return {"amount": 25}  # type: ignore[dict-item]  # the int a loose annotation lets through

    outcomes: list[BaseException | None] = []

    def caller() -> None:
        start.wait()
        try:
            charge("o-1")
        except ResultNotSerializableError as exc:
            with lock:
                outcomes.append(exc)
            return
        with lock:
            outcomes.append(None)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 8
    assert all(isinstance(outcome, ResultNotSerializableError) for outcome in outcomes)
    assert sum(1 for outcome in outcomes if getattr(outcome, "result", None) == {"amount": 25}) == 1
    assert len(calls) == 1


@pytest.mark.slow
def test_concurrent_tasks_run_a_refused_result_once(backend: Backend) -> None:
    """Twenty asyncio tasks race on one key whose result would replay differently: it runs once, every task is told."""
    calls: list[int] = []

    async def main() -> list[BaseException | None]:
        client = backend.async_()
        try:

            @idempotent(client, key=lambda order_id: order_id, namespace=unique("ns"), wait=30)
            async def charge(order_id: str) -> list[int]:
                calls.append(1)
                await asyncio.sleep(0.05)  # the others arrive while it runs
                return [True]  # type: ignore[list-item]  # a bool where ints are promised

            results = await asyncio.gather(*(charge("o-1") for _ in range(20)), return_exceptions=True)
            return [None if isinstance(r, list) else r for r in results]
        finally:
            await client.aclose()

    outcomes = asyncio.run(main())
    assert all(isinstance(outcome, ResultNotSerializableError) for outcome in outcomes)
    assert sum(1 for outcome in outcomes if getattr(outcome, "result", None) == [True]) == 1
    assert len(calls) == 1
