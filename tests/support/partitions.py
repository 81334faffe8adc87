"""A seeded network-partition nemesis: real cuts between namespaces, against the exactly-once promise.

The servers (a Sentinel group of a primary, two replicas and three sentinels, or a
Cluster of three primaries and three replicas) and two client groups, A and B, each run
in a network namespace of their own on one bridge (``tests/support/netns.py``). Every id
of the workload is asked for on both sides: three concurrent callers and a later retry
in group A and the same in group B, through every path of ``tests/support/nemesis.py``
(sync and asyncio; ``Claim``, fenced ``Claim``, ``@idempotent``, ``acquire_many``) plus one
HTTP door (``goblin_claim.wsgi.IdempotencyMiddleware`` called in-process), each group over
its own clients (redis-py or valkey-py). A scenario cuts the network with nftables:

- ``split``: [the primary + clients A] | [the replicas + the sentinels + clients B]
  (on a Cluster: [one primary + A] | [every other node + B]);
- ``isolated``: the primary cut from everything;
- ``flapping``: the split, cut and healed over and over (0.5-3 s each);
- ``one-way``: what the primary sends to the other servers is dropped; the rest passes.

Then the network heals, the group settles, and ``nemesis.check`` holds the promise a lease
later (the same ledger of executions, the same explanations). With the recipe
(``min-replicas-to-write 1``, ``min-replicas-max-lag 2``, ``replicas=1`` on the claims, the
manual's Retry) every invariant must hold; without it the figures are measured only:
ids run twice, ids whose callers hold different answers, answered results missing from
the final record. Side A's availability is probed (a write every 100 ms): its unavailable
seconds and the errors it met (``NOREPLICAS`` where it can reach the old primary only).

The seed is printed first with the command that replays it (``NEMESIS_SEED``);
``make partitions`` runs the long schedule, ``tests/deployment/test_partitions.py`` a short one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import io
import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import redis
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from goblin_claim import Claim
from goblin_claim._http import LOST, UNSTORED_HEADER, claim_name
from goblin_claim.wsgi import IdempotencyMiddleware
from tests.support import nemesis, netns, servers, valkey_py
from tests.support.nemesis import Caller, Execution, FaultEvent, Job, Ledger

SCENARIOS = ("split", "isolated", "flapping", "one-way")
TOPOLOGIES = ("sentinel", "cluster")
CLIENTS = ("redis-py", "valkey-py")
HTTP_PATH = "sync-http"
PATHS = (*nemesis.ALL_PATHS, HTTP_PATH)
# Inside a fresh namespace every port is free: the servers all listen on these.
DATA_PORT = 6379
SENTINEL_PORT = 26379
SERVICE = servers.SERVICE
RECIPE_ARGS = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "2")
TIMEOUTS = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
# What the sentinels' own connections get: without it one cut-off sentinel stalls discovery.
SENTINEL_KWARGS: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 1.0, "retry": Retry(NoBackoff(), 0)}
DOOR_PATH = "/charge"


def now() -> float:
    """The clock of every run (nemesis.py's)."""
    return nemesis.now()


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """One partition run.

    Attributes:
        binary: redis-server or valkey-server.
        topology: ``sentinel`` or ``cluster``.
        scenario: One of ``SCENARIOS``.
        client: ``redis-py`` or ``valkey-py``, for both groups.
        recipe: The manual's recipe (see the module's docstring).
        acks: The recipe's ``replicas=`` on every path that takes it: 1, or every replica of a primary.
        seconds: How long cuts are started for.
        ids: Ids of the run (spread over the paths and over ``seconds``).
        seed: ``None``: ``NEMESIS_SEED`` or a fresh one.
        lease: Every claim's lease.
        deadline: Seconds a caller keeps trying.
        threads: Each group's sync thread pool.
        paths: The workload's paths.
        log: Where progress lines go.
    """

    binary: str
    topology: str = "sentinel"
    scenario: str = "split"
    client: str = "redis-py"
    recipe: bool = True
    acks: int = 1
    seconds: float = 25.0
    ids: int = 300
    seed: int | None = None
    lease: int = 8
    deadline: float = 40.0
    threads: int = 128
    paths: tuple[str, ...] = PATHS
    log: Callable[[str], None] | None = print

    def nemesis(self) -> nemesis.Settings:
        """nemesis.py's settings for its workload and its checker."""
        rate = self.ids / max(1.0, self.seconds) / max(1, len(self.paths))
        return nemesis.Settings(
            binary=self.binary,
            seconds=self.seconds,
            seed=self.seed,
            replicas=2 if self.topology == "sentinel" else 1,
            recipe=self.recipe,
            rate=rate,
            lease=self.lease,
            deadline=self.deadline,
            threads=self.threads,
            paths=self.paths,
            faults=(),
            log=self.log,
        )


def replay_command(settings: Settings, seed: int) -> str:
    """The command that replays a run."""
    server = "valkey" if "valkey" in Path(settings.binary).name else "redis"
    words = [
        f"NEMESIS_SEED={seed} python -m tests.support.partitions --runs 1",
        f"--topology {settings.topology} --scenario {settings.scenario} --server {server} --client {settings.client}",
        f"--seconds {settings.seconds:g} --ids {settings.ids}",
        f"--lease {settings.lease} --deadline {settings.deadline:g}",
    ]
    if not settings.recipe:
        words.append("--no-recipe")
    if settings.acks != 1:
        words.append(f"--acks {settings.acks}")
    if settings.paths != PATHS:
        words.append("--paths " + ",".join(settings.paths))
    return " ".join(words)


@dataclass(frozen=True)
class Cut:
    """One planned cut: when (seconds from the start), for how long, and a pick (which primary, on a Cluster)."""

    at: float
    length: float
    pick: float


def plan_cuts(rng: random.Random, seconds: float, scenario: str) -> list[Cut]:
    """The cuts of a run: long ones with gaps to settle, or (flapping) many short ones in a row."""
    cuts, at = [], rng.uniform(2.0, 4.0)
    while at < seconds:
        if scenario == "flapping":
            length = rng.uniform(0.5, 3.0)
            cuts.append(Cut(round(at, 3), round(length, 3), rng.random()))
            at += length + rng.uniform(0.5, 3.0)
        else:
            length = min(rng.uniform(8.0, 16.0), max(4.0, seconds - at))
            cuts.append(Cut(round(at, 3), round(length, 3), rng.random()))
            at += length + rng.uniform(8.0, 12.0)  # the heal, the old primary's demotion, then a gap
    return cuts


# --------------------------------------------------------------------------- the servers


def _wait_ping(node: netns.Node, port: int, timeout: float = 15.0) -> None:
    def ping() -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError, OSError), local_client(port) as client:
                if client.ping():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.label}: nothing answers on port {port}")
            time.sleep(0.05)

    node.call(ping, timeout + 5)


