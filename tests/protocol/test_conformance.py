"""The implementations of the protocol, held to the seed side by side.

The reference module on a real redis-server, the seed's own Lua script on a stock
redis-server, the fakeredis plug-in (``goblin_claim.testing``), Valkey's built-in
owner checks (``DELIFEQ`` for CAD, ``SET ... IFEQ ... EX`` for the lease renewal,
on valkey-server without the module), the servers' own claim of the one-key record
(``SET key token NX GET EX seconds`` on Redis 7.0, Redis 8.2, Valkey 9 and fakeredis,
its nil read as ``CLAIMED``, as the SDK reads it) and a pure-Python model
(``tests/support/protocol_model.py``) run every row of the seed's table and its edge
cases, and the SDK's lease renewal (extend.lua where there is no built-in check),
called directly, inside MULTI/EXEC and from a script (``redis.call``), and must
agree: by reply, by kind of error, and by what the keyspace holds afterwards
(types, values and TTLs). Each case also states the reply the seed prescribes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from goblin_claim.testing import fake_redis
from tests.conftest import IN_CI, unique
from tests.support import servers
from tests.support.protocol_impls import CALL_CLAIM, CONTEXTS, ClientImpl, ModelImpl
from tests.support.protocol_model import Error, Model, Reply, error_kind
from tests.support.servers import RedisProcess

WORKER_3 = b"worker-3"
Impl = ClientImpl | ModelImpl


@pytest.fixture
def impls(
    request: pytest.FixtureRequest, redis_native: RedisProcess, redis_standalone: RedisProcess
) -> Iterator[list[Impl]]:
    """The module, the seed's script, the plug-in, Valkey's built-ins, the servers' own claim and the model.

    Each on a data set of its own (a database of its own on a shared server). Valkey's and
    Redis 8.2's join where their servers are there (always in CI).
    """
    module, stock, fake = redis_native.client(), redis_standalone.client(), fake_redis(native=True)
    clients = [module, stock, fake, redis_standalone.client(db=1), fake_redis(native=False)]
    found = [
        ClientImpl("module", module, native=True),
        ClientImpl("seed script", stock, native=False),
        ClientImpl("plug-in", fake, native=True),
        ClientImpl("redis 7 SET NX GET", clients[3], native=False, own_claim=True),
        ClientImpl("fakeredis SET NX GET", clients[4], native=False, own_claim=True),
    ]
    if IN_CI or servers.valkey_server_binary() is not None:
        valkey: RedisProcess = request.getfixturevalue("valkey_standalone")
        clients += [valkey.client(), valkey.client(db=1)]
        found.append(ClientImpl("valkey built-ins", clients[-2], native=False, builtin=True))
        found.append(ClientImpl("valkey SET NX GET", clients[-1], native=False, own_claim=True))
    if IN_CI or servers.redis8_server_binary() is not None:
        redis8: RedisProcess = request.getfixturevalue("redis8_standalone")
        clients.append(redis8.client(db=1))
        found.append(ClientImpl("redis 8.2 SET NX GET", clients[-1], native=False, own_claim=True))
    yield [*found, ModelImpl()]
    for client in clients:
        client.close()


# --------------------------------------------------------------------------- the cases

# Each case: (setup, command, arguments, the seed's reply). "c" and "r" stand for a
# claim key and a result key unique to the test; ("sleep", ms) lets time pass.
HUGE_VALID = b"4611686018427387"  # about 2**62 ms: Redis takes it (the claim lives ~146 million years)
CASES: dict[str, tuple[tuple[tuple[Any, ...], ...], str, tuple[Any, ...], Reply]] = {
    # The table, row by row.
    "free: CLAIMED": ((), "claim", ("c", "r", "worker-9", b"30"), b"CLAIMED"),
    "held, result stored: the value": (
        (("set", "c", WORKER_3), ("set", "r", b"charged:txn_551")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"charged:txn_551",
    ),
    "held, result absent: nil": ((("set", "c", WORKER_3),), "claim", ("c", "r", "worker-9", b"30"), None),
    "held, result a hash: WRONGTYPE": (
        (("set", "c", WORKER_3), ("hset", "r")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        Error("WRONGTYPE"),
    ),
    # Edges of the rows.
    "held by the same token: nil (the seed does not tell owners apart)": (
        (("set", "c", "worker-9"),),
        "claim",
        ("c", "r", "worker-9", b"30"),
        None,
    ),
    "held, result empty: the empty value, not nil": (
        (("set", "c", WORKER_3), ("set", "r", b"")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"",
    ),
    "held, result binary: exact bytes": (
        (("set", "c", WORKER_3), ("set", "r", b"\x00\xff\r\n$-1\r\n")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"\x00\xff\r\n$-1\r\n",
    ),
    "held, result an integer (stored int-encoded): its digits": (
        (("set", "c", WORKER_3), ("set", "r", b"9223372036854775807")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"9223372036854775807",
    ),
    "held, result long (stored raw): exact bytes": (
        (("set", "c", WORKER_3), ("set", "r", b"x" * 100_000)),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"x" * 100_000,
    ),
    "claim_key a hash, result absent: nil (NX tests existence only)": (
        (("hset", "c"),),
        "claim",
        ("c", "r", "worker-9", b"30"),
        None,
    ),
    "claim_key a hash, result stored: the value": (
        (("hset", "c"), ("set", "r", b"done")),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"done",
    ),
    "free, result a hash: CLAIMED (the result is not read)": (
        (("hset", "r"),),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"CLAIMED",
    ),
    "result_key is claim_key, free: CLAIMED": ((), "claim", ("c", "c", "worker-9", b"30"), b"CLAIMED"),
    "result_key is claim_key, held: the holder's token": (
        (("set", "c", WORKER_3),),
        "claim",
        ("c", "c", "worker-9", b"30"),
        WORKER_3,
    ),
    "result_key is claim_key, a hash: WRONGTYPE": (
        (("hset", "c"),),
        "claim",
        ("c", "c", "worker-9", b"30"),
        Error("WRONGTYPE"),
    ),
    "result_key is claim_key, held by the same token: the token (only the client tells its own)": (
        (("set", "c", "worker-9"),),
        "claim",
        ("c", "c", "worker-9", b"30"),
        b"worker-9",
    ),
    "result_key is claim_key, a completed record: the record": (
        (("set", "c", b"done worker-3 charged:txn_551"),),
        "claim",
        ("c", "c", "worker-9", b"30"),
        b"done worker-3 charged:txn_551",
    ),
    "result_key is claim_key, an empty value: the empty value": (
        (("set", "c", b""),),
        "claim",
        ("c", "c", "t", b"30"),
        b"",
    ),
    "result_key is claim_key, lapsed: CLAIMED": (
        (("set", "c", WORKER_3, 1), ("sleep", 5)),
        "claim",
        ("c", "c", "worker-9", b"30"),
        b"CLAIMED",
    ),
    "lapsed claim reads as free: CLAIMED": (
        (("set", "c", WORKER_3, 1), ("sleep", 5)),
        "claim",
        ("c", "r", "worker-9", b"30"),
        b"CLAIMED",
    ),
    "lapsed result reads as nil": (
        (("set", "c", WORKER_3), ("set", "r", b"old", 1), ("sleep", 5)),
        "claim",
        ("c", "r", "worker-9", b"30"),
        None,
    ),
    "huge but valid seconds: CLAIMED": ((), "claim", ("c", "r", "worker-9", HUGE_VALID), b"CLAIMED"),
    # GOBLIN.CAD
    "CAD match: 1, deleted": ((("set", "c", WORKER_3),), "cad", ("c", WORKER_3), 1),
    "CAD mismatch: 0, kept": ((("set", "c", WORKER_3),), "cad", ("c", b"worker-9"), 0),
    "CAD missing: 0": ((), "cad", ("c", WORKER_3), 0),
    "CAD lapsed: 0": ((("set", "c", WORKER_3, 1), ("sleep", 5)), "cad", ("c", WORKER_3), 0),
    "CAD prefix of the value: 0": ((("set", "c", WORKER_3),), "cad", ("c", b"worker-"), 0),
    "CAD integer value, match: 1": ((("set", "c", b"42"),), "cad", ("c", b"42"), 1),
    "CAD wrong type: WRONGTYPE, kept": ((("hset", "c"),), "cad", ("c", WORKER_3), Error("WRONGTYPE")),
    # The lease renewal (extend.lua, SET ... IFEQ ... EX): the seconds are always a positive int.
    "extend held by the token: 1, the lease renewed": (
        (("set", "c", WORKER_3, 5000),),
        "extend",
        ("c", WORKER_3, b"30"),
        1,
    ),
    "extend held without an expiry: 1, now it expires": (
        (("set", "c", WORKER_3),),
        "extend",
        ("c", WORKER_3, b"30"),
        1,
    ),
    "extend held by another token: 0, kept": (
        (("set", "c", WORKER_3, 5000),),
        "extend",
        ("c", b"worker-9", b"30"),
        0,
    ),
    "extend missing: 0, nothing made": ((), "extend", ("c", WORKER_3, b"30"), 0),
    "extend lapsed: 0": ((("set", "c", WORKER_3, 1), ("sleep", 5)), "extend", ("c", WORKER_3, b"30"), 0),
    "extend completed (the done marker): 0, kept": (
        (("set", "c", b"done worker-3", 5000),),
        "extend",
        ("c", WORKER_3, b"30"),
        0,
    ),
    "extend prefix of the value: 0": ((("set", "c", WORKER_3, 5000),), "extend", ("c", b"worker-", b"30"), 0),
    "extend integer value, match: 1": ((("set", "c", b"42", 5000),), "extend", ("c", b"42", b"30"), 1),
    "extend binary token, match: 1": (
        (("set", "c", b"\x00\xff\r\n", 5000),),
        "extend",
        ("c", b"\x00\xff\r\n", b"30"),
        1,
    ),
    "extend wrong type: WRONGTYPE, kept": ((("hset", "c"),), "extend", ("c", WORKER_3, b"30"), Error("WRONGTYPE")),
}
# A bad seconds is an error whether the claim is free or held (SET checks it before NX).
BAD_SECONDS: dict[bytes, str] = {
    b"0": "invalid expire",
    b"-1": "invalid expire",
    b"1.5": "not an integer",
    b"abc": "not an integer",
    b" 5": "not an integer",
    b"+5": "not an integer",
    b"05": "not an integer",
    b"-0": "not an integer",
    b"": "not an integer",
    b"9223372036854775": "invalid expire",  # LLONG_MAX / 1000: the absolute expiry overflows
    b"9223372036854775807": "invalid expire",  # LLONG_MAX: seconds * 1000 overflows
    b"9223372036854775808": "not an integer",  # past a long long
}
for _seconds, _kind in BAD_SECONDS.items():
    for _held in (False, True):
        _setup: tuple[tuple[Any, ...], ...] = (("set", "c", WORKER_3), ("set", "r", b"v")) if _held else ()
        CASES[f"seconds {_seconds.decode()!r}, {'held' if _held else 'free'}: {_kind}"] = (
            _setup, "claim", ("c", "r", "worker-9", _seconds), Error(_kind),
        )  # fmt: skip
        # The one-key record (SET ... NX GET's job): the expiry is checked before NX and before GET.
        _one: tuple[tuple[Any, ...], ...] = (("set", "c", WORKER_3),) if _held else ()
        CASES[f"one key, seconds {_seconds.decode()!r}, {'held' if _held else 'free'}: {_kind}"] = (
            _one, "claim", ("c", "c", "worker-9", _seconds), Error(_kind),
        )  # fmt: skip


def _names(prefix: str, args: Sequence[Any]) -> list[bytes]:
    return [f"{prefix}:{arg}".encode() if arg in ("c", "r") else (arg if isinstance(arg, bytes) else arg.encode())
            for arg in args]  # fmt: skip


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("case", list(CASES))
def test_implementations_agree_with_the_seed(impls: list[Impl], case: str, context: str) -> None:
    """Module, seed script, plug-in and model give the seed's reply and leave the same keyspace."""
    setup, command, args, expected = CASES[case]
    prefix = unique("conformance")
    keys = [f"{prefix}:c".encode(), f"{prefix}:r".encode()]
    for op in setup:
        if op[0] == "sleep":
            time.sleep(op[1] / 1000)
            continue
        for impl in impls:
            impl.arrange((op[0], *_names(prefix, op[1:2]), *op[2:]))
    replies = {impl.name: impl.run(command, context, _names(prefix, args)) for impl in impls}
    assert replies == dict.fromkeys(replies, expected), case
    looks = {impl.name: impl.look(keys) for impl in impls}
    reference = looks["model"]
    for name, seen in looks.items():
        assert all(a.agrees(b) for a, b in zip(seen, reference, strict=True)), (name, seen, reference)


