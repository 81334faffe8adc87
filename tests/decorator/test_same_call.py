"""What counts as "the same call": fingerprints, keys, default namespaces, bounded caches.

Fingerprint behaviour runs through ``@idempotent`` on every backend, for def and
async def; the pure parts (canonical forms, module names, cache bounds) run once.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import types
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pydantic
import pytest

from goblin_claim import Claim, InvalidArgumentError, InvalidArgumentTypeError, PayloadMismatchError, idempotent
from goblin_claim._clients import kinds
from goblin_claim._decorator.fingerprint import FINGERPRINT_CHARS, _canonical, fingerprint_of, fingerprint_parameters
from goblin_claim._decorator.plan import default_namespace, module_name_of_path
from goblin_claim._protocol import checks
from goblin_claim.testing import fake_redis
from tests.conftest import Deco

ROOT = Path(__file__).resolve().parents[2]


def counter() -> tuple[list[Any], Any]:
    """A list of calls and a function recording one."""
    calls: list[Any] = []
    return calls, calls.append


def fingerprint(func: Any, *args: Any, names: tuple[str, ...] | None = None, **kwargs: Any) -> str:
    """The default fingerprint of ``func(*args, **kwargs)``, without Redis."""
    signature = inspect.signature(func)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return fingerprint_of(bound.arguments, fingerprint_parameters(signature, names, func.__name__), "k")


# --------------------------------------------------------------------------- secrets and bytes


def test_secret_str_arguments_count_by_their_value(deco: Deco) -> None:
    """Two SecretStr card numbers under one key differ, although both print as '**********'."""
    calls, record = counter()

    def pay(order_id: str, card: Any) -> str:
        record(order_id)
        return "paid"

    wrapped = deco(pay, key="order_id")
    assert wrapped("o", pydantic.SecretStr("4111111111111111")) == "paid"
    assert wrapped("o", pydantic.SecretStr("4111111111111111")) == "paid"
    with pytest.raises(PayloadMismatchError):
        wrapped("o", pydantic.SecretStr("5500000000000004"))
    assert calls == ["o"]


def test_secret_bytes_and_nested_secrets_count_by_their_value(deco: Deco) -> None:
    """SecretBytes, and secrets inside models and lists, count by their secret value."""

    class Card(pydantic.BaseModel):
        holder: str
        number: pydantic.SecretStr

    def pay(order_id: str, card: Any, keys: list[Any]) -> int:
        return len(keys)

    wrapped = deco(pay, key="order_id")
    card = Card(holder="Ann", number=pydantic.SecretStr("4111"))
    assert wrapped("o", card, [pydantic.SecretBytes(b"\x01")]) == 1
    assert wrapped("o", Card(holder="Ann", number=pydantic.SecretStr("4111")), [pydantic.SecretBytes(b"\x01")]) == 1
    with pytest.raises(PayloadMismatchError):
        wrapped("o", Card(holder="Ann", number=pydantic.SecretStr("5500")), [pydantic.SecretBytes(b"\x01")])
    with pytest.raises(PayloadMismatchError):
        wrapped("o", card, [pydantic.SecretBytes(b"\x02")])


def test_secrets_are_never_stored_in_clear(deco: Deco) -> None:
    """Neither the claim (in flight) nor the record (completed) holds a secret argument, nor its plain hash."""
    secret = "4111111111111111"
    key = f"{deco.namespace}:{{o-secret}}"
    stored: list[bytes] = []

    def pay(order_id: str, card: Any) -> str:
        stored.append(deco.raw.get(key))  # the owner's token, while the function runs
        return "paid"

    deco(pay, key="order_id")("o-secret", pydantic.SecretStr(secret))
    stored.append(deco.raw.get(key))
    assert all(stored)
    assert not stored[0].startswith(b"done ")
    assert stored[1].startswith(b"done ")
    plain_hash = hashlib.sha256(secret.encode()).hexdigest()
    for value in stored:
        assert secret.encode() not in value
        assert plain_hash.encode()[:16] not in value


def test_canonical_form_hashes_secrets() -> None:
    """A secret's canonical form is a tag and the sha256 of its value; the value never appears."""
    canonical = _canonical({"card": pydantic.SecretStr("4111"), "pin": pydantic.Secret[int](1234)})
    assert canonical["card"] == {"$secret": hashlib.sha256(b"4111").hexdigest()}
    assert set(canonical["pin"]) == {"$secret"}
    assert "4111" not in repr(canonical)
    assert "1234" not in repr(canonical)


