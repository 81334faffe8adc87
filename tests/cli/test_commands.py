"""``goblin-claim``: doctor, inspect and forget against real servers (in process, and the installed script).

doctor's checks of a server run on redis-server 7, valkey-server and Redis 8 (``each_server``).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from goblin_claim import Claim, Claimed, ResultLostError, WrongTypeError, idempotent
from goblin_claim._cli.doctor import eviction_finding, native_finding, owner_check_finding
from goblin_claim._protocol.scripts import SCRIPTS
from tests.cli.invoke import run, url
from tests.conftest import publish, unique
from tests.support import servers

Tier = Callable[[str], Any]  # each_server: the session's server of a tier


# --------------------------------------------------------------------------- the command itself


def test_installed_script_help_names_the_commands_and_exit_status() -> None:
    """The `goblin-claim` console script (a [project.scripts] entry) explains its commands and exit status."""
    script = Path(sys.executable).parent / "goblin-claim"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True, timeout=60)
    for word in ("doctor", "inspect", "forget", "scan", "stats", "exit status", "--namespace"):
        assert word in done.stdout
    done = subprocess.run([str(script), "doctor", "--help"], capture_output=True, text=True, check=True, timeout=60)
    for word in ("maxmemory-policy", "ACL", "--url", "--no-write", "--import"):
        assert word in done.stdout


def test_a_namespace_with_braces_is_bad_usage() -> None:
    """A namespace the SDK refuses is a usage error (exit 2), before connecting."""
    assert run("inspect", "k", "--namespace", "a{b}", "--url", "redis://127.0.0.1:1")[0] == 2


def test_an_unreachable_server_exits_1_with_what_to_check() -> None:
    """No server at --url: exit 1, saying what to check."""
    status, text = run("doctor", "--url", f"redis://{servers.HOST}:{servers.free_port()}/0")
    assert status == 1
    assert "cannot connect" in text
    assert "check --url" in text


# --------------------------------------------------------------------------- doctor


def test_doctor_on_a_stock_server_notes_the_scripts_and_finds_no_problem(each_server: Tier) -> None:
    """Stock Redis with noeviction: scripts load, the module is optional, the ACL check passes; exit 0, no keys left."""
    server = each_server("standalone")
    namespace = unique("doctor")
    status, text = run("doctor", "--url", url(server), "--namespace", namespace, "--ephemeral")
    assert status == 0, text
    assert "standalone" in text
    assert "GOBLIN.CLAIM / GOBLIN.CAD are not loaded" in text
    assert "loadmodule" in text
    assert f"the {len(SCRIPTS)} Lua scripts load" in text
    assert "maxmemory-policy noeviction" in text
    assert "may run on" in text
    assert "no problems" in text
    with contextlib.closing(server.client()) as stock:
        assert stock.keys(f"{namespace}:*") == []
        # Valkey 9 has DELIFEQ (and SET IFEQ), Redis 7 and 8.2 SET ... NX GET alone: doctor says which.
        has_delifeq = bool(stock.execute_command("COMMAND INFO", "delifeq")[0])
    assert "the server's own commands serve default handles" in text
    assert "claim (SET ... NX GET)" in text
    assert ("release (DELIFEQ)" in text) is has_delifeq
    assert ("complete (SET ... IFEQ)" in text) is has_delifeq


def test_doctor_on_the_module_server_finds_the_native_commands(each_server: Tier) -> None:
    """With the module loaded: GOBLIN.CLAIM / GOBLIN.CAD found, and the ACL check runs them too."""
    status, text = run("doctor", "--url", url(each_server("native")), "--namespace", unique("doctor"), "--ephemeral")
    assert status == 0, text
    assert "GOBLIN.CLAIM and GOBLIN.CAD are loaded" in text
    assert "claim (GOBLIN.CLAIM)" in text
    assert "release (GOBLIN.CAD)" in text


def test_doctor_on_the_module_cluster_checks_every_primary(each_server: Tier) -> None:
    """Given one node of a cluster with the module everywhere: a cluster of 3 primaries, native, no problem."""
    node = each_server("native_cluster")[1]
    status, text = run("doctor", "--url", url(node), "--namespace", unique("doctor"), "--ephemeral")
    assert status == 0, text
    assert "a cluster of 3 primaries" in text
    assert "GOBLIN.CLAIM and GOBLIN.CAD are loaded" in text
    assert "load on every primary" in text
    assert text.count("maxmemory-policy noeviction") == 3


def test_doctor_on_a_stock_cluster(each_server: Tier) -> None:
    """A cluster without the module: the scripts are used, no problem."""
    node = each_server("cluster")[0]
    status, text = run("doctor", "--url", url(node), "--namespace", unique("doctor"), "--ephemeral")
    assert status == 0, text
    assert "a cluster of 3 primaries" in text
    assert "not loaded" in text


def test_owner_checks_on_some_nodes_only_are_a_note_and_on_none_say_nothing() -> None:
    """Built-in owner checks: ok on every node, a note naming the nodes without, nothing where none has them."""
    every = owner_check_finding({"a:1": frozenset({"DELIFEQ"}), "b:2": frozenset({"DELIFEQ"})})
    assert every is not None
    assert every.level == "ok"
    some = owner_check_finding({"a:1": frozenset({"DELIFEQ"}), "b:2": frozenset()})
    assert some is not None
    assert some.level == "note"
    assert "b:2" in some.what
    assert owner_check_finding({"a:1": frozenset(), "b:2": frozenset()}) is None
    assert owner_check_finding({}) is None


def test_a_cluster_with_the_module_on_some_nodes_is_a_problem() -> None:
    """Module on some primaries only: a problem (unsupported), saying where it is missing."""
    finding = native_finding({"a:1": True, "b:2": False, "c:3": True})
    assert finding.level == "problem"
    assert "not on b:2" in finding.what
    assert native_finding({"a:1": True, "b:2": None}).level == "note"  # COMMAND INFO refused somewhere


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-random"])
def test_doctor_flags_policies_that_evict_records(each_server: Tier, policy: str) -> None:
    """Any policy but noeviction, with a maxmemory, is a problem (volatile-* too): an evicted record reruns work."""
    server = each_server("standalone")
    with contextlib.closing(server.client()) as stock:
        before = stock.config_get("maxmemory*")
        try:
            stock.config_set("maxmemory", "1gb")
            stock.config_set("maxmemory-policy", policy)
            status, text = run("doctor", "--url", url(server), "--no-write")
        finally:
            stock.config_set("maxmemory", before["maxmemory"])
            stock.config_set("maxmemory-policy", before["maxmemory-policy"])
    assert status == 1, text
    assert f"PROBLEM  {servers.HOST}:{server.port}: maxmemory-policy {policy} can evict claims and completed" in text
    assert "the next caller runs the work again" in text
    assert "ResultLostError" not in text
    assert "CONFIG SET maxmemory-policy noeviction" in text


def test_an_evicting_policy_without_maxmemory_is_a_note() -> None:
    """Without a maxmemory nothing is evicted yet: a note that says what would happen, not a problem."""
    finding = eviction_finding("n:1", "volatile-lru", 0)
    assert finding.level == "note"
    assert "once one is" in finding.what
    assert "runs the work again" in finding.what


# The server's refusal, by kind: a command, or a key ("no permissions to access one of the
# keys" on Redis 7, "No permissions to access a key" on Valkey 9 and Redis 8).
@pytest.mark.parametrize(
    ("commands", "keys", "refusal", "grant"),
    [(["+@all", "-evalsha"], "goblin:*", r"'evalsha' command", "+evalsha"),
     (["+@all"], "other:*", r"(?i)no permissions to access .*\bkey", "~goblin:*")],
    ids=["no-evalsha", "other-keys"],
)  # fmt: skip
def test_doctor_says_what_a_restricted_acl_user_may_not_run(
    each_server: Tier, commands: list[str], keys: str, refusal: str, grant: str
) -> None:
    """A user without EVALSHA, or without the namespace's keys: a problem naming the refusal and the grants."""
    server = each_server("standalone")
    user = unique("user")
    with contextlib.closing(server.client()) as stock:
        stock.acl_setuser(user, enabled=True, passwords=["+pw"], keys=[keys], commands=commands)
        try:
            status, text = run("doctor", "--url", url(server, user))
            assert status == 1, text
            assert f"ACL user '{user}' may not run" in text
            assert re.search(refusal, text), text
            assert grant in text
        finally:
            stock.acl_deluser(user)


