"""Random sequences of protocol steps: the module, the seed's script, the plug-in and the model agree.

A hypothesis state machine claims, compare-and-deletes, stores and deletes results,
turns keys into hashes and lets time pass, over three keys that serve as claim and
result keys in every combination. After every step all implementations must have
given the same reply and hold the same keyspace (types, values, TTLs within two
seconds). Time passes by ``PEXPIRE key 1`` and a short sleep, so leases never
lapse by accident in a slow run and a run takes seconds, not minutes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from goblin_claim.testing import fake_redis
from tests.conftest import unique
from tests.support.protocol_impls import ClientImpl, ModelImpl
from tests.support.servers import RedisProcess

KEYS = ("a", "b", "c")
TOKENS = (b"worker-3", b"worker-9")
VALUES = (b"charged:txn_551", b"", b"worker-3")
# Leases far longer than a run, so only the time_passes rules make keys lapse; and bad ones.
SECONDS = (b"30", b"60", b"0", b"-1", b"1.5", b"05", b"9223372036854775")

Impl = ClientImpl | ModelImpl


class ProtocolMachine(RuleBasedStateMachine):
    """Every rule runs on every implementation; replies and keyspaces must match."""

    # Set by the test before the machine runs: sync clients on the module's and a stock server.
    module_client: ClassVar[Any] = None
    stock_client: ClassVar[Any] = None

    def __init__(self) -> None:
        super().__init__()
        prefix = unique("stateful")
        self.names = {key: f"{prefix}:{key}".encode() for key in KEYS}
        self.impls: list[Impl] = [
            ClientImpl("module", self.module_client, native=True),
            ClientImpl("seed script", self.stock_client, native=False),
            ClientImpl("plug-in", fake_redis(native=True), native=True),
            ModelImpl(),
        ]

    def _all(self, command: str, *args: bytes) -> None:
        replies = {impl.name: impl.run(command, "direct", args) for impl in self.impls}
        assert len(set(map(repr, replies.values()))) == 1, (command, args, replies)

    @rule(
        claim_key=st.sampled_from(KEYS),
        result_key=st.sampled_from(KEYS),
        token=st.sampled_from(TOKENS),
        seconds=st.sampled_from(SECONDS),
    )
    def claim(self, claim_key: str, result_key: str, token: bytes, seconds: bytes) -> None:
        """GOBLIN.CLAIM (the seed's script on the stock server)."""
        self._all("claim", self.names[claim_key], self.names[result_key], token, seconds)

    @rule(key=st.sampled_from(KEYS), value=st.sampled_from(TOKENS + VALUES))
    def cad(self, key: str, value: bytes) -> None:
        """GOBLIN.CAD (the scripted CAD on the stock server)."""
        self._all("cad", self.names[key], value)

    @rule(key=st.sampled_from(KEYS), value=st.sampled_from(VALUES), ttl_ms=st.sampled_from([None, 60_000]))
    def store_result(self, key: str, value: bytes, ttl_ms: int | None) -> None:
        """SET key value [PX ttl]: a winner publishing its result (or anyone writing the key)."""
        for impl in self.impls:
            impl.arrange(("set", self.names[key], value, ttl_ms))

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key: str) -> None:
        """DEL key: an operator, or an eviction."""
        for impl in self.impls:
            impl.delete(self.names[key])

    @rule(key=st.sampled_from(KEYS))
    def make_hash(self, key: str) -> None:
        """The key becomes a hash: claims fall through, reads of it are WRONGTYPE."""
        for impl in self.impls:
            impl.arrange(("hset", self.names[key]))

    @rule(key=st.sampled_from(KEYS))
    def time_passes_for(self, key: str) -> None:
        """One key's life runs out (its lease or retention lapses), read lazily afterwards."""
        self._lapse([key])

    @rule()
    def time_passes(self) -> None:
        """Every key with a TTL lapses; keys without one stay."""
        model = self.impls[-1]
        assert isinstance(model, ModelImpl)
        self._lapse([key for key in KEYS if model.model.ttl_ms(self.names[key]) >= 0])

    def _lapse(self, keys: list[str]) -> None:
        for impl in self.impls:
            for key in keys:
                impl.expire_soon(self.names[key])
        time.sleep(0.003)

    @invariant()
    def keyspaces_agree(self) -> None:
        """Every implementation holds the same types, values and TTLs."""
        names = list(self.names.values())
        looks = {impl.name: impl.look(names) for impl in self.impls}
        reference = looks["model"]
        for name, seen in looks.items():
            assert all(a.agrees(b) for a, b in zip(seen, reference, strict=True)), (name, seen, reference)

    def teardown(self) -> None:
        """Delete this run's keys."""
        for impl in self.impls:
            for name in self.names.values():
                impl.delete(name)
            if isinstance(impl, ClientImpl) and impl.name == "plug-in":
                impl.client.close()


@pytest.fixture
def machine(redis_native: RedisProcess, redis_standalone: RedisProcess) -> Iterator[type[ProtocolMachine]]:
    """The state machine, with clients on the module's server and a stock one."""
    module, stock = redis_native.client(), redis_standalone.client()
    ProtocolMachine.module_client, ProtocolMachine.stock_client = module, stock
    yield ProtocolMachine
    ProtocolMachine.module_client = ProtocolMachine.stock_client = None
    module.close()
    stock.close()


def test_random_step_sequences_agree(machine: type[ProtocolMachine]) -> None:
    """Claims, CADs, stored results, deletes, hashes and time passing: all four implementations agree."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=30,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
