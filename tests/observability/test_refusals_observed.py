"""Refused commands on real servers: every operation, batch and keep-alive reacts by one rule and reports it alike.

Each test runs a redis-server of its own: a script cache flushed (SCRIPT FLUSH) before
each operation and under a keep-alive, a SET ... IFEQ the server refuses under a
keep-alive, and the reference module unloaded under a release. The notices
(``script_reload``, ``native_fallback``), the path each event reports and the
OpenTelemetry counters are checked, and the work still runs once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio

import goblin_claim
from goblin_claim import AsyncClaim, Claim, Claimed, Completed, idempotent
from goblin_claim._clients.transport import state_of
from goblin_claim._events import Event
from goblin_claim._protocol.scripts import SET_IFEQ
from tests.conftest import unique
from tests.observability.conftest import Telemetry
from tests.support.servers import HOST, RedisProcess

Start = Callable[..., RedisProcess]


@pytest.fixture
def client(own_server: Start) -> Iterator[redis.Redis]:
    """A sync client on a server of this test's own, probed and with its scripts loaded."""
    made = own_server().client()
    Claim(made, unique()).acquire()
    yield made
    made.close()


def _renewed_three_times(claim: Claim) -> None:
    """Keep ``claim`` alive (every 0.1 s) until three renewals succeeded: none may find it lost."""
    with claim.keep_alive(interval=0.1) as keeper:
        deadline = time.monotonic() + 10
        while keeper.renewals < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert keeper.renewals >= 3
    assert not keeper.lost


def _notices(events: list[Event], key: str) -> list[tuple[str, str]]:
    return [
        (e.operation, e.outcome) for e in events if e.key == key and e.operation in ("script_reload", "native_fallback")
    ]


def _flushed_then(client: redis.Redis, operation: str, key: str) -> tuple[object, str | None]:
    """Set up ``operation`` on ``key`` (native="never": every call a script), SCRIPT FLUSH, then run it once.

    Returns what it returned and the operation's event name (None: an operation without one).
    """
    claim = Claim(client, key, native="never", lease=30, checkpoints=operation == "checkpoint")
    if operation == "wait":
        Claim(client, key, lease=1).acquire()  # an owner that never finishes: the waiter takes it over
    elif operation == "release_many":
        ((claim, _),) = Claim.acquire_many(client, [key], native="never")
    elif operation not in ("acquire", "acquire_many"):
        assert isinstance(claim.acquire(), Claimed)
    client.script_flush()
    if operation == "acquire":
        return claim.acquire(), "acquire"
    if operation == "wait":
        return claim.wait(timeout=10), "wait"
    if operation == "extend":
        return claim.extend(), "extend"
    if operation == "complete":
        return claim.complete(b"v"), "complete"
    if operation == "release":
        return claim.release(), "release"
    if operation == "forget":
        return claim.forget(), "forget"
    if operation == "checkpoint":
        return claim.checkpoint(b"half"), "checkpoint"
    if operation == "acquire_many":
        ((_, outcome),) = Claim.acquire_many(client, [key], native="never")
        return outcome, "acquire_many"
    return Claim.release_many(client, [claim]), None


EXPECTED: dict[str, Callable[[object], bool]] = {
    "acquire": lambda got: isinstance(got, Claimed),
    "wait": lambda got: isinstance(got, Claimed),  # taken over once the owner's lease lapsed
    "extend": lambda got: got is None,
    "complete": lambda got: got is None,
    "release": lambda got: got is True,
    "forget": lambda got: got is True,
    "checkpoint": lambda got: got is None,
    "acquire_many": lambda got: isinstance(got, Claimed),
    "release_many": lambda got: got == [True],
}


@pytest.mark.parametrize("operation", sorted(EXPECTED))
def test_a_flushed_script_cache_is_reloaded_once_and_reported_by_every_operation(
    client: redis.Redis, events: list[Event], otel: Telemetry, operation: str
) -> None:
    """After SCRIPT FLUSH each operation sends its script's text, lands, and reports one reload; its path is script."""
    key = unique()
    got, name = _flushed_then(client, operation, key)
    assert EXPECTED[operation](got), (operation, got)
    assert _notices(events, key) == [("script_reload", "reloaded")]
    assert sum(p.value for p in otel.points("goblin_claim.script_reloads")) == 1
    if name is not None:
        (event,) = [e for e in events if e.key == key and e.operation == name]
        assert (event.path, event.error) == ("script", None)


