"""What @idempotent refuses before any I/O: unreadable signatures and annotations, keys that are not UTF-8, bad calls.

Every refusal names its cause and runs nothing; on fakeredis.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from goblin_claim import InvalidArgumentError, InvalidArgumentTypeError, idempotent
from goblin_claim.testing import fake_redis
from tests.conftest import unique


@pytest.fixture
def client() -> Iterator[Any]:
    """A fakeredis client with the scripts."""
    made = fake_redis(native=False)
    yield made
    made.close()


def test_the_default_fingerprint_reads_as_all_arguments_in_the_signature() -> None:
    """help(idempotent) shows what the default fingerprint covers, not an object address."""
    default = inspect.signature(idempotent).parameters["fingerprint"].default
    assert repr(default) == "<all arguments>"
    assert "= <all arguments>," in str(inspect.signature(idempotent))


def test_a_builtin_without_a_signature_is_refused_at_decoration(client: Any) -> None:
    """The builtin min has no signature to bind calls to: InvalidArgumentTypeError when decorating."""
    with pytest.raises(InvalidArgumentTypeError, match="cannot read the signature of"):
        idempotent(client, key=lambda *args: "k", namespace=unique("ns"))(min)


def test_a_return_annotation_that_cannot_be_resolved_is_refused_at_decoration(client: Any) -> None:
    """A string annotation naming nothing: refused when decorating, with the fix in the message."""

    def report() -> NoSuchReceipt:  # type: ignore[name-defined]  # noqa: F821
        return None

    with pytest.raises(InvalidArgumentTypeError) as caught:
        idempotent(client, key=lambda: "k", namespace=unique("ns"))(report)
    assert "cannot resolve the return annotation" in str(caught.value)
    assert "NameError" in str(caught.value)
    assert "module level" in str(caught.value)


def test_a_key_with_a_lone_surrogate_is_refused_and_nothing_runs(client: Any) -> None:
    """A key Redis cannot be sent (not UTF-8): InvalidArgumentError before any I/O; UTF-8 keys work."""
    runs: list[str] = []

    @idempotent(client, key="order", namespace=unique("ns"))
    def charge(order: str) -> str:
        runs.append(order)
        return "charged"

    with pytest.raises(InvalidArgumentError, match="not encodable as UTF-8"):
        charge("order-\udcff")
    assert runs == []
    assert charge("order-\u00e9") == "charged"  # non-ASCII that is UTF-8 is a key like any other
    assert runs == ["order-\u00e9"]


def test_a_fingerprint_with_a_lone_surrogate_is_refused_and_nothing_runs(client: Any) -> None:
    """A custom fingerprint that is not UTF-8: InvalidArgumentError carrying the key; nothing runs."""
    runs: list[str] = []

    @idempotent(client, key="order", fingerprint=lambda order, note: note, namespace=unique("ns"))
    def charge(order: str, note: str) -> str:
        runs.append(order)
        return "charged"

    with pytest.raises(InvalidArgumentError, match="fingerprint returned a str not encodable as UTF-8") as caught:
        charge("o-1", "\ud800")
    assert caught.value.key == "o-1"
    assert runs == []
    assert charge("o-1", "caf\u00e9") == "charged"
    assert runs == ["o-1"]


def test_an_argument_given_twice_is_refused_as_a_plain_call_would_be(client: Any) -> None:
    """Position and keyword for one parameter: the TypeError Python gives, and nothing runs."""
    runs: list[str] = []

    @idempotent(client, key="order", namespace=unique("ns"))
    def charge(order: str, amount: int = 0) -> str:
        runs.append(order)
        return "charged"

    with pytest.raises(TypeError, match="multiple values for argument 'order'"):
        charge("o-1", order="o-1")  # type: ignore[misc]
    assert runs == []
    assert charge("o-1", amount=5) == "charged"  # a keyword for another parameter is fine
    assert runs == ["o-1"]