@contextlib.contextmanager
def local_client(port: int, **kwargs: Any) -> Iterator[redis.Redis]:
    """A client on 127.0.0.1 of the calling thread's namespace (the harness's own looks: never cut)."""
    client = redis.Redis(host=netns.LOCALHOST, port=port, socket_timeout=kwargs.pop("socket_timeout", 2.0), **kwargs)
    try:
        yield client
    finally:
        client.close()


def start_data(node: netns.Node, binary: str, *extra: str) -> netns.Process:
    """A redis-server or valkey-server in ``node``, on its address and its own 127.0.0.1, with an AOF."""
    directory = Path(tempfile.mkdtemp(prefix="goblin-part-"))
    args = [
        binary,
        "--port", str(DATA_PORT),
        "--bind", node.address, netns.LOCALHOST,
        "--protected-mode", "no",
        "--save", "",
        "--appendonly", "yes",
        "--dir", str(directory),
        "--daemonize", "no",
        "--loglevel", "warning",
        "--logfile", str(directory / "redis.log"),
        *servers.FAST_SYNC,
        *extra,
    ]  # fmt: skip
    process = node.spawn(args, directory)
    _wait_ping(node, DATA_PORT)
    return process


def start_sentinel(node: netns.Node, binary: str, primary: str) -> netns.Process:
    """A sentinel in ``node`` watching the primary at ``primary`` (down after 1 s, as servers.sentinel_group)."""
    directory = Path(tempfile.mkdtemp(prefix="goblin-part-sentinel-"))
    config = directory / "sentinel.conf"
    config.write_text(
        f"port {SENTINEL_PORT}\nbind {node.address} {netns.LOCALHOST}\nprotected-mode no\ndaemonize no\n"
        f"dir {directory}\nloglevel warning\nlogfile {directory / 'redis.log'}\n"
        f"sentinel monitor {SERVICE} {primary} {DATA_PORT} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
        f"sentinel parallel-syncs {SERVICE} 2\n"
    )
    process = node.spawn([binary, str(config), "--sentinel"], directory)
    _wait_ping(node, SENTINEL_PORT)
    return process


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Topology:
    """The servers of a run and the client groups A and B, on one ``netns.Network``."""

    kind = ""

    def __init__(self, net: netns.Network, binary: str, recipe: bool) -> None:
        self.net = net
        self.binary = binary
        self.recipe = recipe
        self.a = net.add("a")
        self.b = net.add("b")
        self.directories: list[Path] = []

    def server_args(self) -> tuple[str, ...]:
        """What every data server gets beyond ``start_data``'s."""
        return RECIPE_ARGS if self.recipe else ()

    # what a scenario cuts
    def primary(self, pick: float) -> netns.Node:
        """The node cuts are about (a primary now)."""
        raise NotImplementedError

    def servers_except(self, node: netns.Node) -> list[netns.Node]:
        """Every server node other than ``node``."""
        return [other for other in self.server_nodes() if other is not node]

    def server_nodes(self) -> list[netns.Node]:
        """The nodes the servers run in."""
        raise NotImplementedError

    def wait_whole(self, timeout: float) -> None:
        """Wait until the servers are whole again (one primary, replicas in sync); raise ``RuntimeError`` if not."""
        raise NotImplementedError

    # clients, made and used on a group's own threads
    def sync_client(self, client: str, recipe: bool, probe: bool = False) -> Any:
        """A sync client of the servers (call on a group's thread)."""
        raise NotImplementedError

    def async_client(self, client: str, recipe: bool) -> Any:
        """An asyncio client of the servers (call on the group's loop)."""
        raise NotImplementedError

    def probe_key(self, target: netns.Node | None) -> str:
        """The key the availability probe writes."""
        return "nem-probe:{a}"

    def close(self) -> None:
        """Remove the servers' directories (the processes go with the network)."""
        for node in self.net.nodes.values():
            for process in node.processes:
                shutil.rmtree(process.directory, ignore_errors=True)


def _options(client: str, options: dict[str, Any], asyncio: bool, cluster: bool = False) -> dict[str, Any]:
    return valkey_py.translate(options, asyncio, cluster) if client == "valkey-py" else options


def _sync_retry(recipe: bool, probe: bool) -> dict[str, Any]:
    return {"retry": Retry(NoBackoff(), 0)} if probe else nemesis._retry_options(recipe)


