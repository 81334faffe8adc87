"""One error tree for bad input: every bad argument to every public entry point.

Targeted tests for each known escape (huge numbers, non-str namespaces, lone
surrogates, non-UTF-8 bytes on a decode_responses client, an empty decorator
namespace, clients of the wrong kind), then a hypothesis fuzz that throws junk
at every entry point and checks that a refused call raised a GoblinClaimError
and left the keyspace exactly as it was.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import fakeredis
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    GoblinClaimError,
    InFlight,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    idempotent,
)
from goblin_claim._clients.kinds import client_kind
from goblin_claim._clients.transport import reply_encoding
from goblin_claim._protocol.checks import check_value, describe
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import Backend, Driver, Runner, stored, unique

HUGE = 10**400  # past float's range
HUGER = 10**5000  # past Python's digit limit: repr() of it raises ValueError
ARGUMENT_ERRORS = (InvalidArgumentError, InvalidArgumentTypeError)


class Nasty:
    """An argument whose repr, equality, hash and truth all raise."""

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def __bool__(self) -> bool:
        raise RuntimeError("bool")


def snapshot(raw: Any) -> dict[bytes, tuple[bytes, object, bool]]:
    """Every key with its type, its value and whether it expires (to show that nothing was written)."""
    readers: dict[bytes, Callable[[bytes], object]] = {
        b"string": raw.get,
        b"hash": raw.hgetall,
        b"set": lambda k: sorted(raw.smembers(k)),
        b"list": lambda k: raw.lrange(k, 0, -1),
        b"zset": lambda k: raw.zrange(k, 0, -1, withscores=True),
    }
    state = {}
    for key in raw.keys("*"):
        kind = raw.type(key)
        state[key] = (kind, readers.get(kind, lambda k: None)(key), raw.ttl(key) >= 0)
    return state


def sync_fake() -> fakeredis.FakeRedis:
    """A sync fakeredis client with the scripts."""
    return fake_redis(native=False)


@pytest.fixture
def run() -> Iterator[Runner]:
    """An event loop for asyncio clients."""
    runner = Runner()
    yield runner
    runner.close()


def work(k: str) -> str:
    """A decorated function's body."""
    return f"did {k}"


async def async_work(k: str) -> str:
    """A decorated coroutine function's body."""
    return f"did {k}"


# --------------------------------------------------------------------------- huge numbers


@pytest.mark.parametrize(
    "number", [HUGE, HUGER, -HUGE, math.inf, -math.inf, math.nan, 2**31, 1e300], ids=lambda n: describe(n, 12)
)
@pytest.mark.parametrize(
    "call",
    [lambda c, n: Claim(c, "k").wait(timeout=n), lambda c, n: Claim(c, "k").keep_alive(interval=n),
     lambda c, n: Claim(c, "k").extend(lease=n), lambda c, n: Claim(c, "k", lease=n),
     lambda c, n: Claim(c, "k", ttl=n), lambda c, n: Claim.from_keys(c, "a", "b", lease=n),
     lambda c, n: idempotent(c, key="k", wait=n)(work), lambda c, n: idempotent(c, key="k", lease=n)(work),
     lambda c, n: idempotent(c, key="k", ttl=n)(work)],
    ids=["wait", "keep_alive", "extend", "lease", "ttl", "from_keys", "idempotent-wait", "idempotent-lease",
         "idempotent-ttl"],
)  # fmt: skip
def test_huge_and_non_finite_numbers_are_invalid_arguments(call: Callable[[Any, Any], Any], number: Any) -> None:
    """Numbers past float's range or Python's digit limit, infinities and NaN raise InvalidArgument*, not Overflow."""
    client = sync_fake()
    with pytest.raises(ARGUMENT_ERRORS) as info:
        call(client, number)
    assert isinstance(info.value, (ValueError, TypeError))
    assert snapshot(client) == {}


def test_huge_numbers_are_refused_by_async_handles(run: Runner) -> None:
    """AsyncClaim's wait(), keep_alive() and extend() refuse a huge number with InvalidArgumentError."""

    async def main() -> None:
        handle = AsyncClaim(fake_async_redis(native=False), "k")
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await handle.wait(timeout=HUGE)
        with pytest.raises(InvalidArgumentError, match="interval"):
            handle.keep_alive(interval=HUGE)
        with pytest.raises(InvalidArgumentError, match="lease"):
            await handle.extend(lease=HUGER)

    run(main())