def test_a_claim_sets_the_token_with_the_lease(impls: list[Impl]) -> None:
    """CLAIMED leaves claim_key = token with a TTL of seconds, on every implementation."""
    for impl in impls:
        key = unique("conformance").encode()
        assert impl.run("claim", "direct", [key, key + b"r", b"worker-3", b"30"]) == b"CLAIMED"
        (look,) = impl.look([key])
        assert (look.type, look.value) == ("string", WORKER_3), impl.name
        assert 29_000 < look.ttl_ms <= 30_000, impl.name


@pytest.mark.parametrize(
    ("command", "args"),
    [("GOBLIN.CLAIM", ("c", "r", "t")), ("GOBLIN.CLAIM", ("c", "r", "t", "5", "x")),
     ("GOBLIN.CAD", ("c",)), ("GOBLIN.CAD", ("c", "t", "x"))],
)  # fmt: skip
def test_wrong_arity_is_an_error_of_the_module_plug_in_and_model(
    redis_native: RedisProcess, command: str, args: tuple[str, ...]
) -> None:
    """A wrong number of arguments is Redis's arity error from the module, the plug-in and the model."""
    module, fake = redis_native.client(), fake_redis(native=True)
    model = Model()
    run = model.claim if command == "GOBLIN.CLAIM" else model.cad
    try:
        for client in (module, fake):
            with pytest.raises(redis.ResponseError) as info:
                client.execute_command(command, *args)
            assert str(info.value) == f"wrong number of arguments for '{command.lower()}' command"
        assert run(*args) == Error("arity")
    finally:
        module.close()
        fake.close()