class SentinelTopology(Topology):
    """A primary, two replicas, three sentinels (``servers.sentinel_group``'s settings), each in a namespace."""

    kind = "sentinel"

    def __init__(self, net: netns.Network, binary: str, recipe: bool) -> None:
        super().__init__(net, binary, recipe)
        self.data = [net.add(label) for label in ("p", "r1", "r2")]
        self.sentinels = [net.add(label) for label in ("s1", "s2", "s3")]
        primary = self.data[0]
        start_data(primary, binary, *self.server_args())
        for replica in self.data[1:]:
            start_data(replica, binary, "--replicaof", primary.address, str(DATA_PORT), *self.server_args())
        for sentinel in self.sentinels:
            start_sentinel(sentinel, binary, primary.address)
        self.wait_whole(60)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The sentinels, as a client's ``Sentinel`` takes them."""
        return [(node.address, SENTINEL_PORT) for node in self.sentinels]

    def server_nodes(self) -> list[netns.Node]:
        """The data nodes and the sentinels."""
        return self.data + self.sentinels

    def named_primary(self, sentinel: netns.Node | None = None) -> netns.Node:
        """The data node a sentinel (the first by default) names as the primary."""
        node = sentinel or self.sentinels[0]

        def ask() -> str:
            with local_client(SENTINEL_PORT) as client:
                return _text(client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)[0])

        address = node.call(ask)
        return next(data for data in self.data if data.address == address)

    def primary(self, pick: float) -> netns.Node:
        """The primary the sentinels name now."""
        return self.named_primary()

    def role(self, node: netns.Node) -> dict[str, Any]:
        """``INFO replication`` of a data node (asked inside its namespace)."""

        def info() -> dict[str, Any]:
            with local_client(DATA_PORT, socket_timeout=1.0) as client:
                return dict(client.info("replication"))

        return node.call(info)

    def wait_whole(self, timeout: float) -> None:
        """Every sentinel names one primary that is a master with both replicas online, the others replicas."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                named = {self.named_primary(sentinel).label for sentinel in self.sentinels}
                if len(named) == 1:
                    primary = next(node for node in self.data if node.label in named)
                    info = self.role(primary)
                    online = [
                        value
                        for name, value in info.items()
                        if name.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
                    ]
                    others = [self.role(node).get("role") for node in self.data if node is not primary]
                    whole = info.get("role") == "master" and len(online) == 2 and others == ["slave", "slave"]
                    if whole and self._sentinels_know_each_other():
                        return
                    last = f"primary {primary.label}: role {info.get('role')}, {len(online)} online, others {others}"
                else:
                    last = f"sentinels name {sorted(named)}"
            except Exception as exc:  # a node still restarting its links
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinel group did not settle in {timeout:.0f}s: {last}")
            time.sleep(0.2)

    def _sentinels_know_each_other(self) -> bool:
        def ask() -> tuple[int, int]:
            with local_client(SENTINEL_PORT) as client:
                state = client.execute_command("SENTINEL MASTER", SERVICE)
                if isinstance(state, list):
                    state = dict(zip(state[::2], state[1::2], strict=True))
                state = {_text(k): _text(v) for k, v in state.items()}
                return int(state["num-other-sentinels"]), int(state["num-slaves"])

        return all(sentinel.call(ask) == (2, 2) for sentinel in self.sentinels)

    def _sentinel(self, client: str, asyncio: bool) -> Any:
        skw = _options(client, dict(SENTINEL_KWARGS), asyncio)
        if asyncio:
            skw["retry"] = _options(client, {"retry": AsyncRetry(NoBackoff(), 0)}, True)["retry"]
        if client == "valkey-py":
            import valkey.asyncio.sentinel
            import valkey.sentinel

            family: Any = valkey.asyncio.sentinel if asyncio else valkey.sentinel
        else:
            family = redis.asyncio.sentinel if asyncio else redis.sentinel
        return family.Sentinel(self.addresses, socket_timeout=1.0, sentinel_kwargs=skw)

    def sync_client(self, client: str, recipe: bool, probe: bool = False) -> Any:
        """``Sentinel(...).master_for(...)`` as the manual gives it (bounded ``sentinel_kwargs``)."""
        options = dict(TIMEOUTS, **_sync_retry(recipe, probe))
        if probe:
            options.update(socket_timeout=0.5, socket_connect_timeout=0.5)
        return self._sentinel(client, False).master_for(SERVICE, **_options(client, options, False))

    def async_client(self, client: str, recipe: bool) -> Any:
        """The asyncio twin of ``sync_client``."""
        options = dict(TIMEOUTS, **nemesis._async_retry_options(recipe))
        sentinel = self._sentinel(client, True)
        made = sentinel.master_for(SERVICE, **_options(client, options, True))
        made.partition_sentinels = sentinel.sentinels  # closed with it (_run_async)
        return made


class ClusterTopology(Topology):
    """Three primaries and three replicas (``servers.cluster_with_replicas``'s settings), each in a namespace."""

    kind = "cluster"

    def __init__(self, net: netns.Network, binary: str, recipe: bool) -> None:
        super().__init__(net, binary, recipe)
        self.nodes = [net.add(f"n{index}") for index in range(6)]
        self.ids: dict[str, str] = {}
        cluster_args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(servers.CLUSTER_NODE_TIMEOUT_MS),
        )  # fmt: skip
        for node in self.nodes:
            start_data(node, binary, *cluster_args, *self.server_args())
            self.ids[node.label] = _text(node.call(lambda: self._ask("CLUSTER MYID")))
        self._form()
        self.wait_whole(60)

    @staticmethod
    def _ask(*command: Any) -> Any:
        with local_client(DATA_PORT) as client:
            return client.execute_command(*command)

    def _form(self) -> None:
        heads = self.nodes[:3]
        for index, node in enumerate(heads):
            first, last = index * 5461, 16383 if index == 2 else index * 5461 + 5460
            node.call(lambda first=first, last=last: self._ask("CLUSTER ADDSLOTSRANGE", first, last))
        for node in self.nodes[1:]:
            node.call(lambda: self._ask("CLUSTER MEET", heads[0].address, DATA_PORT))
        deadline = time.monotonic() + 30
        for index, node in enumerate(self.nodes[3:]):
            primary_id = self.ids[heads[index].label]
            while True:
                try:
                    node.call(lambda primary_id=primary_id: self._ask("CLUSTER REPLICATE", primary_id))
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def server_nodes(self) -> list[netns.Node]:
        """The six cluster nodes."""
        return list(self.nodes)

    def view(self, node: netns.Node) -> dict[str, servers.NodeView]:
        """``CLUSTER NODES`` as ``node`` sees it."""

        def look() -> dict[str, servers.NodeView]:
            with local_client(DATA_PORT) as client:
                return servers.cluster_nodes(client)

        return node.call(look)

    def primaries(self) -> list[netns.Node]:
        """The nodes that say they are primaries with slots."""
        found = []
        for node in self.nodes:
            with contextlib.suppress(Exception):
                mine = self.view(node)[self.ids[node.label]]
                if mine.is_primary and mine.slots:
                    found.append(node)
        return found

    def primary(self, pick: float) -> netns.Node:
        """One of the primaries now, by ``pick``."""
        primaries = self.primaries()
        return primaries[min(int(pick * len(primaries)), len(primaries) - 1)]

    def wait_whole(self, timeout: float) -> None:
        """Every node says ``cluster_state:ok``, sees all six without a failure flag, three primaries with a replica."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                problems = []
                for node in self.nodes:
                    info = node.call(lambda: self._ask("CLUSTER INFO"))
                    state = info.get("cluster_state") if isinstance(info, dict) else None
                    view = self.view(node)
                    if state != "ok" or len(view) != 6 or any(item.failing for item in view.values()):
                        problems.append(f"{node.label}: state {state}, {len(view)} known")
                    primaries = [item for item in view.values() if item.is_primary and item.slots]
                    replicas = {item.primary_id for item in view.values() if not item.is_primary}
                    if len(primaries) != 3 or {item.node_id for item in primaries} != replicas:
                        problems.append(f"{node.label}: {len(primaries)} primaries, replicas of {len(replicas)}")
                if not problems:
                    return
                last = "; ".join(problems[:3])
            except Exception as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not heal in {timeout:.0f}s: {last}")
            time.sleep(0.2)

    def sync_client(self, client: str, recipe: bool, probe: bool = False) -> Any:
        """A ``RedisCluster`` (or ``ValkeyCluster``) from the first node's address."""
        options = dict(TIMEOUTS, **_sync_retry(recipe, probe))
        if probe:
            options.update(socket_timeout=0.5, socket_connect_timeout=0.5)
        if client == "valkey-py":
            import valkey.cluster

            made = valkey_py.translate(options, False, cluster=True)
            return valkey.cluster.ValkeyCluster(host=self.nodes[0].address, port=DATA_PORT, **made)
        return redis.cluster.RedisCluster(host=self.nodes[0].address, port=DATA_PORT, **options)

    def async_client(self, client: str, recipe: bool) -> Any:
        """The asyncio cluster client, with room for every task."""
        options = dict(TIMEOUTS, max_connections=1024, **nemesis._async_retry_options(recipe))
        if client == "valkey-py":
            import valkey.asyncio.cluster

            made = valkey_py.translate(options, True, cluster=True)
            return valkey.asyncio.cluster.ValkeyCluster(host=self.nodes[0].address, port=DATA_PORT, **made)
        return redis.asyncio.cluster.RedisCluster(host=self.nodes[0].address, port=DATA_PORT, **options)

    def probe_key(self, target: netns.Node | None) -> str:
        """A key in the first primary's slots (the one cuts are drawn from first)."""
        serial = 0
        while True:
            key = f"nem-probe:{{p{serial}}}"
            if key_slot(key.encode()) < 5461:
                return key
            serial += 1