# --------------------------------------------------------------------------- namespaces


@pytest.mark.parametrize("namespace", [["ns"], {"ns": 1}, b"ns", 7, Nasty()], ids=describe)
def test_non_str_namespaces_are_type_errors(namespace: Any) -> None:
    """A namespace that is not a str (even an unhashable one) raises InvalidArgumentTypeError everywhere."""
    client = sync_fake()
    with pytest.raises(InvalidArgumentTypeError, match="namespace"):
        Claim(client, "k", namespace=namespace)
    with pytest.raises(InvalidArgumentTypeError, match="namespace"):
        idempotent(client, key="k", namespace=namespace)(work)


def test_a_str_subclass_namespace_is_refused_even_when_equal_to_a_seen_one() -> None:
    """A str subclass equal to a namespace already in use is still refused: its formatting is not a str's."""

    class Sneaky(str):
        def __format__(self, spec: str) -> str:
            return "x}{y"

    client = sync_fake()
    Claim(client, "k", namespace="pay")
    with pytest.raises(InvalidArgumentTypeError):
        Claim(client, "k", namespace=Sneaky("pay"))


def test_empty_decorator_namespace_is_refused_like_claims() -> None:
    """@idempotent(namespace="") raises InvalidArgumentError instead of falling back to the default namespace."""
    client = sync_fake()
    with pytest.raises(InvalidArgumentError, match="namespace"):
        Claim(client, "k", namespace="")
    with pytest.raises(InvalidArgumentError, match="namespace"):
        idempotent(client, key="k", namespace="")(work)


# --------------------------------------------------------------------------- lone surrogates


@pytest.mark.parametrize(
    "call",
    [lambda c: Claim(c, "a\ud800"), lambda c: Claim(c, "k", namespace="\udcff"),
     lambda c: Claim(c, "k", token="t\ud800"), lambda c: Claim.from_keys(c, "\ud800", "r"),
     lambda c: Claim.from_keys(c, "c", "\ud800"),
     lambda c: idempotent(c, key="k", namespace="n\ud800")(work),
     lambda c: idempotent(c, key=lambda k: k + "\ud800")(work)("x"),
     lambda c: idempotent(c, key="k")(work)("\udfff"),
     lambda c: idempotent(c, key="k", fingerprint=lambda k: "\ud800")(work)("x")],
    ids=["key", "namespace", "token", "claim_key", "result_key", "idempotent-namespace", "key-function",
         "key-parameter", "fingerprint"],
)  # fmt: skip
def test_lone_surrogates_are_refused_everywhere(call: Callable[[Any], Any]) -> None:
    """A str with a lone surrogate in a key, namespace, token or fingerprint raises InvalidArgumentError, no I/O."""
    client = sync_fake()
    with pytest.raises(InvalidArgumentError, match="surrogate"):
        call(client)
    assert snapshot(client) == {}


@pytest.mark.parametrize("value", ["\ud800", "caf\u00e9\udcff"])
def test_complete_refuses_lone_surrogates_before_io(driver: Driver, value: str) -> None:
    """complete() with a lone surrogate raises InvalidArgumentError; the claim stays held and no result is stored."""
    key = unique()
    owner = driver.claim(key)
    assert isinstance(owner.acquire(), Claimed)
    with pytest.raises(InvalidArgumentError, match="surrogate"):
        owner.complete(value)
    assert stored(driver.raw, owner) is None
    assert driver.raw.get(owner.claim_key) == owner.token.encode()