@pytest.mark.parametrize(
    ("seconds", "message"),
    [("0", "invalid expire time in 'goblin.claim' command"),
     ("x", "value is not an integer or out of range")],
)  # fmt: skip
def test_module_and_plug_in_word_errors_as_the_seed(redis_native: RedisProcess, seconds: str, message: str) -> None:
    """The module and the plug-in reply the seed's error texts exactly, and Redis's WRONGTYPE text."""
    module, fake = redis_native.client(), fake_redis(native=True)
    key = unique("conformance")
    try:
        for client in (module, fake):
            client.set(key, "worker-3")
            with pytest.raises(redis.ResponseError) as info:
                client.execute_command("GOBLIN.CLAIM", key, key + "r", "worker-9", seconds)
            assert str(info.value) == message  # redis-py drops the leading "ERR "
            client.hset(key + "r", "f", "v")
            with pytest.raises(redis.ResponseError) as info:
                client.execute_command("GOBLIN.CLAIM", key, key + "r", "worker-9", "5")
            assert str(info.value) == "WRONGTYPE Operation against a key holding the wrong kind of value"
    finally:
        module.close()
        fake.close()


def test_module_errors_inside_a_script_carry_the_kind(redis_native: RedisProcess) -> None:
    """From EVAL, Redis 7 suffixes the module's error with the script's name; the kind stays readable."""
    client = redis_native.client()
    try:
        with pytest.raises(redis.ResponseError) as info:
            client.eval(CALL_CLAIM, 2, "a", "b", "t", "0")
        text = str(info.value)
        assert text.startswith("invalid expire time in 'goblin.claim' command")
        assert error_kind(text) == "invalid expire"
    finally:
        client.close()