@contextlib.contextmanager
def topology(kind: str, binary: str, recipe: bool) -> Iterator[Topology]:
    """A network with ``kind``'s servers and the two client groups; all removed when the block ends."""
    with netns.network() as net:
        made: Topology | None = None
        try:
            made = SentinelTopology(net, binary, recipe) if kind == "sentinel" else ClusterTopology(net, binary, recipe)
            yield made
        finally:
            net.close()  # the processes first (by PID), then the directories
            if made is not None:
                made.close()


# --------------------------------------------------------------------------- the HTTP door


class DoorPaths(nemesis.SyncPaths):
    """nemesis.py's sync paths, plus ``sync-http``: a WSGI app behind ``IdempotencyMiddleware``, in-process."""

    def __init__(
        self, settings: nemesis.Settings, client: Any, ledger: Ledger, replicated: frozenset[str], group: str
    ) -> None:
        super().__init__(settings, client, ledger, replicated)
        self.group = group
        self.statuses: collections.Counter[str] = collections.Counter()
        ledger_ = ledger
        self._ran = threading.local()  # the door calls the app on the caller's own thread

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
            caller = nemesis._caller.get()
            execution = ledger_.begin(environ["HTTP_IDEMPOTENCY_KEY"], caller)
            self._ran.execution = execution  # this request's run, for _once to settle by the door's answer
            time.sleep(caller.job.work)
            execution.end = now()
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [execution.value.encode()]

        # The recipe's client side on the door too: its claim and its stored answer wait for a replica.
        recipe = nemesis.REPLICATED if settings.recipe else {}
        self.door = IdempotencyMiddleware(
            app,
            client=client,
            lease=settings.lease,
            wait=nemesis.WAIT,
            namespace=nemesis.namespace(HTTP_PATH),
            **recipe,
        )

    def _once(self, caller: Caller) -> str | None:
        if caller.job.path != HTTP_PATH:
            return super()._once(caller)
        ident = caller.job.idents[0]
        got: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            got.append((status, headers))
            return lambda _data: None

        environ = {
            "REQUEST_METHOD": "POST",
            "SCRIPT_NAME": "",
            "PATH_INFO": DOOR_PATH,
            "QUERY_STRING": "",
            "CONTENT_TYPE": "text/plain",
            "CONTENT_LENGTH": "0",
            "HTTP_IDEMPOTENCY_KEY": ident,
            "SERVER_NAME": "partitions",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
        }
        self._ran.execution = None
        result = self.door(environ, start_response)
        try:
            body = b"".join(result).decode()
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = got[-1] if got else ("000 none", [])
        code = status.split()[0]
        unstored = any(
            name.lower().encode() == UNSTORED_HEADER[0] and value.encode() == UNSTORED_HEADER[1]
            for name, value in headers
        )
        self.statuses[code + (" unstored" if unstored else "")] += 1
        if code.startswith("2") and not unstored:
            self.ledger.settle(body, "completed")
            return body
        if unstored:
            self.ledger.settle(body, "unstored")
        ran = self._ran.execution
        if code == "503" and ran is not None and ran.fate == "running" and _detail(body) == LOST:
            # The door's ClaimLostError: this request ran, and its caller was told its answer was not kept.
            ran.fate, ran.fate_at = "refused", now()
        return None  # a problem answer (409 in flight, 503 unavailable): asked again


