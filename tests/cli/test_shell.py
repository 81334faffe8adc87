"""``goblin-claim`` in a shell: closed pipes, Ctrl-C, ``--json`` when empty, and exit statuses for cron checks.

Every command runs as the installed console script on real redis-servers (standalone and the
three-primary cluster), through real pipes: ``bash -c '... | head -1'``, and a pipe whose
reader has gone before the command writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster

from goblin_claim import Claim, Claimed, ResultLostError, WrongTypeError
from tests.cli.invoke import url
from tests.conftest import unique
from tests.support import servers

SCRIPT = Path(sys.executable).parent / "goblin-claim"
# What a shell shows for a command SIGPIPE ended: 128 + 13, as for `yes | head -1`.
PIPE_STATUS = 141


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator runs it."""
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=120, check=False)


def environment(buffered: bool) -> dict[str, str]:
    """This environment, with Python's stdout block-buffered (an operator's shell) or unbuffered (PYTHONUNBUFFERED)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    return env if buffered else {**env, "PYTHONUNBUFFERED": "1"}


# A closed pipe shows at a write when stdout is unbuffered, at a flush when it is buffered: both.
BUFFERING = pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])


def quiet(stderr: str) -> None:
    """Nothing a shell user would call noise: no traceback, no 'Exception ignored', no BrokenPipeError."""
    assert stderr == "", stderr


@pytest.fixture(scope="module")
def many(redis_standalone: servers.RedisProcess) -> str:
    """A namespace of 4,000 claims: a listing far larger than a pipe's buffer."""
    ns = unique("many")
    client = redis_standalone.client()
    try:
        pairs = Claim.acquire_many(client, [f"k{index}" for index in range(4000)], namespace=ns, lease=600)
        assert all(isinstance(outcome, Claimed) for _, outcome in pairs)
    finally:
        client.close()
    return ns


# --------------------------------------------------------------------------- closed pipes and Ctrl-C


def shell(command: str, pipefail: bool, buffered: bool = True) -> subprocess.CompletedProcess[str]:
    """``command`` run by bash, with pipefail on or off."""
    options = "set -o pipefail; " if pipefail else "set +o pipefail; "
    return subprocess.run(
        ["bash", "-c", options + command], capture_output=True, text=True, timeout=120, check=False,
        env=environment(buffered),
    )  # fmt: skip


@BUFFERING
@pytest.mark.parametrize("pipefail", [False, True], ids=["pipefail-off", "pipefail-on"])
@pytest.mark.parametrize("form", [["--json"], []], ids=["json", "table"])
def test_scan_into_head_ends_quietly_as_yes_into_head_does(
    redis_standalone: servers.RedisProcess, many: str, pipefail: bool, form: list[str], buffered: bool
) -> None:
    """`goblin-claim scan | head -1`: head's line, nothing on stderr, and the status `yes | head -1` gives (0 / 141)."""
    command = f"{SCRIPT} scan {' '.join(form)} --namespace {many} --url {url(redis_standalone)} | head -1"
    done = shell(command, pipefail, buffered)
    quiet(done.stderr)
    yes = shell("yes | head -1", pipefail)
    assert yes.returncode == (PIPE_STATUS if pipefail else 0)  # the shell's own answer, for comparison
    assert done.returncode == yes.returncode
    line = done.stdout.splitlines()
    assert len(line) == 1
    if form:
        assert json.loads(line[0])["state"] == "in-flight"
    else:
        assert line[0].startswith("goblin-claim scan: namespace")
    status = shell(command.replace("| head -1", "| head -1 >/dev/null; echo ${PIPESTATUS[0]}"), pipefail, buffered)
    assert status.stdout.strip() == str(PIPE_STATUS)  # the command's own status, whatever pipefail says


@pytest.mark.parametrize(
    "argv",
    [
        ["scan", "--namespace", "{many}"],
        ["scan", "--json", "--namespace", "{many}"],
        ["stats", "--namespace", "{many}"],
        ["stats", "--json", "--namespace", "{many}"],
        ["namespaces"],
        ["namespaces", "--json"],
        ["inspect", "k1", "--namespace", "{many}"],
        ["forget", "nothing-here", "--namespace", "{many}"],
        ["doctor", "--no-write", "--ephemeral"],
        ["--help"],
        ["scan", "--help"],
    ],
    ids=lambda argv: "-".join(word for word in argv if not word.startswith("{"))[:40],
)
@BUFFERING
def test_every_command_into_a_pipe_already_closed_exits_141_without_a_traceback(
    redis_standalone: servers.RedisProcess, many: str, argv: list[str], buffered: bool
) -> None:
    """Whatever it prints, however little: a reader gone before the first write ends the command with 141, quietly."""
    argv = [many if word == "{many}" else word for word in argv]
    helping = "--help" in argv
    if not helping:
        argv += ["--url", url(redis_standalone)]
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone: every write fails with EPIPE
    try:
        done = subprocess.run(
            [str(SCRIPT), *argv], stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
            env=environment(buffered),
        )  # fmt: skip
    finally:
        os.close(writer)
    quiet(done.stderr)
    # argparse ignores a failed write of --help itself, so unbuffered, help ends with its own 0.
    assert done.returncode == (0 if helping and not buffered else PIPE_STATUS)