def test_a_flush_under_a_keep_alive_is_reloaded_and_reported_as_the_drivers_do(
    client: redis.Redis, events: list[Event], otel: Telemetry
) -> None:
    """The keep-alive's renewal after SCRIPT FLUSH sends extend.lua's text, renews, and reports one reload."""
    claim = Claim(client, unique(), lease=30)
    assert isinstance(claim.acquire(), Claimed)
    client.script_flush()
    _renewed_three_times(claim)
    assert _notices(events, claim.key) == [("script_reload", "reloaded")]
    assert sum(p.value for p in otel.points("goblin_claim.script_reloads")) == 1
    renewals = [e for e in events if e.key == claim.key and e.operation == "renew"]
    assert renewals
    assert {(e.outcome, e.path) for e in renewals} == {("claimed", "script")}  # Redis 7: no SET ... IFEQ


def test_an_asyncio_keep_alive_reacts_to_a_flush_as_the_sync_one(own_server: Start, events: list[Event]) -> None:
    """AsyncKeepAlive's renewal after SCRIPT FLUSH reloads, renews and reports the same notice and path."""
    server = own_server()

    async def scenario() -> tuple[str, int, bool]:
        client = redis.asyncio.Redis(host=HOST, port=server.port)
        try:
            claim = AsyncClaim(client, unique(), lease=30)
            assert isinstance(await claim.acquire(), Claimed)
            await client.script_flush()
            async with claim.keep_alive(interval=0.1) as keeper:
                for _ in range(500):  # up to 10 s
                    if keeper.renewals >= 3:
                        break
                    await asyncio.sleep(0.02)
            return claim.key, keeper.renewals, keeper.lost
        finally:
            await client.aclose()

    key, renewals, lost = asyncio.run(scenario())
    assert renewals >= 3
    assert not lost
    assert _notices(events, key) == [("script_reload", "reloaded")]
    assert {(e.outcome, e.path) for e in events if e.key == key and e.operation == "renew"} == {("claimed", "script")}


def test_work_kept_alive_across_a_flush_runs_once(client: redis.Redis, events: list[Event]) -> None:
    """A decorated call whose scripts are flushed mid-work is renewed past its lease, stored, and replayed: one run."""
    runs: Counter[str] = Counter()

    @idempotent(client, key=lambda order: order, lease=1, namespace=unique("ns"))
    def charge(order: str) -> str:
        runs[order] += 1
        client.script_flush()
        time.sleep(1.6)  # past the 1 s lease: only the keep-alive's renewals keep the claim
        return f"charged {order}"

    order = unique()
    assert charge(order) == f"charged {order}"
    assert charge(order) == f"charged {order}"  # a replay of the stored result
    assert runs[order] == 1
    outcomes = [e.outcome for e in events if e.key == order and e.operation == "call"]
    assert outcomes == ["claimed", "completed"]
    assert "lease_lost" not in [e.outcome for e in events if e.operation == "renew"]
    # The renewal after the flush, then the store (complete.lua was flushed too): each reloads once.
    assert _notices(events, order) == [("script_reload", "reloaded")] * 2


def test_a_keep_alive_whose_set_ifeq_is_refused_falls_back_and_reports_it(
    client: redis.Redis, events: list[Event], otel: Telemetry
) -> None:
    """A table that vouched for SET ... IFEQ the server refuses: the renewal falls back once, as extend() would."""
    claim = Claim(client, unique(), lease=30)
    assert isinstance(claim.acquire(), Claimed)
    state = state_of(client)
    assert state.native is not None
    state.native = state.native | {SET_IFEQ}  # Redis 7 answers SET ... IFEQ with a syntax error
    _renewed_three_times(claim)
    assert SET_IFEQ not in state.native  # the script from now on
    assert _notices(events, claim.key) == [("native_fallback", "owner_check")]
    assert sum(p.value for p in otel.points("goblin_claim.native_fallbacks")) == 1
    assert {e.path for e in events if e.key == claim.key and e.operation == "renew"} == {"script"}


