"""``goblin-claim scan`` / ``stats``: walking a namespace on real servers, standalone and cluster.

Keys are made by the SDK itself (``Claim``, ``@idempotent``) in each state; odd keys
by hand, as another writer or an older release (two keys per key) would leave them.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster

from goblin_claim import Claim, Claimed, idempotent
from goblin_claim._cli.connect import redacted
from goblin_claim._cli.doctor import pubsub_metrics_finding
from goblin_claim._cli.scan import classify, key_of, legacy_entry, owner_part, parse_name, scan_pattern
from goblin_claim._decorator.fingerprint import FINGERPRINT_CHARS
from goblin_claim._protocol.record import build_keys
from tests.cli.invoke import run, url
from tests.conftest import unique
from tests.support import servers


def listing(*argv: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """``goblin-claim scan --json argv...``: the exit status and the entries by key (each key once)."""
    status, text = run("scan", "--json", *argv)
    entries: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        entry = json.loads(line)
        assert entry["key"] not in entries, f"listed twice: {entry}"
        entries[entry["key"]] = entry
    return status, entries


def counts(text: str) -> dict[str, str]:
    """The ``stats`` table: state -> the figure as printed (``~`` marks an estimate)."""
    table = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("in-flight", "interrupted", "done", "odd", "total"):
            table[parts[0]] = parts[1]
    return table


def cli(*argv: str, module: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it: the installed console script, or ``python -m goblin_claim._cli``."""
    if module:
        command = [sys.executable, "-m", "goblin_claim._cli", *argv]
    else:
        command = [str(Path(sys.executable).parent / "goblin-claim"), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, **kwargs)


@pytest.fixture
def cluster_client(redis_cluster: list[servers.RedisProcess]) -> Iterator[redis.cluster.RedisCluster]:
    """A cluster client on the stock three-primary cluster."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    yield client
    client.close()


def make_each_state(client: Any, ns: str) -> dict[str, Any]:
    """One key per state: in flight and done through the SDK; three odd ones by hand, and an older release's pair."""
    flying = Claim(client, "evt-flying", namespace=ns, token="worker-3", lease=60, ttl=600)
    assert isinstance(flying.acquire(), Claimed)
    done = Claim(client, "evt{done}", namespace=ns, token="worker-4", lease=60, ttl=600)
    assert isinstance(done.acquire(), Claimed)
    done.complete("charged:txn_551")
    hashed = Claim(client, "evt-hash", namespace=ns)
    client.hset(hashed.claim_key, "f", "v")
    client.expire(hashed.claim_key, 600)
    marker = Claim(client, "evt-marker", namespace=ns)
    client.set(marker.claim_key, "done worker-5", ex=600)  # a done marker without a value: another writer's
    # An older release's two keys for one key (claim and result); this release does not read them.
    legacy = [f"{ns}:{{evt-old}}:claim", f"{ns}:{{evt-old}}:result"]
    client.set(legacy[0], "done worker-6", ex=600)
    client.set(legacy[1], "charged:txn_552", ex=600)
    return {"flying": flying, "done": done, "hash": hashed, "marker": marker, "legacy": legacy}


# The keys make_each_state lists, as scan names them.
def each_state_keys(ns: str) -> set[str]:
    """The keys scan lists for make_each_state's keys."""
    return {"evt-flying", "evt{done}", "evt-hash", "evt-marker", f"{ns}:{{evt-old}}:claim", f"{ns}:{{evt-old}}:result"}


# --------------------------------------------------------------------------- the pure pieces


@pytest.mark.parametrize("key", ["evt88", "a{b}c", "100%", "%7B", "}{", "naïve key", "x:{y}:claim"])
def test_parse_name_and_key_of_undo_build_keys(key: str) -> None:
    """The record build_keys makes, its fence counter and an older release's two keys parse back to the key."""
    prefix = b"ns:{"
    record = build_keys("ns", key)[0]
    assert build_keys("ns", key) == (record, record)
    for name, suffix in ((record, b""), (record + ":fence", b":fence"), (record + ":claim", b":claim")):
        parsed = parse_name(name.encode(), prefix)
        assert parsed is not None
        assert parsed[1] == suffix
        assert key_of(parsed[0]) == key


