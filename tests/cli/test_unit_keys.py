"""``goblin-claim`` on at-most-once records and checkpoints: in flight, interrupted, and the progress beside them.

An at-most-once record (``held <deadline_ms> <claimed_ms> <token>``) is in flight until
its lease deadline and interrupted after it, read against the server's clock (TIME),
never the operator's: ``inspect`` says which, with the holder and when it claimed;
``scan`` and ``stats`` count interrupted keys as their own state (and exit 1: every
caller gets ``InterruptedWorkError``). A checkpoint key (``<record>:checkpoint``) is
shown with its record by ``inspect`` and never counted on its own; ``forget``
deletes it with the record.
"""

from __future__ import annotations

import datetime
import json
import re
import time

import pytest
import redis
import redis.cluster

from goblin_claim import Claim, Claimed, InterruptedWorkError
from goblin_claim._cli.scan import classify, parse_name
from goblin_claim._handle import CHECKPOINT_SUFFIX
from goblin_claim._protocol.record import build_keys
from tests.cli.invoke import run, url
from tests.conftest import unique
from tests.support import servers


def _held(client: redis.Redis | redis.cluster.RedisCluster, ns: str, key: str, lease: int, token: str) -> Claim:
    """An at-most-once claim with checkpoints, taken and checkpointed, never completed."""
    claim = Claim(client, key, namespace=ns, lease=lease, token=token, at_most_once=True, checkpoints=True)
    assert isinstance(claim.acquire(), Claimed)
    claim.checkpoint("step 2 of 5")
    return claim


def test_classify_reads_an_at_most_once_record_against_the_servers_clock() -> None:
    """Before its deadline: in flight, the lease left; at or after it: interrupted, raising, the retention left."""
    head = b"held 1000500 990000 worker-1." + b"ab" * 8
    flying = classify("k", "string", 86_000_000, head, 1_000_000)
    assert flying is not None
    assert (flying.state, flying.ttl_ms, flying.holder, flying.raises) == ("in-flight", 500, "worker-1", None)
    assert "at most once, claimed 1970-01-01T00:16:30+00:00" in flying.note
    stopped = classify("k", "string", 86_000_000, head, 1_002_500)
    assert stopped is not None
    assert (stopped.state, stopped.ttl_ms, stopped.holder) == ("interrupted", 86_000_000, "worker-1")
    assert stopped.raises == "InterruptedWorkError"
    assert "its lease ended 2.0 s ago without a result" in stopped.note
    unknown = classify("k", "string", 86_000_000, head)  # no clock (TIME refused): never called interrupted
    assert unknown is not None
    assert (unknown.state, unknown.ttl_ms) == ("in-flight", None)
    assert "may not run TIME" in unknown.note


def test_a_checkpoint_key_is_beside_its_record() -> None:
    """``<ns>:{<key>}:checkpoint`` parses as the record's, under the suffix of its own."""
    assert parse_name(b"ns:{k}" + CHECKPOINT_SUFFIX.encode(), b"ns:{") == (b"k", CHECKPOINT_SUFFIX.encode())