def _detail(body: str) -> object:
    """A problem answer's ``detail`` (``None`` for any other body)."""
    with contextlib.suppress(ValueError, AttributeError):
        return json.loads(body).get("detail")
    return None


# --------------------------------------------------------------------------- a group's workload


@dataclass
class Group:
    """One client group: its namespace, its callers, its door's statuses."""

    name: str
    node: netns.Node
    callers: list[Caller] = field(default_factory=list)
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    finished: dict[str, bool] = field(default_factory=dict)


def _run_sync(
    settings: Settings, nset: nemesis.Settings, topo: Topology, group: Group, ledger: Ledger, jobs: list[Job],
    t0: float, timeout: float,
) -> None:  # fmt: skip
    pool = group.node.pool(settings.threads, f"part-{group.name}")
    client = pool.submit(topo.sync_client, settings.client, settings.recipe).result(60)
    replicated: frozenset[str] = frozenset()
    if settings.recipe:
        replicated = frozenset(pool.submit(nemesis.probe_sync_replicas, client).result(120))
    paths = DoorPaths(nset, client, ledger, replicated, group.name)
    workload = nemesis.SyncWorkload(nset, paths, jobs, group.callers, pool)  # callers on the group's namespace
    try:
        group.finished["sync"] = workload.run(t0, timeout)
    finally:
        group.statuses.update(paths.statuses)
        with contextlib.suppress(Exception):
            pool.submit(client.close).result(10)


async def _run_async(
    settings: Settings, nset: nemesis.Settings, topo: Topology, group: Group, ledger: Ledger, jobs: list[Job],
    t0: float, timeout: float,
) -> bool:  # fmt: skip
    """nemesis.run_async_workload's shape over this topology's asyncio client (made on the group's loop)."""
    client = topo.async_client(settings.client, settings.recipe)
    replicated: set[str] = set()
    if settings.recipe:
        replicated.update(await nemesis.probe_async_replicas(client))
    paths = nemesis.AsyncPaths(nset, client, ledger, frozenset(replicated))
    try:
        return await nemesis.drive_async(paths, jobs, group.callers, t0, timeout)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.aclose(), 10)
        for sentinel in getattr(client, "partition_sentinels", []):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sentinel.aclose(), 10)


# --------------------------------------------------------------------------- availability of a side


class SideProbe:
    """Writes one key every 100 ms from a group's namespace: the seconds it could not, the errors it met."""

    def __init__(self, topo: Topology, group: Group, client: str) -> None:
        self.topo = topo
        self.group = group
        self.client_kind = client
        self.intervals: list[tuple[float, float]] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.pool = group.node.pool(1, f"probe-{group.name}")
        self.future: Any = None

    def start(self) -> None:
        """Probe on the group's namespace until ``stop``."""
        self.future = self.pool.submit(self._run)

    def _run(self) -> None:
        client = self.topo.sync_client(self.client_kind, False, probe=True)
        key = self.topo.probe_key(None)
        try:
            while not self.stop.wait(0.1):
                started = now()
                try:
                    client.set(key, b"x", ex=60)
                    ok = True
                except Exception as exc:
                    ok = False
                    self.errors[_error_name(exc)] += 1
                ended = now()
                if not ok or ended - started > 0.3:
                    self.intervals.append((started, ended if ok else max(ended, started + 0.1)))
        finally:
            client.close()

    def unavailable_seconds(self, start: float = 0.0, end: float = float("inf")) -> float:
        """The union of the intervals it failed or stalled in, within ``start``-``end``."""
        total, last = 0.0, -1.0
        for begin, finish in sorted(self.intervals):
            begin, finish = max(begin, last, start), min(finish, end)
            if finish > begin:
                total += finish - begin
                last = finish
        return total


