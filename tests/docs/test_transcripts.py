"""The CLI output the manual shows is what the command prints: each transcript is made here.

Each test starts a redis-server of its own (with the settings the transcript is about),
writes the keys it shows, runs ``goblin-claim`` as a user would (a subprocess, a clean
environment) and compares its output with the file under ``docs/figures/cli/`` that the
pages include. What changes from run to run is normalized first: the port is shown as
6379, a TTL left as whole seconds, and the lines of a SCAN walk (whose order is the
server's) sorted. ``GOBLIN_CLAIM_WRITE_TRANSCRIPTS=1`` writes the files instead of
comparing (after a change to the command's output).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from goblin_claim import Claim
from tests.support import servers
from tests.support.servers import RedisProcess

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures" / "cli"
SHOWN_URL = "redis://127.0.0.1:6379/0"  # the server as the pages show it
WRITE = os.environ.get("GOBLIN_CLAIM_WRITE_TRANSCRIPTS") == "1"


def _binary() -> str:
    packaged = Path("/usr/bin/redis-server")
    found = shutil.which("redis-server") or (str(packaged) if packaged.exists() else None)
    if found is None:
        pytest.skip("redis-server is not installed (make redis-server)")
    return found


@pytest.fixture
def durable() -> Iterator[RedisProcess]:
    """A redis-server with AOF on (appendfsync everysec) and noeviction, as the persistence page advises."""
    server = servers.start_server(_binary(), "--appendonly", "yes", "--maxmemory-policy", "noeviction")
    yield server
    server.stop()


@pytest.fixture
def evicting() -> Iterator[RedisProcess]:
    """A redis-server that may evict records (volatile-lru), with AOF on."""
    server = servers.start_server(
        _binary(), "--appendonly", "yes", "--maxmemory", "256mb", "--maxmemory-policy", "volatile-lru"
    )
    yield server
    server.stop()


SET_TTLS = (30, 86400)  # the lease and the ttl the transcripts' keys are written with


def _tens(seconds: float) -> int:
    """A TTL left, shown as the lease or ttl it was set to (29.4 s reads 30, 86396 s reads 86400)."""
    return next((ttl for ttl in SET_TTLS if ttl - 20 < seconds <= ttl), math.ceil(seconds))


def normalized(text: str, port: int, *, walk: bool = False) -> str:
    """The command's output ``text`` with what varies between runs made fixed."""
    text = text.replace(f"{servers.HOST}:{port}", "127.0.0.1:6379")
    text = re.sub(r'("ttl_ms": )(\d+)', lambda m: f"{m.group(1)}{_tens(int(m.group(2)) / 1000) * 1000}", text)
    text = re.sub(r"\b(\d+\.\d) s\b", lambda m: f"{_tens(float(m.group(1))):.1f} s", text)
    text = re.sub(r"\bkept (\d+) s\b", lambda m: f"kept {_tens(int(m.group(1)))} s", text)
    if walk:  # SCAN's order is the server's: the walk's lines sorted, the header first and the summary last
        lines = text.splitlines()
        body = [line for line in lines if line.startswith(("{", "odd ", "in-flight ", "interrupted ", "done "))]
        head = [line for line in lines[: lines.index(body[0])]] if body else []
        rest = [line for line in lines if line not in body and line not in head]
        text = "\n".join([*head, *sorted(body), *rest]) + ("\n" if text else "")
    return text