def test_names_goblin_claim_does_not_write_do_not_parse() -> None:
    """A name under the prefix with another suffix, no closing brace or an empty tag is not goblin-claim's."""
    prefix = b"ns:{"
    for name in (b"ns:{k}:other", b"ns:{k", b"ns:{}", b"ns:{}:claim", b"ns:{k}claim", b"other:{k}", b"ns:{k}:claimx"):
        assert parse_name(name, prefix) is None, name
    assert parse_name(b"ns:{k}:result", prefix) == (b"k", b":result")


def test_owner_part_leaves_out_only_the_call_fingerprint() -> None:
    """The decorator's ``.<16 hex>`` (the HTTP layers' ``.<32 hex>``) goes; a dot alone, or no suffix, stays."""
    assert owner_part(b"9f3a-1." + b"ab" * 8) == "9f3a-1"
    assert owner_part(b"9f3a-1." + b"ab" * 16) == "9f3a-1"
    assert owner_part(b"9f3a-1." + b"ab" * 12) == "9f3a-1." + "ab" * 12  # neither length: not a fingerprint
    assert owner_part(b"worker.3") == "worker.3"
    assert owner_part(b"worker-3") == "worker-3"
    assert owner_part(b"\xff." + b"0" * 16) == repr(b"\xff")
    assert owner_part(b"bell\x07") == repr("bell\x07")  # never a control byte on the operator's terminal


def test_classify_names_each_state() -> None:
    """A token: in flight; a record: done, by its token; a marker without a value or another type: odd, raising."""
    flying = classify("k", "string", 5000, b"w-1")
    assert flying is not None
    assert (flying.state, flying.ttl_ms, flying.holder, flying.note, flying.raises) == (
        "in-flight",
        5000,
        "w-1",
        "",
        None,
    )
    done = classify("k", "string", 9000, b"done w-1." + b"ab" * 8 + b" charged")
    assert done is not None
    assert (done.state, done.ttl_ms, done.holder, done.note) == ("done", 9000, "w-1", "")
    marker = classify("k", "string", 9000, b"done w-1")
    assert marker is not None
    assert (marker.state, marker.ttl_ms, marker.holder, marker.raises) == ("odd", 9000, "w-1", "ResultLostError")
    assert "ResultLostError" in marker.note
    # A head cut at 1024 bytes inside a long token is still a record (its value comes after).
    long = classify("k", "string", 9000, b"done " + b"t" * 1019)
    assert long is not None
    assert long.state == "done"
    hashed = classify("k", "hash", -1, None)
    assert hashed is not None
    assert (hashed.state, hashed.ttl_ms, hashed.raises) == ("odd", -1, "WrongTypeError")
    assert "WrongTypeError" in hashed.note
    stuck = classify("k", "string", -1, b"w-1")
    assert stuck is not None
    assert (stuck.state, stuck.ttl_ms, stuck.raises) == ("in-flight", -1, None)  # stuck, but acquire() answers
    assert "never frees itself" in stuck.note
    forever = classify("k", "string", -1, b"done w-1 v")
    assert forever is not None
    assert (forever.state, forever.ttl_ms) == ("done", -1)
    assert "no TTL" in forever.note
    assert classify("k", "none", -2, None) is None


def test_an_older_releases_keys_are_odd_and_say_so() -> None:
    """A claim or result key of the two-key layout: odd, named by its Redis key, saying this release ignores it."""
    entry = legacy_entry(b"ns:{k}:claim", b"k", b":claim", 5000)
    assert entry is not None
    assert (entry.state, entry.key, entry.ttl_ms, entry.holder, entry.raises) == (
        "odd",
        "ns:{k}:claim",
        5000,
        None,
        None,
    )
    assert "older release's two-key layout" in entry.note
    assert "does not read it" in entry.note
    assert legacy_entry(b"ns:{k}:result", b"k", b":result", -2) is None  # gone since SCAN named it