def test_bytes_arguments_count_even_when_not_utf8(deco: Deco) -> None:
    """Arguments of bytes (any bytes, not only UTF-8) count by their content."""
    calls, record = counter()

    def upload(name: str, blob: bytes) -> int:
        record(name)
        return len(blob)

    wrapped = deco(upload, key="name")
    assert wrapped("f", b"\xff\x00\xfe") == 3
    assert wrapped("f", bytearray(b"\xff\x00\xfe")) == 3
    with pytest.raises(PayloadMismatchError):
        wrapped("f", b"\xff\x00\xfd")
    assert calls == ["f"]


def test_tags_cannot_be_forged_by_plain_dicts() -> None:
    """A dict that looks like a tag ({'$bytes': ...}) never fingerprints like the bytes it imitates."""

    def upload(blob: Any) -> None:
        return None

    tag = _canonical(b"abc")
    assert fingerprint(upload, b"abc") != fingerprint(upload, tag)
    assert fingerprint(upload, {"$x": 1}) != fingerprint(upload, {"$$x": 1})


# --------------------------------------------------------------------------- methods


class Billing:
    """A service whose instances hold state that has no JSON form."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.lock = threading.Lock()


def test_self_of_a_method_does_not_count(deco: Deco) -> None:
    """Two instances of a service (holding a lock) make the same call: self is not fingerprinted."""
    calls, record = counter()

    def charge(self: Any, order_id: str, amount: int) -> str:
        record(self.region)
        return f"{self.region}:{amount}"

    service_type = type("Service", (Billing,), {"charge": deco(charge, key="order_id")})
    first, second = service_type("eu"), service_type("us")
    assert first.charge("o", 5) == "eu:5"
    assert second.charge("o", 5) == "eu:5"
    with pytest.raises(PayloadMismatchError):
        second.charge("o", 6)
    assert calls == ["eu"]


def test_cls_of_a_classmethod_does_not_count(deco: Deco) -> None:
    """The cls of a classmethod is not fingerprinted: a subclass's call replays its base's."""
    calls, record = counter()

    def refund(cls: type, order_id: str) -> str:
        record(cls.__name__)
        return cls.__name__

    base: Any = type("Base", (), {"refund": classmethod(deco(refund, key="order_id"))})
    child: Any = type("Child", (base,), {})
    assert base.refund("o") == "Base"
    assert child.refund("o") == "Base"
    assert calls == ["Base"]


def test_only_a_leading_self_or_cls_is_left_out() -> None:
    """A parameter named self that is not first, or is keyword-only, still counts."""

    def late(order_id: str, self: str) -> None:
        return None

    def keyword(*, self: str) -> None:
        return None

    assert [name for name, _ in fingerprint_parameters(inspect.signature(late), None, "late")] == ["order_id", "self"]
    assert [name for name, _ in fingerprint_parameters(inspect.signature(keyword), None, "keyword")] == ["self"]


# --------------------------------------------------------------------------- defaults


def test_a_new_optional_parameter_keeps_retries_replaying(deco: Deco) -> None:
    """Adding a parameter with a default keeps the fingerprint of calls that leave it out."""
    calls, record = counter()

    def charge_v1(order_id: str, amount: int) -> int:
        record("v1")
        return amount

    def charge_v2(order_id: str, amount: int, note: str | None = None, *, retries: int = 3) -> int:
        record("v2")
        return amount

    assert deco(charge_v1, key="order_id")("o", 5) == 5
    upgraded = deco(charge_v2, key="order_id")  # the same namespace: a new release of one function
    assert upgraded("o", 5) == 5
    assert upgraded("o", 5, None, retries=3) == 5  # passing the default is leaving it out
    with pytest.raises(PayloadMismatchError):
        upgraded("o", 5, "gift")
    with pytest.raises(PayloadMismatchError):
        upgraded("o", 5, retries=4)
    assert calls == ["v1"]


def test_defaults_compare_by_type_and_equality() -> None:
    """0 is not a default False; equal values of the default's type are; odd __eq__ never hides a value."""

    class Weird:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing")

        __hash__ = object.__hash__

    class Vague:
        def __eq__(self, other: object) -> Any:
            return [True]  # truthy, but not True (an array's answer)

        __hash__ = object.__hash__

    weird_default, vague_default = Weird(), Vague()

    def flag(k: str, on: bool = False, limit: float = 1.5) -> None:
        return None

    assert fingerprint(flag, "k", 0) != fingerprint(flag, "k")
    assert fingerprint(flag, "k", False, 1.5) == fingerprint(flag, "k")
    assert fingerprint(flag, "k", limit=float("1.5")) == fingerprint(flag, "k")

    def odd(k: str, w: Any = weird_default, v: Any = vague_default) -> None:
        return None

    assert fingerprint(odd, "k") == fingerprint(odd, "k", weird_default, vague_default)  # the default object itself
    with pytest.raises(TypeError, match="fingerprint"):
        fingerprint(odd, "k", Weird())  # not the default, and no JSON form: it counts, and says so
    with pytest.raises(TypeError, match="fingerprint"):
        fingerprint(odd, "k", v=Vague())


