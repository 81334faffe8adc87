"""Logs: standard logging under goblin_claim.*, no handlers, never a token, value or plain key."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import goblin_claim
from goblin_claim import Claim, Claimed, Completed, ResultLostError, ResultNotSerializableError, idempotent
from goblin_claim._events import key_digest
from tests.conftest import unique, wait_past_subscription
from tests.support.servers import HOST, RedisProcess

ROOT = Path(__file__).resolve().parents[2]
LOGGERS = ("goblin_claim", "goblin_claim.claim", "goblin_claim.idempotent", "goblin_claim.keepalive",
           "goblin_claim.server", "goblin_claim.wakeup", "goblin_claim.events")  # fmt: skip


@pytest.fixture
def client(redis_standalone: RedisProcess) -> Iterator[redis.Redis]:
    """A sync client on the session's standalone server."""
    made = redis_standalone.client()
    yield made
    made.close()


def _everything(record: logging.LogRecord) -> str:
    """All a record could show a handler: its message and every field in ``extra``."""
    return record.getMessage() + " " + " ".join(f"{k}={v!r}" for k, v in vars(record).items())


def test_the_library_adds_no_handlers(client: redis.Redis) -> None:
    """After real work, no goblin_claim logger has a handler of its own (the application decides)."""
    claim = Claim(client, unique())
    claim.acquire()
    claim.complete(b"v")
    for name in LOGGERS:
        assert logging.getLogger(name).handlers == [], name