def test_scan_pattern_escapes_glob_characters() -> None:
    """A namespace's glob characters (star, question mark, brackets, backslash) match literally in SCAN MATCH."""
    assert scan_pattern("shop.charge") == "shop.charge:{*"
    assert scan_pattern("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\:{*"


def test_printed_urls_hide_the_password() -> None:
    """A password in --url is replaced by *** wherever the CLI prints the URL."""
    assert redacted("redis://app:s3cret@10.0.0.1:6380/2") == "redis://app:***@10.0.0.1:6380/2"
    assert redacted("redis://:s3cret@host/0") == "redis://:***@host/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"
    status, text = run("scan", "--url", f"redis://u:s3cret@{servers.HOST}:{servers.free_port()}/0")
    assert status == 1
    assert "s3cret" not in text
    assert "u:***@" in text


# --------------------------------------------------------------------------- scan, standalone


def test_scan_lists_each_state_with_holder_and_ttl(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """In flight (holder, lease left), done (holder, retention left), odd, older-layout keys; no result; exit 1."""
    ns = unique("scan")
    made = make_each_state(stock, ns)
    before = {name: (stock.dump(name), stock.ttl(name)) for name in stock.scan_iter(match=f"{ns}:*")}
    status, entries = listing("--namespace", ns, "--count", "2", "--url", url(redis_standalone))
    assert status == 1  # the hash and the marker: acquire() raises on them
    assert set(entries) == each_state_keys(ns)
    flying = entries["evt-flying"]
    assert (flying["state"], flying["holder"]) == ("in-flight", "worker-3")
    assert 50_000 < flying["ttl_ms"] <= 60_000
    done = entries["evt{done}"]
    assert (done["state"], done["holder"]) == ("done", "worker-4")
    assert 590_000 < done["ttl_ms"] <= 600_000
    assert entries["evt-hash"]["state"] == "odd"
    assert "a hash, not written by goblin-claim" in entries["evt-hash"]["note"]
    assert (entries["evt-marker"]["state"], entries["evt-marker"]["holder"]) == ("odd", "worker-5")
    assert "a done marker without a value" in entries["evt-marker"]["note"]
    raising = {key: entry["raises"] for key, entry in entries.items() if entry["raises"]}
    assert raising == {"evt-hash": "WrongTypeError", "evt-marker": "ResultLostError"}
    for name in made["legacy"]:
        assert entries[name]["state"] == "odd"
        assert "older release's two-key layout" in entries[name]["note"]
        assert 590_000 < entries[name]["ttl_ms"] <= 600_000
    status, text = run("scan", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1
    assert f"goblin-claim scan: namespace '{ns}' at {url(redis_standalone)}, standalone" in text
    assert "6 keys: 1 in-flight, 0 interrupted, 1 done, 4 odd" in text
    assert "2 keys that acquire() raises on (WrongTypeError, ResultLostError, InterruptedWorkError)" in text
    assert "charged:txn_55" not in text  # results are never printed
    # Read-only: every key holds what it held, and the owner still completes its work.
    after = {name: (stock.dump(name), stock.ttl(name)) for name in stock.scan_iter(match=f"{ns}:*")}
    assert after.keys() == before.keys()
    assert all(after[name][0] == before[name][0] for name in after)
    made["flying"].complete("charged:txn_554")
    assert listing("--namespace", ns, "--url", url(redis_standalone))[1]["evt-flying"]["state"] == "done"


def test_scan_lists_a_fenced_claim_once_and_an_evicted_record_not_at_all(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A fenced claim's counter is not a key of its own; a record deleted (evicted) is gone and its work free."""
    ns = unique("scan")
    fenced = Claim(stock, "evt-fenced", namespace=ns, token="worker-7", fencing=True, lease=60)
    assert isinstance(fenced.acquire(), Claimed)
    assert stock.exists(fenced.claim_key + ":fence") == 1
    status, entries = listing("--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert list(entries) == ["evt-fenced"]
    assert (entries["evt-fenced"]["state"], entries["evt-fenced"]["holder"]) == ("in-flight", "worker-7")
    fenced.complete("v")
    stock.delete(fenced.claim_key)  # what an eviction does to the record
    status, entries = listing("--namespace", ns, "--url", url(redis_standalone))
    assert (status, entries) == (0, {})
    assert isinstance(Claim(stock, "evt-fenced", namespace=ns).acquire(), Claimed)


def test_scan_filters_by_state_and_the_summary_counts_every_state(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """--state lists one state (repeatable); the summary and the exit status still count every key walked."""
    ns = unique("scan")
    make_each_state(stock, ns)
    status, text = run("scan", "--namespace", ns, "--state", "in-flight", "--url", url(redis_standalone))
    assert status == 1  # the odd keys acquire() raises on were walked, though not listed
    assert "evt-flying" in text
    assert "evt{done}" not in text
    assert "6 keys: 1 in-flight, 0 interrupted, 1 done, 4 odd, 1 listed (--state in-flight)" in text
    status, entries = listing("--namespace", ns, "--state", "done", "--state", "odd", "--url", url(redis_standalone))
    assert status == 1
    assert set(entries) == each_state_keys(ns) - {"evt-flying"}
    with pytest.raises(SystemExit) as refused:  # "lost" (a done marker without its result) needs two keys
        run("scan", "--namespace", ns, "--state", "lost", "--url", url(redis_standalone))
    assert refused.value.code == 2


def test_scan_limit_stops_early(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """--limit N lists N keys and says it stopped."""
    ns = unique("scan")
    for index in range(12):
        Claim(stock, f"k{index}", namespace=ns, lease=60).acquire()
    status, text = run("scan", "--namespace", ns, "--limit", "5", "--count", "3", "--url", url(redis_standalone))
    assert status == 0
    assert sum(line.startswith("in-flight") for line in text.splitlines()) == 5
    assert "stopped after 5 keys (--limit)" in text


def test_a_namespace_with_glob_characters_matches_only_itself(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Scanning ``a*b`` lists a*b's keys, not those of ``axb`` (SCAN MATCH would take * as a wildcard)."""
    base = unique("glob")
    Claim(stock, "mine", namespace=f"{base}*b", lease=60).acquire()
    Claim(stock, "theirs", namespace=f"{base}xb", lease=60).acquire()
    Claim(stock, "nested", namespace=f"{base}*b:more", lease=60).acquire()
    status, entries = listing("--namespace", f"{base}*b", "--url", url(redis_standalone))
    assert status == 0
    assert set(entries) == {"mine"}


def test_scan_hides_the_call_fingerprint_and_the_results_of_decorated_work(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """@idempotent keys, done and in flight, show the token's owner part only; each call ran once."""
    ns = unique("deco")
    runs: collections.Counter[str] = collections.Counter()
    started, finish = threading.Event(), threading.Event()

    @idempotent(stock, key="order_id", namespace=ns, lease=30, ttl=600, wait=10)
    def charge(order_id: str, card: str) -> dict[str, str]:
        runs[order_id] += 1
        if order_id == "slow":
            started.set()
            assert finish.wait(30)
        return {"receipt": f"secret-receipt-{order_id}"}

    charge("fast", card="cardnumber-1")
    worker = threading.Thread(target=charge, args=("slow",), kwargs={"card": "cardnumber-2"})
    worker.start()
    try:
        assert started.wait(10)
        raw = {key: stock.get(build_keys(ns, key)[0]) for key in ("fast", "slow")}
        status, text = run("scan", "--namespace", ns, "--url", url(redis_standalone))
        status_json, entries = listing("--namespace", ns, "--url", url(redis_standalone))
    finally:
        finish.set()
        worker.join(30)
    assert (status, status_json) == (0, 0)
    assert entries["fast"]["state"] == "done"
    assert entries["slow"]["state"] == "in-flight"
    assert raw["fast"] is not None
    assert raw["fast"].startswith(b"done ")
    assert raw["slow"] is not None
    assert not raw["slow"].startswith(b"done ")
    for key, held in raw.items():
        assert held is not None
        token = held.split(b" ", 2)[1] if held.startswith(b"done ") else held  # done <token> <value>
        owner, fingerprint = token.decode().rsplit(".", 1)
        assert len(fingerprint) == FINGERPRINT_CHARS
        assert entries[key]["holder"] == owner
        assert fingerprint not in text
        assert fingerprint not in json.dumps(entries)
    assert "secret-receipt" not in text
    assert "cardnumber" not in text
    assert charge("slow", card="cardnumber-2") == {"receipt": "secret-receipt-slow"}
    assert runs == {"fast": 1, "slow": 1}


def test_a_scan_during_live_work_never_reports_a_false_odd_key(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Scans racing claims, completions, forgets and expiries (real threads) see no odd key; each id runs once."""
    ns = unique("race")
    ids = [f"id-{index}" for index in range(150)]
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    client = redis_standalone.client(max_connections=64)

    @idempotent(client, key="item", namespace=ns, lease=5, ttl=2, wait=10)
    def work(item: str) -> str:
        with lock:
            runs[item] += 1
        time.sleep(0.002)
        return item

    def worker(order: list[str]) -> None:
        for item in order:
            work(item)

    stop = threading.Event()

    def churn() -> None:
        # Claim, complete, then forget, over and over: the moves a non-atomic read could misread as odd.
        while not stop.is_set():
            for index in range(3):
                claim = Claim(client, f"churn-{index}", namespace=ns, lease=5, ttl=5)
                if isinstance(claim.acquire(), Claimed):
                    claim.complete("v")
                    claim.forget()

    threads = [threading.Thread(target=worker, args=(ids[shift:] + ids[:shift],)) for shift in (0, 37, 75, 112)]
    threads += [threading.Thread(target=churn) for _ in range(2)]
    for thread in threads:
        thread.start()
    statuses, seen = [], collections.Counter()
    deadline = time.monotonic() + 30
    try:
        # Scan while the work runs, and on past it while the 2 s results expire. Batches of
        # 500 make pipelines that span several of the server's reads, so other clients'
        # commands (and expiries) land between one key's reads: without reading the record's
        # head twice, this reports expired, forgotten and just-claimed keys as odd.
        quiet_until = None
        while time.monotonic() < deadline:
            status, entries = listing("--namespace", ns, "--count", "500", "--url", url(redis_standalone))
            statuses.append(status)
            seen.update(entry["state"] for entry in entries.values())
            assert not [entry for entry in entries.values() if entry["state"] == "odd"], entries
            # Nor a key read half before and half after it went (a holder read as empty).
            assert all(entry["holder"] and entry["ttl_ms"] >= 0 for entry in entries.values()), entries
            if quiet_until is None and not any(thread.is_alive() for thread in threads[:4]):
                quiet_until = time.monotonic() + 3
            if quiet_until is not None and time.monotonic() > quiet_until:
                break
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        client.close()
    assert set(statuses) == {0}
    assert len(statuses) >= 5
    assert seen["done"] > 0
    assert runs == dict.fromkeys(ids, 1)


# --------------------------------------------------------------------------- stats


def test_stats_counts_each_state_exactly(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """An exact walk counts every state, says it is exact and points at the odd keys; exit 1 until they are gone."""
    ns = unique("stats")
    made = make_each_state(stock, ns)
    for index in range(7):
        claim = Claim(stock, f"more-{index}", namespace=ns, lease=60, ttl=600)
        claim.acquire()
        if index % 2:
            claim.complete("v")
    status, text = run("stats", "--namespace", ns, "--count", "3", "--url", url(redis_standalone))
    assert status == 1, text
    assert counts(text) == {"in-flight": "5", "interrupted": "0", "done": "4", "odd": "4", "total": "13"}
    assert "2 keys that acquire() raises on" in text
    assert "exact: every key of the namespace, walked with SCAN on 1 primary" in text
    assert (
        f"odd keys found: 4; list them, with what each is, with `goblin-claim scan --namespace {ns} --state odd`"
        in text
    )
    stock.delete(*made["legacy"], made["hash"].claim_key, made["marker"].claim_key)
    status, text = run("stats", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0, text
    assert counts(text)["odd"] == "0"
    assert "odd keys" not in text


def test_stats_samples_a_large_keyspace_and_labels_the_estimate(redis_server_binary: str) -> None:
    """Past --exact-up-to (or with --sample) stats reads a few SCAN batches, scales by DBSIZE and says so."""
    with servers.standalone(redis_server_binary) as server:
        client = server.client()
        try:
            pipe = client.pipeline(transaction=False)
            for index in range(6000):
                pipe.set(f"other:{index}", "x", ex=600)
            pipe.execute()
            pairs = Claim.acquire_many(client, [f"k{index}" for index in range(1200)], namespace="big", lease=600)
            for claim, outcome in pairs[:600]:
                assert isinstance(outcome, Claimed)
                claim.complete("v")
            target = url(server)
            status, text = run("stats", "--namespace", "big", "--exact-up-to", "1000", "--count", "10", "--url", target)
            assert status == 0, text
            table = counts(text)
            assert all(figure.startswith("~") for figure in table.values()), table
            for state in ("in-flight", "done"):
                assert 300 <= int(table[state].lstrip("~").replace(",", "")) <= 900, table  # truth: 600 each
            assert f"estimate (DBSIZE {6000 + 1200:,} is over --exact-up-to 1,000)" in text  # one key per claim
            assert "scaled by DBSIZE" in text
            status, text = run("stats", "--namespace", "big", "--sample", "2", "--count", "300", "--url", target)
            assert "estimate (--sample 2): 2 SCAN batches of 300 per primary" in text
            status, text = run("stats", "--namespace", "big", "--exact", "--exact-up-to", "1000", "--url", target)
            assert counts(text) == {"in-flight": "600", "interrupted": "0", "done": "600", "odd": "0", "total": "1,200"}
            assert "exact:" in text
            # Odd keys in the sample: said to be found in the sample.
            pipe = client.pipeline(transaction=False)
            for index in range(600):
                pipe.hset(f"big:{{odd-{index}}}", "f", "v")
            pipe.execute()
            status, text = run("stats", "--namespace", "big", "--sample", "4", "--count", "300", "--url", target)
            assert status == 1, text  # hashes where records belong, found in the sample
            assert int(counts(text)["odd"].lstrip("~").replace(",", "")) > 0
            assert "odd keys found in the sample" in text
            # Evicted records are simply gone: the work is free again.
            client.delete(*(claim.claim_key for claim, _ in pairs[:600]))
            status, text = run("stats", "--namespace", "big", "--exact", "--url", target)
            assert counts(text) == {"in-flight": "600", "interrupted": "0", "done": "0", "odd": "600", "total": "1,200"}
            assert isinstance(Claim(client, "k0", namespace="big").acquire(), Claimed)
        finally:
            client.close()


# --------------------------------------------------------------------------- cluster, and as an operator runs it


def test_scan_walks_every_primary_of_a_cluster(
    redis_cluster: list[servers.RedisProcess], cluster_client: redis.cluster.RedisCluster
) -> None:
    """Given one node, the console script lists keys from all three primaries, each once; exit 1 for the odd two."""
    ns = unique("cscan")
    make_each_state(cluster_client, ns)
    keys = [f"spread-{index}" for index in range(40)]
    for key in keys:
        Claim(cluster_client, key, namespace=ns, token="worker-9", lease=60).acquire()
    holders = {cluster_client.get_node_from_key(build_keys(ns, key)[0]).name for key in keys}
    assert len(holders) == 3  # the keys really are spread over every primary
    done = cli("scan", "--json", "--namespace", ns, "--count", "5", "--url", url(redis_cluster[2]))
    assert done.returncode == 1, done.stderr  # make_each_state's hash and marker
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    listed = collections.Counter(entry["key"] for entry in entries)
    assert listed == dict.fromkeys([*keys, *each_state_keys(ns)], 1)
    assert {entry["state"] for entry in entries if entry["key"] in keys} == {"in-flight"}
    text = cli("scan", "--namespace", ns, "--url", url(redis_cluster[0]))
    assert "a cluster of 3 primaries" in text.stdout
    assert "46 keys: 41 in-flight, 0 interrupted, 1 done, 4 odd" in text.stdout


def test_stats_on_a_cluster_counts_every_primary(
    redis_cluster: list[servers.RedisProcess], cluster_client: redis.cluster.RedisCluster
) -> None:
    """``python -m goblin_claim._cli stats`` on a cluster counts exactly over the 3 primaries; --sample labels it."""
    ns = unique("cstats")
    make_each_state(cluster_client, ns)
    for index in range(30):
        claim = Claim(cluster_client, f"c{index}", namespace=ns, lease=60)
        claim.acquire()
        claim.complete("v")
    done = cli("stats", "--namespace", ns, "--count", "4", "--url", url(redis_cluster[1]), module=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert counts(done.stdout) == {"in-flight": "1", "interrupted": "0", "done": "31", "odd": "4", "total": "36"}
    assert "walked with SCAN on 3 primaries" in done.stdout
    done = cli("stats", "--namespace", ns, "--sample", "1", "--count", "2", "--url", url(redis_cluster[1]), module=True)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1 when the sample met the hash or the marker
    assert "estimate (--sample 1)" in done.stdout
    assert "on 3 primaries" in done.stdout


def test_scan_help_documents_the_states_and_the_exit_status() -> None:
    """``goblin-claim scan --help`` and ``stats --help`` name the states, SCAN, the estimate and the older layout."""
    scan = cli("scan", "--help")
    assert scan.returncode == 0
    flat = " ".join(scan.stdout.split())
    for words in ("in-flight", "done", "odd", "older release's two-key layout", "SCAN MATCH", "never KEYS", "--count"):
        assert words in flat, words
    assert "lost" not in flat
    stats = cli("stats", "--help")
    flat = " ".join(stats.stdout.split())
    for words in ("--sample", "--exact", "estimate", "DBSIZE", "in-flight, interrupted, done, odd"):
        assert words in flat, words
    top = " ".join(cli("--help").stdout.split())
    assert "exit status: 0 when all is well; 1 on a problem" in top
    assert "a key scan or stats finds that acquire() raises on" in top
    assert "lost" not in top


# --------------------------------------------------------------------------- doctor: pub/sub metrics


def test_doctor_warns_when_redis_py_metrics_record_channel_names() -> None:
    """MetricGroup.PUBSUB without hide_pubsub_channel_names is a warning; hidden or off is ok; not set up, a note."""
    from redis.observability import MetricGroup, OTelConfig

    warned = pubsub_metrics_finding(OTelConfig(metric_groups=[MetricGroup.PUBSUB]))
    assert warned.level == "warning"
    assert "named after claim keys" in warned.what
    assert "hide_pubsub_channel_names=True" in warned.todo
    hidden = OTelConfig(metric_groups=[MetricGroup.PUBSUB], hide_pubsub_channel_names=True)
    assert pubsub_metrics_finding(hidden).level == "ok"
    assert pubsub_metrics_finding(OTelConfig(metric_groups=[MetricGroup.COMMAND])).level == "ok"
    assert pubsub_metrics_finding(OTelConfig(enabled_telemetry=[], metric_groups=[MetricGroup.PUBSUB])).level == "ok"
    assert pubsub_metrics_finding(None).level == "note"
    assert pubsub_metrics_finding(None, available=False).level == "ok"


def test_doctor_checks_the_applications_observability_setup(
    redis_standalone: servers.RedisProcess, tmp_path: Path
) -> None:
    """``doctor --import MODULE`` sees the app's redis-py OTelConfig: WARNING and exit 0 when channel names are kept."""
    (tmp_path / "app_telemetry.py").write_text(
        "from redis.observability import MetricGroup, OTelConfig, get_observability_instance\n"
        "get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.PUBSUB]))\n"
    )
    (tmp_path / "app_hidden.py").write_text(
        "from redis.observability import MetricGroup, OTelConfig, get_observability_instance\n"
        "get_observability_instance().init(\n"
        "    OTelConfig(metric_groups=[MetricGroup.PUBSUB], hide_pubsub_channel_names=True)\n"
        ")\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = cli(
        "doctor", "--no-write", "--ephemeral", "--import", "app_telemetry", "--url", url(redis_standalone), env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING  redis-py's OpenTelemetry metrics record the channel name" in done.stdout
    assert "no problems, 1 warning" in done.stdout
    done = cli("doctor", "--no-write", "--ephemeral", "--import", "app_hidden", "--url", url(redis_standalone), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "channel names hidden" in done.stdout
    assert "WARNING" not in done.stdout
    done = cli("doctor", "--import", "no_such_module_here", "--url", url(redis_standalone), env=env)
    assert done.returncode == 2
    assert "cannot import no_such_module_here" in done.stderr
