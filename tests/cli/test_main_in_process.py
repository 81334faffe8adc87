"""``goblin-claim``'s entry point called in process: bad usage, refusals, lost servers, and what each prints.

Every command runs through ``main()`` against the session's standalone redis-server
(restricted ACL users are made on it per test and deleted after), or against a tiny
server of the test's own that answers the handshake and then goes away.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from goblin_claim import Claim, Claimed, idempotent
from goblin_claim._cli.main import main
from tests.cli.invoke import run, url
from tests.conftest import unique
from tests.support import servers


@pytest.fixture
def acl_user(stock: redis.Redis) -> Iterator[Any]:
    """Make ACL users (password ``pw``) with the given rules on the stock server; deleted afterwards."""
    made: list[str] = []

    def make(*rules: str) -> str:
        user = unique("cli-user")
        stock.execute_command("ACL", "SETUSER", user, "on", ">pw", "resetchannels", *rules)
        made.append(user)
        return user

    yield make
    for user in made:
        stock.execute_command("ACL", "DELUSER", user)


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(("value", "said"), [("0", "must be at least 1, not 0"), ("many", "not an integer: 'many'")])
def test_a_count_that_is_not_a_positive_integer_is_bad_usage(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--count`` takes a positive integer: anything else exits 2 with argparse's message, before connecting."""
    with pytest.raises(SystemExit) as exited:
        main(["scan", "--count", value, "--url", "redis://127.0.0.1:1/0"])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_owner_without_http_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """``--owner`` names an HTTP door's key: without ``--http`` it is a usage error (exit 2) naming the fix."""
    assert main(["inspect", "k", "--owner", "alice", "--url", "redis://127.0.0.1:1/0"]) == 2
    assert "--owner names an HTTP door's key: give --http METHOD PATH too" in capsys.readouterr().err


