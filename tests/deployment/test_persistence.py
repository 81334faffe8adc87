"""What a restart keeps, on real redis-server and valkey-server processes: no persistence, RDB only, AOF; doctor.

Each test crashes its own server (SIGKILL) and starts it again on the same port and
directory, then asks for the ids completed before: executions are counted in the test
process, so "ran again" is exact. The figures are printed at the end of the run.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from goblin_claim import idempotent
from goblin_claim._cli.doctor import doctor, min_replicas_finding, persistence_finding
from tests.conftest import unique
from tests.support import servers

Figures = Callable[[str], None]
IDS = 200
# Every scenario runs on redis-server and again on valkey-server.
SERVERS = ("redis", "valkey")


class Own:
    """redis-servers of one test's own, stopped by PID afterwards (restarted ones too)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.started: list[servers.RedisProcess] = []

    def __call__(self, *extra: str) -> servers.RedisProcess:
        """Start a server with ``extra`` arguments."""
        server = servers.start_server(self.binary, *extra)
        self.started.append(server)
        return server

    def crash_and_restart(self, server: servers.RedisProcess) -> servers.RedisProcess:
        """SIGKILL the server (no shutdown save), then start it again on its port and directory."""
        server.process.send_signal(signal.SIGKILL)
        restarted = servers.restart(server)
        self.started.append(restarted)
        return restarted


@pytest.fixture
def own_server(redis_server_binary: str) -> Iterator[Own]:
    """Start redis-servers of this test's own."""
    own = Own(redis_server_binary)
    yield own
    for server in reversed(own.started):
        server.stop()


def counted(client: Any, namespace: str, runs: Counter[str]) -> Callable[[str], str]:
    """The decorated work: each execution counted in ``runs``."""

    @idempotent(client, key="item", namespace=namespace, lease=10, ttl=600)
    def work(item: str) -> str:
        runs[item] += 1
        return f"{item}/{runs[item]}"

    return work


def complete_all(port: int, namespace: str, ids: list[str], runs: Counter[str]) -> dict[str, str]:
    """Complete every id once, through a fresh client."""
    client = redis.Redis(host=servers.HOST, port=port)
    try:
        work = counted(client, namespace, runs)
        return {item: work(item) for item in ids}
    finally:
        client.close()


def ran_again(port: int, namespace: str, ids: list[str], runs: Counter[str]) -> list[str]:
    """Ask for every id again; the ids whose work ran again."""
    before = dict(runs)
    complete_all(port, namespace, ids, runs)
    return [item for item in ids if runs[item] > before.get(item, 0)]


def findings_text(port: int, durable: bool = True) -> list[tuple[str, str]]:
    """Doctor's findings on the server at ``port``, as (level, what)."""
    client = redis.Redis(host=servers.HOST, port=port)
    try:
        return [(found.level, found.what) for found in doctor(client, False, unique("doctor"), durable=durable)]
    finally:
        client.close()


def test_restart_without_persistence_forgets_every_completed_id(own_server: Own, figures: Figures) -> None:
    """No AOF, no RDB: after a crash and restart every completed id runs again, and doctor calls it a problem."""
    server = own_server()  # the fixtures' default: --save "" --appendonly no
    assert ("problem", f"{servers.HOST}:{server.port}: persistence is off") in [
        (level, what.split(" (no AOF")[0]) for level, what in findings_text(server.port)
    ]
    namespace, ids, runs = unique("nopersist"), [f"id-{n}" for n in range(IDS)], Counter[str]()
    complete_all(server.port, namespace, ids, runs)
    server = own_server.crash_and_restart(server)
    again = ran_again(server.port, namespace, ids, runs)
    figures(f"restart without persistence: {len(again)} of {len(ids)} completed ids ran again after the restart")
    assert again == ids


