"""What the decorator's codec stores and refuses at its edges.

The fields of a stored error, types pydantic cannot store, another writer's envelope
of the wrong type, and results whose parts would not replay as they ran.

Through ``@idempotent`` on fakeredis (the scripts' path), reading the record back as a duplicate or an
operator would; the replay walk's own refusals through the codec, each message naming the part.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic_core import core_schema

from goblin_claim import (
    InvalidArgumentTypeError,
    ReplayedError,
    ResultNotSerializableError,
    UnreadableResultError,
    idempotent,
)
from goblin_claim._decorator.codec import Codec
from goblin_claim._decorator.replay import _difference
from goblin_claim._protocol.record import build_keys, split_done
from goblin_claim.testing import fake_redis
from tests.conftest import unique


class Declined(Exception):
    """A terminal error with attributes: a code, a private one and one that is not JSON."""

    def __init__(self, code: int) -> None:
        super().__init__(f"card declined ({code})")
        self.code = code
        self._attempt = 3
        self.lock = object()


def test_a_stored_error_keeps_its_public_json_attributes_only() -> None:
    """A replayed error's record holds its type, message and public JSON attributes: no private, no unserializable."""
    client = fake_redis(native=False)
    ns = unique("codec")
    runs: list[str] = []

    @idempotent(client, key="order", namespace=ns, replay_errors=(Declined,))
    def charge(order: str) -> int:
        runs.append(order)
        raise Declined(51)

    with pytest.raises(Declined):
        charge("o-1")
    done = split_done(client.get(build_keys(ns, "o-1")[0]))
    assert done is not None
    envelope = json.loads(done[1])
    assert envelope["kind"] == "error"
    assert envelope["error"] == {
        "type": f"{__name__}.Declined",
        "message": "card declined (51)",
        "fields": {"code": 51},  # neither _attempt nor lock
    }
    with pytest.raises(ReplayedError, match=r"card declined \(51\)"):
        charge("o-1")
    assert runs == ["o-1"]


class Opaque:
    """A class pydantic has no schema for."""


def test_a_return_type_pydantic_cannot_store_is_refused_with_its_name() -> None:
    """A return annotation pydantic has no schema for: InvalidArgumentTypeError naming the type."""
    with pytest.raises(InvalidArgumentTypeError, match=r"cannot store results of type .*Opaque"):
        Codec(Opaque)


def test_another_writers_plain_envelope_of_the_wrong_type_is_unreadable() -> None:
    """A plain envelope holding a str under ``-> int``: UnreadableResultError, and the function does not run."""
    client = fake_redis(native=False)
    ns = unique("codec")
    runs: list[str] = []

    @idempotent(client, key="order", namespace=ns)
    def total(order: str) -> int:
        runs.append(order)
        return 5

    client.set(build_keys(ns, "o-9")[0], b'done other-writer {"goblin":1,"value":"five"}', ex=600)
    with pytest.raises(UnreadableResultError, match="not a goblin-claim envelope for this function's return type"):
        total("o-9")
    assert runs == []
    assert Codec(int).decode(b'{"goblin":1,"value":5}', "k").value == 5  # the right type reads


# --------------------------------------------------------------------------- parts that would replay otherwise


class Tag(str):
    """A str subclass: JSON gives back a plain str."""


class Cents(int):
    """An int subclass."""


class Ratio(float):
    """A float subclass."""


@dataclasses.dataclass
class Point:
    """A dataclass with one field."""

    x: float


def _with_extra() -> Point:
    point = Point(1.5)
    point.label = "set after construction"  # type: ignore[attr-defined]
    return point


REFUSED: list[tuple[str, Any, Any, str]] = [
    ("str-subclass", list[str], [Tag("a")], "result[0] would come back as str 'a', not as the Tag 'a'"),
    ("int-subclass", list[int], [Cents(3)], "result[0] would come back as int 3, not as the Cents 3"),
    ("float-subclass", list[float], [Ratio(1.5)], "result[0] would come back as float 1.5, not as the Ratio 1.5"),
    (
        "defaultdict-factory",
        collections.defaultdict[str, list[int]],
        collections.defaultdict(set, {"a": [1]}),
        "the result would come back with the default <class 'list'>",
    ),
    ("attribute-after-init", Point, _with_extra(), "the result would come back without ['label'] as attributes"),
    ("int-key-of-float-dict", dict[float, str], {1: "a"}, "result (the key 1) would come back as float 1.0"),
    (
        "keys-that-collapse",
        dict[Any, str],
        {1: "a", "1": "b"},
        "it would come back as dict {'1': 'b'}, not as the dict {1: 'a', '1': 'b'}",
    ),
]