def test_debug_logs_one_line_per_operation_with_fields_and_no_secrets(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG each operation logs one line with structured fields; no token, value or plain key anywhere."""
    key = f"order-{unique()}"
    claim = Claim(client, key, token="secret-token-4711")
    with caplog.at_level(logging.DEBUG, logger="goblin_claim"):
        claim.acquire()
        claim.complete(b"card-4242-result")
        Claim(client, key).acquire()
    lines = [r for r in caplog.records if r.name == "goblin_claim.claim"]
    assert [(r.operation, r.outcome) for r in lines] == [  # type: ignore[attr-defined]
        ("acquire", "claimed"),
        ("complete", "completed"),
        ("acquire", "completed"),
    ]
    for record in lines:
        assert record.levelno == logging.DEBUG
        assert record.key_digest == key_digest(key)  # type: ignore[attr-defined]
        assert record.namespace == "goblin"  # type: ignore[attr-defined]
        # Redis 7: claims take its SET ... NX GET, the store the script.
        assert record.path == ("script" if record.operation == "complete" else "command")  # type: ignore[attr-defined]
        assert record.duration > 0  # type: ignore[attr-defined]
    for record in caplog.records:
        text = _everything(record)
        assert "secret-token-4711" not in text
        assert "card-4242" not in text
        assert key not in text


def test_nothing_is_logged_below_warning_by_default(client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """With loggers at WARNING, the happy path logs nothing at all."""
    Claim(client, unique()).acquire()  # the client's INFO probe line is not the point here
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        claim = Claim(client, unique())
        claim.acquire()
        claim.complete(b"v")
        Claim(client, claim.key).acquire()
    assert caplog.records == []


def test_info_once_per_client_for_what_the_probe_found(
    redis_standalone: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe's finding is logged at INFO once per client, however many operations follow."""
    with caplog.at_level(logging.INFO, logger="goblin_claim.server"):
        first = redis_standalone.client()
        for _ in range(3):
            Claim(first, unique()).acquire()
        second = redis_standalone.client()
        Claim(second, unique()).acquire()
    probes = [r for r in caplog.records if r.name == "goblin_claim.server"]
    assert len(probes) == 2
    assert all(r.levelno == logging.INFO and r.native == [] for r in probes)  # type: ignore[attr-defined]
    assert all(r.commands == ["SET NX GET"] for r in probes)  # type: ignore[attr-defined]
    assert "no native commands" in probes[0].getMessage()
    assert "its own SET NX GET" in probes[0].getMessage()
    first.close()
    second.close()


def test_info_says_whether_waiters_are_woken_by_push(client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The first wait on a client logs at INFO that waiters are woken by pub/sub."""
    key = unique()
    owner = Claim(client, key)
    owner.acquire()
    with caplog.at_level(logging.INFO, logger="goblin_claim.wakeup"):
        assert isinstance(wait_past_subscription(client, Claim(client, key), lambda: owner.complete(b"v")), Completed)
    wakeups = [r for r in caplog.records if r.name == "goblin_claim.wakeup" and r.levelno == logging.INFO]
    assert [r.wakeup for r in wakeups] == ["push"]  # type: ignore[attr-defined]


def test_warnings_an_operator_must_act_on_come_without_any_setup(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """With no listener and no instrument(): a takeover, a lost result, an unstorable result are WARNINGs.

    A lost result (done marker, result gone) exists on ``from_keys`` handles' two keys; a
    default handle's evicted record simply reopens the work, and warns of nothing.
    """
    lapsed, lost, gone = unique(), unique(), unique()
    runs = []
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        Claim(client, lapsed, lease=1).acquire()
        assert isinstance(Claim(client, lapsed).wait(timeout=10), Claimed)

        owner = Claim.from_keys(client, f"c:{{{lost}}}", f"r:{{{lost}}}")
        owner.acquire()
        owner.complete(b"v")
        client.delete(owner.result_key)  # evicted
        with pytest.raises(ResultLostError):
            Claim.from_keys(client, owner.claim_key, owner.result_key).acquire()

        first = Claim(client, gone)
        first.acquire()
        first.complete(b"v")
        client.delete(first.claim_key)  # the record evicted: the work is free again
        assert isinstance(Claim(client, gone).acquire(), Claimed)

        @idempotent(client, key="item", namespace=unique("ns"))
        def unstorable(item: str) -> object:
            runs.append(item)
            return object()

        with pytest.raises(ResultNotSerializableError):
            unstorable("x")
    assert runs == ["x"]
    outcomes = [(r.name, r.outcome) for r in caplog.records]  # type: ignore[attr-defined]
    assert ("goblin_claim.claim", "taken_over") in outcomes
    assert outcomes.count(("goblin_claim.claim", "result_lost")) == 1  # the two-key handle's only
    assert ("goblin_claim.idempotent", "unstorable") in outcomes
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    for record in caplog.records:
        assert lapsed not in _everything(record)
        assert lost not in _everything(record)
        assert gone not in _everything(record)


def test_a_lost_lease_and_a_failing_renewal_are_warnings(own_server: object, caplog: pytest.LogCaptureFixture) -> None:
    """Renewals the server refuses warn (renewal failing); once the lease runs out, lease lost warns."""
    server = own_server()  # type: ignore[operator]
    client = server.client()
    try:
        claim = Claim(client, unique(), lease=2)
        claim.acquire()  # the client's INFO probe line is not the point here
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="goblin_claim.keepalive"):
            with claim.keep_alive(interval=0.2) as keeper:
                # From now on the server refuses every script: each renewal fails with NOPERM.
                client.execute_command("ACL", "SETUSER", "default", "-@scripting")
                deadline = time.monotonic() + 15
                while not keeper.lost and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert keeper.lost
        outcomes = [r.outcome for r in caplog.records]  # type: ignore[attr-defined]
        assert "unavailable" in outcomes
        assert outcomes[-1] == "lease_lost"
        assert all(r.name == "goblin_claim.keepalive" for r in caplog.records)
    finally:
        client.close()


def test_keys_are_logged_verbatim_only_when_opted_in(redis_standalone: RedisProcess) -> None:
    """GOBLIN_CLAIM_LOG_KEYS=1 puts the key in the log line and its fields; without it only the digest."""
    script = (
        "import logging, sys, redis\n"
        "from goblin_claim import Claim\n"
        "logging.basicConfig(level=logging.DEBUG, format='%(name)s %(message)s %(key_digest)s', stream=sys.stdout)\n"
        "logging.getLogger('goblin_claim.server').setLevel(logging.WARNING)\n"
        f"Claim(redis.Redis(host='{HOST}', port={redis_standalone.port}), sys.argv[1]).acquire()\n"
    )
    hidden, shown = f"visible-{unique()}", f"visible-{unique()}"
    outputs = {}
    for opted, key in (("", hidden), ("1", shown)):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GOBLIN_CLAIM_LOG_KEYS": opted}
        command = [sys.executable, "-c", script, key]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        outputs[opted] = result.stdout
    assert hidden not in outputs[""]
    assert f"acquire {key_digest(hidden)}: claimed" in outputs[""]
    assert f"goblin_claim.claim acquire {shown}: claimed {key_digest(shown)}" in outputs["1"]


def test_debug_logging_alone_turns_the_events_path_on(client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A DEBUG level on goblin_claim.idempotent alone logs each decorated call, with no listener."""
    assert goblin_claim._events.enabled is False

    @idempotent(client, key="item", namespace=unique("ns"))
    def work(item: str) -> str:
        return item

    with caplog.at_level(logging.DEBUG, logger="goblin_claim.idempotent"):
        work("a")
        work("a")
    calls = [r.outcome for r in caplog.records if r.name == "goblin_claim.idempotent"]  # type: ignore[attr-defined]
    assert calls == ["claimed", "completed"]
