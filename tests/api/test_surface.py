"""The public surface: names fixed by the design, sync/async parity, outcome values."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

import goblin_claim
from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    Completed,
    GoblinClaimError,
    InFlight,
    Outcome,
    PayloadMismatchError,
    StillInFlightError,
)
from goblin_claim.testing import fake_redis

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ["Claim", "AsyncClaim", "Claimed", "Completed", "InFlight", "idempotent", "current_claim", "GoblinClaimError",
          "ClaimLostError", "StillInFlightError", "PayloadMismatchError"]  # fmt: skip


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted, lists only real attributes, and includes every name the design fixes."""
    assert goblin_claim.__all__ == sorted(goblin_claim.__all__)
    assert all(hasattr(goblin_claim, name) for name in goblin_claim.__all__)
    assert set(PUBLIC) <= set(goblin_claim.__all__)


def test_every_error_derives_from_the_root() -> None:
    """Every exported exception class is a GoblinClaimError."""
    errors = [getattr(goblin_claim, n) for n in goblin_claim.__all__ if n.endswith("Error")]
    assert errors
    assert all(issubclass(e, GoblinClaimError) for e in errors)
    assert issubclass(goblin_claim.InvalidArgumentError, ValueError)
    assert issubclass(goblin_claim.InvalidArgumentTypeError, TypeError)


def _public_methods(cls: type) -> dict[str, object]:
    return {name: member for name, member in inspect.getmembers(cls) if not name.startswith("_") and callable(member)}


def _shape(function: object) -> list[tuple[str, object, object, str]]:
    """A signature with the sync/async type names made equal: (name, kind, default, annotation)."""
    signature = inspect.signature(function)  # type: ignore[arg-type]
    params = [(p.name, p.kind, p.default, str(p.annotation)) for p in signature.parameters.values()]
    params.append(("return", None, None, str(signature.return_annotation)))
    return [(n, k, d, a.replace("AsyncClient", "SyncClient").replace("Async", "")) for n, k, d, a in params]


def _doc(member: object) -> str:
    """A docstring with the async spellings of its example removed."""
    text = inspect.getdoc(member) or ""
    text = text.replace("async ", "").replace("await ", "").replace("AsyncClaim(redis.asyncio.", "Claim(redis.")
    return text.replace("AsyncClaim.acquire_many(", "Claim.acquire_many(")


def test_sync_and_async_handles_mirror_each_other() -> None:
    """Claim and AsyncClaim have the same public methods, signatures and docstrings; async ones are coroutines."""
    sync, asyn = _public_methods(Claim), _public_methods(AsyncClaim)
    assert sync.keys() == asyn.keys()
    assert {"acquire", "complete", "extend", "release", "wait", "from_keys", "keep_alive"} <= sync.keys()
    for name in [*sync, "__init__"]:
        sync_member, async_member = getattr(Claim, name), getattr(AsyncClaim, name)
        assert _shape(sync_member) == _shape(async_member), name
        assert _doc(sync_member) == _doc(async_member), name
    assert "ensure_held" in sync
    for name in sync.keys() - {"from_keys", "keep_alive", "ensure_held"}:  # ensure_held: no round trip
        assert inspect.iscoroutinefunction(asyn[name]), name
        assert not inspect.iscoroutinefunction(sync[name]), name


