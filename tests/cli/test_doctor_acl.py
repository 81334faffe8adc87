"""``goblin-claim doctor`` names what a restricted ACL user lacks, per operation, on real servers.

Each test runs on redis-server 7, valkey-server and Redis 8 (the session's servers).

The commands each operation needs are read from the scripts themselves; publishing
and subscribing only wake waiters (they poll without), so lacking them is a note.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from goblin_claim._cli.acl import acl_operation_findings, operation_needs, script_commands
from goblin_claim._cli.doctor import doctor
from tests.conftest import unique
from tests.support import servers


@pytest.fixture(params=["redis", "valkey", "redis8"])
def standalone(request: pytest.FixtureRequest) -> servers.RedisProcess:
    """The session's standalone server: redis-server 7, valkey-server, Redis 8."""
    server: servers.RedisProcess = request.getfixturevalue(f"{request.param}_standalone")
    return server


@pytest.fixture(params=["redis", "valkey", "redis8"])
def with_module(request: pytest.FixtureRequest) -> servers.RedisProcess:
    """The session's standalone server with the reference module: redis-server 7, valkey-server, Redis 8."""
    server: servers.RedisProcess = request.getfixturevalue(f"{request.param}_native")
    return server


@pytest.fixture
def admin(standalone: servers.RedisProcess) -> Iterator[redis.Redis]:
    """The default (all-powerful) user on the session's standalone server."""
    client = standalone.client()
    yield client
    client.close()


def findings_for(server: servers.RedisProcess, admin: redis.Redis, *rules: str, namespace: str = "") -> list[Any]:
    """Doctor's ACL findings for a fresh user with ``rules`` on ``~<namespace>:*``."""
    namespace = namespace or unique("acl")
    user = unique("user")
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{namespace}:*", "resetchannels", *rules)
    client = redis.Redis(host=servers.HOST, port=server.port, username=user, password="pw")
    try:
        return [found for found in doctor(client, False, namespace, durable=False) if "ACL user" in found.what]
    finally:
        client.close()
        admin.execute_command("ACL", "DELUSER", user)


def test_exact_command_list_without_pttl_and_time_names_them_where_the_scripts_call_them(
    standalone: servers.RedisProcess, admin: redis.Redis
) -> None:
    """Exact commands evalsha eval get set del expire strlen: each operation whose scripts call pttl or time, by name.

    Claim, wait and batch (fences, at-most-once records, the lease-left hint), extend (an
    at-most-once record's renewal) and checkpoint (its owner check) lack them; complete,
    release and forget do not.
    """
    found = findings_for(standalone, admin, "+evalsha", "+eval", "+get", "+set", "+del", "+expire", "+strlen")
    (problem,) = [f for f in found if f.level == "problem" and "on the scripts path" in f.what]
    (options,) = [f for f in found if f.level == "note" and "on the scripts path" in f.what]
    for operation, script in [
        ("claim", "claim"), ("wait and its wake-up", "claim"), ("batch (acquire_many)", "claim"),
        ("extend (and keep-alive)", "extend"), ("checkpoint", "checkpoint"),
    ]:  # fmt: skip
        missing = " ".join(sorted(script_commands(script) & {"pttl", "time"}))
        assert missing
        # checkpoint() runs for checkpoints=True alone: a note for those options, beside the default handle's problems.
        assert f"{operation} lacks {missing}" in (options if operation == "checkpoint" else problem).what
    for operation in ("complete", "release", "forget"):
        assert f"{operation} lacks" not in problem.what
    assert "+pttl" in problem.todo
    assert "+time" in problem.todo
    assert "the scripts for claim" in next(f.what for f in found if "default handles here" in f.what)


def test_categories_without_pubsub_make_publish_and_subscribe_notes_not_problems(
    standalone: servers.RedisProcess, admin: redis.Redis
) -> None:
    """+@read +@write +@scripting (no pub/sub): PUBLISH and SUBSCRIBE are notes naming the operations they wake."""
    found = findings_for(standalone, admin, "+@read", "+@write", "+@scripting")
    notes = {f.what.split(" may not ")[1].split(" ")[0]: f for f in found if f.level == "note" and "may not" in f.what}
    assert {"PUBLISH", "SUBSCRIBE"} <= notes.keys()
    assert "poll instead" in notes["PUBLISH"].what
    assert not any(
        "PUBLISH" in f.what or "publish" in f.what.split(" lacks ")[-1] for f in found if f.level == "problem"
    )