def goblin_claim(*argv: str) -> tuple[int, str]:
    """Run the command as a user would; its exit status and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_URL", "GOBLIN_CLAIM_"))}
    env["COLUMNS"] = "100"
    done = subprocess.run(
        [sys.executable, "-m", "goblin_claim._cli", *argv], capture_output=True, text=True, env=env, timeout=60
    )
    return done.returncode, done.stdout


def check(name: str, shown: str) -> None:
    """``shown`` is the transcript ``name`` the pages include (or becomes it, when writing)."""
    path = FIGURES / name
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(shown, "utf-8")
    assert path.read_text("utf-8") == shown, f"{path} is stale: rerun with GOBLIN_CLAIM_WRITE_TRANSCRIPTS=1"


def _command(argv: list[str], output: str, status: int) -> str:
    line = "$ goblin-claim " + " ".join(argv)
    return f"{line}\n{output}" + (f"$ echo $?\n{status}\n" if status else "")


def test_doctor_on_a_server_set_up_as_advised(durable: RedisProcess) -> None:
    """Doctor on a server with AOF and noeviction: no problems, and what the notes say."""
    argv = ["doctor", "--url", f"redis://{servers.HOST}:{durable.port}/0"]
    status, output = goblin_claim(*argv)
    assert status == 0, output
    assert "no problems" in output
    check("doctor.txt", _command(["doctor", "--url", SHOWN_URL], normalized(output, durable.port), status))


def test_doctor_on_a_server_that_can_evict(evicting: RedisProcess) -> None:
    """Doctor names an evicting maxmemory-policy as a problem, with the fix, and exits 1."""
    argv = ["doctor", "--url", f"redis://{servers.HOST}:{evicting.port}/0"]
    status, output = goblin_claim(*argv)
    assert status == 1, output
    assert "PROBLEM" in output
    assert "volatile-lru" in output
    check("doctor-evicting.txt", _command(["doctor", "--url", SHOWN_URL], normalized(output, evicting.port), status))


def _shop(server: RedisProcess) -> str:
    """Three keys in namespace ``shop``: one in flight, one done, one of another type; the URL."""
    with redis.Redis(host=servers.HOST, port=server.port) as client:
        client.flushall()
        Claim(client, "evt_1", namespace="shop", lease=30, token="worker-1").acquire()
        done = Claim(client, "evt_2", namespace="shop", lease=30, ttl=86400, token="worker-2")
        done.acquire()
        done.complete(b"receipt")
        client.hset("shop:{evt_3}", "a", "b")
    return f"redis://{servers.HOST}:{server.port}/0"


def test_scan_inspect_and_stats_of_a_namespace(durable: RedisProcess) -> None:
    """The scan lists each state with its holder and TTL, exits 1 for the key acquire() raises on; inspect, stats."""
    shown = []
    for argv, walk in (
        (["scan", "--namespace", "shop"], True),
        (["inspect", "evt_2", "--namespace", "shop"], False),
        (["stats", "--namespace", "shop"], False),
    ):
        status, output = goblin_claim(*argv, "--url", _shop(durable))  # the keys written just before
        shown.append(_command([*argv, "--url", SHOWN_URL], normalized(output, durable.port, walk=walk), status))
    check("scan.txt", shown[0])
    check("inspect.txt", shown[1])
    check("stats.txt", shown[2])


def test_scan_json_is_one_object_a_line_and_nothing_when_nothing_matches(durable: RedisProcess) -> None:
    """Scan with --json prints JSON Lines, one object per key; a namespace with no key prints nothing at all."""
    url = _shop(durable)
    argv = ["scan", "--namespace", "shop", "--json"]
    status, output = goblin_claim(*argv, "--url", url)
    assert status == 1
    assert len(output.splitlines()) == 3
    empty_status, empty = goblin_claim("scan", "--namespace", "nothing", "--json", "--url", url)
    assert (empty_status, empty) == (0, "")
    shown = _command([*argv, "--url", SHOWN_URL], normalized(output, durable.port, walk=True), status)
    empty_argv = ["scan", "--namespace", "nothing", "--json", "--url", SHOWN_URL]
    check("scan-json.txt", shown + _command(empty_argv, "", 0) + "$ goblin-claim scan --namespace nothing --json"
          " --url redis://127.0.0.1:6379/0 | wc -l\n0\n")  # fmt: skip


def _payouts(server: RedisProcess) -> str:
    """Namespace ``payouts``, at most once with checkpoints: one in flight, one interrupted, one done; the URL."""
    with redis.Redis(host=servers.HOST, port=server.port) as client:
        client.flushall()
        for key, lease, token in (("po_1", 30, "worker-1"), ("po_2", 1, "worker-2")):
            claim = Claim(
                client, key, namespace="payouts", lease=lease, token=token, at_most_once=True, checkpoints=True
            )
            claim.acquire()
            claim.checkpoint("step 2 of 5")
        done = Claim(client, "po_3", namespace="payouts", ttl=86400, token="worker-3", at_most_once=True)
        done.acquire()
        done.complete(b"paid")
        time.sleep(1.2)  # po_2's one-second lease is over: interrupted
    return f"redis://{servers.HOST}:{server.port}/0"


def _clocked(text: str) -> str:
    """Times read from the clock shown fixed: when an attempt claimed its key, how long ago its lease ended."""
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "2026-12-04T09:30:00+00:00", text)
    return re.sub(r"\b(ended|over) \d+\.\d s ago", r"\1 0.2 s ago", text)


def test_at_most_once_keys_in_flight_interrupted_and_their_checkpoints(durable: RedisProcess) -> None:
    """Scan, inspect and stats of at-most-once keys: in flight, interrupted (exit 1), a checkpoint beside each."""
    url = _payouts(durable)
    shown = []
    for argv, walk in (
        (["scan", "--namespace", "payouts"], True),
        (["inspect", "po_2", "--namespace", "payouts"], False),
        (["inspect", "po_1", "--namespace", "payouts"], False),
        (["stats", "--namespace", "payouts"], False),
        (["forget", "po_2", "--namespace", "payouts"], False),
    ):
        status, output = goblin_claim(*argv, "--url", url)
        shown.append(
            _command([*argv, "--url", SHOWN_URL], _clocked(normalized(output, durable.port, walk=walk)), status)
        )
    assert "interrupted" in shown[0]
    check("at-most-once.txt", "".join(shown))


def test_doctor_names_what_a_restricted_user_lacks(durable: RedisProcess) -> None:
    """Doctor, connected as a user granted the exact commands but PTTL, TIME and pub/sub, names what each lacks."""
    with redis.Redis(host=servers.HOST, port=durable.port) as admin:
        admin.execute_command(
            "ACL", "SETUSER", "app", "on", ">secret", "~goblin:*", "+evalsha", "+eval", "+get", "+set", "+del",
            "+expire", "+ping", "+acl|whoami", "+info", "+config|get", "+command|info", "+script|load",
        )  # fmt: skip
    status, output = goblin_claim("doctor", "--url", f"redis://app:secret@{servers.HOST}:{durable.port}/0")
    assert status == 1, output
    assert "claim lacks pexpiretime pttl" in output  # the server's own SET ... NX GET reads the lease left
    shown = "redis://app:secret@127.0.0.1:6379/0"
    check("doctor-acl.txt", _command(["doctor", "--url", shown], normalized(output, durable.port), status))
