"""Random sequences of a unit of work's steps: the scripts on fakeredis and a redis-server agree with the model.

A hypothesis state machine claims (plain, at most once, with checkpoints, fenced, in
every mix), checkpoints, completes, renews, releases and forgets one key with two
tokens, lets leases and deadlines pass, and turns the record or the checkpoint key
into a hash. Each step runs the scripts with the arguments a handle sends on fakeredis
(scripts, and the native plug-in), a stock redis-server and the model
(``tests/support/protocol_model.py``); each implementation's fenced handles carry the
fence its own last win gave them. After every step the replies must agree (clock
readings within two seconds) and the record, its checkpoint and its counter must hold
the same on all four. A deadline passes by rewriting the record's deadline into the
past (its TTL kept), a lease by ``PEXPIRE key 1``: a run takes seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from goblin_claim import Claim
from goblin_claim.testing import fake_redis
from tests.conftest import unique
from tests.protocol.test_unit_conformance import UNSENT, Impl, _call, _looks_agree
from tests.support.protocol_model import replies_agree
from tests.support.servers import RedisProcess

# w1 twice: most steps are one owner's, so its checkpoints and results land as often as they are refused.
TOKENS = ("w1", "w1", "w3")
OPTIONS = {
    "plain": {},
    "at most once": {"at_most_once": True},
    "checkpoints": {"checkpoints": True},
    "both": {"at_most_once": True, "checkpoints": True},
    "fenced, at most once": {"at_most_once": True, "fencing": True},
    "fenced, both": {"at_most_once": True, "checkpoints": True, "fencing": True},
    "fenced, checkpoints": {"checkpoints": True, "fencing": True},
}
VALUES = (b"step=1", b"step=2", b"receipt")
ROLES = ("record", "checkpoint", "fence")
_HELD = re.compile(rb"held (\d+) (\d+) (.+)", re.DOTALL)


class UnitMachine(RuleBasedStateMachine):
    """Every rule runs on every implementation; replies and keys must match."""

    stock_client: ClassVar[Any] = None

    def __init__(self) -> None:
        super().__init__()
        self.namespace = unique("unit-stateful")
        self.impls = [
            Impl("fake", fake_redis(native=False)),
            Impl("plug-in", fake_redis(native=True)),
            Impl("stock", self.stock_client),
            Impl("model"),
        ]
        # Per implementation, the fence each token's last win gave it (fences read the clock).
        self.fences: dict[str, dict[str, int]] = {impl.name: {} for impl in self.impls}
        record = Claim(UNSENT, "job", namespace=self.namespace).claim_key
        self.keys = {"record": record, "checkpoint": record + ":checkpoint", "fence": record + ":fence"}

    def _handle(self, impl: Impl, token: str, options: str) -> Claim:
        handle = Claim(UNSENT, "job", namespace=self.namespace, token=token, lease=30, ttl=600, **OPTIONS[options])
        handle._fence = self.fences[impl.name].get(token)
        return handle

    def _all(self, operation: str, token: str, options: str, value: bytes = b"v") -> None:
        replies = {}
        for impl in self.impls:
            script, call = _call(self._handle(impl, token, options), operation, value)
            reply = impl.run(script, call)
            replies[impl.name] = reply
            won = operation == "claim" and isinstance(reply, list) and reply[:1] == [b"CLAIMED"]
            if won and type(reply[1]) is int:  # type: ignore[index]
                self.fences[impl.name][token] = reply[1]  # type: ignore[index]
        reference = replies["model"]
        for name, reply in replies.items():
            assert replies_agree(reply, reference), (operation, token, options, name, replies)

    @initialize(options=st.sampled_from(list(OPTIONS)))
    def first_claim(self, options: str) -> None:
        """Every run starts with w1's claim."""
        self._all("claim", "w1", options)

    @rule(token=st.sampled_from(TOKENS), options=st.sampled_from(list(OPTIONS)))
    def claim(self, token: str, options: str) -> None:
        """acquire()'s script."""
        self._all("claim", token, options)

    @rule(token=st.sampled_from(TOKENS), options=st.sampled_from(list(OPTIONS)))
    def claim_again(self, token: str, options: str) -> None:
        """acquire()'s script again (claims are what the other steps need: twice the weight)."""
        self._all("claim", token, options)

    @rule(
        operation=st.sampled_from(("checkpoint", "checkpoint", "complete", "extend")),
        token=st.sampled_from(TOKENS),
        options=st.sampled_from(list(OPTIONS)),
        value=st.sampled_from(VALUES),
    )
    def owner_step(self, operation: str, token: str, options: str, value: bytes) -> None:
        """What an owner sends while it works: checkpoint() (with checkpoints), complete(), extend()."""
        if operation == "checkpoint" and "checkpoints" not in OPTIONS[options]:
            options = "fenced, checkpoints" if "fencing" in OPTIONS[options] else "checkpoints"
        self._all(operation, token, options, value)

    @rule(
        operation=st.sampled_from(("release", "release", "forget", "peek")),
        token=st.sampled_from(TOKENS),
        options=st.sampled_from(list(OPTIONS)),
    )
    def let_go(self, operation: str, token: str, options: str) -> None:
        """release() (the owner gives the work back), forget() (an operator), or the read behind GOBLIN.CLAIM."""
        self._all(operation, token, options)

    @rule()
    def deadline_passes(self) -> None:
        """An at-most-once record's deadline passes (its TTL kept); a bare token's lease lapses."""
        now = int(time.time() * 1000)
        for impl in self.impls:
            look = impl.look([self.keys["record"]])[0]
            if look.type != "string" or not isinstance(look.value, bytes):
                continue
            held = _HELD.fullmatch(look.value)
            if held is None:
                if look.ttl_ms >= 0 and not look.value.startswith(b"done "):
                    self._expire_soon(impl, self.keys["record"])
                continue
            record = b"held %d %s %s" % (now - 1000, held[2], held[3])
            if impl.model is not None:
                entry = impl.model.entry(self.keys["record"])
                assert entry is not None
                entry.value = record
            else:
                impl.client.set(self.keys["record"], record, keepttl=True)
        time.sleep(0.003)

    @rule(role=st.sampled_from(ROLES), hashed=st.sampled_from((False, False, True)))
    def another_writer(self, role: str, hashed: bool) -> None:
        """One key's life runs out; or the record or the checkpoint becomes a hash (another writer's key)."""
        for impl in self.impls:
            if not hashed:
                self._expire_soon(impl, self.keys[role])
            elif role != "fence":
                impl.client.delete(self.keys[role]) if impl.model is None else impl.model.delete(self.keys[role])
                impl.hash(self.keys[role])
        time.sleep(0.003)

    @staticmethod
    def _expire_soon(impl: Impl, key: str) -> None:
        if impl.model is not None:
            entry = impl.model.entry(key)
            if entry is not None:
                entry.expire_at = impl.model.clock() + 1
        else:
            impl.client.pexpire(key, 1)

    @invariant()
    def keys_agree(self) -> None:
        """The record, its checkpoint and its counter hold the same everywhere."""
        keys = list(self.keys.values())
        looks = {impl.name: impl.look(keys) for impl in self.impls}
        for name, seen in looks.items():
            for a, b in zip(seen, looks["model"], strict=True):
                assert _looks_agree(a, b), (name, a, b)

    def teardown(self) -> None:
        """Delete this run's keys."""
        for impl in self.impls:
            if impl.model is None:
                impl.client.delete(*self.keys.values())
                if impl.name != "stock":
                    impl.client.close()


@pytest.fixture
def machine(redis_standalone: RedisProcess) -> Iterator[type[UnitMachine]]:
    """The state machine, with a client on a stock redis-server."""
    stock = redis_standalone.client()
    UnitMachine.stock_client = stock
    yield UnitMachine
    UnitMachine.stock_client = None
    stock.close()


def test_random_unit_of_work_steps_agree(machine: type[UnitMachine]) -> None:
    """Claims of every kind, checkpoints, completions, renewals, releases, forgets, lapses and hashes: all agree."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