def test_model_and_dataclass_fields_at_their_default_do_not_count() -> None:
    """A field added with a default to a model or dataclass keeps the fingerprint of values that leave it out."""

    class OrderV1(pydantic.BaseModel):
        sku: str

    class OrderV2(pydantic.BaseModel):
        sku: str
        gift: bool = False

    @dataclasses.dataclass
    class LineV1:
        sku: str

    @dataclasses.dataclass
    class LineV2:
        sku: str
        qty: int = 1

    def buy(order: Any) -> None:
        return None

    assert fingerprint(buy, OrderV1(sku="a")) == fingerprint(buy, OrderV2(sku="a"))
    assert fingerprint(buy, OrderV2(sku="a", gift=True)) != fingerprint(buy, OrderV2(sku="a"))
    assert fingerprint(buy, LineV1("a")) == fingerprint(buy, LineV2("a"))
    assert fingerprint(buy, LineV2("a", 2)) != fingerprint(buy, LineV2("a"))


def test_args_and_kwargs_count_when_given() -> None:
    """*args and **kwargs count by what they hold; left empty, they count as left out."""

    def loose(k: str, *args: Any, **kwargs: Any) -> None:
        return None

    def strict(k: str) -> None:
        return None

    assert fingerprint(loose, "k") == fingerprint(strict, "k")
    assert fingerprint(loose, "k", 1) != fingerprint(loose, "k")
    assert fingerprint(loose, "k", a=1) != fingerprint(loose, "k", b=1)


# --------------------------------------------------------------------------- fingerprint=(names)


def test_fingerprint_tuple_counts_only_those_parameters(deco: Deco) -> None:
    """fingerprint=("amount", "currency") compares just those: another trace id replays, another amount does not."""
    calls, record = counter()

    def charge(order_id: str, amount: int, currency: str, trace: object = None) -> int:
        record(order_id)
        return amount

    wrapped = deco(charge, key="order_id", fingerprint=("amount", "currency"))
    assert wrapped("o", 5, "EUR", trace=object()) == 5  # trace has no JSON form, and does not count
    assert wrapped("o", 5, "EUR", trace="t2") == 5
    with pytest.raises(PayloadMismatchError):
        wrapped("o", 5, "USD")
    with pytest.raises(PayloadMismatchError):
        wrapped("o", 7, "EUR")
    assert calls == ["o"]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ((), InvalidArgumentError),
        (("amount", "amount"), InvalidArgumentError),
        (("nope",), InvalidArgumentTypeError),
        (("amount", 1), InvalidArgumentTypeError),
        ("amount", InvalidArgumentTypeError),
        (["amount"], InvalidArgumentTypeError),
    ],
)
def test_fingerprint_tuple_is_checked_when_decorating(deco: Deco, bad: Any, error: type[Exception]) -> None:
    """An empty tuple, a repeated or unknown name, a non-str name, a bare str or a list fail when decorating."""

    def charge(order_id: str, amount: int) -> int:
        return amount

    with pytest.raises(error, match="fingerprint"):
        deco(charge, key="order_id", fingerprint=bad)


# --------------------------------------------------------------------------- stability


