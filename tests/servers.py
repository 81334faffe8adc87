"""Real redis-server processes for the tests: standalone, primary + replica, cluster.

Each server runs on a free loopback port in a temporary directory and is stopped
by its PID. Nothing here uses a fixed port. Any of them may load the reference
module (``native/goblin.c``, built by ``make native``) with ``"--loadmodule", path``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
# Where `make native` builds the reference module.
MODULE = ROOT / "build" / "native" / "goblin.so"


def redis_server_binary() -> str | None:
    """The redis-server on PATH (or in /usr/sbin, /usr/bin), if any."""
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/sbin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    """A port that was free a moment ago (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisProcess:
    """One redis-server child process."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    def client(self, **kwargs: object) -> redis.Redis:
        """A sync client on this server."""
        return redis.Redis(host=HOST, port=self.port, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the server by its PID and wait for it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_server(binary: str, *extra: str, attempts: int = 5) -> RedisProcess:
    """Start a redis-server on a free port and wait until it answers PING."""
    last_error = ""
    for _ in range(attempts):
        port = free_port()
        directory = Path(tempfile.mkdtemp(prefix="goblin-redis-"))
        args = [
            binary,
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(directory),
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(directory / "redis.log"),
            *extra,
        ]  # fmt: skip
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = RedisProcess(port, directory, process, args)
        if _wait_ready(server):
            return server
        log = directory / "redis.log"
        last_error = log.read_text(errors="replace") if log.exists() else ""
        server.stop()  # most likely the port was taken meanwhile: try another
    raise RuntimeError(f"redis-server did not start: {last_error[-2000:]}")


def _wait_ready(server: RedisProcess, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    client = server.client(socket_timeout=1)
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                if client.ping():
                    return True
            time.sleep(0.05)
        return False
    finally:
        client.close()


def restart(server: RedisProcess, args: Sequence[str] | None = None) -> RedisProcess:
    """Start a stopped (or killed) server again on its port and directory; ``args`` replace its own.

    The directory is kept, so an AOF or RDB written before is loaded again.
    """
    server.process.wait(10)
    command = list(server.args if args is None else args)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    restarted = RedisProcess(server.port, server.directory, process, command)
    if not _wait_ready(restarted, timeout=20):
        log = server.directory / "redis.log"
        raise RuntimeError(f"redis-server did not restart: {log.read_text(errors='replace')[-2000:]}")
    return restarted


def build_module() -> tuple[Path | None, str]:
    """The reference module, built by ``make native`` when missing or older than its source.

    Returns:
        The module's path (``None`` when the build failed), and the build's output.
    """
    source = ROOT / "native" / "goblin.c"
    if MODULE.exists() and MODULE.stat().st_mtime >= source.stat().st_mtime:
        return MODULE, ""
    try:
        done = subprocess.run(
            ["make", "--no-print-directory", "native"], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    output = done.stdout + done.stderr
    return (MODULE if done.returncode == 0 and MODULE.exists() else None), output


@contextlib.contextmanager
def standalone(binary: str, *extra: str) -> Iterator[RedisProcess]:
    """A standalone server (``extra``: more server arguments, such as ``--loadmodule``)."""
    server = start_server(binary, *extra)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def primary_with_replica(binary: str, primary_args: Sequence[str] = ()) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    """A primary and one replica of it, in sync before this yields (``primary_args``: the primary's alone)."""
    primary = start_server(binary, *primary_args)
    replica: RedisProcess | None = None
    try:
        replica = start_server(binary, "--replicaof", HOST, str(primary.port))
        client = replica.client()
        deadline = time.monotonic() + 20
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)
        client.close()
        yield primary, replica
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


@contextlib.contextmanager
def cluster(binary: str, primaries: int = 3, extra: Sequence[str] = ()) -> Iterator[list[RedisProcess]]:
    """A cluster of ``primaries`` primaries (no replicas), all slots covered (``extra``: for every node)."""
    nodes: list[RedisProcess] = []
    try:
        for _ in range(primaries):
            nodes.append(
                start_server(binary, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *extra)
            )
        _assign_slots(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _assign_slots(nodes: list[RedisProcess]) -> None:
    # Done by hand (ADDSLOTSRANGE, MEET) rather than through redis-cli, so the
    # fixture needs nothing but the server binary.
    per_node = 16384 // len(nodes)
    clients = [node.client() for node in nodes]
    for index, client in enumerate(clients):
        first = index * per_node
        last = 16383 if index == len(nodes) - 1 else first + per_node - 1
        client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
    for client in clients[1:]:
        client.execute_command("CLUSTER MEET", HOST, nodes[0].port)
    deadline = time.monotonic() + 30
    for client in clients:
        while not (
            client.execute_command("CLUSTER INFO").get("cluster_state") == "ok"
            and len(client.execute_command("CLUSTER NODES")) == len(nodes)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not form")
            time.sleep(0.05)
    for client in clients:
        client.close()
