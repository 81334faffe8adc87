"""``goblin-claim scan``, ``stats`` and ``namespaces`` in process on the stock redis-server.

Names it cannot parse, keys without a TTL, multi-round walks, and a read the ACL refuses half way.
"""

from __future__ import annotations

import json

import redis

from goblin_claim import Claim, Claimed
from tests.cli.invoke import run, url
from tests.conftest import unique
from tests.support import servers


def rows(text: str) -> dict[str, list[str]]:
    """Scan's table: the last word of each row (the key, or the note's end) -> the row's words."""
    found = {}
    for line in text.splitlines()[2:]:
        if line.startswith(("odd", "done", "in-flight")):
            found[line.split()[3]] = line.split()
    return found


def test_scan_lists_names_it_does_not_write_and_keys_without_a_ttl(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A name under the namespace that is no record is odd with no TTL shown; a record without a TTL says so."""
    ns = unique("scan-ns")
    stock.set(f"{ns}:{{evt-1}}junk", "x", ex=600)
    stock.set(Claim(stock, "evt-2", namespace=ns).claim_key, "worker-2")  # another writer's, no TTL
    stock.set(f"{ns}:{{".encode() + b"\xff\xfe}", "worker-3", ex=600)  # a tag that is not UTF-8
    status, text = run("scan", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    odd = next(line for line in text.splitlines() if f"{ns}:{{evt-1}}junk" in line)
    assert odd.split()[:2] == ["odd", "-"]
    assert odd.endswith("(a key under the namespace that goblin-claim does not write)")
    held = next(line for line in text.splitlines() if " evt-2 " in line)
    assert held.split()[:4] == ["in-flight", "no", "TTL", "worker-2"]
    assert held.endswith("(no TTL: goblin-claim always sets one (another writer?), so it never frees itself)")
    assert any(line.split()[-1] == "b'\\xff\\xfe'" for line in text.splitlines() if line.startswith("in-flight"))
    assert "3 keys: 2 in-flight, 0 interrupted, 0 done, 1 odd" in text
    stock.delete(Claim(stock, "evt-2", namespace=ns).claim_key)


def test_scan_json_of_a_key_without_a_ttl(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """``--json`` gives ``ttl_ms`` -1 for a record without a TTL, and its holder."""
    ns = unique("scan-ns")
    name = Claim(stock, "evt-9", namespace=ns).claim_key
    stock.set(name, "worker-9")
    status, text = run("scan", "--namespace", ns, "--json", "--url", url(redis_standalone))
    stock.delete(name)
    assert status == 0
    entry = json.loads(text)
    assert (entry["state"], entry["key"], entry["ttl_ms"], entry["holder"]) == ("in-flight", "evt-9", -1, "worker-9")


def test_namespaces_walks_in_many_rounds_and_skips_names_of_another_shape(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """``--count 1`` takes many SCAN rounds and counts every key once; ``x:{y}z`` names are not namespaces."""
    ns = unique("spaces")
    for key in ("a", "b", "c"):
        assert isinstance(Claim(stock, key, namespace=ns).acquire(), Claimed)
    other = unique("other")
    stock.set(f"{other}:{{y}}z", "v", ex=600)
    status, text = run("namespaces", "--count", "1", "--json", "--url", url(redis_standalone))
    assert status == 0
    found = {row["namespace"]: row["keys"] for row in map(json.loads, text.splitlines())}
    assert found[ns] == 3
    assert other not in found


def test_scan_that_may_not_read_the_records_exits_1(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """A user that may SCAN and TYPE but not GETRANGE: the walk stops with the server's refusal, exit 1."""
    ns = unique("scan-ns")
    assert isinstance(Claim(stock, "evt-1", namespace=ns).acquire(), Claimed)
    user = unique("scan-user")
    stock.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "~*", "resetchannels", "+@connection", "+scan", "+type", "+pttl", "+dbsize"
    )
    try:
        status, text = run("scan", "--namespace", ns, "--url", url(redis_standalone, user))
    finally:
        stock.execute_command("ACL", "DELUSER", user)
    assert status == 1
    assert "goblin-claim scan: the server refused: " in text
    assert "no permissions to run the 'getrange' command" in text


def test_stats_of_an_empty_namespace_is_exact_and_zero(redis_standalone: servers.RedisProcess) -> None:
    """Stats on an empty namespace of a small keyspace: every count 0, walked exactly, exit 0."""
    ns = unique("stats-ns")
    status, text = run("stats", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"goblin-claim stats: namespace {ns!r} at {url(redis_standalone)}, standalone" in text
    assert [line.split() for line in text.splitlines()[1:6]] == [
        ["in-flight", "0"],
        ["interrupted", "0"],
        ["done", "0"],
        ["odd", "0"],
        ["total", "0"],
    ]
    assert "exact: every key of the namespace, walked with SCAN on 1 primary" in text