@pytest.mark.parametrize(("annotation", "value", "said"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_part_that_would_replay_otherwise_is_refused_where_it_is(annotation: Any, value: Any, said: str) -> None:
    """The codec refuses the result, naming the part and what would come back."""
    with pytest.raises(ResultNotSerializableError) as info:
        Codec(annotation).encode_result(value, None, "k")
    assert f"would not replay as it ran: {said}" in str(info.value)


def test_date_keys_replay_as_they_ran() -> None:
    """Keys that are not plain leaves (dates) are compared too, and equal ones store."""
    value = {datetime.date(2026, 1, 2): "b", datetime.date(2026, 1, 1): "a"}
    body = Codec(dict[datetime.date, str]).encode_result(value, None, "k")
    assert Codec(dict[datetime.date, str]).decode(body, "k").value == value


@pytest.mark.parametrize(
    ("came", "ran", "said"),
    [
        ([1, 2], [1, 2, 3], "it would come back as list [1, 2], not as the list [1, 2, 3] that was returned"),
        ({1}, {1, 2}, "it would come back as set {1}, not as the set {1, 2} that was returned"),
        ({1, 3}, {1, 2}, "the result would come back without 2"),
        ([*range(100)], [*range(99), 7], "result[99] would come back as int 99, not as the int 7 that was returned"),
        (
            {1.0: 1, 2: 2},
            {2: 2, 1: 1},
            "result (the key 1) would come back as float 1.0, not as the int 1 that was returned",
        ),
        (
            {datetime.date(2026, 1, 2): 1, datetime.date(2026, 1, 1): 2},
            {datetime.date(2026, 1, 1): 2, datetime.date(2026, 1, 2): 1},
            None,
        ),
    ],
)
def test_the_walk_compares_lengths_members_long_sequences_and_reordered_keys(came: Any, ran: Any, said: Any) -> None:
    """What came back against what ran: lengths, missing members, a long flat list, keys in another order."""
    assert _difference(came, ran) == said


class Money(float):
    """A float subclass of the application's with its own pydantic schema: it comes back as itself."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_after_validator_function(
            cls, core_schema.float_schema(), serialization=core_schema.plain_serializer_function_ser_schema(float)
        )


class Sku(str):
    """A str subclass of the application's with its own pydantic schema."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


def test_subclasses_with_their_own_schema_replay_as_themselves() -> None:
    """A float or str subclass that validates back into itself is stored, and replays with its own type."""
    codec = Codec(tuple[Money, Sku])
    back = codec.decode(codec.encode_result((Money(2.5), Sku("ab-1")), None, "k"), "k").value
    assert back == (2.5, "ab-1")
    assert (type(back[0]), type(back[1])) == (Money, Sku)


def test_a_client_that_decodes_responses_replays_results_and_errors() -> None:
    """With decode_responses=True the records come back as text: a result and a stored error still replay."""
    client = fake_redis(native=False, decode_responses=True)
    ns = unique("codec")
    runs: list[str] = []

    @idempotent(client, key="order", namespace=ns, replay_errors=(Declined,))
    def charge(order: str) -> dict[str, float]:
        runs.append(order)
        if order == "bad":
            raise Declined(5)
        return {"total": 2.5}

    assert charge("good") == {"total": 2.5}
    assert charge("good") == {"total": 2.5}
    with pytest.raises(Declined):
        charge("bad")
    with pytest.raises(ReplayedError, match=r"card declined \(5\)"):
        charge("bad")
    assert runs == ["good", "bad"]


def test_an_iterator_return_type_is_refused_at_decoration() -> None:
    """``-> Iterator[int]`` on a plain def: a first caller would use it up, so it is refused, saying what to return."""
    with pytest.raises(
        InvalidArgumentTypeError, match=r"results of type .*Iterator.* cannot be replayed to duplicates"
    ):

        @idempotent(fake_redis(native=False), key="order", namespace=unique("codec"))
        def numbers(order: str) -> Iterator[int]:
            return iter([1])