def test_ctrl_c_ends_a_scan_with_130_and_no_traceback(redis_standalone: servers.RedisProcess, many: str) -> None:
    """SIGINT in the middle of a long walk: exit 130, as a shell shows for Ctrl-C, and no traceback."""
    walk = subprocess.Popen(
        [str(SCRIPT), "scan", "--json", "--count", "1", "--namespace", many, "--url", url(redis_standalone)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert walk.stdout is not None
        json.loads(walk.stdout.readline())  # it is walking, well inside main()
        walk.send_signal(signal.SIGINT)
        rest, stderr = walk.communicate(timeout=60)
    finally:
        if walk.poll() is None:
            walk.kill()
            walk.wait()
    quiet(stderr)
    assert walk.returncode == 130
    assert len(rest.splitlines()) < 3999  # it stopped early


# --------------------------------------------------------------------------- --json, empty


def test_json_output_is_valid_when_nothing_is_found(own_server: Any) -> None:
    """An empty keyspace: scan and namespaces print no line at all (JSON Lines), stats one document of zeros; exit 0."""
    target = url(own_server())
    for argv in (["scan", "--json", "--namespace", "nothing"], ["namespaces", "--json"]):
        done = cli(*argv, "--url", target)
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
        quiet(done.stderr)
    done = cli("stats", "--json", "--namespace", "nothing", "--url", target)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "namespace": "nothing",
        "exact": True,
        "counts": {"in-flight": 0, "interrupted": 0, "done": 0, "odd": 0},
        "total": 0,
        "raising": 0,
        "primaries": 1,
        "examined": 0,
        "dbsize": 0,
    }
    assert done.stdout.count("\n") == 1  # one document, one line


# --------------------------------------------------------------------------- exit statuses for a cron check


@pytest.fixture(params=["redis_standalone", "redis_cluster"])
def where(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A redis-py client and a --url, on the standalone server and on the cluster (the URL of its last node)."""
    server = request.getfixturevalue(request.param)
    if isinstance(server, list):
        client: Any = redis.cluster.RedisCluster(host=servers.HOST, port=server[0].port)
        target = url(server[-1])
    else:
        client, target = server.client(), url(server)
    yield client, target
    client.close()


def exits(ns: str, target: str) -> dict[str, int]:
    """The exit status of scan, scan --json --state in-flight, stats and stats --json on ``ns``."""
    statuses = {}
    for name, argv in {
        "scan": ["scan"],
        "scan-in-flight": ["scan", "--json", "--state", "in-flight"],
        "stats": ["stats"],
        "stats-json": ["stats", "--json"],
    }.items():
        done = cli(*argv, "--namespace", ns, "--url", target)
        quiet(done.stderr)
        statuses[name] = done.returncode
    return statuses


def test_scan_and_stats_exit_1_exactly_when_acquire_cannot_serve_a_key(where: tuple[Any, str]) -> None:
    """Odd but servable keys exit 0; a hash record or a done marker without its value exits 1, as inspect does."""
    client, target = where
    ns = unique("cron")
    Claim(client, "flying", namespace=ns, lease=60).acquire()
    done = Claim(client, "done", namespace=ns)
    done.acquire()
    done.complete("v")
    client.set(f"{ns}:{{stuck}}", "worker-1")  # in flight for good: stuck, but acquire() answers InFlight
    client.set(f"{ns}:{{old}}:claim", "done w", ex=60)  # an older release's key: acquire() never reads it
    client.set(f"{ns}:{{x}}:other", "x", ex=60)  # a name goblin-claim does not write
    client.set(f"{ns}:{{done}}:task", "celery-task-id", ex=60)  # Celery's enqueue_once marker
    assert exits(ns, target) == dict.fromkeys(["scan", "scan-in-flight", "stats", "stats-json"], 0)
    for key, arrange, error in (
        ("hash", lambda name: client.hset(name, "f", "v"), WrongTypeError),
        ("marker", lambda name: client.set(name, "done worker-5", ex=600), ResultLostError),
    ):
        name = Claim(client, key, namespace=ns).claim_key
        arrange(name)
        with pytest.raises(error):  # what "cannot serve" means
            Claim(client, key, namespace=ns).acquire()
        assert exits(ns, target) == dict.fromkeys(["scan", "scan-in-flight", "stats", "stats-json"], 1), key
        stats = json.loads(cli("stats", "--json", "--namespace", ns, "--url", target).stdout)
        assert stats["raising"] == 1
        listing = [
            json.loads(line) for line in cli("scan", "--json", "--namespace", ns, "--url", target).stdout.splitlines()
        ]
        assert {entry["key"]: entry["raises"] for entry in listing if entry["raises"]} == {key: error.__name__}
        assert cli("inspect", key, "--namespace", ns, "--url", target).returncode == 1  # the same key, the same 1
        assert cli("forget", key, "--namespace", ns, "--url", target).returncode == 0
        assert exits(ns, target) == dict.fromkeys(["scan", "scan-in-flight", "stats", "stats-json"], 0), key
