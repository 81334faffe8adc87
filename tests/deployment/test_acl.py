"""Restricted ACL users: the narrowest lines the README gives, each run through every operation.

Each test makes a user of its own (``ACL SETUSER``) with one line, on a real
redis-server 7, valkey-server and Redis 8 (the reference module loaded for the
native lines), and drives
claim, in-flight, extend, keep-alive, wait, complete, duplicate, release, forget
and a batch after a lost script cache through it, with both drivers. Without
pub/sub permissions the scripts' wake-up announcements are refused inside them:
the writes must still land and say so, and waiters poll, silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from goblin_claim import AsyncClaim, Claim, Claimed, Completed, InFlight, NotReplicatedError, ServerError, idempotent
from tests.conftest import record, stored, unique
from tests.support import servers

# The README's lines, with NS for the namespace (the SDK's keys and channels all start "NS:").
SCRIPTS_BY_CATEGORY = "~NS:* +@read +@write +@scripting"
SCRIPTS_BY_COMMAND = "~NS:* +evalsha +eval +get +set +del +expire +pttl"
NATIVE_BY_CATEGORY = "~NS:* +@read +@write +@scripting +goblin.claim +goblin.cad +command|info"
NATIVE_BY_COMMAND = "~NS:* +evalsha +eval +get +set +del +expire +pttl +goblin.claim +goblin.cad +command|info"
# What the options add to any of them.
WAKEUPS = "&NS:* +publish +subscribe +unsubscribe"
FENCING = "+time"
REPLICAS = "+wait"

LINES = {
    "scripts-by-category": (SCRIPTS_BY_CATEGORY, False),
    "scripts-by-command": (SCRIPTS_BY_COMMAND, False),
    "native-by-category": (NATIVE_BY_CATEGORY, True),
    "native-by-command": (NATIVE_BY_COMMAND, True),
    # The minimum, without even the lease-left hint (PTTL) that InFlight.retry_after reads.
    "scripts-bare": ("~NS:* +evalsha +eval +get +set +del +expire", False),
}


# An ACL refusal inside a script, by kind: Redis 7.0 says "The user executing the script
# can't run this command or subcommand", Valkey and Redis 8 "ACL failure in script: User u
# has no permissions to run the 'time' command".
REFUSED_IN_SCRIPT = r"can't run this command|ACL failure in script"


@pytest.fixture(params=["redis", "valkey", "redis8"])
def user_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory on each server: (line, native) -> (namespace, username, password, admin client, server port)."""
    made: list[tuple[redis.Redis, str]] = []

    def make(line: str, native: bool) -> tuple[str, str, str, redis.Redis, int]:
        fixture = f"{request.param}_native" if native else f"{request.param}_standalone"
        server: servers.RedisProcess = request.getfixturevalue(fixture)
        admin = server.client()
        namespace, name, password = unique("acl"), unique("user"), unique("pw")
        rules = ["reset", "on", f">{password}", *line.replace("NS", namespace).split()]
        admin.execute_command("ACL SETUSER", name, *rules)  # reset: a clean slate, then the line itself
        admin.script_flush()  # the user's first calls find no scripts: SCRIPT LOAD and EVAL are exercised
        made.append((admin, name))
        return namespace, name, password, admin, server.port

    yield make
    for admin, name in made:
        admin.acl_deluser(name)
        admin.close()


def _sync_scenario(client: redis.Redis, admin: redis.Redis, namespace: str, native: bool) -> None:
    options = {"namespace": namespace, "native": "always" if native else "never"}
    key = unique()
    owner = Claim(client, key, lease=2, **options)
    assert isinstance(owner.acquire(), Claimed)
    assert isinstance(Claim(client, key, **options).acquire(), InFlight)
    owner.extend()
    with owner.keep_alive(interval=0.2) as keeper:
        time.sleep(2.3)  # past the lease: only the renewals keep it
    assert not keeper.lost
    assert admin.get(owner.claim_key) == owner.token.encode()

    waiter = Claim(client, key, **options)
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(waiter.wait(timeout=10)))
    thread.start()
    time.sleep(0.2)  # the waiter is waiting
    owner.complete(b"done")  # the announcement inside is refused without pub/sub: still stored
    thread.join(15)
    assert seen == [Completed(key=key, value=b"done")]
    assert Claim(client, key, **options).acquire() == Completed(key=key, value=b"done")
    assert owner.release() is False

    other = Claim(client, unique(), **options)
    assert isinstance(other.acquire(), Claimed)
    assert other.release() is True
    assert isinstance(Claim(client, other.key, **options).acquire(), Claimed)

    assert Claim(client, key, **options).forget() is True
    assert isinstance(Claim(client, key, **options).acquire(), Claimed)

    admin.script_flush()  # a lost script cache: the batch goes again as EVAL
    batch = Claim.acquire_many(client, [unique() for _ in range(3)], **options)
    assert all(isinstance(outcome, Claimed) for _, outcome in batch)