def test_restart_with_rdb_only_forgets_what_completed_after_the_last_snapshot(
    own_server: Own, figures: Figures
) -> None:
    """RDB only: ids completed before the snapshot are kept, those completed after it run again; doctor: a problem."""
    server = own_server("--save", "3600 1")  # a snapshot only when the test asks for one
    assert any(level == "problem" and "RDB snapshots only" in what for level, what in findings_text(server.port))
    namespace, runs = unique("rdb"), Counter[str]()
    saved, unsaved = [f"saved-{n}" for n in range(IDS // 2)], [f"late-{n}" for n in range(IDS // 2)]
    answers = complete_all(server.port, namespace, saved, runs)
    admin = server.client()
    admin.save()
    admin.close()
    complete_all(server.port, namespace, unsaved, runs)
    server = own_server.crash_and_restart(server)
    again = ran_again(server.port, namespace, saved + unsaved, runs)
    figures(
        f"restart with RDB only: {len(set(again) & set(saved))} of {len(saved)} ids completed before the snapshot "
        f"and {len(set(again) & set(unsaved))} of {len(unsaved)} completed after it ran again"
    )
    assert again == unsaved
    client = redis.Redis(host=servers.HOST, port=server.port)
    work = counted(client, namespace, runs)
    assert {item: work(item) for item in saved} == answers  # the kept ones replay their stored results
    client.close()


def test_restart_with_aof_everysec_keeps_every_completed_id_across_a_server_crash(
    own_server: Own, figures: Figures
) -> None:
    """AOF everysec: a redis-server crash (not the machine's) keeps every completed id; doctor: a note on power loss."""
    server = own_server("--appendonly", "yes", "--appendfsync", "everysec")
    found = findings_text(server.port)
    assert any(level == "note" and "appendfsync everysec" in what for level, what in found)
    assert not any(level == "problem" for level, what in found), found
    namespace, ids, runs = unique("aof"), [f"id-{n}" for n in range(IDS)], Counter[str]()
    complete_all(server.port, namespace, ids, runs)
    server = own_server.crash_and_restart(server)
    again = ran_again(server.port, namespace, ids, runs)
    figures(f"restart with AOF everysec (server SIGKILL): {len(again)} of {len(ids)} completed ids ran again")
    assert again == []


def test_doctor_ephemeral_makes_persistence_off_a_note(own_server: Own) -> None:
    """With durable=False (--ephemeral) persistence off is a note, not a problem."""
    server = own_server()
    found = findings_text(server.port, durable=False)
    assert any(level == "note" and "persistence is off" in what for level, what in found)
    assert not any("persistence is off" in what for level, what in found if level == "problem")


def test_doctor_names_a_primary_with_replicas_and_no_min_replicas_to_write(redis_server_binary: str) -> None:
    """A primary with a replica: min-replicas-to-write 0 is a warning, 1 is ok; a standalone server gets neither."""
    with servers.primary_with_replica(redis_server_binary) as (primary, _replica):
        found = findings_text(primary.port)
        assert any(level == "warning" and "min-replicas-to-write 0" in what for level, what in found), found
    with servers.primary_with_replica(
        redis_server_binary, primary_args=("--min-replicas-to-write", "1", "--min-replicas-max-lag", "2")
    ) as (primary, _replica):
        found = findings_text(primary.port)
        assert any(level == "ok" and "min-replicas-to-write 1" in what for level, what in found), found
    with servers.standalone(redis_server_binary) as alone:
        assert not any("min-replicas" in what for _level, what in findings_text(alone.port))


@pytest.mark.parametrize(
    ("appendonly", "appendfsync", "save", "level"),
    [("yes", "always", "", "ok"), ("yes", "everysec", "", "note"), ("yes", "no", "3600 1", "warning"),
     ("no", "everysec", "3600 1", "problem"), ("no", "everysec", "", "problem")],
)  # fmt: skip
def test_persistence_finding_levels(appendonly: str, appendfsync: str, save: str, level: str) -> None:
    """Only AOF always is clean; everysec is a note (power loss), fsync no a warning, RDB only or nothing a problem."""
    assert persistence_finding("n", appendonly, appendfsync, save).level == level


def test_min_replicas_finding_levels() -> None:
    """min-replicas-to-write 0 with replicas is a warning naming the setting and the loss it allows; 1 or more is ok."""
    assert min_replicas_finding("n", 2, 0, 10).level == "warning"
    assert "results whose callers were answered are lost" in min_replicas_finding("n", 2, 0, 10).what
    assert "min-replicas-to-write 1" in min_replicas_finding("n", 2, 0, 10).todo
    assert min_replicas_finding("n", 2, 1, 2).level == "ok"
