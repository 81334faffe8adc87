"""Real network partitions for the tests: Linux network namespaces on a bridge, cut by nftables.

A ``Network`` is one run's little LAN: a Linux bridge in the root namespace and, per node,
a network namespace joined to it by a veth pair. Every address is in ``127.0.0.0/8``
(``127.0.N.x/24``, ``N`` picked per run), so nothing here can reach or shadow a real
network. Inside a namespace the kernel's ``local 127.0.0.0/8 dev lo`` route would answer
every ``127.x`` address itself; it is replaced by local routes for ``127.0.0.1`` and the
namespace's own veth address only, and ``route_localnet=1`` lets ``127.x`` packets leave
and arrive on the veth. The root namespace only bridges frames: it gets no address and no
sysctl change.

Cuts are nftables rules in one ``bridge``-family table of the run's own, on the bridge's
forward hook: ``cut(a, b)`` drops both directions between two groups of nodes,
``cut_one_way(a, b)`` drops what ``a`` sends to ``b`` only, ``isolate(node)`` cuts a node
from every other, ``heal()`` removes every rule. Established TCP connections survive a
cut (their packets are dropped, then retransmitted once healed), as over a real network.

Servers run in their namespace under ``ip netns exec``; in-process clients run on threads
that entered the namespace with ``setns(2)`` (a network namespace is per thread on Linux,
and a socket belongs to the namespace of the thread that made it): ``Node.executor`` for
sync code, ``Node.loop_thread`` for asyncio. Every name a run makes (namespaces, veths,
the bridge, the nft table) starts with the run's prefix; everything is removed by name,
and its processes stopped by PID, when the ``network()`` block ends however it ends, and a
run's start sweeps the leftovers of an earlier run that could not clean up (``PREFIX``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import random
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.support.servers import stop_by_pid

# Every name a run makes starts with this and the run's four hex digits: gp1a2b-n0, gp1a2b-br...
PREFIX = "gpn"
NETNS_DIR = Path("/run/netns")
# Who owns a run's names: a file per run holding its process's PID (a live owner's names are not swept).
OWNERS = Path("/run/goblin-netns")
CLONE_NEWNET = 0x40000000
LOCALHOST = "127.0.0.1"

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def missing() -> str | None:
    """Why this machine cannot make partitions (not root, no ``ip`` or ``nft``), or ``None``."""
    if os.geteuid() != 0:
        return "network partitions need root (network namespaces, a bridge, nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"network partitions need {tool} (make test installs iproute2 and nftables)"
    return None


def run_cmd(*args: str, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one command of the harness (``ip``, ``nft``, ``sysctl``), raising with its stderr when it fails."""
    done = subprocess.run(list(args), capture_output=True, text=True, input=input_text, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def enter(name: str) -> None:
    """Move the calling thread into the network namespace ``name`` (``setns``; the thread stays there)."""
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def sweep(prefix: str = PREFIX) -> list[str]:
    """Remove what runs that could not clean up left: processes in prefixed namespaces, the namespaces, links, tables.

    Returns what it removed, in words.
    """
    removed: list[str] = []
    live = _live_runs()
    names = [line.split()[0] for line in run_cmd("ip", "netns", "list", check=False).stdout.splitlines() if line]
    for name in names:
        if not name.startswith(prefix) or name[: len(PREFIX) + 4] in live:
            continue
        pids = run_cmd("ip", "netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run_cmd("ip", "netns", "del", name, check=False)
        removed.append(f"namespace {name} ({len(pids)} processes)")
    for line in run_cmd("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            link = parts[1].strip().split("@")[0]
            if link.startswith(prefix) and link[: len(PREFIX) + 4] not in live:
                run_cmd("ip", "link", "del", link, check=False)
                removed.append(f"link {link}")
    for line in run_cmd("nft", "list", "tables", check=False).stdout.splitlines():
        words = line.split()
        if len(words) == 3 and words[2].startswith(prefix) and words[2][: len(PREFIX) + 4] not in live:
            run_cmd("nft", "delete", "table", words[1], words[2], check=False)
            removed.append(f"nft table {words[1]} {words[2]}")
    for owner in OWNERS.glob(f"{prefix}*") if OWNERS.exists() else []:
        if owner.name not in live:
            owner.unlink(missing_ok=True)
    return removed


def _live_runs() -> set[str]:
    """The run prefixes whose owning process is alive (this one's included)."""
    live: set[str] = set()
    for owner in OWNERS.glob(f"{PREFIX}*") if OWNERS.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(owner.read_text()), 0)
            live.add(owner.name)
    return live


@dataclass
class Process:
    """A server started in a namespace; stopped by its PID."""

    name: str
    process: subprocess.Popen[bytes]
    directory: Path

    def stop(self) -> None:
        """SIGCONT then SIGTERM by PID; SIGKILL if it does not exit within 10 s."""
        stop_by_pid(self.process)


@dataclass
class Node:
    """One namespace on the run's bridge: its address, the threads that run inside it, its processes."""

    network: Network
    label: str
    namespace: str
    address: str
    processes: list[Process] = field(default_factory=list)
    _executor: concurrent.futures.ThreadPoolExecutor | None = None
    _loops: list[LoopThread] = field(default_factory=list)
    _pools: list[concurrent.futures.ThreadPoolExecutor] = field(default_factory=list)

    def pool(self, workers: int, name: str = "") -> concurrent.futures.ThreadPoolExecutor:
        """A thread pool whose every thread runs inside this namespace (shut down with the network)."""
        pool = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix=name or f"ns-{self.label}", initializer=enter, initargs=(self.namespace,)
        )
        self._pools.append(pool)
        return pool

    @property
    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """This namespace's control thread (four workers): for the harness's own looks at its servers."""
        if self._executor is None:
            self._executor = self.pool(4, f"ns-{self.label}-control")
        return self._executor

    def call(self, fn: Callable[[], T], timeout: float = 60.0) -> T:
        """Run ``fn`` on a thread inside this namespace and return what it returns."""
        return self.executor.submit(fn).result(timeout)

    def loop_thread(self) -> LoopThread:
        """A new event loop running on a thread inside this namespace (stopped with the network)."""
        loop = LoopThread(self.namespace, f"ns-{self.label}-loop")
        self._loops.append(loop)
        return loop

    def spawn(self, args: Iterable[str], directory: Path) -> Process:
        """Start ``args`` inside this namespace (``ip netns exec``); its PID is the program's own."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started = Process(self.label, process, directory)
        self.processes.append(started)
        return started

    def close(self) -> None:
        """Stop its processes by PID, its loops and its threads."""
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.stop()
        for loop in self._loops:
            loop.close()
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)


class LoopThread:
    """An asyncio event loop on a thread of its own, inside a namespace."""

    def __init__(self, namespace: str, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._entered = concurrent.futures.Future[None]()
        self._namespace = namespace
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._entered.result(10)

    def _main(self) -> None:
        try:
            enter(self._namespace)
        except BaseException as exc:
            self._entered.set_exception(exc)
            return
        self._entered.set_result(None)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop; wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and its thread."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.loop.is_running():
            with contextlib.suppress(Exception):
                self.loop.close()


class Network:
    """One run's namespaces on one bridge, and the cuts between them (see the module's docstring)."""

    def __init__(self) -> None:
        self.run_id = f"{random.SystemRandom().getrandbits(16):04x}"
        self.prefix = f"{PREFIX}{self.run_id}"
        self.subnet = random.SystemRandom().randrange(64, 250)  # 127.0.<subnet>.x/24
        self.bridge = f"{self.prefix}br"
        self.table = f"{self.prefix}cut"
        self.nodes: dict[str, Node] = {}
        self.rules: list[str] = []
        self._lock = threading.Lock()

    # -- making it

    def open(self) -> None:
        """Make the bridge and the run's (empty) nft table."""
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.prefix).write_text(str(os.getpid()))
        run_cmd("ip", "link", "add", self.bridge, "type", "bridge")
        run_cmd("ip", "link", "set", self.bridge, "up")
        run_cmd(
            "nft",
            "-f",
            "-",
            input_text=(
                f"table bridge {self.table} {{\n"
                "  chain forward { type filter hook forward priority 0; policy accept; }\n"
                "}\n"
            ),
        )

    def add(self, label: str) -> Node:
        """A new namespace on the bridge, with lo up and the next address of the run's /24."""
        index = len(self.nodes) + 1
        namespace = f"{self.prefix}-{label}"
        address = f"127.0.{self.subnet}.{index + 1}"
        outer, inner = f"{self.prefix}v{index}", f"{self.prefix}i{index}"
        node = Node(self, label, namespace, address)
        self.nodes[label] = node
        run_cmd("ip", "netns", "add", namespace)
        run_cmd("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run_cmd("ip", "link", "set", outer, "master", self.bridge, "up")
        run_cmd("ip", "link", "set", inner, "netns", namespace)
        inside = ("ip", "netns", "exec", namespace)
        run_cmd(*inside, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1")
        run_cmd(*inside, "sysctl", "-q", "-w", f"net.ipv4.conf.{inner}.route_localnet=1")
        run_cmd(*inside, "ip", "link", "set", "lo", "up")
        # The kernel's local 127.0.0.0/8 route on lo would take the peers' addresses: keep 127.0.0.1 only.
        run_cmd(*inside, "ip", "route", "del", "table", "local", "local", "127.0.0.0/8", "dev", "lo")
        run_cmd(*inside, "ip", "route", "replace", "table", "local", "local", LOCALHOST, "dev", "lo", "scope", "host")
        run_cmd(*inside, "ip", "addr", "add", f"{address}/24", "dev", inner)
        run_cmd(*inside, "ip", "link", "set", inner, "up")
        return node

    def close(self) -> None:
        """Stop every process and thread by PID and object, then delete the table, the namespaces and the bridge."""
        for node in self.nodes.values():
            node.close()
        run_cmd("nft", "delete", "table", "bridge", self.table, check=False)
        for node in self.nodes.values():
            for pid in run_cmd("ip", "netns", "pids", node.namespace, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)  # a child a server left (none expected)
            run_cmd("ip", "netns", "del", node.namespace, check=False)
        run_cmd("ip", "link", "del", self.bridge, check=False)
        (OWNERS / self.prefix).unlink(missing_ok=True)
        sweep(self.prefix)

    # -- cutting it

    def _addresses(self, nodes: Iterable[Node | str]) -> str:
        found = [node.address if isinstance(node, Node) else self.nodes[node].address for node in nodes]
        return "{ " + ", ".join(found) + " }"

    def _add_rule(self, rule: str) -> None:
        run_cmd("nft", "add", "rule", "bridge", self.table, "forward", *rule.split())
        self.rules.append(rule)

    def cut_one_way(self, senders: Iterable[Node | str], receivers: Iterable[Node | str]) -> None:
        """Drop every packet ``senders`` send to ``receivers``; the other direction passes."""
        with self._lock:
            self._add_rule(f"ip saddr {self._addresses(senders)} ip daddr {self._addresses(receivers)} drop")

    def cut(self, group_a: Iterable[Node | str], group_b: Iterable[Node | str]) -> None:
        """Drop every packet between ``group_a`` and ``group_b``, both ways."""
        a, b = list(group_a), list(group_b)
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def isolate(self, node: Node | str) -> None:
        """Cut ``node`` from every other node, both ways."""
        label = node.label if isinstance(node, Node) else node
        self.cut([label], [other for other in self.nodes if other != label])

    def heal(self) -> None:
        """Remove every cut."""
        with self._lock:
            run_cmd("nft", "flush", "chain", "bridge", self.table, "forward")
            self.rules.clear()

    def cuts(self) -> str:
        """The table's rules as nft lists them (for a failure's message)."""
        return run_cmd("nft", "list", "table", "bridge", self.table, check=False).stdout


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A run's network: leftovers of crashed runs swept first; everything removed when the block ends."""
    sweep()
    net = Network()
    try:
        net.open()
        yield net
    finally:
        net.close()