async def _async_scenario(client: Any, admin: redis.Redis, namespace: str, native: bool) -> None:
    options = {"namespace": namespace, "native": "always" if native else "never"}
    key = unique()
    owner = AsyncClaim(client, key, lease=2, **options)
    assert isinstance(await owner.acquire(), Claimed)
    assert isinstance(await AsyncClaim(client, key, **options).acquire(), InFlight)
    await owner.extend()
    async with owner.keep_alive(interval=0.2) as keeper:
        await asyncio.sleep(2.3)
    assert not keeper.lost
    assert admin.get(owner.claim_key) == owner.token.encode()

    waiter = asyncio.create_task(AsyncClaim(client, key, **options).wait(timeout=10))
    await asyncio.sleep(0.2)
    await owner.complete(b"done")
    assert await asyncio.wait_for(waiter, 15) == Completed(key=key, value=b"done")
    assert await AsyncClaim(client, key, **options).acquire() == Completed(key=key, value=b"done")
    assert await owner.release() is False

    other = AsyncClaim(client, unique(), **options)
    assert isinstance(await other.acquire(), Claimed)
    assert await other.release() is True
    assert isinstance(await AsyncClaim(client, other.key, **options).acquire(), Claimed)

    assert await AsyncClaim(client, key, **options).forget() is True
    assert isinstance(await AsyncClaim(client, key, **options).acquire(), Claimed)

    admin.script_flush()
    batch = await AsyncClaim.acquire_many(client, [unique() for _ in range(3)], **options)
    assert all(isinstance(outcome, Claimed) for _, outcome in batch)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("line", list(LINES))