def _error_name(exc: BaseException) -> str:
    name = type(exc).__name__
    if name == "ResponseError" or name.endswith("ResponseError"):
        return f"{name}({str(exc).split(' ')[0]})"
    return name


# --------------------------------------------------------------------------- the partitioner


class Partitioner:
    """Does a run's cuts, one after another; after each (and at the end) the network heals and the servers settle."""

    def __init__(self, settings: Settings, topo: Topology, cuts: list[Cut]) -> None:
        self.settings = settings
        self.topo = topo
        self.cuts = cuts
        self.events: list[FaultEvent] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.t0 = 0.0

    def log(self, line: str) -> None:
        """A progress line with the time since the start."""
        if self.settings.log is not None:
            self.settings.log(f"[partitions {now() - self.t0:6.1f}s] {line}")

    def _sides(self, cut: Cut) -> tuple[netns.Node, list[netns.Node], list[netns.Node]]:
        """The primary of the cut, its side (it and group A) and the other side."""
        primary = self.topo.primary(cut.pick)
        return primary, [primary, self.topo.a], [*self.topo.servers_except(primary), self.topo.b]

    def apply(self, cut: Cut) -> str:
        """Make the scenario's cut; what it cut, in words."""
        net, scenario = self.topo.net, self.settings.scenario
        primary, minority, majority = self._sides(cut)
        if scenario in ("split", "flapping"):
            net.cut(minority, majority)
            return f"[{', '.join(n.label for n in minority)}] | [{', '.join(n.label for n in majority)}]"
        if scenario == "isolated":
            net.isolate(primary)
            return f"{primary.label} isolated"
        others = self.topo.servers_except(primary)
        net.cut_one_way([primary], others)
        return f"{primary.label} -> [{', '.join(n.label for n in others)}] dropped (one way)"

    def run(self, t0: float) -> None:
        """Every cut whose time comes within the schedule, then the heal."""
        self.t0 = t0
        flapping = self.settings.scenario == "flapping"
        try:
            for cut in self.cuts:
                if self.stop.wait(max(0.0, t0 + cut.at - now())) or now() - t0 >= self.settings.seconds:
                    break
                event = FaultEvent(f"partition-{self.settings.scenario}", now())
                self.events.append(event)
                try:
                    event.detail = self.apply(cut)
                except Exception as exc:
                    self.failures.append(f"cut at {event.start - t0:.1f}s: {exc!r}")
                self.stop.wait(cut.length)
                self.topo.net.heal()
                event.end = now()
                if not flapping:
                    self._whole()
                event.healed = now()
                self.log(
                    f"cut {event.detail} for {event.end - event.start:.1f}s"
                    + ("" if flapping else f", settled {event.healed - event.end:.1f}s after the heal")
                )
        finally:
            self.topo.net.heal()
            self._whole()
            for event in self.events:
                event.healed = max(event.healed, now())

    def _whole(self) -> None:
        try:
            self.topo.wait_whole(90)
        except RuntimeError as exc:
            self.failures.append(f"at {now() - self.t0:.1f}s: {exc}")
            self.log(str(exc))


# --------------------------------------------------------------------------- records and figures


def read_records(topo: Topology, client: str, idents_by_path: dict[str, list[str]]) -> dict[str, bytes | None]:
    """Every id's record, read from group B's namespace through a fresh client."""

    def read() -> dict[str, bytes | None]:
        reader = topo.sync_client(client, True)
        try:
            records: dict[str, bytes | None] = {}
            for path, idents in idents_by_path.items():
                for ident in idents:
                    if path == HTTP_PATH:
                        name = claim_name("POST", DOOR_PATH, None, ident)
                        key = Claim(reader, name, namespace=nemesis.namespace(HTTP_PATH)).claim_key
                    else:
                        key = f"{nemesis.namespace(path)}:{{{ident}}}"
                    records[ident] = reader.get(key)
                    if path == HTTP_PATH:
                        records[ident] = _door_body(records[ident])
            return records
        finally:
            reader.close()

    return topo.b.call(read, 300)


def _door_body(record: bytes | None) -> bytes | None:
    """A door's stored response as the checker reads a record: ``done <token> <body>`` (the body out of its JSON)."""
    if record is None or not record.startswith(b"done "):
        return record
    head, _, payload = record.partition(b" {")
    with contextlib.suppress(ValueError, KeyError, TypeError):
        envelope = json.loads(b"{" + payload)
        return head + b" " + base64.b64decode(envelope["body"])
    return record


def explain_told(
    report: nemesis.Report, ledger: Ledger, callers: Sequence[Caller], records: dict[str, bytes | None]
) -> int:
    """Count as explained the double runs whose every extra run's owner was told (``.result`` on its error).

    nemesis.py explains a told run only when it was told after holding its claim a lease (a
    process fault); across a partition a caller is told at once (``NotReplicatedError``,
    ``NOREPLICAS``) and the other side runs the id after the lease lapses. Every caller's answer
    must still be the stored one. Returns how many ids this explained.
    """
    answers: dict[str, set[str | None]] = collections.defaultdict(set)
    for caller in callers:
        for ident, answer in caller.answers.items():
            answers[ident].add(nemesis._nonce_of(answer))
    moved: list[str] = []
    for index, line in enumerate(report.details):
        if not line.startswith("unexplained: "):
            continue
        ident = line.split()[1]
        record = records.get(ident)
        final = nemesis._nonce_of(record) if record is not None and record.startswith(b"done ") else None
        runs: list[Execution] = ledger.runs.get(ident, [])
        told = all(run.fate in ("refused", "unstored", "stopped") for run in runs if run.nonce != final)
        if final is not None and told and answers.get(ident, set()) <= {final}:
            report.details[index] = "explained (told): " + line.removeprefix("unexplained: ")
            moved.append(ident)
    if moved:
        runs = report.summary["double_runs"]
        runs["explained"] += len(moved)
        runs["unexplained"] -= len(moved)
        left = [line.split()[1] for line in report.details if line.startswith(("unexplained: ", "foreign record: "))]
        report.broken = [line for line in report.broken if "unexplained" not in line]
        if runs["unexplained"]:
            report.broken.append(
                f"{runs['unexplained']} ids ran more than once (or answered otherwise) unexplained: {left[:10]}"
            )
    return len(moved)


