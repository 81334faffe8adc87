"""The scripts of a unit of work, on every implementation, held to the model reply for reply.

An at-most-once record (``held <deadline_ms> <claimed_ms> <token>``), the checkpoint key
and the fence counter, arranged on each implementation and on the model
(``tests/support/protocol_model.py``), then one script run with the arguments a handle
sends (``Claim._claim_call`` and its siblings, so the keys and arguments are the SDK's
own): the reply must be the case's, the model's (clock readings within two seconds) and,
afterwards, the record, the checkpoint and the counter must hold what the model holds.

The implementations: fakeredis running the scripts (``fake_redis(native=False)``) and
with the native plug-in (``native=True``: at-most-once and checkpointed handles always run
the scripts there, the documented fallback), a stock redis-server, the redis-server with
the reference module loaded (the same fallback), Redis 8.2, Valkey 9 and a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from goblin_claim import Claim
from goblin_claim._protocol.scripts import PEEK, Script
from goblin_claim.testing import fake_redis
from tests.conftest import unique
from tests.support import servers
from tests.support.protocol_impls import Look
from tests.support.protocol_model import Error, Model, error_kind, replies_agree, values_agree

IMPLS = ("fake", "fake-native", "standalone", "native", "redis8", "valkey", "cluster")
_SESSION = {
    "standalone": "redis_standalone",
    "native": "redis_native",
    "redis8": "redis8_standalone",
    "valkey": "valkey_standalone",
    "cluster": "redis_cluster",
}


class Impl:
    """One implementation: a client that runs the scripts, or the model."""

    def __init__(self, name: str, client: Any = None) -> None:
        self.name = name
        self.client = client
        self.model = Model() if client is None else None

    def run(self, script: Script, call: tuple[Any, ...]) -> object:
        """``script`` with a handle's call (its keys, then its arguments)."""
        keys, args = call[: script.numkeys], call[script.numkeys :]
        if self.model is not None:
            return self.model.script(script.name, keys, args)
        try:
            return self.client.eval(script.source, script.numkeys, *keys, *args)
        except redis.ResponseError as exc:
            return Error(error_kind(str(exc)))

    def set(self, key: str, value: bytes, ttl_s: int | None) -> None:
        """``SET key value [EX ttl_s]``."""
        if self.model is not None:
            self.model.set(key, value, None if ttl_s is None else ttl_s * 1000)
        else:
            self.client.set(key, value, ex=ttl_s)

    def hash(self, key: str) -> None:
        """A hash at ``key``."""
        if self.model is not None:
            self.model.hset(key, "field", "value")
        else:
            self.client.hset(key, "field", "value")

    def look(self, keys: list[str]) -> list[Look]:
        """Each key's type, value and TTL."""
        if self.model is not None:
            looks = []
            for key in keys:
                entry = self.model.entry(key)
                looks.append(
                    Look("none", None, -2) if entry is None else Look(entry.type, entry.value, self.model.ttl_ms(key))
                )
            return looks
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
            pipe.get(key)
            pipe.hgetall(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
        found = []
        for index in range(0, len(replies), 4):
            kind, text, table, ttl = replies[index : index + 4]
            kind = kind.decode() if isinstance(kind, bytes) else kind
            found.append(Look(kind, text if kind == "string" else table if kind == "hash" else None, float(ttl)))
        return found


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> Iterator[Impl]:
    """Each implementation in turn (the model beside it is made by the test)."""
    name = request.param
    if name in ("fake", "fake-native"):
        client: Any = fake_redis(native=name == "fake-native")
    elif name == "cluster":
        nodes: list[servers.RedisProcess] = request.getfixturevalue("redis_cluster")
        client = redis.cluster.RedisCluster(host=servers.HOST, port=nodes[0].port)
    else:
        server: servers.RedisProcess = request.getfixturevalue(_SESSION[name])
        client = server.client()
    yield Impl(name, client)
    client.close()


# --------------------------------------------------------------------------- what a reply may be


@dataclass(frozen=True)
class Left:
    """Milliseconds a lease has left: ``positive`` while it lasts, else at most 0 (it passed)."""

    positive: bool

    def matches(self, value: object) -> bool:
        """Whether ``value`` is such a reading."""
        return type(value) is int and (value > 0) == self.positive


@dataclass(frozen=True)
class Clock:
    """A reading of the server clock in ms (a claim time), within a minute of now."""

    def matches(self, value: object) -> bool:
        """Whether ``value`` is such a reading."""
        return type(value) is int and abs(value - time.time() * 1000) < 60_000


@dataclass(frozen=True)
class Fence:
    """A fence made of the clock (microseconds)."""

    def matches(self, value: object) -> bool:
        """Whether ``value`` is such a fence."""
        return type(value) is int and abs(value - time.time() * 1_000_000) < 60_000_000


@dataclass(frozen=True)
class HeldBy:
    """An at-most-once record of ``token``."""

    token: bytes

    def matches(self, value: object) -> bool:
        """Whether ``value`` is such a record."""
        return isinstance(value, bytes) and value.startswith(b"held ") and value.endswith(b" " + self.token)


LIVE, LAPSED, CLOCK, FENCE = Left(True), Left(False), Clock(), Fence()


def matches(pattern: object, reply: object) -> bool:
    """Whether ``reply`` is what ``pattern`` says (exact, or a matcher above, element by element)."""
    if isinstance(pattern, list):
        return isinstance(reply, list) and len(pattern) == len(reply) and all(map(matches, pattern, reply))
    if isinstance(pattern, (Left, Clock, Fence, HeldBy)):
        return pattern.matches(reply)
    return type(pattern) is type(reply) and pattern == reply


# --------------------------------------------------------------------------- the cases

# Arranging: ("held", role, deadline_ms from now, claimed_ms from now, token, ttl_s) writes an
# at-most-once record; ("set", role, value, ttl_s); ("hash", role). Roles: the record, its
# checkpoint key and its fence counter. A step: (handle options, operation, value). Each
# case states what the keys hold afterwards where it matters: role -> value (a matcher, or
# None for absent) and, as a third field, the TTL in seconds it should have (roughly).
AMO = {"at_most_once": True}
CPS = {"checkpoints": True}
BOTH = {"at_most_once": True, "checkpoints": True}
W1, W3 = b"w1", b"w3"


@dataclass(frozen=True)
class Case:
    """Keys arranged, a handle's options, one operation and its reply, and what the keys hold after."""

    setup: tuple[tuple[Any, ...], ...]
    options: dict[str, Any]
    operation: str
    expected: object
    value: bytes = b"v"
    after: tuple[tuple[str, object, float | None], ...] = ()


CASES: dict[str, Case] = {
    # -- claim
    "at most once, free: CLAIMED, the attempt kept for the ttl": Case(
        (), AMO, "claim", b"CLAIMED", after=(("record", HeldBy(W1), 600), ("checkpoint", None, None))
    ),
    "at most once and fenced, free: CLAIMED with the fence": Case(
        (), {**AMO, "fencing": True}, "claim", [b"CLAIMED", FENCE], after=(("record", HeldBy(W1), 600),)
    ),
    "checkpoints, free, none saved: CLAIMED, no fence, no checkpoint": Case(
        (), CPS, "claim", [b"CLAIMED", None, []], after=(("record", W1, 30),)
    ),
    "checkpoints, free, one saved: CLAIMED with it": Case(
        (("set", "checkpoint", b"step=3", 600),), CPS, "claim", [b"CLAIMED", None, [b"step=3"]],
        after=(("checkpoint", b"step=3", 600),),
    ),
    "both and fenced, free, one saved: CLAIMED, the next fence, the checkpoint": Case(
        (("set", "checkpoint", b"step=3", 600), ("set", "fence", b"41", 600)),
        {**BOTH, "fencing": True}, "claim", [b"CLAIMED", 42, [b"step=3"]],
        after=(("record", HeldBy(W1), 600), ("fence", b"42", 600)),
    ),
    "at most once, another's attempt within its deadline: in flight, its token, claim time": Case(
        (("held", "record", 20_000, -1000, W3, 600),), AMO, "claim", [W3, LIVE, None, CLOCK],
        after=(("record", HeldBy(W3), 600),),
    ),
    "at most once, another's attempt past its deadline: interrupted (left <= 0)": Case(
        (("held", "record", -1000, -5000, W3, 600),), AMO, "claim", [W3, LAPSED, None, CLOCK],
        after=(("record", HeldBy(W3), 600),),
    ),
    "a plain claim meets a lapsed attempt: the same four entries": Case(
        (("held", "record", -1000, -5000, W3, 600),), {}, "claim", [W3, LAPSED, None, CLOCK],
    ),
    "a plain fenced claim meets an attempt: the counter third": Case(
        (("held", "record", -1000, -5000, W3, 600), ("set", "fence", b"7", 600)), {"fencing": True}, "claim",
        [W3, LAPSED, 7, CLOCK],
    ),
    "a checkpointed claim meets another's attempt: four entries, no checkpoint": Case(
        (("held", "record", -1000, -5000, W3, 600), ("set", "checkpoint", b"step=2", 600)), CPS, "claim",
        [W3, LAPSED, None, CLOCK],
    ),
    "at most once, its own attempt (sent again): in flight by its token, left > 0": Case(
        (("held", "record", 20_000, -1000, W1, 600),), AMO, "claim", [W1, LIVE, None, CLOCK],
    ),
    "checkpoints, its own claim (sent again): five entries, the checkpoint last": Case(
        (("set", "record", W1, 30), ("set", "checkpoint", b"step=4", 600)), CPS, "claim",
        [W1, LIVE, None, None, [b"step=4"]],
    ),
    "both, its own attempt (sent again): five entries, the claim time fourth": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("set", "checkpoint", b"step=4", 600)), BOTH, "claim",
        [W1, LIVE, None, CLOCK, [b"step=4"]],
    ),
    "both, its own attempt past its deadline: five entries, left <= 0": Case(
        (("held", "record", -1000, -5000, W1, 600),), BOTH, "claim", [W1, LAPSED, None, CLOCK, []],
    ),
    "checkpoints, another holds: holder and lease left": Case(
        (("set", "record", W3, 30),), CPS, "claim", [W3, LIVE],
    ),
    "at most once, completed: the record": Case(
        (("set", "record", b"done w3 receipt", 600),), BOTH, "claim", b"done w3 receipt",
    ),
    "at most once, the record a hash: WRONGTYPE, nothing written": Case(
        (("hash", "record"),), {**BOTH, "fencing": True}, "claim", Error("WRONGTYPE"),
        after=(("checkpoint", None, None), ("fence", None, None)),
    ),
    "checkpoints, the checkpoint a hash: WRONGTYPE, nothing written": Case(
        (("hash", "checkpoint"),), {**BOTH, "fencing": True}, "claim", Error("WRONGTYPE"),
        after=(("record", None, None), ("fence", None, None)),
    ),
    # -- peek (the read after GOBLIN.CLAIM's answer)
    "peek, an attempt within its deadline": Case(
        (("held", "record", 20_000, -1000, W3, 600),), {}, "peek", [W3, LIVE, None, CLOCK],
    ),
    "peek, an attempt past its deadline": Case(
        (("held", "record", -1000, -5000, W3, 600),), {}, "peek", [W3, LAPSED, None, CLOCK],
    ),
    # -- extend
    "extend its own attempt within its deadline: 1, the deadline moved, the ttl kept": Case(
        (("held", "record", 1000, -5000, W1, 600),), AMO, "extend", 1, after=(("record", HeldBy(W1), 600),),
    ),
    "extend its own attempt, the lease past the record's ttl: the key kept for the lease": Case(
        (("held", "record", 1000, -5000, W1, 10),), AMO, "extend", 1, after=(("record", HeldBy(W1), 30),),
    ),
    "extend its own attempt past its deadline: 0, unchanged": Case(
        (("held", "record", -1000, -5000, W1, 600),), AMO, "extend", 0, after=(("record", HeldBy(W1), 600),),
    ),
    "extend another's attempt: 0": Case((("held", "record", 20_000, -1000, W3, 600),), AMO, "extend", 0),
    "extend, the record a hash: WRONGTYPE": Case((("hash", "record"),), AMO, "extend", Error("WRONGTYPE")),
    # -- complete
    "complete its own attempt: 1, done for the ttl, the checkpoint deleted": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("set", "checkpoint", b"step=9", 600)), BOTH, "complete", 1,
        after=(("record", b"done w1 v", 600), ("checkpoint", None, None)),
    ),
    "complete its own attempt past its deadline (a late owner): 1, stored": Case(
        (("held", "record", -1000, -5000, W1, 600),), AMO, "complete", 1, after=(("record", b"done w1 v", 600),),
    ),
    "complete another's attempt: 0 and its record, nothing written": Case(
        (("held", "record", 20_000, -1000, W3, 600), ("set", "checkpoint", b"step=2", 600)), BOTH, "complete",
        [0, HeldBy(W3)], after=(("record", HeldBy(W3), 600), ("checkpoint", b"step=2", 600)),
    ),
    "complete sent again: 1": Case((("set", "record", b"done w1 v", 600),), BOTH, "complete", 1),
    "complete sent again with another value: 2, the first stays": Case(
        (("set", "record", b"done w1 first", 600),), BOTH, "complete", 2, after=(("record", b"done w1 first", 600),),
    ),
    "complete, the claim gone, unfenced: 3, the checkpoint kept": Case(
        (("set", "checkpoint", b"step=2", 600),), BOTH, "complete", 3, after=(("checkpoint", b"step=2", 600),),
    ),
    "complete fenced, the claim gone, the counter at its fence: 1, counter and checkpoint deleted": Case(
        (("set", "fence", b"5", 600), ("set", "checkpoint", b"step=2", 600)), {**BOTH, "fencing": True, "fence": 5},
        "complete", 1, after=(("record", b"done w1 v", 600), ("fence", None, None), ("checkpoint", None, None)),
    ),
    "complete fenced, the counter moved on: 0 and the record": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("set", "fence", b"6", 600)),
        {**BOTH, "fencing": True, "fence": 5}, "complete", [0, HeldBy(W1)], after=(("fence", b"6", 600),),
    ),
    "complete, the record a hash: WRONGTYPE": Case((("hash", "record"),), BOTH, "complete", Error("WRONGTYPE")),
    "complete, the checkpoint a hash: 1, deleted with the store": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("hash", "checkpoint")), BOTH, "complete", 1,
        after=(("checkpoint", None, None),),
    ),
    # -- release
    "release its own attempt: 1, deleted, the checkpoint kept": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("set", "checkpoint", b"step=2", 600)), BOTH, "release", 1,
        after=(("record", None, None), ("checkpoint", b"step=2", 600)),
    ),
    "release its own attempt past its deadline: 1, given back": Case(
        (("held", "record", -1000, -5000, W1, 600),), AMO, "release", 1, after=(("record", None, None),),
    ),
    "release another's attempt: 0": Case((("held", "record", 20_000, -1000, W3, 600),), AMO, "release", 0),
    "release, the record a hash: WRONGTYPE": Case((("hash", "record"),), AMO, "release", Error("WRONGTYPE")),
    # -- checkpoint
    "checkpoint its own attempt: 1, kept for the ttl": Case(
        (("held", "record", 20_000, -1000, W1, 600),), BOTH, "checkpoint", 1, value=b"step=5",
        after=(("checkpoint", b"step=5", 600),),
    ),
    "checkpoint its own claim: 1": Case(
        (("set", "record", W1, 30), ("set", "checkpoint", b"step=4", 600)), CPS, "checkpoint", 1, value=b"step=5",
        after=(("checkpoint", b"step=5", 600),),
    ),
    "checkpoint its own attempt past its deadline: 0, nothing written": Case(
        (("held", "record", -1000, -5000, W1, 600), ("set", "checkpoint", b"step=4", 600)), BOTH, "checkpoint", 0,
        value=b"step=5", after=(("checkpoint", b"step=4", 600),),
    ),
    "checkpoint another's claim: 0, its checkpoint kept": Case(
        (("set", "record", W3, 30), ("set", "checkpoint", b"theirs", 600)), CPS, "checkpoint", 0, value=b"stale",
        after=(("checkpoint", b"theirs", 600),),
    ),
    "checkpoint with no claim: 0, nothing written": Case(
        (), CPS, "checkpoint", 0, value=b"stale", after=(("checkpoint", None, None),)
    ),
    "checkpoint of completed work: 0": Case(
        (("set", "record", b"done w1 v", 600),), CPS, "checkpoint", 0, value=b"stale",
        after=(("checkpoint", None, None),),
    ),
    "checkpoint fenced, the counter at its fence: 1": Case(
        (("held", "record", 20_000, -1000, W1, 600), ("set", "fence", b"5", 600)),
        {**BOTH, "fencing": True, "fence": 5}, "checkpoint", 1, value=b"step=5",
        after=(("checkpoint", b"step=5", 600),),
    ),
    "checkpoint fenced, the counter moved on (a later owner of the token): 0": Case(
        (("set", "record", W1, 30), ("set", "fence", b"6", 600), ("set", "checkpoint", b"step=7", 600)),
        {**CPS, "fencing": True, "fence": 5}, "checkpoint", 0, value=b"step=5",
        after=(("checkpoint", b"step=7", 600),),
    ),
    "checkpoint, the record a hash: WRONGTYPE, nothing written": Case(
        (("hash", "record"),), CPS, "checkpoint", Error("WRONGTYPE"), after=(("checkpoint", None, None),)
    ),
    "checkpoint over a hash at the checkpoint key: 1, replaced": Case(
        (("set", "record", W1, 30), ("hash", "checkpoint")), CPS, "checkpoint", 1, value=b"step=1",
        after=(("checkpoint", b"step=1", 600),),
    ),
    # -- forget
    "forget an attempt and its checkpoint: 2": Case(
        (("held", "record", -1000, -5000, W3, 600), ("set", "checkpoint", b"step=2", 600)), BOTH, "forget", 2,
        after=(("record", None, None), ("checkpoint", None, None)),
    ),
    "forget without checkpoints still deletes the checkpoint: 2": Case(
        (("held", "record", -1000, -5000, W3, 600), ("set", "checkpoint", b"step=2", 600)), {}, "forget", 2,
        after=(("checkpoint", None, None),),
    ),
    "forget nothing: 0": Case((), BOTH, "forget", 0),
    "forget a hash record: 1": Case((("hash", "record"),), BOTH, "forget", 1),
}  # fmt: skip