# --------------------------------------------------------------------------- decode_responses


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("value", [b"\xff", b"caf\xe9", b"\xc3"])
def test_decoding_client_refuses_non_utf8_bytes_at_complete(
    make_driver: Callable[..., Driver], kind: str, value: bytes
) -> None:
    """On a decode_responses client, complete(non-UTF-8 bytes) raises InvalidArgumentError and writes nothing."""
    driver = make_driver(kind, decode_responses=True)
    key = unique()
    owner = driver.claim(key)
    assert isinstance(owner.acquire(), Claimed)
    with pytest.raises(InvalidArgumentError, match="decode"):
        owner.complete(value)
    assert driver.raw.get(owner.claim_key) == owner.token  # the token, no record (a decoding client)
    assert isinstance(driver.claim(key).acquire(), InFlight)  # duplicates can still read the key


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_decoding_client_stores_utf8_bytes_and_bytes_clients_store_any(
    make_driver: Callable[..., Driver], kind: str
) -> None:
    """UTF-8 bytes on a decode_responses client come back as str; a bytes client stores non-UTF-8 bytes as they are."""
    text, plain = make_driver(kind, decode_responses=True), make_driver(kind)
    key, other = unique(), unique()
    owner = text.claim(key)
    owner.acquire()
    owner.complete("café".encode())
    assert text.claim(key).acquire() == Completed(key=key, value="café")
    owner = plain.claim(other)
    owner.acquire()
    owner.complete(b"\xff\xfe")
    assert plain.claim(other).acquire() == Completed(key=other, value=b"\xff\xfe")


def test_reply_encoding_reads_each_client(backend: Backend, run: Runner) -> None:
    """reply_encoding() tells decoding clients from bytes clients, sync and asyncio, on every backend."""
    assert reply_encoding(backend.sync()) == ("utf-8", False)
    assert reply_encoding(backend.sync(decode_responses=True)) == ("utf-8", True)

    async def main() -> tuple[tuple[str, bool], tuple[str, bool]]:
        plain, text = backend.async_(), backend.async_(decode_responses=True)
        try:
            return reply_encoding(plain), reply_encoding(text)
        finally:
            await plain.aclose()
            await text.aclose()

    assert run(main()) == (("utf-8", False), ("utf-8", True))


def test_check_value_follows_the_client_encoding() -> None:
    """check_value: surrogates never pass; bytes must decode only for decoding clients, in the client's encoding."""
    assert check_value(b"\xff", "k") == b"\xff"
    assert check_value("café", "k", text_only=True) == "café"
    with pytest.raises(InvalidArgumentError):
        check_value(b"\xff", "k", text_only=True)
    with pytest.raises(InvalidArgumentError):
        check_value("\ud800", "k")
    assert check_value(b"\xff", "k", text_only=True, encoding="iso8859-1") == b"\xff"
    with pytest.raises(InvalidArgumentError):
        check_value("\u20ac", "k", encoding="iso8859-1")  # the euro sign has no latin-1 byte
    with pytest.raises(InvalidArgumentError, match="CLAIMED"):
        check_value(b"CLAIMED", "k", text_only=True)


# --------------------------------------------------------------------------- client kinds


def test_wrong_kind_clients_are_type_errors_at_construction(backend: Backend, run: Runner) -> None:
    """Claim over an asyncio client and AsyncClaim over a sync one raise InvalidArgumentTypeError, with no I/O."""
    sync_client = backend.sync()
    assert isinstance(Claim(sync_client, unique()).acquire(), Claimed)

    async def main() -> None:
        async_client = backend.async_()
        try:
            with pytest.raises(InvalidArgumentTypeError, match="AsyncClaim"):
                Claim(async_client, "k")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentTypeError, match="AsyncClaim"):
                Claim.from_keys(async_client, "{k}c", "{k}r")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentTypeError, match="an asyncio client"):
                AsyncClaim(sync_client, "k")
            with pytest.raises(InvalidArgumentTypeError, match="an asyncio client"):
                AsyncClaim.from_keys(sync_client, "{k}c", "{k}r")
            assert isinstance(await AsyncClaim(async_client, unique()).acquire(), Claimed)
        finally:
            await async_client.aclose()

    run(main())


@pytest.mark.parametrize(
    "client",
    [None, object(), "redis://localhost:6379", 42, Nasty()],
    ids=["None", "object", "url", "int", "nasty"],  # fixed ids: pytest-xdist's processes must collect the same names
)
def test_non_clients_are_type_errors(client: Any) -> None:
    """Anything without execute_command, evalsha and eval is refused by every entry point."""
    every_family = "redis-py, valkey-py or GLIDE client"
    for make in (Claim, AsyncClaim):
        with pytest.raises(InvalidArgumentTypeError, match=every_family):
            make(client, "k")
        with pytest.raises(InvalidArgumentTypeError, match=every_family):
            make.from_keys(client, "c", "r")
    with pytest.raises(InvalidArgumentTypeError, match=every_family):
        idempotent(client, key="k")(work)
    with pytest.raises(InvalidArgumentTypeError, match=r"an asyncio client \(redis\.asyncio\.Redis, .*valkey\.asyncio"):
        idempotent(client, key="k")(async_work)