def test_a_key_that_is_not_utf8_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """A key of undecodable bytes (as a shell passes them, surrogate-escaped) exits 2 saying it is not UTF-8."""
    assert main(["forget", "evt\udcff", "--url", "redis://127.0.0.1:1/0"]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--http", "POST", "/pay", "--owner", ""], "an empty --owner is no owner"),
        (["--http", "POST", "/pay", "--owner-type", "int"], "--owner-type needs --owner"),
        (["--http", "POST", "/pay", "--owner", "seven", "--owner-type", "int"], "--owner 'seven' is not an int"),
        (["--http", "POST", "/pay", "--owner", "x", "--owner-type", "uuid"], "--owner 'x' is not a UUID"),
        (["--http", "GET", "/pay"], "the doors never claim GET (a safe method)"),
        (["--http", "POST", "pay"], "the path must begin with /"),
    ],
)
def test_an_http_key_the_doors_would_never_claim_is_bad_usage(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--http`` requests no door claims (or owners it cannot have) exit 2 with the reason, before connecting."""
    assert main(["inspect", "k-1", *argv, "--url", "redis://127.0.0.1:1/0"]) == 2
    assert said in capsys.readouterr().err


def test_doctor_imports_the_applications_module_from_the_working_directory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_standalone: servers.RedisProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--import`` finds a module in the working directory (as ``python -m`` would), runs it, then checks."""
    name = unique("gc_app").replace("-", "_")
    (tmp_path / f"{name}.py").write_text("import builtins\nbuiltins._gc_cli_imported = True\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    status, text = run("doctor", "--no-write", "--ephemeral", "--import", name, "--url", url(redis_standalone))
    import builtins

    assert getattr(builtins, "_gc_cli_imported", False) is True
    monkeypatch.delattr(builtins, "_gc_cli_imported")
    assert status == 0
    assert text.startswith(f"goblin-claim doctor: {url(redis_standalone)}")
    assert sys.path[0] == str(tmp_path)
    sys.modules.pop(name, None)


def test_doctor_stops_with_bad_usage_when_the_module_does_not_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module whose import raises: exit 2 saying which and what it raised, without connecting anywhere."""
    name = unique("gc_broken").replace("-", "_")
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('no settings file')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = io.StringIO()
    assert main(["doctor", "--import", name, "--url", "redis://127.0.0.1:1/0"], out=out) == 2
    assert f"cannot import {name}: RuntimeError: no settings file" in capsys.readouterr().err
    assert out.getvalue() == ""  # it never got as far as connecting


# --------------------------------------------------------------------------- the reader goes away


class _Closing(io.StringIO):
    """An output that raises ``error`` on the first write: a reader gone, or Ctrl-C while printing."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


@pytest.mark.parametrize(("error", "status"), [(BrokenPipeError(), 141), (KeyboardInterrupt(), 130)])
def test_a_closed_pipe_or_ctrl_c_while_printing_ends_with_the_shells_status(
    error: BaseException, status: int, redis_standalone: servers.RedisProcess
) -> None:
    """A reader that closes the pipe ends the command with 141, Ctrl-C with 130; neither raises out of main()."""
    assert main(["namespaces", "--url", url(redis_standalone)], out=_Closing(error)) == status


# --------------------------------------------------------------------------- the server refuses or goes away


def test_scan_stats_and_namespaces_say_the_server_refused_scan(
    redis_standalone: servers.RedisProcess, acl_user: Any
) -> None:
    """A user that may not SCAN: each walking command exits 1 saying the server refused, and why."""
    user = acl_user("~*", "+@connection", "+get", "+type", "+pttl", "+dbsize")
    for command in ("scan", "stats", "namespaces"):
        status, text = run(command, "--url", url(redis_standalone, user))
        assert status == 1, command
        assert f"goblin-claim {command}: the server refused: " in text, text
        assert "no permissions to run the 'scan' command" in text


def test_inspect_says_the_server_refused_a_read(redis_standalone: servers.RedisProcess, acl_user: Any) -> None:
    """A user that may not read the key's type: inspect exits 1 saying the server refused."""
    user = acl_user("~*", "+@connection", "+get")
    status, text = run("inspect", "evt-1", "--url", url(redis_standalone, user))
    assert status == 1
    assert text.startswith("goblin-claim inspect: the server refused: ")
    assert "this user has no permissions to run the 'type' command" in text


def test_forget_that_the_server_refuses_exits_1_and_keeps_the_record(
    redis_standalone: servers.RedisProcess, stock: redis.Redis, acl_user: Any
) -> None:
    """A user that may read but not delete: forget exits 1 with the SDK's error, and the record stays."""
    ns = unique("cli-ns")
    handle = Claim(stock, "evt-1", namespace=ns, token="worker-1")
    assert isinstance(handle.acquire(), Claimed)
    user = acl_user("~*", "+@connection", "+@read", "-@write", "-evalsha", "-eval", "-fcall")
    status, text = run("forget", "evt-1", "--namespace", ns, "--url", url(redis_standalone, user))
    assert status == 1
    assert text.startswith("goblin-claim forget: ")
    assert "NOPERM" in text or "permission" in text
    assert stock.get(handle.claim_key) is not None


# HELLO 3's answer: a RESP3 map of the server's particulars.
_HELLO = (
    b"%7\r\n+server\r\n+redis\r\n+version\r\n+7.2.0\r\n+proto\r\n:3\r\n+id\r\n:1\r\n"
    b"+mode\r\n+standalone\r\n+role\r\n+master\r\n+modules\r\n*0\r\n"
)


class _Vanishing:
    """A server that answers the handshake (PING, INFO, CLIENT ...), then closes and stops listening."""

    def __init__(self) -> None:
        self.listener = socket.create_server((servers.HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        buffer = b""
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
                while b"\r\n" in buffer:
                    command, buffer = self._command(buffer)
                    if command is None:
                        break
                    name = command[0].upper()
                    if name == b"PING":
                        conn.sendall(b"+PONG\r\n")
                    elif name == b"INFO":
                        body = b"# Cluster\r\ncluster_enabled:0\r\n"
                        conn.sendall(b"$%d\r\n%s\r\n" % (len(body), body))
                    elif name == b"HELLO":
                        conn.sendall(_HELLO)
                    elif name == b"CLIENT":
                        conn.sendall(b"+OK\r\n")
                    else:  # the first real command: the server is gone
                        self.listener.close()
                        return

    @staticmethod
    def _command(buffer: bytes) -> tuple[list[bytes] | None, bytes]:
        """One RESP array of bulk strings off ``buffer``; ``None`` while incomplete."""
        lines = buffer.split(b"\r\n")
        if not lines[0].startswith(b"*"):
            return None, buffer
        count, at, parts = int(lines[0][1:]), 1, []
        for _ in range(count):
            if at + 1 >= len(lines):
                return None, buffer
            parts.append(lines[at + 1])
            at += 2
        return parts, b"\r\n".join(lines[at:])


def test_a_server_lost_after_connecting_exits_1_saying_so() -> None:
    """The server answers the handshake, then goes away: exit 1, "lost the connection", no traceback."""
    server = _Vanishing()
    status, text = run("inspect", "evt-1", "--url", f"redis://{servers.HOST}:{server.port}/0")
    server.thread.join(timeout=30)
    assert status == 1
    assert text.startswith("goblin-claim inspect: lost the connection: ")


# --------------------------------------------------------------------------- inspect and forget say what they found


def test_inspect_by_http_request_names_the_request_and_an_empty_record(redis_standalone: servers.RedisProcess) -> None:
    """``--http``: inspect says which request it read, then that nothing is stored under it (exit 0)."""
    key = unique("idem")
    status, text = run(
        "inspect", key, "--http", "post", "/pay%20now?x=1", "--owner", "7", "--owner-type", "int",
        "--url", url(redis_standalone),
    )  # fmt: skip
    assert status == 0
    assert text.startswith(f"HTTP    POST /pay now, owner 'int:7', Idempotency-Key {key!r}")
    assert "(its query string is in the fingerprint, not the key)" in text
    assert "state   free: the next acquire() claims it" in text
    assert "`goblin-claim namespaces` lists the namespaces in use" in text


def test_inspect_shows_a_token_that_is_not_utf8_and_raw_values(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Records of another writer: a non-UTF-8 owner shows as bytes, a non-JSON value as raw bytes or text."""
    ns = unique("cli-ns")
    binary = Claim(stock, "bin", namespace=ns)
    stock.set(binary.claim_key, b"done \xff\xfe " + b"\x80" * 300, ex=600)
    status, text = run("inspect", "bin", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "done by b'\\xff\\xfe', 300 bytes of value" in text
    assert "  raw bytes: b'\\x80" in text
    assert text.rstrip().count(" ...") >= 1
    textual = Claim(stock, "txt", namespace=ns)
    stock.set(textual.claim_key, b"done w-1 " + b"charged " * 100, ex=600)
    status, text = run("inspect", "txt", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "  raw text: 'charged charged" in text
    assert "' ..." in text
    assert "done by 'w-1', kept " in text


def test_inspect_decodes_a_stored_error_and_an_unstorable_result(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """The decorator's error and unstorable envelopes are decoded: the error's type and message, the reason."""
    ns = unique("cli-ns")

    @idempotent(stock, key="order", namespace=ns, replay_errors=(ValueError,))
    def charge(order: str) -> int:
        raise ValueError(f"card declined for {order}")

    @idempotent(stock, key="order", namespace=ns)
    def label(order: str) -> Any:
        return {1, 2}  # a set does not replay as JSON

    with pytest.raises(ValueError, match="card declined"):
        charge("o-1")
    with pytest.raises(Exception, match="replay"):
        label("o-2")
    status, text = run("inspect", "o-1", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "@idempotent stored error, call fingerprint " in text
    assert "builtins.ValueError: card declined for o-1" in text
    status, text = run("inspect", "o-2", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "@idempotent unstorable result, call fingerprint " in text
    assert "(duplicates get ResultNotSerializableError)" in text


def test_forget_says_when_there_was_nothing_and_leaves_an_older_releases_keys(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Nothing stored: forget says so (exit 0); an older release's keys are named, and left in place."""
    ns = unique("cli-ns")
    legacy = [f"{ns}:{{evt-old}}:claim", f"{ns}:{{evt-old}}:result"]
    stock.set(legacy[0], "done worker-6", ex=600)
    stock.set(legacy[1], "charged", ex=600)
    status, text = run("forget", "evt-old", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"nothing to forget: {ns}:{{evt-old}} does not exist" in text
    for name in legacy:
        assert f"  left {name}: an older release's key, which this release neither reads nor deletes" in text
        assert stock.exists(name)


# --------------------------------------------------------------------------- scan, stats and namespaces output


def test_scan_json_exits_1_on_a_key_acquire_raises_on(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """``scan --json``: one object per key, and exit 1 when one of them makes acquire() raise."""
    ns = unique("cli-ns")
    odd = Claim(stock, "evt-hash", namespace=ns)
    stock.hset(odd.claim_key, "f", "v")
    stock.expire(odd.claim_key, 600)
    status, text = run("scan", "--namespace", ns, "--json", "--url", url(redis_standalone))
    assert status == 1
    (line,) = text.splitlines()
    entry = json.loads(line)
    assert (entry["state"], entry["key"]) == ("odd", "evt-hash")
    assert entry["raises"] == "WrongTypeError"


def test_stats_json_gives_the_counts_and_the_keys_that_raise(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """``stats --json --exact``: one document with the counts by state; exit 1 as a done marker raises."""
    ns = unique("cli-ns")
    held = Claim(stock, "a", namespace=ns)
    assert isinstance(held.acquire(), Claimed)
    stock.set(Claim(stock, "b", namespace=ns).claim_key, "done worker-5", ex=600)
    status, text = run("stats", "--namespace", ns, "--exact", "--json", "--url", url(redis_standalone))
    assert status == 1
    document = json.loads(text)
    assert document["namespace"] == ns
    assert document["exact"] is True
    assert document["counts"] == {"in-flight": 1, "interrupted": 0, "done": 0, "odd": 1}
    assert (document["total"], document["raising"], document["primaries"]) == (2, 1, 1)


def test_namespaces_counts_each_namespace_in_a_table(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """``namespaces``: a table of keys per namespace, and the totals with a pointer to stats."""
    ns = unique("cli-table")
    for key in ("a", "b"):
        assert isinstance(Claim(stock, key, namespace=ns).acquire(), Claimed)
    status, text = run("namespaces", "--url", url(redis_standalone))
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == f"goblin-claim namespaces: {url(redis_standalone)}, standalone"
    assert lines[1].split() == ["KEYS", "NAMESPACE"]
    assert f"{2:>10,}  {ns}" in lines
    assert "; `goblin-claim stats --namespace NS` counts one's keys by state" in lines[-1]
    status, text = run("namespaces", "--json", "--url", url(redis_standalone))
    assert {"namespace": ns, "keys": 2} in [json.loads(line) for line in text.splitlines()]


def test_inspect_and_forget_a_celery_marker_beside_the_record(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """Celery's enqueue_once marker: inspect shows it; forget deletes it with the record and says so."""
    ns = unique("cli-ns")
    handle = Claim(stock, "evt-7", namespace=ns, token="worker-7")
    assert isinstance(handle.acquire(), Claimed)
    marker = handle.claim_key + ":task"
    stock.set(marker, "task-id-1", ex=600)
    status, text = run("inspect", "evt-7", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"task    {marker}: 'task-id-1', TTL " in text
    assert "(enqueue_once's marker: the first Celery task's or RQ job's id)" in text
    status, text = run("forget", "evt-7", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert f"forgot 'evt-7': deleted {handle.claim_key}" in text
    assert "  it was: held by 'worker-7', lease ends in " in text
    assert f"  deleted {marker}: enqueue_once's marker, so the next delay() or enqueue_once() enqueues again" in text
    assert stock.exists(handle.claim_key, marker) == 0


def test_inspect_a_claim_without_a_ttl_says_it_never_ends(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A token record another writer left without a TTL: held with no lease end, the TTL line says so."""
    ns = unique("cli-ns")
    handle = Claim(stock, "evt-8", namespace=ns)
    stock.set(handle.claim_key, "worker-8")
    status, text = run("inspect", "evt-8", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    assert "no TTL (goblin-claim always sets one: another writer?)" in text
    assert "state   held by 'worker-8', with no lease end: in flight until the record is deleted" in text
    stock.delete(handle.claim_key)


def test_inspect_by_http_request_refuses_a_malformed_key_and_takes_a_plain_path(
    redis_standalone: servers.RedisProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Idempotency-Key the doors answer 400 to is bad usage with their reason; a plain path names the key."""
    assert main(["inspect", '"unterminated', "--http", "POST", "/pay", "--url", url(redis_standalone)]) == 2
    assert "goblin-claim inspect: " in capsys.readouterr().err
    status, text = run("inspect", "k-2", "--http", "PUT", "/orders/9", "--url", url(redis_standalone))
    assert status == 0
    assert text.splitlines()[0] == "HTTP    PUT /orders/9, owner none, Idempotency-Key 'k-2'"


def test_scan_of_an_empty_namespace_points_at_namespaces(redis_standalone: servers.RedisProcess) -> None:
    """Nothing in the namespace: ``0 keys`` and where to look for the namespaces in use (exit 0)."""
    status, text = run("scan", "--namespace", unique("cli-empty"), "--url", url(redis_standalone))
    assert status == 0
    assert "0 keys: 0 in-flight, 0 interrupted, 0 done, 0 odd" in text
    assert text.rstrip().endswith("(`goblin-claim namespaces` lists the namespaces in use)")


def test_namespaces_on_an_empty_server_and_doctors_warning_summary(own_server: Any) -> None:
    """An empty server: ``0 namespaces, 0 keys``; doctor's summary counts its warnings, and still exits 0."""
    server = own_server("--appendonly", "yes", "--appendfsync", "no")
    status, text = run("namespaces", "--url", url(server))
    assert status == 0
    assert text.splitlines()[-1] == "0 namespaces, 0 keys"
    status, text = run("doctor", "--no-write", "--url", url(server))
    assert status == 0
    assert "  WARNING  " in text
    assert "AOF with appendfsync no" in text
    assert re.search(r"^no problems, \d+ warnings?$", text.splitlines()[-1])


def test_a_closed_stdout_is_pointed_at_devnull_so_the_exit_flush_stays_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_standalone: servers.RedisProcess
) -> None:
    """On stdout, a closed pipe exits 141 and stdout's descriptor then leads to /dev/null, not the dead pipe."""
    with open(tmp_path / "stdout", "wb") as sink:

        class _Stdout(_Closing):
            def fileno(self) -> int:
                return sink.fileno()

        monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError()))
        assert main(["namespaces", "--url", url(redis_standalone)]) == 141
        os.write(sink.fileno(), b"what the interpreter flushes as it exits")
    assert (tmp_path / "stdout").read_bytes() == b""


def test_inspect_a_record_of_another_type_or_a_bare_done_marker_exits_1(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """A hash where the record belongs, or ``done <token>`` without a value: odd, what acquire() raises, exit 1."""
    ns = unique("cli-ns")
    hashed = Claim(stock, "evt-h", namespace=ns).claim_key
    stock.hset(hashed, "f", "v")
    stock.expire(hashed, 600)
    status, text = run("inspect", "evt-h", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1
    assert f"record  {hashed}: a hash, not written by goblin-claim" in text
    assert "state   odd: a hash where the record belongs; acquire() raises WrongTypeError" in text
    marker = Claim(stock, "evt-m", namespace=ns).claim_key
    stock.set(marker, "done worker-5", ex=600)
    status, text = run("inspect", "evt-m", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 1
    assert f"record  {marker}: 'done worker-5', TTL " in text
    assert "acquire() raises ResultLostError; `goblin-claim forget evt-m` reopens the key" in text


def test_inspect_shows_the_fence_of_a_fenced_claim(redis_standalone: servers.RedisProcess, stock: redis.Redis) -> None:
    """``fencing=True``: inspect shows the fence counter beside the record, with the fence the owner got."""
    ns = unique("cli-ns")
    handle = Claim(stock, "evt-f", namespace=ns, fencing=True)
    outcome = handle.acquire()
    assert isinstance(outcome, Claimed)
    status, text = run("inspect", "evt-f", "--namespace", ns, "--url", url(redis_standalone))
    assert status == 0
    (line,) = [line for line in text.splitlines() if line.startswith("fence   ")]
    assert line.endswith(f": '{outcome.fence}' (the fence of the latest claim)")