def test_inspect_shows_an_at_most_once_claim_in_flight_with_its_checkpoint(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Held at most once, within its lease: in flight (holder, claimed time, lease left), the checkpoint's size."""
    ns = unique("unit")
    _held(stock, ns, "po-1", 30, "worker-1")
    status, text = run("inspect", "po-1", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0, text
    record = build_keys(ns, "po-1")[0]
    assert f"record  {record}: held by 'worker-1' at most once, claimed " in text
    assert f"checkpoint {record}:checkpoint: 11 bytes, TTL " in text
    assert re.search(r"state   held by 'worker-1', lease ends in (29|30)\.\d s: in flight, at most once", text), text


def test_inspect_scan_and_stats_name_an_interrupted_key_and_forget_reopens_it(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Lease over: inspect says interrupted (exit 1); scan lists it raising, stats counts it; forget takes both keys."""
    ns = unique("unit")
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    _held(stock, ns, "po-2", 1, "worker-2")
    _held(stock, ns, "po-3", 30, "worker-3")
    done = Claim(stock, "po-4", namespace=ns)
    done.acquire()
    done.complete("paid")
    time.sleep(1.2)
    target = url(redis_standalone)
    status, text = run("inspect", "po-2", "--namespace", ns, "--url", target)
    assert status == 1, text
    claimed = re.search(r"claimed (\S+), TTL", text)
    assert claimed is not None
    assert before <= datetime.datetime.fromisoformat(claimed.group(1)) <= before + datetime.timedelta(seconds=2)
    assert "state   interrupted: the at-most-once attempt of 'worker-2' ended without a result" in text
    assert "        -> find out whether the work took effect; then `goblin-claim forget po-2` lets it run again" in text
    status, listed = run("scan", "--json", "--namespace", ns, "--url", target)
    assert status == 1
    entries = {entry["key"]: entry for entry in map(json.loads, listed.splitlines())}
    assert set(entries) == {"po-2", "po-3", "po-4"}  # the checkpoints are not keys of their own
    assert (entries["po-2"]["state"], entries["po-2"]["holder"], entries["po-2"]["raises"]) == (
        "interrupted", "worker-2", "InterruptedWorkError"
    )  # fmt: skip
    assert (entries["po-3"]["state"], entries["po-3"]["raises"]) == ("in-flight", None)
    assert 0 < entries["po-3"]["ttl_ms"] <= 30_000  # the lease left, not the record's retention
    status, table = run("scan", "--namespace", ns, "--url", target)
    assert "3 keys: 1 in-flight, 1 interrupted, 1 done, 0 odd" in table
    assert "InterruptedWorkError" in table
    status, stats = run("stats", "--json", "--namespace", ns, "--url", target)
    assert status == 1
    document = json.loads(stats)
    assert document["counts"] == {"in-flight": 1, "interrupted": 1, "done": 1, "odd": 0}
    assert document["raising"] == 1
    status, spaces = run("namespaces", "--json", "--url", target)
    assert {"namespace": ns, "keys": 3} in map(json.loads, spaces.splitlines())
    status, forgot = run("forget", "po-2", "--namespace", ns, "--url", target)
    assert status == 0, forgot
    checkpoint = build_keys(ns, "po-2")[0] + CHECKPOINT_SUFFIX
    assert f"deleted {checkpoint} too" in forgot
    assert stock.exists(build_keys(ns, "po-2")[0], checkpoint) == 0
    assert isinstance(Claim(stock, "po-2", namespace=ns).acquire(), Claimed)  # reopened


def test_inspect_and_scan_read_the_clock_of_the_node_holding_the_key(redis_cluster: list[servers.RedisProcess]) -> None:
    """On a cluster: inspect reads TIME on the key's own node, scan on each primary; both call the key interrupted."""
    cluster_client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    ns = unique("cunit")
    keys = [f"po-{index}" for index in range(6)]
    for key in keys:
        _held(cluster_client, ns, key, 1, "worker-9")
    time.sleep(1.2)
    with pytest.raises(InterruptedWorkError):
        Claim(cluster_client, keys[0], namespace=ns).acquire()
    target = url(redis_cluster[1])
    for key in keys:
        status, text = run("inspect", key, "--namespace", ns, "--url", target)
        assert status == 1, text
        assert "state   interrupted" in text
    status, listed = run("scan", "--json", "--namespace", ns, "--url", target)
    assert status == 1
    assert sorted(entry["key"] for entry in map(json.loads, listed.splitlines())) == keys
    assert {entry["state"] for entry in map(json.loads, listed.splitlines())} == {"interrupted"}
    cluster_client.close()


def test_a_user_without_time_still_inspects_and_scans_saying_what_it_cannot_tell(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """No +time: inspect and scan still read an at-most-once record, as held, saying they cannot tell interrupted."""
    ns = unique("unit")
    _held(stock, ns, "po-5", 1, "worker-5")
    time.sleep(1.2)
    user = unique("no-time")
    stock.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels", "+@read", "+@connection", "-time")
    try:
        status, text = run("inspect", "po-5", "--namespace", ns, "--url", url(redis_standalone, user))
        assert status == 0, text
        assert "in flight or interrupted cannot be told, as this user may not run TIME" in text
        status, listed = run("scan", "--json", "--namespace", ns, "--url", url(redis_standalone, user))
        assert status == 0, listed
        (entry,) = map(json.loads, listed.splitlines())
        assert (entry["state"], entry["ttl_ms"]) == ("in-flight", None)
        assert "may not run TIME" in entry["note"]
    finally:
        stock.execute_command("ACL", "DELUSER", user)