class Wrapped:
    """A redis-py-compatible client that is no redis-py class: it forwards to a real one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Forwarded."""
        return self._inner.execute_command(*args, **options)

    def evalsha(self, *args: Any) -> Any:
        """Forwarded."""
        return self._inner.evalsha(*args)

    def eval(self, *args: Any) -> Any:
        """Forwarded."""
        return self._inner.eval(*args)


class AsyncWrapped(Wrapped):
    """The asyncio twin of ``Wrapped``."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Forwarded and awaited."""
        return await self._inner.execute_command(*args, **options)

    async def evalsha(self, *args: Any) -> Any:
        """Forwarded and awaited."""
        return await self._inner.evalsha(*args)

    async def eval(self, *args: Any) -> Any:
        """Forwarded and awaited."""
        return await self._inner.eval(*args)


def test_compatible_clients_are_judged_by_what_they_do(run: Runner) -> None:
    """Clients that are no redis-py class work when their kind fits (awaitable execute_command or not)."""
    sync_client = Wrapped(sync_fake())
    assert client_kind(sync_client) is False
    assert isinstance(Claim(sync_client, "k").acquire(), Claimed)  # type: ignore[arg-type]
    assert idempotent(sync_client, key="k", namespace=unique("ns"))(work)("x") == "did x"
    with pytest.raises(InvalidArgumentTypeError):
        AsyncClaim(sync_client, "k")  # type: ignore[arg-type]

    async def main() -> None:
        async_client = AsyncWrapped(fake_async_redis(native=False))
        assert client_kind(async_client) is True
        assert isinstance(await AsyncClaim(async_client, "k").acquire(), Claimed)  # type: ignore[arg-type]
        assert await idempotent(async_client, key="k", namespace=unique("ns"))(async_work)("x") == "did x"
        with pytest.raises(InvalidArgumentTypeError):
            Claim(async_client, "k")  # type: ignore[arg-type]

    run(main())


# --------------------------------------------------------------------------- the decorator's calls


def test_decorated_calls_with_bad_arguments_raise_the_tree() -> None:
    """Missing arguments, int keys past the digit limit and self-containing arguments raise InvalidArgument*."""
    client = sync_fake()
    wrapped = idempotent(client, key="k", namespace="calls")(work)
    with pytest.raises(InvalidArgumentTypeError, match="missing"):
        wrapped()  # type: ignore[call-arg]
    with pytest.raises(InvalidArgumentError, match="digits"):
        wrapped(HUGER)  # type: ignore[arg-type]

    def collect(k: str, items: list[Any]) -> str:
        return k

    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(InvalidArgumentTypeError, match="fingerprint"):
        idempotent(client, key="k", namespace="calls")(collect)("x", looped)
    with pytest.raises(InvalidArgumentError, match="empty"):
        idempotent(client, key=lambda k: "", namespace="calls")(work)("x")
    assert snapshot(client) == {}


class CallableObject:
    """A callable that is not a function: it has no __qualname__ of its own."""

    def __call__(self, k: str) -> str:
        """The body."""
        return k


@pytest.mark.parametrize(
    ("target", "options"),
    [(42, {}), (CallableObject(), {}), (work, {"keep_alive": "yes"}),
     (work, {"key": "args"}), (work, {"native": ["auto"]}), (work, {"fingerprint": 3})],
    ids=["not-callable", "object-default-namespace", "keep_alive", "missing-key", "native", "fingerprint"],
)  # fmt: skip
def test_decorating_odd_targets_raises_the_tree(target: Any, options: dict[str, Any]) -> None:
    """Decorating a non-function, or with a non-bool keep_alive or odd options, raises InvalidArgument*."""
    options.setdefault("key", "k")
    with pytest.raises(ARGUMENT_ERRORS):
        idempotent(sync_fake(), **options)(target)