# The client of the handles whose calls the cases run: they make their calls, never send them.
UNSENT = fake_redis(native=False)


def _handle(namespace: str, options: dict[str, Any]) -> Claim:
    """A handle of token w1 (lease 30 s, ttl 600 s) whose calls the case runs; it does no I/O."""
    options = dict(options)
    fence = options.pop("fence", None)
    handle = Claim(UNSENT, "job", namespace=namespace, token="w1", lease=30, ttl=600, **options)
    handle._fence = fence
    return handle


def _call(handle: Claim, operation: str, value: bytes) -> tuple[Script, tuple[Any, ...]]:
    """What the handle sends for ``operation``: its script and call (keys, then arguments), as the drivers do."""
    if operation == "claim":
        return handle._claim_call()
    if operation == "peek":
        return PEEK, (handle.claim_key, handle.result_key)
    if operation == "extend":
        return handle._extend_script, (handle.claim_key, handle.token, handle.lease)
    if operation == "release":
        return handle._release_script, (handle.claim_key, handle.token, "")
    if operation == "complete":
        return handle._complete_call(value)
    if operation == "checkpoint":
        return handle._checkpoint_call(value)
    assert operation == "forget"
    return handle._forget_call("")


def _roles(handle: Claim) -> dict[str, str]:
    record = handle.claim_key
    return {"record": record, "checkpoint": record + ":checkpoint", "fence": record + ":fence"}


