"""A loopback TCP proxy that loses, holds back or cuts Redis traffic on cue, for the fault tests.

``FaultProxy`` forwards one free loopback port to one redis-server. It reads the
byte streams just enough to know where each request and each reply ends (RESP2
and RESP3), so a fault hits exactly one command:

- ``lose_next_reply``: the server ran the command; its reply is swallowed and the
  connection closed, so redis-py's default ``Retry`` re-sends the command on a new
  connection (a lost reply, re-sent).
- ``hold_next_reply``: the reply is held back until the client gives up (its
  ``socket_timeout`` fires and it closes the connection), then dropped.
- ``drop_before``: the connection is cut before the request reaches the server.

Faults and the log of forwarded requests live in a ``Faults`` object, which
several proxies may share (one proxy per cluster node). Everything runs in the
proxy's own threads, so sync and asyncio clients use it alike. Standard library only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from tests.support.servers import HOST, free_port

__all__ = [
    "SET_IFEQ", "SET_NX_GET", "FaultProxy", "Faults", "ProtocolError", "parse_request", "proxy_nodes", "reply_end",
]  # fmt: skip

Action = Literal["pass", "lose", "hold", "drop"]

# The SDK's claim and store by the server's own commands, as a request's bytes show them
# (with the record's key beside them, to match one command): ``SET key token NX GET EX
# lease`` and ``SET key "done <token> <value>" IFEQ token EX ttl``.
SET_NX_GET = b"$2\r\nNX\r\n$3\r\nGET\r\n"
SET_IFEQ = b"$4\r\nIFEQ\r\n"
Remap = Callable[[tuple[str, int]], tuple[str, int]]


class ProtocolError(Exception):
    """Bytes that are not RESP."""


# --------------------------------------------------------------------------- RESP framing


def parse_request(buffer: bytes | bytearray, start: int = 0) -> tuple[int, list[bytes]] | None:
    """The request at ``buffer[start:]``: ``(offset past its end, arguments)``, or ``None`` while incomplete.

    Clients send each command as an array of bulk strings; an inline command (a
    bare line) is split on whitespace, as the server does.
    """
    if start >= len(buffer):
        return None
    line_end = buffer.find(b"\r\n", start)
    if buffer[start] != ord("*"):
        newline = buffer.find(b"\n", start)
        if newline < 0:
            return None
        return newline + 1, bytes(buffer[start:newline]).split()
    if line_end < 0:
        return None
    count = _length(buffer, start, line_end)
    pos, args = line_end + 2, []
    for _ in range(count):
        if pos >= len(buffer):
            return None
        if buffer[pos] != ord("$"):
            raise ProtocolError(f"expected a bulk string in a request, got {bytes(buffer[pos : pos + 20])!r}")
        line_end = buffer.find(b"\r\n", pos)
        if line_end < 0:
            return None
        data = line_end + 2
        end = data + _length(buffer, pos, line_end)
        if end + 2 > len(buffer):
            return None
        args.append(bytes(buffer[data:end]))
        pos = end + 2
    return pos, args


_LINE_TYPES = frozenset(b"+-:_,#(")  # simple string, error, integer, null, double, boolean, big number
_BULK_TYPES = frozenset(b"$!=")  # bulk string, bulk error, verbatim string
_ARRAY_TYPES = frozenset(b"*~>")  # array, set, push: N values
_PAIR_TYPES = frozenset(b"%|")  # map, attribute: N key/value pairs


def reply_end(buffer: bytes | bytearray, start: int = 0) -> int | None:
    """The offset just past the reply that starts at ``buffer[start]``, or ``None`` while incomplete.

    Knows every RESP2 and RESP3 type. An attribute (``|``) is not a reply of its
    own: it belongs to the value after it, so that value is included.
    """
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return None
    kind, after = buffer[start], line_end + 2
    if kind in _LINE_TYPES:
        return after
    if kind not in _BULK_TYPES and kind not in _ARRAY_TYPES and kind not in _PAIR_TYPES:
        raise ProtocolError(f"unknown RESP type {bytes(buffer[start : start + 20])!r}")
    size = _length(buffer, start, line_end)
    if kind in _BULK_TYPES:
        if size < 0:  # RESP2 null bulk string
            return after
        end = after + size + 2
        return end if end <= len(buffer) else None
    pos: int | None = after
    for _ in range(size * 2 if kind in _PAIR_TYPES else max(size, 0)):  # max: RESP2 null array *-1
        assert pos is not None
        pos = reply_end(buffer, pos)
        if pos is None:
            return None
    if kind == ord("|"):
        assert pos is not None
        return reply_end(buffer, pos)
    return pos


def _length(buffer: bytes | bytearray, start: int, line_end: int) -> int:
    try:
        return int(buffer[start + 1 : line_end])
    except ValueError:
        raise ProtocolError(f"bad length line {bytes(buffer[start:line_end])!r}") from None


# --------------------------------------------------------------------------- faults


@dataclass
class _Rule:
    parts: tuple[bytes, ...]
    action: Action
    remaining: int | None  # None: every matching request

    def matches(self, request: bytes) -> bool:
        return all(part in request for part in self.parts)


class Faults:
    """The faults armed on one or more proxies, and the log of what passed them. Thread-safe.

    A request "contains" ``match`` when every given byte string occurs in its raw
    RESP bytes (a command name, a key, a script SHA, a value...). The first armed
    rule that matches a request applies to it; a rule fires ``times`` times
    (``None``: on every match).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._forwarded: list[bytes] = []
        self._dropped: list[bytes] = []
        self._lost: list[bytes] = []

    def lose_next_reply(self, *match: bytes, times: int | None = 1) -> None:
        """Let the next request containing ``match`` run, swallow its reply and close the connection."""
        self._arm(match, "lose", times)

    def hold_next_reply(self, *match: bytes, times: int | None = 1) -> None:
        """Let the next request containing ``match`` run, and hold its reply until the client hangs up."""
        self._arm(match, "hold", times)

    def drop_before(self, *match: bytes, times: int | None = 1) -> None:
        """Cut the connection when a request containing ``match`` arrives: the server never sees it."""
        self._arm(match, "drop", times)

    def clear(self) -> None:
        """Disarm every rule (the log is kept)."""
        with self._lock:
            self._rules.clear()

    def armed(self) -> int:
        """How many rules have not fired yet (``times=None`` rules always count)."""
        with self._lock:
            return len(self._rules)

    def count(self, *match: bytes) -> int:
        """How many requests containing ``match`` reached the server."""
        return self._count(self._forwarded, match)

    def dropped(self, *match: bytes) -> int:
        """How many requests containing ``match`` were cut before the server."""
        return self._count(self._dropped, match)

    def lost(self, *match: bytes) -> int:
        """How many replies to requests containing ``match`` were lost or held back."""
        return self._count(self._lost, match)

    def on_request(self, request: bytes) -> Action:
        """What the proxy does with one complete request (and log it)."""
        with self._lock:
            action: Action = "pass"
            for rule in self._rules:
                if rule.matches(request):
                    action = rule.action
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining == 0:
                            self._rules.remove(rule)
                    break
            (self._dropped if action == "drop" else self._forwarded).append(request)
            if action in ("lose", "hold"):
                self._lost.append(request)
            return action

    def _arm(self, match: tuple[bytes, ...], action: Action, times: int | None) -> None:
        if not match or not all(isinstance(part, bytes) and part for part in match):
            raise ValueError(f"match must be one or more non-empty bytes, not {match!r}")
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None, not {times!r}")
        with self._lock:
            self._rules.append(_Rule(match, action, times))

    def _count(self, log: list[bytes], match: tuple[bytes, ...]) -> int:
        with self._lock:
            return sum(all(part in request for part in match) for request in log)