def test_key_may_not_name_a_variadic_parameter() -> None:
    """key="args" on def f(*args) is refused at decoration: it holds no single key."""

    def variadic(*args: str) -> str:
        return "x"

    with pytest.raises(InvalidArgumentError, match="args"):
        idempotent(sync_fake(), key="args")(variadic)


def test_describe_never_raises() -> None:
    """Error messages show bad arguments shortened, even ones whose repr raises."""
    assert describe(Nasty()) == "<Nasty object>"
    assert describe(HUGER) == "<int object>"
    assert len(describe("x" * 1000)) == 80


# --------------------------------------------------------------------------- the fuzz

SURROGATE_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)
ODD_NUMBERS = st.sampled_from(
    [0, -1, 1, 2, 3, 2**31 - 1, 2**31, 2**63, HUGE, -HUGE, HUGER, 0.0, 0.5, 1e-300, 1e300, math.inf, -math.inf,
     math.nan, True, False, Decimal("1"), 1 + 0j]
)  # fmt: skip
ODD_TEXT = st.sampled_from(
    ["", " ", "k", "a b", "ns{x}", "{", "}", "%7B", "\x00", "\t", "\ud800", "a\udcffb", "CLAIMED", "auto", "never",
     "always", "done x", "é", "k" * 300]
)  # fmt: skip
JUNK: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    ODD_NUMBERS,
    st.integers(),
    st.floats(),
    ODD_TEXT,
    SURROGATE_TEXT,
    st.binary(max_size=8),
    st.sampled_from([b"\xff", b"CLAIMED", bytearray(b"x"), memoryview(b"x")]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.tuples(st.integers()),
    st.builds(object),
    st.builds(Nasty),
    st.sampled_from([int, str, ValueError, (ValueError,), (ValueError, 3), print, lambda *a, **k: "x", ...]),
)