STABLE_ARGUMENTS = """
import datetime, decimal, enum, uuid
import pydantic
from goblin_claim._decorator.fingerprint import fingerprint_of, fingerprint_parameters
import inspect

class Tier(enum.Enum):
    GOLD = "gold"

class Card(pydantic.BaseModel):
    number: pydantic.SecretStr
    tags: frozenset[str]

def charge(self, order_id, tags, card, blob, extra, when, amount, tier, ids, cents=0):
    pass

signature = inspect.signature(charge)
bound = signature.bind(
    object(), "o-1", {"alpha", "beta", "gamma", "delta"}, Card(number="4111", tags={"x", "y", "z"}),
    b"\\xff\\x00", {3: "three", "b": [1, 2.5, None, True], "$a": {"nested": {"q", "r"}}},
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc), decimal.Decimal("12.50"), Tier.GOLD,
    [uuid.UUID(int=7)],
)
bound.apply_defaults()
print(fingerprint_of(bound.arguments, fingerprint_parameters(signature, None, "charge"), "k"))
"""


def test_fingerprints_are_the_same_in_every_process() -> None:
    """Sets of str, secrets, bytes, models, enums and odd dict keys fingerprint alike under any hash seed."""
    prints = set()
    for seed in ("1", "2", "random"):
        result = subprocess.run(
            [sys.executable, "-c", STABLE_ARGUMENTS],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=False,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr
        prints.add(result.stdout.strip())
    assert len(prints) == 1
    (value,) = prints
    assert len(value) == FINGERPRINT_CHARS == 16


# --------------------------------------------------------------------------- keys


def test_uuid_keys_use_their_canonical_text(deco: Deco) -> None:
    """A UUID key (a parameter or a key function's answer) is its canonical str: equal UUIDs, one claim."""
    calls, record = counter()

    def fetch(request_id: Any) -> str:
        record(request_id)
        return str(request_id)

    request = uuid.UUID("12345678-1234-5678-1234-567812345678")
    wrapped = deco(fetch, key="request_id")
    assert wrapped(request) == wrapped(uuid.UUID(str(request).upper())) == str(request)
    assert calls == [request]
    assert deco.raw.get(f"{deco.namespace}:{{{request}}}").startswith(b"done ")  # completed under that key
    by_function = deco(fetch, key=lambda request_id: request_id, namespace=deco.namespace + "-f")
    assert by_function(request) == str(request)
    assert deco.raw.get(f"{deco.namespace}-f:{{{request}}}").startswith(b"done ")


def test_int_keys_from_a_key_function(deco: Deco) -> None:
    """A key function may answer an int: it is the key's decimal text, like an int parameter."""

    def fetch(order: dict[str, int]) -> int:
        return order["id"]

    wrapped = deco(fetch, key=lambda order: order["id"])
    assert wrapped({"id": 42}) == 42
    assert deco.raw.get(f"{deco.namespace}:{{42}}").startswith(b"done ")


@pytest.mark.parametrize("bad", [True, 4.0, b"raw", ("a",), Decimal(1)])
def test_other_key_types_are_refused(deco: Deco, bad: Any) -> None:
    """A bool, float, bytes, tuple or Decimal key is an InvalidArgumentTypeError before anything runs."""
    calls, record = counter()

    def work(k: Any) -> None:
        record(k)

    with pytest.raises(InvalidArgumentTypeError, match="str, an int or a UUID"):
        deco(work, key=lambda k: bad)("x")
    with pytest.raises(InvalidArgumentTypeError, match="str, an int or a UUID"):
        deco(work, key="k")(bad)
    assert calls == []


# --------------------------------------------------------------------------- namespaces


PACKAGED_MODULE = """
import multiprocessing

from goblin_claim import idempotent
from goblin_claim.testing import fake_redis

client = fake_redis(False)


@idempotent(client, key="order_id")
def charge(order_id: str) -> str:
    return order_id


class Billing:
    @idempotent(client, key="order_id")
    def refund(self, order_id: str) -> str:
        return order_id


charge("o-1")
Billing().refund("o-2")
print(" ".join(sorted({key.decode().split(":{")[0] for key in client.keys("*")})), flush=True)

if __name__ == "__main__":  # a spawned child imports this file again, as __mp_main__
    child = multiprocessing.get_context("spawn").Process(target=int)
    child.start()
    child.join()
"""


def test_default_namespace_does_not_depend_on_how_python_started(tmp_path: Path) -> None:
    """Running `python file.py`, `python -m pkg.mod`, `import pkg.mod` or a spawned child: one default namespace."""
    package = tmp_path / "shopapp" / "billing"
    package.mkdir(parents=True)
    (tmp_path / "shopapp" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "charges.py").write_text(textwrap.dedent(PACKAGED_MODULE))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = {
        "script": ([sys.executable, "shopapp/billing/charges.py"], tmp_path),
        "script, absolute path": ([sys.executable, str(package / "charges.py")], elsewhere),
        "-m": ([sys.executable, "-m", "shopapp.billing.charges"], tmp_path),
        "import": ([sys.executable, "-c", "import shopapp.billing.charges"], tmp_path),
    }
    expected = "shopapp.billing.charges.Billing.refund shopapp.billing.charges.charge"
    for how, (command, cwd) in runs.items():
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False, cwd=cwd)
        assert result.returncode == 0, (how, result.stderr)
        assert result.stdout.splitlines() == [expected] * (1 if how == "import" else 2), how  # parent and child