# --------------------------------------------------------------------------- the proxy


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        # One entry per forwarded request, in order: what to do with its reply.
        self.pending: deque[Action] = deque()
        self.lock = threading.Lock()
        self.client_gone = threading.Event()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.client_gone.set()  # a held reply stops waiting: nobody is left to hear it
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.proxy._forget(self)

    def requests(self) -> None:
        """Client to server: forward whole requests, applying the faults to each."""
        buffer = bytearray()
        try:
            while data := self.client.recv(65536):
                buffer += data
                out, pos = bytearray(), 0
                while (parsed := parse_request(buffer, pos)) is not None:
                    end = parsed[0]
                    request = bytes(buffer[pos:end])
                    action = self.proxy.faults.on_request(request)
                    if action == "drop":
                        if out:
                            self.server.sendall(out)
                        return
                    with self.lock:
                        self.pending.append(action)
                    out += request
                    pos = end
                del buffer[:pos]
                if out:
                    self.server.sendall(out)
        except (OSError, ProtocolError):
            pass
        finally:
            self.client_gone.set()
            self.close()

    def replies(self) -> None:
        """Server to client: forward whole replies, swallowing or holding the marked ones."""
        buffer = bytearray()
        try:
            while data := self.server.recv(65536):
                buffer += data
                out, pos = bytearray(), 0
                while (end := reply_end(buffer, pos)) is not None:
                    action: Action = "pass"
                    if buffer[pos] != ord(">"):  # a push message answers no request
                        with self.lock:
                            action = self.pending.popleft() if self.pending else "pass"
                    if action != "pass":
                        if out:
                            self.client.sendall(out)
                        if action == "hold":
                            self.client_gone.wait(self.proxy.hold_limit)
                        return
                    out += buffer[pos:end]
                    pos = end
                del buffer[:pos]
                if out:
                    self.client.sendall(out)
        except (OSError, ProtocolError):
            pass
        finally:
            self.close()