def split_figures(
    ledger: Ledger, callers: Sequence[Caller], records: dict[str, bytes | None], idents: Sequence[str]
) -> dict[str, int]:
    """What exactly-once lost, counted: ids run twice, ids with two answers, answered results not in the record."""
    answers: dict[str, set[str | None]] = collections.defaultdict(set)
    for caller in callers:
        for ident, answer in caller.answers.items():
            answers[ident].add(nemesis._nonce_of(answer))
    twice = sum(1 for ident in idents if len(ledger.runs.get(ident, [])) > 1)
    split = sum(1 for ident in idents if len(answers.get(ident, set())) > 1)
    lost = 0
    for ident in idents:
        record = records.get(ident)
        final = nemesis._nonce_of(record) if record is not None and record.startswith(b"done ") else None
        if any(nonce != final for nonce in answers.get(ident, set())):
            lost += 1
    return {"ids_run_twice": twice, "ids_with_two_answers": split, "ids_answered_not_in_record": lost}


def _caller_errors(callers: Sequence[Caller], start: float, end: float) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for caller in callers:
        for error in caller.errors:
            if start <= error.at <= end:
                name = error.type_name.rsplit(".", 1)[-1]
                if "NOREPLICAS" in error.cause or "NOREPLICAS" in error.text:
                    name += "(NOREPLICAS)"
                counts[name] += 1
    return dict(counts.most_common())


@dataclass
class Outcome:
    """A run's report (nemesis.py's) and its partition figures."""

    report: nemesis.Report
    figures: dict[str, Any]

    @property
    def broken(self) -> list[str]:
        """The invariants broken (those the checker holds with or without the recipe)."""
        return self.report.broken

    def line(self) -> str:
        """The figures on one line."""
        return json.dumps(self.figures, default=str)


def run(settings: Settings) -> Outcome:
    """One partition run on a topology of its own: plan, cuts and workload at once, heal, check.

    The recipe's ``replicas=`` (``settings.acks``) is set in ``nemesis.REPLICATED``, which every
    path reads, for the run only.
    """
    before = nemesis.REPLICATED["replicas"]
    nemesis.REPLICATED["replicas"] = settings.acks
    try:
        return _run(settings)
    finally:
        nemesis.REPLICATED["replicas"] = before