def test_module_name_of_path_walks_up_through_packages(tmp_path: Path) -> None:
    """A file's module name climbs every directory with __init__.py, and stops at the first without one."""
    (tmp_path / "outer" / "pkg" / "sub").mkdir(parents=True)
    for directory in ("outer/pkg", "outer/pkg/sub"):
        (tmp_path / directory / "__init__.py").write_text("")
    assert module_name_of_path(str(tmp_path / "outer" / "pkg" / "sub" / "mod.py")) == "pkg.sub.mod"
    assert module_name_of_path(str(tmp_path / "outer" / "pkg" / "sub" / "__init__.py")) == "pkg.sub"
    assert module_name_of_path(str(tmp_path / "outer" / "script.py")) == "script"


def test_default_namespace_is_none_without_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function of a REPL or python -c (a __main__ without a file) has no default namespace: pass namespace=."""

    def work(k: str) -> str:
        return k

    monkeypatch.setattr(work, "__module__", "__main__")
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    assert default_namespace(work) is None
    with pytest.raises(InvalidArgumentError, match="namespace="):
        idempotent(fake_redis(False), key="k")(work)
    assert callable(idempotent(fake_redis(False), key="k", namespace="pinned")(work))


def test_default_namespace_of_a_script_uses_its_module_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A __main__ run from a file, or with python -m, names functions as import would."""

    def work(k: str) -> str:
        return k

    monkeypatch.setattr(work, "__module__", "__main__")
    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "tool.py")
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert default_namespace(work) == f"tool.{work.__qualname__}"
    script.__spec__ = types.SimpleNamespace(name="app.tool")  # type: ignore[assignment]
    assert default_namespace(work) == f"app.tool.{work.__qualname__}"


# --------------------------------------------------------------------------- bounded caches


def test_many_namespaces_keep_memory_bounded() -> None:
    """300 000 handles with distinct namespaces keep the validated-namespace cache under its bound."""
    client = fake_redis(False)
    for i in range(1000):  # warm up: the first handles allocate what every later one reuses
        Claim(client, "k", namespace=f"warm-{i}")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300_000):
            Claim(client, "k", namespace=f"tenant-{i}")
            assert len(checks._NAMESPACES_SEEN) <= checks.NAMESPACES_SEEN_MAX
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2 * 1024 * 1024, grown  # unbounded, the set alone held ~30 MB


def test_client_kinds_cache_is_bounded() -> None:
    """Client types made at run time (one per mock, say) do not pile up in the client-kind cache."""

    def execute_command(self: Any, *args: Any) -> None:
        return None

    methods = {"execute_command": execute_command, "evalsha": execute_command, "eval": execute_command}
    for i in range(3 * kinds.CLIENT_KINDS_MAX):
        client = type(f"Client{i}", (), methods)()
        assert kinds.client_kind(client) is False
        assert len(kinds._CLIENT_KINDS) <= kinds.CLIENT_KINDS_MAX


def test_time_fields_count_as_their_json() -> None:
    """Dates, decimals and UUIDs count by their JSON text: equal values, equal fingerprints."""

    def book(at: datetime.datetime, price: Decimal, ref: uuid.UUID) -> None:
        return None

    at = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    assert fingerprint(book, at, Decimal("1.50"), uuid.UUID(int=1)) == fingerprint(
        book, at, Decimal("1.50"), uuid.UUID(int=1)
    )
    assert fingerprint(book, at, Decimal("1.50"), uuid.UUID(int=1)) != fingerprint(
        book, at, Decimal("1.5"), uuid.UUID(int=1)
    )