def _pair() -> tuple[str, str]:
    key = unique("n")
    return f"c:{{{key}}}", f"r:{{{key}}}"


@pytest.mark.parametrize("batch", [False, True], ids=["release", "release_many"])
def test_releases_after_the_module_is_unloaded_fall_back_and_the_work_runs_once(
    own_server: Start, goblin_module: str, events: list[Event], otel: Telemetry, batch: bool
) -> None:
    """GOBLIN.CAD gone after the probe: the release lands as the script, one fell_back; the key runs once more only."""
    server = own_server("--loadmodule", goblin_module, "--enable-module-command", "yes")
    client = server.client()
    runs: Counter[str] = Counter()
    try:
        claim = Claim.from_keys(client, *_pair())  # two keys: GOBLIN.CLAIM, and GOBLIN.CAD to release
        assert isinstance(claim.acquire(), Claimed)
        assert [e.path for e in events if e.operation == "acquire"] == ["native"]
        client.execute_command("MODULE", "UNLOAD", "goblin")  # the reference module's name
        released = Claim.release_many(client, [claim]) == [True] if batch else claim.release()
        assert released
        for _ in range(3):  # the freed key is claimed and run once more, then replayed
            again = Claim.from_keys(client, claim.claim_key, claim.result_key)
            outcome = again.acquire()
            if isinstance(outcome, Claimed):
                runs[claim.key] += 1
                again.complete(b"done")
            else:
                assert isinstance(outcome, Completed)
        assert runs[claim.key] == 1
    finally:
        client.close()
    assert _notices(events, claim.key) == [("native_fallback", "fell_back")]
    assert sum(p.value for p in otel.points("goblin_claim.native_fallbacks")) == 1
    if not batch:
        (release,) = [e for e in events if e.operation == "release"]
        assert (release.outcome, release.path) == ("released", "script")
    assert [e.path for e in events if e.operation == "acquire"][1:] == ["script"] * 3


def test_a_batch_reports_one_reload_for_all_its_keys(client: redis.Redis, events: list[Event]) -> None:
    """acquire_many after SCRIPT FLUSH: every key lands through EVAL; the round reports one reload, on its first key."""
    keys = [unique() for _ in range(3)]
    client.script_flush()
    batch = Claim.acquire_many(client, keys, native="never")
    assert all(isinstance(outcome, Claimed) for _, outcome in batch)
    assert [(e.key, e.operation) for e in events if e.operation == "script_reload"] == [(keys[0], "script_reload")]
    assert [e.path for e in events if e.operation == "acquire_many"] == ["script"] * 3


def test_renewals_and_release_many_refused_scripting_give_up_with_the_handle_s_error(
    own_server: Start, events: list[Event]
) -> None:
    """An ACL without scripting (Redis 7): renewals and release_many say what to grant, as extend() and release() do."""
    server = own_server()
    admin = server.client()
    admin.execute_command("ACL SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    client = server.client(username="app", password="pw")
    try:
        claim = Claim(client, unique(), lease=2)
        assert isinstance(claim.acquire(), Claimed)  # SET ... NX GET: no script needed
        with claim.keep_alive(interval=0.1) as keeper:
            deadline = time.monotonic() + 10
            while keeper._error is None and time.monotonic() < deadline:
                time.sleep(0.02)
        assert isinstance(keeper._error, goblin_claim.ServerError)
        assert "grant +@scripting" in str(keeper._error)
        with pytest.raises(goblin_claim.ServerError, match=r"grant \+@scripting"):
            claim.release()
        with pytest.raises(goblin_claim.ServerError, match=r"grant \+@scripting"):
            Claim.release_many(client, [claim])
    finally:
        client.close()
        admin.close()
    assert not [e for e in events if e.operation in ("script_reload", "native_fallback")]