def test_each_acl_line_runs_every_operation(
    line: str, kind: str, user_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Claim, extend, keep-alive, wait, complete, release, forget and a batch all work for a user with this line."""
    rules, native = LINES[line]
    namespace, name, password, admin, port = user_client(rules, native)
    caplog.set_level(logging.WARNING, logger="goblin_claim")
    if kind == "sync":
        client = redis.Redis(host=servers.HOST, port=port, username=name, password=password)
        try:
            _sync_scenario(client, admin, namespace, native)
        finally:
            client.close()
    else:

        async def run() -> None:
            client = redis.asyncio.Redis(host=servers.HOST, port=port, username=name, password=password)
            try:
                await _async_scenario(client, admin, namespace, native)
            finally:
                await client.aclose()

        asyncio.run(run())
    # Polling instead of push is no problem to report: nothing above INFO.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_refused_publish_still_completes_releases_and_forgets(user_client: Any) -> None:
    """complete(), release() and forget() succeed for a user refused PUBLISH; the writes are on the server."""
    namespace, name, password, admin, port = user_client(SCRIPTS_BY_COMMAND, False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish(f"{namespace}:x", "refused")  # the premise: this user may not announce
        done = Claim(client, unique(), namespace=namespace, native="never")
        done.acquire()
        done.complete(b"stored")
        assert stored(admin, done) == b"stored"
        assert admin.get(done.claim_key) == record(done.token, b"stored")
        released = Claim(client, unique(), namespace=namespace, native="never")
        released.acquire()
        assert released.release() is True
        assert admin.exists(released.claim_key) == 0
        assert Claim(client, done.key, namespace=namespace).forget() is True
        assert admin.exists(done.claim_key, done.result_key) == 0


def test_in_flight_without_pttl_has_no_retry_after(user_client: Any) -> None:
    """A user without PTTL still gets InFlight, with retry_after unknown (None) instead of an error."""
    namespace, name, password, admin, port = user_client(LINES["scripts-bare"][0], False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        key = unique()
        Claim(client, key, namespace=namespace).acquire()
        outcome = Claim(client, key, namespace=namespace).acquire()
        assert isinstance(outcome, InFlight)
        assert outcome.retry_after is None
    full = Claim(admin, key, namespace=namespace).acquire()  # with PTTL the hint is there
    assert isinstance(full, InFlight)
    assert full.retry_after is not None


def test_options_add_their_commands(user_client: Any) -> None:
    """With the wake-up, fencing and replicas additions, push wake-ups, fences and WAIT all run for the user."""
    line = f"{SCRIPTS_BY_COMMAND} {WAKEUPS} {FENCING} {REPLICAS}"
    namespace, name, password, admin, port = user_client(line, False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        fenced = Claim(client, unique(), namespace=namespace, fencing=True)
        outcome = fenced.acquire()
        assert isinstance(outcome, Claimed)
        assert isinstance(outcome.fence, int)
        assert admin.get(f"{fenced.claim_key}:fence") == str(outcome.fence).encode()  # under ~NS:* too
        listener = client.pubsub()
        listener.subscribe(fenced.claim_key)  # permitted: the user may listen for the announcement
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        fenced.complete(b"done")
        message = listener.get_message(timeout=5)
        listener.close()
        assert message is not None
        assert (message["type"], message["data"]) == ("message", b"done")  # announced by complete.lua
        assert admin.exists(f"{fenced.claim_key}:fence") == 0  # the record written, the counter goes
        # A standalone server has no replica: WAIT runs (permitted) and answers 0.
        with pytest.raises(NotReplicatedError):
            Claim(client, unique(), namespace=namespace, replicas=1, replica_timeout_ms=50).acquire()


def test_fencing_without_time_is_refused_with_nothing_written(user_client: Any) -> None:
    """fencing=True for a user without TIME fails before the claim is written, so no claim hides behind the error."""
    namespace, name, password, admin, port = user_client(SCRIPTS_BY_COMMAND, False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        fenced = Claim(client, unique(), namespace=namespace, fencing=True)
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):
            fenced.acquire()
        assert admin.exists(fenced.claim_key, f"{fenced.claim_key}:fence") == 0


# --------------------------------------------------------------------------- scripting refused

# A user denied Lua scripting, who may ask the server which commands it has (+command|info):
# the server's own commands serve what they can (SET ... NX GET everywhere here; SET ... IFEQ,
# DELIFEQ on Valkey 9), and what still needs a script raises an error naming the permission.
NO_SCRIPTING = f"~NS:* +@read +@write -@scripting +command|info {WAKEUPS}"


def _refused(exc: BaseException, *why: str) -> None:
    """A scripting refusal, as the SDK words it: the permission, and why this call needs a script here."""
    text = str(exc)
    assert "+@scripting" in text, text
    assert "EVALSHA" in text, text
    for words in why:
        assert words in text, text


def test_a_user_denied_scripting_claims_waits_stores_and_releases_where_the_server_can(
    user_client: Any,
) -> None:
    """-@scripting: every default operation the server's own commands serve, and a clear error for the rest.

    Claims, waits, batches and forget everywhere; stores, renewals and releases where the
    server has SET ... IFEQ and DELIFEQ (Valkey 9); the rest raises an error naming
    +@scripting and what needs the script.
    """
    namespace, name, password, admin, port = user_client(NO_SCRIPTING, False)
    own = bool(admin.execute_command("COMMAND INFO", "delifeq")[0])  # Valkey 9
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.eval("return 1", 0)  # the premise: no scripts for this user
        options = {"namespace": namespace}
        key = unique()
        owner = Claim(client, key, lease=2, **options)
        assert isinstance(owner.acquire(), Claimed)
        busy = Claim(client, key, **options).acquire()
        assert isinstance(busy, InFlight)
        assert busy.retry_after is not None  # PTTL beside it
        if own:
            owner.extend()
            with owner.keep_alive(interval=0.2) as keeper:
                time.sleep(2.3)  # past the lease: only the renewals (SET ... IFEQ) keep it
            assert not keeper.lost
            waiter = Claim(client, key, **options)
            seen: list[object] = []
            thread = threading.Thread(target=lambda: seen.append(waiter.wait(timeout=10)))
            thread.start()
            time.sleep(0.2)
            owner.complete(b"done")  # SET ... IFEQ, its announcement behind it
            thread.join(15)
            assert seen == [Completed(key=key, value=b"done")]
            other = Claim(client, unique(), **options)
            assert isinstance(other.acquire(), Claimed)
            assert other.release() is True  # DELIFEQ
        else:
            for call, why in (
                (owner.complete, "SET ... IFEQ"),
                (owner.extend, "SET ... IFEQ"),
                (owner.release, "DELIFEQ"),
            ):
                with pytest.raises(ServerError) as info:
                    call(*((b"done",) if call == owner.complete else ()))
                _refused(info.value, why)
            assert admin.get(owner.claim_key) == owner.token.encode()  # nothing was written
            time.sleep(2.1)  # the lease lapses: a waiter takes it over by SET ... NX GET
            assert isinstance(Claim(client, key, **options).wait(timeout=10), Claimed)
        assert Claim(client, key, **options).forget() is True  # DEL
        batch = Claim.acquire_many(client, [unique() for _ in range(3)], **options)
        assert all(isinstance(outcome, Claimed) for _, outcome in batch)
        for scripted in ({"at_most_once": True}, {"fencing": True}, {"native": "never"}):
            handle = Claim(client, unique(), **options, **scripted)  # type: ignore[arg-type]
            with pytest.raises(ServerError) as info:
                handle.acquire()
            _refused(info.value, next(iter(scripted)))
            assert admin.exists(handle.claim_key) == 0  # refused before anything was written


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_user_denied_scripting_runs_the_decorator_where_the_server_stores_without_scripts(
    user_client: Any, kind: str
) -> None:
    """@idempotent for a user denied scripting, where the server stores without scripts.

    First calls and duplicates on Valkey 9; on Redis 7 and 8.2 duplicates of work stored by
    others, and a first call's store refused with the permission named (its result carried).
    """
    namespace, name, password, admin, port = user_client(NO_SCRIPTING, False)
    own = bool(admin.execute_command("COMMAND INFO", "delifeq")[0])
    runs: list[str] = []

    def charge(order: str) -> dict[str, str]:
        runs.append(order)
        return {"order": order}

    # Work another caller (with scripting) completed: a duplicate reads it by SET ... NX GET.
    idempotent(admin, key="order", namespace=namespace)(charge)("o-0")

    async def acharge(order: str) -> dict[str, str]:
        return charge(order)

    async def run_async(orders: list[str]) -> list[object]:
        aclient = redis.asyncio.Redis(host=servers.HOST, port=port, username=name, password=password)
        try:
            wrapped = idempotent(aclient, key="order", namespace=namespace)(acharge)
            results: list[object] = []
            for order in orders:
                try:
                    results.append(await wrapped(order))
                except ServerError as exc:
                    results.append(exc)
            return results
        finally:
            await aclient.aclose()

    def run_sync(orders: list[str]) -> list[object]:
        with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
            wrapped = idempotent(client, key="order", namespace=namespace)(charge)
            results: list[object] = []
            for order in orders:
                try:
                    results.append(wrapped(order))
                except ServerError as exc:
                    results.append(exc)
            return results

    # Where the store is refused the claim stays until its lease lapses, as for any refused store
    # (the function ran): a duplicate then would wait for it, so none is sent there.
    orders = ["o-0", "o-1", "o-1"] if own else ["o-0", "o-1"]
    results = run_sync(orders) if kind == "sync" else asyncio.run(run_async(orders))
    assert results[0] == {"order": "o-0"}  # a duplicate: served, nothing run
    if own:
        assert results[1:] == [{"order": "o-1"}] * 2
        assert runs == ["o-0", "o-1"]
    else:
        first = results[1]
        assert isinstance(first, ServerError)
        _refused(first, "SET ... IFEQ")
        assert first.result == {"order": "o-1"}  # the function ran: its result goes with the error
        assert runs[:2] == ["o-0", "o-1"]


def test_a_user_denied_scripting_and_the_probe_is_told_to_grant_either(user_client: Any) -> None:
    """Without +command|info the SDK cannot see the server's own commands: the error names both permissions."""
    namespace, name, password, admin, port = user_client("~NS:* +@read +@write -@scripting", False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        handle = Claim(client, unique(), namespace=namespace)
        with pytest.raises(ServerError) as info:
            handle.acquire()
        _refused(info.value, "+command|info")
        assert admin.exists(handle.claim_key) == 0


# What at_most_once and checkpoints add: TIME (the deadline, the owner check) to any line, and PTTL
# to a renewal of an at-most-once record (it keeps the key at least as long as the new lease).
UNITS = "+time"


@pytest.mark.parametrize("line", ["scripts-by-command", "scripts-by-category", "native-by-command"])
def test_at_most_once_and_checkpoints_run_with_time_added(user_client: Any, line: str) -> None:
    """With +time: an at-most-once checkpointed claim, its renewal, checkpoint, release, the next claim and complete."""
    rules, native = LINES[line]
    # A line with the probe's +command|info takes the server's own commands for a plain reader, which
    # judges an at-most-once record by PTTL and PEXPIRETIME (acl.md: add +pexpiretime to such lines).
    reads = " +pexpiretime" if "command|info" in rules else ""
    namespace, name, password, admin, port = user_client(f"{rules} {UNITS}{reads}", native)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        options = {"namespace": namespace, "at_most_once": True, "checkpoints": True, "fencing": True}
        owner = Claim(client, unique(), lease=5, **options)
        assert isinstance(owner.acquire(), Claimed)
        owner.extend()
        owner.checkpoint(b"step=1")
        assert isinstance(Claim(client, owner.key, namespace=namespace).acquire(), InFlight)  # a plain reader
        assert owner.release() is True
        nxt = Claim(client, owner.key, **options)
        outcome = nxt.acquire()
        assert isinstance(outcome, Claimed)
        assert outcome.checkpoint == b"step=1"
        nxt.complete(b"done")
        assert admin.get(nxt.claim_key) == record(nxt.token, b"done")
        assert admin.exists(f"{nxt.claim_key}:checkpoint", f"{nxt.claim_key}:fence") == 0


def test_at_most_once_and_checkpoints_without_time_are_refused_with_nothing_written(user_client: Any) -> None:
    """Without TIME: an at-most-once claim, a checkpoint and a renewal of such a record, and reading it, all refused."""
    namespace, name, password, admin, port = user_client(SCRIPTS_BY_COMMAND, False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        refused = Claim(client, unique(), namespace=namespace, at_most_once=True, checkpoints=True)
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):
            refused.acquire()
        assert admin.exists(refused.claim_key) == 0
        # Claimed by a user who may: this one's checkpoint and renewal of it are refused, nothing changed.
        owner = Claim(client, refused.key, namespace=namespace, at_most_once=True, checkpoints=True)
        Claim(admin, refused.key, namespace=namespace, at_most_once=True, token=owner.token).acquire()
        before = admin.get(owner.claim_key)
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):  # a plain reader reads the deadline too
            Claim(client, refused.key, namespace=namespace).acquire()
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):
            owner.checkpoint(b"step=1")
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):
            owner.extend()
        assert admin.get(owner.claim_key) == before
        assert admin.exists(f"{owner.claim_key}:checkpoint") == 0


def test_renewing_an_at_most_once_claim_needs_pttl(user_client: Any) -> None:
    """The bare line plus +time, without PTTL: the at-most-once claim and checkpoint run, its renewal is refused."""
    namespace, name, password, admin, port = user_client(f"{LINES['scripts-bare'][0]} {UNITS}", False)
    with contextlib.closing(redis.Redis(host=servers.HOST, port=port, username=name, password=password)) as client:
        owner = Claim(client, unique(), namespace=namespace, at_most_once=True, checkpoints=True)
        assert isinstance(owner.acquire(), Claimed)
        owner.checkpoint(b"step=1")
        before = admin.get(owner.claim_key)
        with pytest.raises(ServerError, match=REFUSED_IN_SCRIPT):
            owner.extend()
        assert admin.get(owner.claim_key) == before
        owner.complete(b"done")
