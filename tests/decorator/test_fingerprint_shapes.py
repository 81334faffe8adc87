"""What counts as "the same call" for arguments of less common shapes.

Through ``@idempotent`` on fakeredis: a duplicate whose arguments write the same JSON
as the first call's replays its result (the function ran once); one whose arguments
differ gets ``PayloadMismatchError``.
"""

from __future__ import annotations

import collections
import types
from typing import Any, NamedTuple

import pydantic
import pytest

from goblin_claim import InvalidArgumentTypeError, PayloadMismatchError, idempotent
from goblin_claim.testing import fake_redis
from tests.conftest import unique


class Tag(str):
    """A str subclass: JSON writes its plain value."""


class Cents(int):
    """An int subclass."""


class Loose(pydantic.BaseModel, extra="allow"):
    """A model that keeps extra fields."""

    n: int


def counted() -> tuple[Any, list[Any]]:
    """A decorated function of (order, payload) on a fresh fake, and the list of payloads it ran with."""
    runs: list[Any] = []

    @idempotent(fake_redis(native=False), key="order", namespace=unique("fp"))
    def record(order: str, payload: Any) -> str:
        runs.append(payload)
        return f"ran {len(runs)}"

    return record, runs


@pytest.mark.parametrize(
    ("first", "same", "other"),
    [
        (Tag("a"), "a", "b"),
        (Cents(3), 3, 4),
        (types.MappingProxyType({"a": 1}), {"a": 1}, types.MappingProxyType({"a": 2})),
        (range(3), [0, 1, 2], range(4)),
        (collections.deque([1, 2]), (1, 2), collections.deque([2, 1])),
        (Loose(n=1, note="x"), Loose(n=1, note="x"), Loose(n=1, note="y")),
    ],
    ids=["str-subclass", "int-subclass", "mapping-proxy", "range", "deque", "model-extra"],
)
def test_arguments_that_write_the_same_json_are_the_same_call(first: Any, same: Any, other: Any) -> None:
    """Same JSON, same call: the duplicate replays; a different value (an extra field too) is refused."""
    record, runs = counted()
    assert record("o-1", first) == "ran 1"
    assert record("o-1", same) == "ran 1"
    with pytest.raises(PayloadMismatchError):
        record("o-1", other)
    assert runs == [first]


def test_fingerprint_of_the_wrong_type_is_refused_with_what_it_takes() -> None:
    """``fingerprint=["order"]`` (a list): InvalidArgumentTypeError saying what fingerprint= takes."""
    with pytest.raises(InvalidArgumentTypeError, match="fingerprint must be a function, a tuple of parameter names"):

        @idempotent(fake_redis(native=False), key="order", fingerprint=["order"], namespace=unique("fp"))  # type: ignore[arg-type]
        def charge(order: str) -> str:
            return order


class Names(NamedTuple):
    """A tuple subclass: not the plain tuple fingerprint= takes."""

    first: str


def test_a_tuple_subclass_for_fingerprint_is_refused() -> None:
    """``fingerprint=`` a NamedTuple of names: InvalidArgumentTypeError, as for any other non-tuple."""
    with pytest.raises(InvalidArgumentTypeError, match="fingerprint must be a function, a tuple of parameter names"):

        @idempotent(fake_redis(native=False), key="order", fingerprint=Names("order"), namespace=unique("fp"))
        def charge(order: str) -> str:
            return order