def _arrange(target: Impl, roles: dict[str, str], op: tuple[Any, ...]) -> None:
    if op[0] == "held":
        _, role, deadline, claimed, token, ttl = op
        now = int(time.time() * 1000)
        target.set(roles[role], b"held %d %d %s" % (now + deadline, now + claimed, token), ttl)
    elif op[0] == "set":
        target.set(roles[op[1]], op[2], op[3])
    else:
        target.hash(roles[op[1]])


def _looks_agree(seen: Look, reference: Look, stalled_ms: float = 0.0) -> bool:
    """Two keys alike: type and value, and TTLs within 2 s (plus ``stalled_ms``).

    ``stalled_ms``: how long the steps that set and read the TTLs took, as a loaded
    machine can stop a test between one look and the next.
    """
    if seen.type != reference.type or not values_agree(seen.value, reference.value):
        return False
    if seen.ttl_ms < 0 or reference.ttl_ms < 0:
        return seen.ttl_ms == reference.ttl_ms
    return abs(seen.ttl_ms - reference.ttl_ms) <= 2000 + stalled_ms


@pytest.mark.parametrize("case", list(CASES))
def test_the_scripts_agree_with_the_model(impl: Impl, case: str) -> None:
    """One script on arranged keys: the case's reply, the model's reply, and the model's keyspace afterwards."""
    spec = CASES[case]
    handle = _handle(unique("unit"), spec.options)
    roles = _roles(handle)
    model = Impl("model")
    began = time.monotonic()
    for op in spec.setup:
        for target in (impl, model):
            _arrange(target, roles, op)
    script, call = _call(handle, spec.operation, spec.value)
    reply, expected = impl.run(script, call), model.run(script, call)
    assert matches(spec.expected, expected), ("the model", expected)
    assert matches(spec.expected, reply), (impl.name, reply)
    assert replies_agree(reply, expected), (impl.name, reply, expected)
    keys = list(roles.values())
    seen_looks, reference_looks = impl.look(keys), model.look(keys)
    looks = dict(zip(roles, impl.look(keys), strict=True))
    stalled_ms = (time.monotonic() - began) * 1000  # the TTLs were set and read within this
    for key, seen, reference in zip(keys, seen_looks, reference_looks, strict=True):
        assert _looks_agree(seen, reference, stalled_ms), (impl.name, key, seen, reference)
    for role, value, ttl in spec.after:
        look = looks[role]
        if value is None:
            assert look.type == "none", (role, look)
            continue
        assert matches(value, look.value), (role, look)
        assert ttl is not None
        assert abs(look.ttl_ms - ttl * 1000) <= 2000 + stalled_ms, (role, look)