class FaultProxy:
    """Forwards a free loopback port to one redis-server, applying ``faults`` to the traffic.

    Args:
        upstream_port: The redis-server's port (on ``upstream_host``).
        faults: The rules and log to use; a fresh ``Faults`` if left out. Share one
            between the proxies of a cluster's nodes.
        upstream_host: The redis-server's address.
        hold_limit: Seconds a held reply waits for the client to hang up before the
            proxy closes the connection itself.

    Example::

        with FaultProxy(server.port) as proxy:
            client = redis.Redis(port=proxy.port)
            proxy.faults.lose_next_reply(b"INCR")
            client.incr("n")  # runs twice: the lost reply is re-sent by redis-py
    """

    def __init__(
        self, upstream_port: int, faults: Faults | None = None, upstream_host: str = HOST, hold_limit: float = 30.0
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.faults = faults if faults is not None else Faults()
        self.hold_limit = hold_limit
        self.port = 0
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> FaultProxy:
        """Listen on a free loopback port and start forwarding."""
        last: OSError | None = None
        for _ in range(5):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.bind((HOST, free_port()))
            except OSError as exc:  # taken between free_port() and bind(): try another
                listener.close()
                last = exc
                continue
            listener.listen(128)
            listener.settimeout(0.05)  # accept() polls, so stop() never waits on a blocked accept
            self._listener, self.port = listener, int(listener.getsockname()[1])
            self._acceptor = threading.Thread(target=self._accept, name=f"proxy :{self.port} accept", daemon=True)
            self._acceptor.start()
            return self
        raise RuntimeError(f"no free port for the proxy: {last}")

    def stop(self) -> None:
        """Stop accepting, close every connection and wait for the proxy's threads."""
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(5)
        if self._listener is not None:
            self._listener.close()
        self.cut_all()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)

    def cut_all(self) -> int:
        """Close every live connection (both sides); returns how many there were."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        return len(links)

    def connections(self) -> int:
        """How many client connections are open."""
        with self._lock:
            return len(self._links)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:  # the server is down: the client sees its connection closed
                client.close()
                continue
            server.settimeout(None)
            for sock in (client, server):
                # Without it, Nagle and delayed ACKs add ~40 ms to each small reply.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            pumps = [
                threading.Thread(target=link.requests, name=f"proxy :{self.port} requests", daemon=True),
                threading.Thread(target=link.replies, name=f"proxy :{self.port} replies", daemon=True),
            ]
            with self._lock:
                stopping = self._stopping.is_set()
                if not stopping:
                    self._links.add(link)
                    self._threads = [t for t in self._threads if t.is_alive()] + pumps
            if stopping:
                # Outside the lock: closing a link takes it (_forget), and stop() waits on it.
                link.close()
                return
            for pump in pumps:
                pump.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)


@contextlib.contextmanager
def proxy_nodes(
    ports: list[int], faults: Faults
) -> Iterator[tuple[list[FaultProxy], Callable[[tuple[str, int]], tuple[str, int]]]]:
    """One proxy per cluster node, sharing ``faults``, and the ``address_remap`` that routes through them.

    Give the remap to ``RedisCluster(address_remap=...)``: every node address the
    cluster reports (its real port) becomes the address of that node's proxy.
    """
    proxies: list[FaultProxy] = []
    try:
        for port in ports:
            proxies.append(FaultProxy(port, faults).start())
        by_port = {port: proxy.port for port, proxy in zip(ports, proxies, strict=True)}

        def remap(address: tuple[str, int]) -> tuple[str, int]:
            host, port = address
            return (HOST, by_port[port]) if port in by_port else (host, port)

        yield proxies, remap
    finally:
        for proxy in proxies:
            proxy.stop()