def half(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` or ``bad``, half and half (one_of would weigh each of JUNK's branches like ``good``)."""
    return st.booleans().flatmap(lambda flip: bad if flip else good)  # hypothesis favours False: the good side


def maybe(valid: Any) -> st.SearchStrategy[Any]:
    """The valid value or junk, half and half."""
    return half(st.just(valid), JUNK)


KEYS = half(st.sampled_from(["fresh", "held", "done"]), JUNK)
# Mostly str and bytes: stored ones are read back through every kind of client.
VALUES = st.integers(0, 3).flatmap(
    lambda n: (
        JUNK
        if n == 3
        else st.one_of(
            st.binary(max_size=8),
            SURROGATE_TEXT,
            st.sampled_from(["CLAIMED", b"CLAIMED", b"\xff", "\xe9", b"\xc3\xa9"]),
        )
    )
)
NO_IO_AFTER = ("replicas", "replica_timeout_ms")  # valid values would make WAIT block on absent replicas


def pick(draw: Callable[[st.SearchStrategy[Any]], Any], items: list[Any]) -> Any:
    """One of ``items``, drawn by index (sampled_from hashes them, and some junk refuses that)."""
    return items[draw(st.integers(0, len(items) - 1))]


def any_client(world: World, draw: Callable[[st.SearchStrategy[Any]], Any]) -> Any:
    """Mostly a client of the right kind; sometimes one of the wrong kind, or no client at all."""
    return pick(draw, world.wrong_clients if draw(st.integers(0, 3)) == 3 else world.clients)


def keyword_options(func: Callable[..., Any], draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, Any]:
    """Keyword-only parameters of ``func``: each left out (mostly), or passed its default or junk.

    Read from the signature, so a keyword added later is fuzzed too.
    """
    options: dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if param.kind is param.KEYWORD_ONLY and draw(st.integers(0, 3)) == 3:
            options[name] = draw(JUNK if param.default is param.empty else maybe(param.default))
    return options


def expected(value: bytes | str, decodes: bool) -> bytes | str:
    """What a duplicate reads back for a stored value."""
    if decodes:
        return value.decode("utf-8") if isinstance(value, bytes) else value
    return value.encode("utf-8") if isinstance(value, str) else value


CLIENT_OPTIONS = [(native, decodes) for native in (False, True) for decodes in (False, True)]


class World:
    """Clients on one fake server, seeded before every example, and the way to call the API under test."""

    def __init__(self, asyncio_: bool) -> None:
        self.server = fakeredis.FakeServer()
        self.raw = fake_redis(native=False, server=self.server)
        self.run = Runner() if asyncio_ else None
        self.clients: list[Any] = self.run(self._async_clients()) if self.run else self._sync_clients()
        wrong = (
            [fake_redis(native=False, server=self.server)]
            if self.run
            else [fake_async_redis(native=False, server=self.server)]
        )
        self.wrong_clients: list[Any] = [*wrong, None, object(), "redis://localhost", Nasty()]
        self.handle_class: Any = AsyncClaim if self.run else Claim

    def _sync_clients(self) -> list[Any]:
        return [fake_redis(native=n, server=self.server, decode_responses=d) for n, d in CLIENT_OPTIONS]

    async def _async_clients(self) -> list[Any]:
        return [fake_async_redis(native=n, server=self.server, decode_responses=d) for n, d in CLIENT_OPTIONS]

    def close(self) -> None:
        """Close the clients and the loop."""
        if self.run:
            for client in self.clients:
                self.run(client.aclose())
            self.run.close()

    def seed(self) -> None:
        """An empty keyspace but for a claim in flight ("held") and a completed one ("done")."""
        self.raw.flushall()
        for namespace in ("goblin", "fz"):
            self.raw.set(f"{namespace}:{{held}}", "other", ex=600)
            self.raw.set(f"{namespace}:{{done}}", "done other v", ex=600)

    def call(self, value: Any) -> Any:
        """``value``, awaited on the loop if it is awaitable."""
        if self.run and inspect.isawaitable(value):
            return self.run(value)
        return value

    def decodes(self, client: Any) -> bool:
        """Whether ``client`` returns str."""
        return bool(client.get_encoder().decode_responses)


class UserCodeError(Exception):
    """A user's key or fingerprint function failed: its error propagates as it is, before any I/O."""


def guarded(option: Any) -> Any:
    """``option``, and if it is callable, with its own errors marked as ``UserCodeError``."""
    if not callable(option):
        return option

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return option(*args, **kwargs)
        except Exception as exc:
            raise UserCodeError(describe(option)) from exc

    return call


def attempt(world: World, label: str, action: Callable[[], Any], *, no_io: bool = False) -> tuple[bool, Any]:
    """Run ``action``: it works, or raises a GoblinClaimError (or the user's own error) and writes nothing.

    Returns ``(True, result)`` when it worked, ``(False, error)`` when it was refused.
    With ``no_io`` (a constructor or a decoration) any refusal must be an argument error.
    """
    before = snapshot(world.raw)
    try:
        result = action()
    except (GoblinClaimError, UserCodeError) as exc:
        refused = exc
    else:
        event(f"{label}: worked")
        return True, result
    event(f"{label}: {type(refused).__name__}")
    assert snapshot(world.raw) == before, f"{type(refused).__name__} after a write: {refused}"
    if no_io:
        assert isinstance(refused, ARGUMENT_ERRORS), repr(refused)
    return False, refused


def fuzz_handles(world: World, data: st.DataObject) -> None:
    """Constructors, from_keys, complete, extend, wait and keep_alive with junk; round trips when accepted."""
    draw = data.draw
    client = any_client(world, draw)
    cls = world.handle_class
    entry = draw(st.sampled_from(["new", "from_keys", "complete", "extend", "wait", "keep_alive"]))
    if entry in ("new", "from_keys"):
        options = keyword_options(cls.from_keys if entry == "from_keys" else cls.__init__, draw)
        if entry == "new":
            key = draw(KEYS)
            made, handle = attempt(world, "constructor", lambda: cls(client, key, **options), no_io=True)
        else:
            claim_key, result_key = draw(maybe("fz:{fresh}:claim")), draw(maybe("fz:{fresh}:result"))
            made, handle = attempt(
                world, "from_keys()", lambda: cls.from_keys(client, claim_key, result_key, **options), no_io=True
            )
        if made and not set(options) & set(NO_IO_AFTER):
            attempt(world, "acquire()", lambda: world.call(handle.acquire()))
        return
    client = pick(draw, world.clients)
    if entry == "wait":  # never on the key held by another owner: a valid timeout would really wait
        handle = cls(client, draw(st.sampled_from(["fresh", "done"])))
        timeout = keyword_or_default(draw, "timeout", 0)
        attempt(world, "wait()", lambda: world.call(handle.wait(**timeout)))
        return
    key = draw(st.sampled_from(["fresh", "held", "done"]))
    handle = cls(client, key)
    world.call(handle.acquire())
    if entry == "complete":
        value = draw(VALUES)
        stored, _ = attempt(world, "complete()", lambda: world.call(handle.complete(value)))
        if stored:
            reread = world.call(cls(client, key).acquire())
            assert reread == Completed(key=key, value=expected(value, world.decodes(client)))
    elif entry == "extend":
        lease = keyword_or_default(draw, "lease", 30)
        attempt(world, "extend()", lambda: world.call(handle.extend(**lease)))
    else:
        interval = keyword_or_default(draw, "interval", None)
        made, keep = attempt(world, "keep_alive()", lambda: handle.keep_alive(**interval))
        if made:
            world.call(enter_and_leave(keep))


def keyword_or_default(draw: Callable[[st.SearchStrategy[Any]], Any], name: str, valid: Any) -> dict[str, Any]:
    """``{name: junk or the valid value}``, or nothing (the default)."""
    return {name: draw(maybe(valid))} if draw(st.booleans()) else {}


def enter_and_leave(keep: Any) -> Any:
    """Enter and leave a keep-alive at once (a coroutine for the asyncio one)."""
    if hasattr(keep, "__aenter__"):

        async def both() -> None:
            async with keep:
                pass

        return both()
    with keep:
        return None


def fuzz_decorator(world: World, data: st.DataObject) -> None:
    """@idempotent with junk options, key functions, fingerprints and call arguments; replays when accepted."""
    draw = data.draw
    runs: list[object] = []

    def body(k: Any, v: Any = None) -> str:
        runs.append(k)
        return "ok"

    async def async_body(k: Any, v: Any = None) -> str:
        return body(k, v)

    target: Any = async_body if world.run else body
    client = any_client(world, draw)
    if draw(st.booleans()):  # junk options, then a plain call
        options = keyword_options(idempotent, draw)
        for name in ("key", "fingerprint"):  # a junk callable may fail on its own: that is the user's error
            if name in options:
                options[name] = guarded(options[name])
        options.setdefault("key", "k")
        options.setdefault("namespace", "fz")
        args: tuple[Any, ...] = ("fresh",)
    else:  # plain options, junk keys, fingerprints and arguments
        key_result, fp_result = draw(KEYS), draw(JUNK)
        options = {
            "key": draw(st.sampled_from(["k", lambda k, v=None: key_result])),
            "fingerprint": draw(st.sampled_from([None, lambda k, v=None: fp_result])),
            "namespace": "fz",
            "wait": 0,
        }
        if draw(st.booleans()):
            del options["fingerprint"]  # the default: all arguments
        args = (draw(KEYS), draw(JUNK))
    made, wrapped = attempt(world, "@idempotent", lambda: idempotent(client, **options)(target), no_io=True)
    if not made:
        return
    done, result = attempt(world, "decorated call", lambda: world.call(wrapped(*args)))
    if done:
        assert result == "ok"
        count = len(runs)
        again, replay = attempt(world, "duplicate call", lambda: world.call(wrapped(*args)))
        assert (again, replay) == (True, "ok")
        assert len(runs) == count  # the duplicate did not run the function


SYNC_EXAMPLES = 1000
ASYNC_EXAMPLES = 500
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(params=["sync", "asyncio"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """Fake clients of one kind on one server."""
    made = World(asyncio_=request.param == "asyncio")
    yield made
    made.close()


def test_fuzz_every_entry_point_with_junk(world: World) -> None:
    """Junk at every public entry point: it works (and round-trips), or raises the tree having written nothing."""
    examples = ASYNC_EXAMPLES if world.run else SYNC_EXAMPLES

    @settings(FUZZ, max_examples=examples)
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        world.seed()
        if data.draw(st.integers(0, 2)):
            fuzz_handles(world, data)
        else:
            fuzz_decorator(world, data)

    fuzz()