def test_doctor_on_a_replica_is_a_problem(each_server: Tier) -> None:
    """Pointed at a replica: a problem (claims go to the primary), and its writes are refused."""
    _, replica = each_server("replicated")
    status, text = run("doctor", "--url", url(replica), "--namespace", unique("doctor"))
    assert status == 1, text
    assert "is a replica" in text
    assert "point the SDK at the primary" in text


# --------------------------------------------------------------------------- inspect and forget


def test_inspect_names_each_state(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """free, held (token and lease), done (token, value, retention), free again once the record is gone."""
    ns = unique("ns")
    target = url(redis_standalone)
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", target)
    assert (status, "state   free" in text) == (0, True)
    assert f"record  {ns}:{{evt88}}: none" in text
    owner = Claim(stock, "evt88", namespace=ns, token="worker-3", lease=30, ttl=600)
    assert isinstance(owner.acquire(), Claimed)
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", target)
    assert status == 0
    assert f"record  {ns}:{{evt88}}: 'worker-3', TTL " in text
    assert "state   held by 'worker-3', lease ends in" in text
    owner.complete("charged:txn_551")
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", target)
    assert status == 0
    assert f"record  {ns}:{{evt88}}: done by 'worker-3', 15 bytes of value, TTL " in text
    assert "raw text: 'charged:txn_551'" in text
    assert "state   done by 'worker-3', kept 600 s more" in text
    stock.delete(owner.claim_key)  # evicted: the work is free again, not lost
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", target)
    assert (status, "state   free" in text) == (0, True)


def test_inspect_shows_the_fence_counter_of_a_fenced_claim(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A fenced claim in flight: the fence line names the counter; once completed, the counter is gone."""
    ns = unique("ns")
    owner = Claim(stock, "evt88", namespace=ns, token="worker-3", fencing=True)
    claimed = owner.acquire()
    assert isinstance(claimed, Claimed)
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"fence   {ns}:{{evt88}}:fence: '{claimed.fence}'" in text
    owner.complete("v")
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "fence " not in text


def test_inspect_decodes_the_decorators_envelope(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """A result stored by @idempotent shows as its JSON value and call fingerprint; a stored error as its type."""
    ns = unique("ns")

    class CardDeclined(Exception):
        pass

    @idempotent(stock, key="order_id", namespace=ns, replay_errors=(CardDeclined,))
    def charge(order_id: str, amount: int) -> dict[str, Any]:
        if amount < 0:
            raise CardDeclined("insufficient funds")
        return {"txn": "txn_551", "amount": amount}

    charge("o1", 25)
    with pytest.raises(CardDeclined):
        charge("o2", -1)
    status, text = run("inspect", "o1", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "@idempotent result, call fingerprint " in text
    assert '"txn": "txn_551"' in text
    status, text = run("inspect", "o2", "--namespace", ns, "--url", url(redis_standalone))
    assert "@idempotent stored error" in text
    assert "CardDeclined: insufficient funds" in text


def test_inspect_flags_keys_goblin_claim_did_not_write(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A hash at the record (acquire() raises WrongTypeError), a done marker without a value: odd, exit 1."""
    ns = unique("ns")
    record = Claim(stock, "k", namespace=ns).claim_key
    stock.hset(record, "f", "v")
    status, text = run("inspect", "k", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1
    assert "a hash, not written by goblin-claim" in text
    assert "acquire() raises WrongTypeError" in text
    with pytest.raises(WrongTypeError):
        Claim(stock, "k", namespace=ns).acquire()
    stock.delete(record)
    stock.set(record, b"done w-1")
    status, text = run("inspect", "k", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1
    assert "a done marker without a value" in text
    assert "no TTL" in text
    assert "`goblin-claim forget k` reopens the key" in text
    with pytest.raises(ResultLostError):
        Claim(stock, "k", namespace=ns).acquire()


def test_inspect_shows_binary_values_as_bytes(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """A completed record whose value is not UTF-8 is shown as bytes, and is not a problem."""
    ns = unique("ns")
    handle = Claim(stock, "k", namespace=ns)
    publish(stock, handle, b"\xff\x00")
    status, text = run("inspect", "k", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0, text
    assert "raw bytes: b'\\xff\\x00'" in text
    assert "state   done by 'raw-writer'" in text


def test_inspect_and_forget_name_an_older_releases_two_keys(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Keys of the old two-key layout: inspect lists them as legacy (exit 1); forget leaves them and says so."""
    ns = unique("ns")
    stock.set(f"{ns}:{{evt88}}:claim", "done old-worker", ex=600)
    stock.set(f"{ns}:{{evt88}}:result", "charged", ex=600)
    status, text = run("inspect", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1, text
    assert "state   free" in text  # this release does not read them
    assert f"legacy  {ns}:{{evt88}}:claim: a string, TTL " in text
    assert f"legacy  {ns}:{{evt88}}:result: a string, TTL " in text
    assert "written by an older release" in text
    assert isinstance(Claim(stock, "evt88", namespace=ns).acquire(), Claimed)
    status, text = run("forget", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"deleted {ns}:{{evt88}}\n" in text
    assert f"left {ns}:{{evt88}}:claim: an older release's key" in text
    assert stock.exists(f"{ns}:{{evt88}}:claim", f"{ns}:{{evt88}}:result") == 2


def test_inspect_on_a_cluster(redis_native_cluster: list[servers.RedisProcess]) -> None:
    """Given any node of a cluster, inspect finds the key on the node that holds its slot."""
    ns = unique("ns")
    client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_native_cluster[0].port)
    try:
        Claim(client, "evt88", namespace=ns, token="worker-3").acquire()
        for node in redis_native_cluster:
            status, text = run("inspect", "evt88", "--namespace", ns, "--url", url(node))
            assert status == 0
            assert "held by 'worker-3'" in text
    finally:
        client.close()


def test_forget_says_what_it_deleted_and_reopens_the_key(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Forget deletes the record, says which key and what it held; again: nothing to forget (exit 0)."""
    ns = unique("ns")
    owner = Claim(stock, "evt88", namespace=ns, token="worker-3")
    owner.acquire()
    owner.complete("charged:txn_551")
    status, text = run("forget", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"forgot 'evt88': deleted {ns}:{{evt88}}\n" in text
    assert "it was: done by 'worker-3'" in text
    assert stock.exists(owner.claim_key) == 0
    assert stock.keys(f"{ns}:*") == []
    assert isinstance(Claim(stock, "evt88", namespace=ns).acquire(), Claimed)
    Claim(stock, "evt88", namespace=ns).forget()
    status, text = run("forget", "evt88", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"nothing to forget: {ns}:{{evt88}} does not exist" in text