def test_the_sync_flavour_is_generated_from_the_asyncio_one() -> None:
    """The sync modules (drivers, HTTP claim paths, decorator flow, GLIDE adapter) are what tools/unasync.py makes."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "unasync.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_handle_attributes_are_strings() -> None:
    """claim_key, result_key and token are str; one key, with the namespace and one hash tag; from_keys keeps two."""
    handle = Claim(fake_redis(native=False), "evt88", namespace="pay", token="worker-3")
    assert (handle.claim_key, handle.result_key, handle.token) == ("pay:{evt88}", "pay:{evt88}", "worker-3")
    exact = Claim.from_keys(fake_redis(native=False), "claim:{evt88}", "result:{evt88}", token="worker-3")
    assert (exact.claim_key, exact.result_key, exact.token) == ("claim:{evt88}", "result:{evt88}", "worker-3")
    client = fake_redis(native=False)
    assert Claim(client, "evt88").token != Claim(client, "evt88").token


def test_outcomes_are_frozen_values() -> None:
    """Outcomes compare by value and refuse mutation."""
    outcome = Claimed(key="k", token="t", lease=30)
    assert outcome == Claimed(key="k", token="t", lease=30)
    with pytest.raises(pydantic.ValidationError):
        outcome.lease = 5  # type: ignore[misc]


def test_outcome_union_is_discriminated() -> None:
    """The Outcome union validates from its 'kind' tag; str values round-trip through JSON, bytes through Python."""
    adapter = pydantic.TypeAdapter(Outcome)
    for outcome in (Claimed(key="k", token="t", lease=3), Completed(key="k", value="v"), InFlight(key="k")):
        assert adapter.validate_json(adapter.dump_json(outcome)) == outcome
    raw = Completed(key="k", value=b"v")
    assert adapter.validate_python(adapter.dump_python(raw)) == raw


def test_outcomes_work_with_match() -> None:
    """Positional and keyword class patterns narrow each outcome."""

    def describe(outcome: Claimed | Completed | InFlight) -> str:
        match outcome:
            case Claimed(key, token):
                return f"claimed {key} as {token}"
            case Completed(value=value):
                return f"done: {value!r}"
            case InFlight():
                return "in flight"

    assert describe(Claimed(key="k", token="t", lease=1)) == "claimed k as t"
    assert describe(Completed(key="k", value=b"v")) == "done: b'v'"
    assert describe(InFlight(key="k")) == "in flight"


def test_errors_carry_the_key() -> None:
    """Errors keep the key they were raised for; ClaimLostError can carry a computed result."""
    assert StillInFlightError("x", key="k").key == "k"
    assert PayloadMismatchError("x", key="k").key == "k"
    assert ClaimLostError("x", key="k", result=3).result == 3


def _drawn_tree(text: str) -> dict[str, str | None]:
    """The classes of an error tree drawn with box characters, each with its parent (``None`` for the root)."""
    lines = [line for line in text.splitlines() if re.match(r"\s*(?:[│ ]*[├└]── )?[A-Z]\w*Error\b", line)]
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("GoblinClaimError"))
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (depth, name) of the branch above
    indent = len(lines[start]) - len(lines[start].lstrip())
    for line in lines[start:]:
        match = re.match(r"((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w*Error)\b", line[indent:])
        if match is None:
            break
        depth = len(match.group(1)) // 4 + (1 if "── " in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if parents and not stack:
            break  # past the tree
        parents[match.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, match.group(2)))
    return parents


def _error_classes() -> dict[str, str | None]:
    """Every error class the package defines, with the goblin-claim class it derives from."""
    found: dict[str, str | None] = {"GoblinClaimError": None}
    pending = [GoblinClaimError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("goblin_claim"):
                found[sub.__name__] = cls.__name__
                pending.append(sub)
    return found


def test_error_tree_is_drawn_in_the_docstring() -> None:
    """The errors module's docstring draws every error class the package defines, each under its parent."""
    from goblin_claim import _errors

    assert _drawn_tree(_errors.__doc__ or "") == _error_classes()
    assert {name for name in goblin_claim.__all__ if name.endswith("Error")} == set(_error_classes())


def test_error_tree_in_the_manual_is_the_code() -> None:
    """The error tree on the manual's errors page lists every error the package raises, each under its parent."""
    page = (ROOT / "docs" / "reference" / "errors.md").read_text("utf-8")
    assert _drawn_tree(page) == _error_classes()


def test_every_test_the_manual_names_exists() -> None:
    """Each promise in the README and on the manual's pages names tests that prove it; those tests exist."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = set(re.findall(r"`(test_\w+)`", "\n".join(page.read_text("utf-8") for page in pages)))
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text("utf-8"), flags=re.MULTILINE))
    assert len(named) > 20
    assert named <= defined, sorted(named - defined)