def test_a_user_with_every_command_gets_one_ok(standalone: servers.RedisProcess, admin: redis.Redis) -> None:
    """+@all with the namespace's channels: every operation has what it needs, one ok line."""
    namespace = unique("acl")
    found = findings_for(standalone, admin, "+@all", f"&{namespace}:*", namespace=namespace)
    assert [f.level for f in found if "every command each operation needs" in f.what] == ["ok"]
    assert not [f for f in found if f.level in ("problem", "note") and "on the" in f.what]


def test_native_path_needs_the_module_commands(with_module: servers.RedisProcess) -> None:
    """With the module: a user without goblin.cad is told release lacks it on the native path."""
    admin = with_module.client()
    try:
        found = findings_for(with_module, admin, "+@all", "-goblin.cad")
    finally:
        admin.close()
    problems = [f for f in found if f.level == "problem" and "on the native path" in f.what]
    (paths,) = [f for f in found if "default handles here" in f.what]
    if "release (DELIFEQ)" in paths.what:  # Valkey 9: its own DELIFEQ, not GOBLIN.CAD, releases
        assert problems == []
        return
    (problem,) = problems
    assert "release lacks goblin.cad" in problem.what
    assert "claim lacks" not in problem.what  # one key: SET ... NX GET, the server's own


def test_operation_needs_follow_the_scripts() -> None:
    """Each operation's script-path needs are EVALSHA, EVAL and what its scripts call; wake-ups kept apart."""
    rows = {operation: (needs, wake) for operation, needs, wake in operation_needs(native=False)}
    assert rows["extend (and keep-alive)"][0] == {"evalsha", "eval"} | script_commands("extend")
    assert rows["checkpoint"] == ({"evalsha", "eval", "get", "set", "time"}, set())
    assert rows["complete"][1] == {"publish"}
    assert rows["wait and its wake-up"][1] == {"subscribe"}
    sharded = {operation: wake for operation, _needs, wake in operation_needs(native=False, sharded=True)}
    assert sharded["release"] == {"spublish"}
    native = {operation: needs for operation, needs, _wake in operation_needs(native=True)}
    assert "goblin.cad" in native["release"]
    assert "goblin.claim" in native["claim"]


def test_acl_operation_findings_lists_only_what_is_lacking() -> None:
    """Lacking only expire: one problem naming extend; nothing else, no notes."""
    found, paths = acl_operation_findings({"expire": "NOPERM"}, "u", "ns:*", native=False)
    assert paths.level == "ok"
    assert "the scripts for claim" in paths.what  # no server commands given: every operation by script
    assert found.level == "problem"
    assert "extend (and keep-alive) lacks expire" in found.what
    assert "claim lacks" not in found.what


def test_a_user_without_scripting_takes_the_server_s_own_commands(
    standalone: servers.RedisProcess, admin: redis.Redis
) -> None:
    """-@scripting: the paths a default handle takes go without scripts where the server can.

    On Valkey 9 every default operation goes by the server's own commands (a note for the
    options); on Redis 7 and 8.2 claims, waits, batches and forget do, and complete, extend
    and release lack the scripts.
    """
    found = findings_for(standalone, admin, "+@all", "-@scripting")
    (paths,) = [f for f in found if "default handles here" in f.what]
    assert "claim (SET ... NX GET)" in paths.what
    assert "forget (DEL)" in paths.what
    problems = [f for f in found if f.level == "problem"]
    if "complete (SET ... IFEQ)" in paths.what:  # Valkey 9
        assert problems == []
        assert any(f.level == "note" and "on the scripts path lacks eval evalsha" in f.what for f in found)
        assert "the scripts for" not in paths.what
    else:
        (scripts,) = [f for f in problems if "on the scripts path" in f.what]
        for operation in ("complete", "extend (and keep-alive)", "release"):
            assert f"{operation} lacks eval evalsha" in scripts.what
        assert "claim lacks" not in scripts.what


def test_operation_needs_on_the_server_s_own_commands() -> None:
    """The server's own commands: a row for what they serve, with the commands sent and the wake-ups apart."""
    valkey = {op: (needs, wake) for op, needs, wake in operation_needs(False, builtins=frozenset({
        "SET NX GET", "SET IFEQ", "DELIFEQ", "DEL"}))}  # fmt: skip
    assert valkey["claim"] == ({"set", "get", "pttl", "pexpiretime"}, frozenset())
    assert valkey["complete"] == ({"set", "get"}, {"publish"})
    assert valkey["release"] == ({"delifeq"}, {"publish"})
    assert valkey["forget"] == ({"del"}, {"publish"})
    redis7 = {op for op, _needs, _wake in operation_needs(False, builtins=frozenset({"SET NX GET", "DEL"}))}
    assert redis7 == {"claim", "wait and its wake-up", "batch (acquire_many)", "forget"}