def _run(settings: Settings) -> Outcome:
    seed = nemesis.seed_from_env(settings.seed)
    settings = replace(settings, seed=seed)
    log = settings.log or (lambda line: None)
    replay = replay_command(settings, seed)
    log(f"NEMESIS_SEED={seed} to replay: {replay}")
    nset = settings.nemesis()
    cuts = plan_cuts(random.Random(f"cuts-{seed}"), settings.seconds, settings.scenario)
    jobs = nemesis.plan_workload(random.Random(f"workload-{seed}"), settings.seconds, nset.rate, settings.paths)
    log("cut plan: " + ", ".join(f"{cut.at:.1f}s for {cut.length:.1f}s" for cut in cuts))
    ledger = Ledger(f"{random.Random(seed).getrandbits(24):06x}")
    sync_paths = (*nemesis.SYNC_PATHS, HTTP_PATH)
    sync_jobs = [job for job in jobs if job.path in sync_paths]
    async_jobs = [job for job in jobs if job.path in nemesis.ASYNC_PATHS]
    logs = nemesis.LogCounter()
    with topology(settings.topology, settings.binary, settings.recipe) as topo, logs.attached():
        groups = [Group("a", topo.a), Group("b", topo.b)]
        partitioner = Partitioner(settings, topo, cuts)
        probes = [SideProbe(topo, group, settings.client) for group in groups]
        timeout = settings.seconds + 2 * settings.deadline + nset.margin + 30
        t0 = now() + 2.0
        threads = [threading.Thread(target=partitioner.run, args=(t0,), name="partitioner")]
        loops = []
        for group in groups:
            threads.append(
                threading.Thread(
                    target=_run_sync,
                    args=(settings, nset, topo, group, ledger, sync_jobs, t0, timeout),
                    name=f"part-{group.name}-sync",
                )
            )
            loop = group.node.loop_thread()
            loops.append(loop)

            def async_side(group: Group = group, loop: netns.LoopThread = loop) -> None:
                group.finished["async"] = loop.run(
                    _run_async(settings, nset, topo, group, ledger, async_jobs, t0, timeout)
                )

            threads.append(threading.Thread(target=async_side, name=f"part-{group.name}-async"))
        try:
            for probe in probes:
                probe.start()
            for thread in threads:
                thread.start()
            threads[0].join(settings.seconds + 400)
            faults_stopped = now()
            log(f"cuts stopped and healed at {faults_stopped - t0:.1f}s")
            for thread in threads[1:]:
                thread.join(max(1.0, t0 + timeout + 60 - now()))
            workload_done = now()
            log(f"workload done at {workload_done - t0:.1f}s")
        finally:
            partitioner.stop.set()
            for probe in probes:
                probe.stop.set()
            threads[0].join(120)
        time.sleep(max(0.0, max(faults_stopped, workload_done) + settings.lease + 1.0 - now()))
        idents_by_path: dict[str, list[str]] = collections.defaultdict(list)
        for job in jobs:
            idents_by_path[job.path].extend(job.idents)
        records = read_records(topo, settings.client, idents_by_path)
        callers = groups[0].callers + groups[1].callers
        finished = all(group.finished.get(side, False) for group in groups for side in ("sync", "async"))
        first_cut = min((event.start for event in partitioner.events), default=faults_stopped)
        report = nemesis.check(
            nset,
            seed,
            ledger,
            callers,
            partitioner.events,
            records,
            finished,
            probes[0].unavailable_seconds(),
            partitioner.failures,
            t0,
        )
        report.replay = replay
        explain_told(report, ledger, callers, records)
        idents = sorted({ident for job in jobs for ident in job.idents})
        cut_seconds = sum(event.end - event.start for event in partitioner.events)
        figures: dict[str, Any] = {
            "seed": seed,
            "topology": settings.topology,
            "scenario": settings.scenario,
            "server": Path(settings.binary).name,
            "client": settings.client,
            "recipe": settings.recipe,
            "acks": settings.acks,
            "ids": len(idents),
            "callers": len(callers),
            "cuts": len(partitioner.events),
            "cut_s": round(cut_seconds, 1),
            "double_runs": report.summary["double_runs"],
            **split_figures(ledger, callers, records, idents),
            "answer_mismatches": report.summary["answer_mismatches"],
            "stuck_ids": len(report.summary["stuck_ids"]),
            "non_goblin_errors": report.summary["non_goblin_errors"],
            "past_deadline": report.summary["past_deadline"],
            "gave_up": report.summary["gave_up"],
            "max_latency_s": report.summary["max_latency_s"],
            "minority_unavailable_s": round(probes[0].unavailable_seconds(first_cut, faults_stopped), 1),
            "minority_probe_errors": dict(probes[0].errors.most_common()),
            "minority_caller_errors": _caller_errors(groups[0].callers, first_cut, faults_stopped),
            "majority_unavailable_s": round(probes[1].unavailable_seconds(first_cut, faults_stopped), 1),
            "majority_caller_errors": _caller_errors(groups[1].callers, first_cut, faults_stopped),
            "door_statuses": dict((groups[0].statuses + groups[1].statuses).most_common()),
            "broken": len(report.broken),
        }
        figures["log_warnings"] = dict(logs.counts.most_common())
    log("figures: " + json.dumps(figures, default=str))
    for line in report.details:
        if not line.startswith("explained"):
            log(line)
    for name, trace in report.samples.items():
        log(f"--- a {name}, first seen:\n{trace}")
    for line in report.broken:
        log(("BROKEN: " if settings.recipe else "without the recipe: ") + line)
    return Outcome(report, figures)


# --------------------------------------------------------------------------- by hand: make partitions


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.support.partitions``: runs per scenario, with and without the recipe; their figures.

    Exits 1 if a run with the recipe broke an invariant (runs without it are measured only).
    """
    # A SIGTERM (a stopped make, a CI timeout) unwinds like Ctrl-C, so every namespace, rule and server goes.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    parser = argparse.ArgumentParser(prog="python -m tests.support.partitions", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs (seeds) per scenario and recipe")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of cuts per run")
    parser.add_argument("--ids", type=int, default=300)
    parser.add_argument("--topology", default="sentinel", help="sentinel, cluster, or both (comma-separated)")
    parser.add_argument("--scenario", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument("--client", choices=CLIENTS, default="redis-py")
    parser.add_argument("--no-recipe", action="store_true", help="only runs without the recipe")
    parser.add_argument("--recipe-only", action="store_true", help="only runs with the recipe")
    parser.add_argument("--seed", type=int, default=None, help="the first run's seed (default NEMESIS_SEED, or fresh)")
    parser.add_argument("--lease", type=int, default=8)
    parser.add_argument("--acks", type=int, default=1, help="the recipe's replicas= (2: every replica on Sentinel)")
    parser.add_argument("--deadline", type=float, default=40.0)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args(argv)
    why = netns.missing()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    binary = servers.valkey_server_binary() if args.server == "valkey" else servers.redis_server_binary()
    if binary is None:
        print(f"no {args.server}-server binary (make {args.server}-server)", file=sys.stderr)
        return 2
    recipes = [False] if args.no_recipe else [True] if args.recipe_only else [True, False]
    first = nemesis.seed_from_env(args.seed)
    outcomes: list[Outcome] = []
    serial = 0
    for kind in args.topology.split(","):
        for scenario in args.scenario.split(","):
            for recipe in recipes:
                for _ in range(args.runs):
                    settings = Settings(
                        binary=binary,
                        topology=kind,
                        scenario=scenario,
                        client=args.client,
                        recipe=recipe,
                        acks=args.acks,
                        seconds=args.seconds,
                        ids=args.ids,
                        seed=first + serial,
                        lease=args.lease,
                        deadline=args.deadline,
                        paths=tuple(args.paths.split(",")),
                    )
                    serial += 1
                    print(f"=== {kind} {scenario} {'recipe' if recipe else 'no recipe'} seed {first + serial - 1}")
                    outcomes.append(run(settings))
    print("=== figures per run")
    for outcome in outcomes:
        recipe = outcome.figures["recipe"]
        print(("BROKEN " if outcome.broken and recipe else "ok     ") + outcome.line())
    return 1 if any(outcome.broken and outcome.figures["recipe"] for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
