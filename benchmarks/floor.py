"""The duplicate path against the bare-socket floor, side by side on one redis-server in one run.

The floor is what a duplicate cannot go below from Python: a pre-encoded
``EVALSHA <claim sha> 2 <claim_key> <result_key> <token> <lease>`` written to a
bare blocking socket, its reply read until it is one complete RESP reply (the
server's work plus loopback plus two system calls). For asyncio, 50 tasks each
write pre-encoded commands to their own ``asyncio.open_connection`` stream, timed
as throughput. Against it, on the same completed key:

- ``Claim.acquire`` (one connection pool) and ``AsyncClaim.acquire`` (50 tasks,
  ``BlockingConnectionPool`` of 50);
- an ``@idempotent`` duplicate, sync and asyncio (50 tasks);
- raw redis-py ``execute_command("EVALSHA", ...)``, sync and asyncio;
- ``@idempotent(keep_alive=False)`` beside it: what registering the renewal costs;
- the SDK's own CPU per duplicate, with the transport stubbed: the driver's one
  send (``_sync._send``, ``_async._send``) replaced by a function that answers the
  reply recorded from the server, for ``Claim.acquire`` and ``@idempotent``; once
  in a hot loop, and once with each call timed alone right after a bare round
  trip (its caches cold, as it runs in place).

Then a breakdown of what stands between ``Claim.acquire`` and the floor: a
ladder of steps timed in the same rounds (a held redis-py connection sending
pre-packed bytes, plus the pool, plus packing, the SDK's ``send_direct``, then
``acquire`` on one handle and on a new one), and the CPU of each piece timed
alone, without I/O.

Rounds interleave every contender of a group (rotating who goes first); the
tables give each one's median µs per call and the median of its per-round ratios
to the floor of the same round, beside the targets, met or not as measured.
Machines here are noisy: read the ratios, and trust a run only when the floor's
rounds agree (the script says when they spread: a loaded machine slows the
floor's wake-ups more than anyone's CPU, which flatters every ratio). Starts a
redis-server on a free port (or uses REDIS_URL) and stops it afterwards.

    python benchmarks/floor.py [--rounds 7] [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis
import redis.asyncio
import redis.connection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import LEASE, TASKS, server_url

import goblin_claim._drivers.aio as async_driver
import goblin_claim._drivers.sync as sync_driver
from goblin_claim import AsyncClaim, Claim, Completed, idempotent
from goblin_claim._clients.transport import pack, run_meanwhile, send_direct, send_direct_async, state_of
from goblin_claim._protocol.record import new_token
from goblin_claim._protocol.scripts import CLAIM

RESULT = b'{"status":"charged"}'
NAMESPACE = "bench-floor"

# Targets of the issue: at most this many times the floor, or (own CPU) Claim.acquire's.
TARGETS = {
    ("sync", "Claim.acquire"): 2.0,
    ("sync", "@idempotent"): 2.5,
    ("asyncio", "AsyncClaim.acquire"): 2.0,
    ("asyncio", "@idempotent"): 2.5,
}
OWN_CPU_TARGET = 2.0


@dataclass
class Contender:
    """One way of answering the duplicate; ``run(n)`` makes about n calls and returns µs per call."""

    name: str
    run: Callable[[int], float]
    us: list[float] = field(default_factory=list)


# --------------------------------------------------------------------------- RESP on a bare socket


def reply_end(buf: bytes, pos: int = 0) -> int:
    """Where the RESP2 reply starting at ``pos`` ends, or -1 while it is incomplete."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return -1
    kind = buf[pos]
    if kind in b"+-:":
        return line_end + 2
    count = int(buf[pos + 1 : line_end])
    if kind == ord("$"):
        end = line_end + 2 if count < 0 else line_end + 4 + count
        return end if len(buf) >= end else -1
    if kind == ord("*"):
        pos = line_end + 2
        for _ in range(max(count, 0)):
            pos = reply_end(buf, pos)
            if pos < 0:
                return -1
        return pos
    raise ValueError(f"not a RESP2 reply: {buf[pos:line_end]!r}")


def encode(*args: str | bytes | int) -> bytes:
    """One command in RESP, encoded once, outside every timing."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def round_trip(sock: socket.socket, packed: bytes) -> bytes:
    """Send ``packed``, read until one complete reply."""
    sock.sendall(packed)
    data = sock.recv(65536)
    while reply_end(data) < 0:
        data += sock.recv(65536)
    return data


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    """One complete RESP2 reply from ``reader``."""
    line = await reader.readuntil(b"\r\n")
    kind = line[0]
    if kind in b"+-:":
        return line
    count = int(line[1:-2])
    if kind == ord("$"):
        return line if count < 0 else line + await reader.readexactly(count + 2)
    if kind == ord("*"):
        parts = [line]
        for _ in range(max(count, 0)):
            parts.append(await read_reply(reader))
        return b"".join(parts)
    raise ValueError(f"not a RESP2 reply: {line!r}")


# --------------------------------------------------------------------------- the contenders


def charge(order: dict[str, Any]) -> dict[str, Any]:
    """The decorated function of benchmarks/peers.py: a three-field result."""
    return {"order_id": order["order_id"], "amount": order["amount"], "status": "charged"}


async def charge_async(order: dict[str, Any]) -> dict[str, Any]:
    """``charge``'s asyncio twin."""
    return {"order_id": order["order_id"], "amount": order["amount"], "status": "charged"}


class Stub:
    """The driver's one send (``_sync._send``) answered from a recorded reply, for the SDK's own CPU."""

    def __init__(self) -> None:
        self.real = sync_driver._send

    def record(self, action: Callable[[], object]) -> object:
        """Run ``action`` against the server; the one reply its one send got (checked to be one)."""
        replies: list[object] = []

        def recording(*args: Any, **kwargs: Any) -> object:
            reply = self.real(*args, **kwargs)
            replies.append(reply)
            return reply

        sync_driver._send = recording
        try:
            action()
        finally:
            sync_driver._send = self.real
        if len(replies) != 1:
            raise SystemExit(f"expected one round trip on a duplicate, saw {len(replies)}")
        return replies[0]

    @contextlib.contextmanager
    def answering(self, reply: object) -> Iterator[None]:
        """Within the block, every send answers ``reply`` without I/O (counting the send, as the real one)."""

        def answer(client: Any, pool: Any, command: Any, meanwhile: Any = None, sends: Any = None) -> object:
            if sends is not None:
                sends.count += 1
            run_meanwhile(meanwhile)
            return reply

        sync_driver._send = answer
        try:
            yield
        finally:
            sync_driver._send = self.real

    def timed(self, reply: object, action: Callable[[], object]) -> Callable[[int], float]:
        """``action`` n times with the send answering ``reply``: µs per call."""

        def run(n: int) -> float:
            with self.answering(reply):
                started = time.perf_counter()
                for _ in range(n):
                    action()
                return (time.perf_counter() - started) / n * 1e6

        return run


class AsyncStub:
    """``Stub`` for ``AsyncClaim``: the asyncio driver's one send (``_async._send``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.real = async_driver._send
        self.loop = loop

    def record(self, action: Callable[[], Awaitable[object]]) -> object:
        """Run ``action`` against the server; the one reply its one send got (checked to be one)."""
        replies: list[object] = []

        async def recording(*args: Any, **kwargs: Any) -> object:
            reply = await self.real(*args, **kwargs)
            replies.append(reply)
            return reply

        async_driver._send = recording
        try:
            self.loop.run_until_complete(action())
        finally:
            async_driver._send = self.real
        if len(replies) != 1:
            raise SystemExit(f"expected one round trip on an asyncio duplicate, saw {len(replies)}")
        return replies[0]

    def timed(self, reply: object, action: Callable[[], Awaitable[object]]) -> Callable[[int], float]:
        """``action`` awaited n times in one task, the send answering ``reply``: µs per call."""

        async def answer(client: Any, pool: Any, command: Any, meanwhile: Any = None, sends: Any = None) -> object:
            if sends is not None:
                sends.count += 1
            run_meanwhile(meanwhile)
            return reply

        async def calls(n: int) -> None:
            for _ in range(n):
                await action()

        def run(n: int) -> float:
            async_driver._send = answer
            try:
                started = time.perf_counter()
                self.loop.run_until_complete(calls(n))
                return (time.perf_counter() - started) / n * 1e6
            finally:
                async_driver._send = self.real

        return run


def repeat(action: Callable[[], object]) -> Callable[[int], float]:
    def run(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            action()
        return (time.perf_counter() - started) / n * 1e6

    return run


def tasks(loop: asyncio.AbstractEventLoop, body: Callable[[int], Awaitable[None]]) -> Callable[[int], float]:
    """``TASKS`` tasks each running ``body(i)`` (task i, n // TASKS calls): µs per call, from throughput."""

    def run(n: int) -> float:
        per_task = max(1, n // TASKS)

        async def all_tasks() -> None:
            await asyncio.gather(*(body_of(i, per_task) for i in range(TASKS)))

        async def body_of(i: int, count: int) -> None:
            for _ in range(count):
                await body(i)

        started = time.perf_counter()
        loop.run_until_complete(all_tasks())
        return (time.perf_counter() - started) / (per_task * TASKS) * 1e6

    return run


@dataclass
class Setup:
    """Clients, keys and the pre-encoded floor command, made once."""

    url: str
    client: redis.Redis
    async_client: redis.asyncio.Redis
    loop: asyncio.AbstractEventLoop
    key: str
    command: tuple[str | int, ...]
    packed: bytes
    expected: bytes
    sock: socket.socket
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    order: dict[str, Any]
    deco: Callable[[dict[str, Any]], Any]
    deco_async: Callable[[dict[str, Any]], Awaitable[Any]]
    # The same without keep_alive: what registering the renewal costs a duplicate.
    deco_nk: Callable[[dict[str, Any]], Any]
    deco_nk_async: Callable[[dict[str, Any]], Awaitable[Any]]
    async_key: str
    async_order: dict[str, Any]
    closers: list[Callable[[], object]] = field(default_factory=list)
    profiles: list[tuple[str, Callable[[], object], contextlib.AbstractContextManager[None]]] = field(
        default_factory=list
    )


def prepare(url: str) -> Setup:
    client = redis.Redis.from_url(url)
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=TASKS)
    async_client = redis.asyncio.Redis.from_pool(pool)
    loop = asyncio.new_event_loop()
    run_id = time.time_ns()

    key = f"done-{run_id}"
    done = Claim(client, key, lease=LEASE, namespace=NAMESPACE)
    done.acquire()
    done.complete(RESULT)
    token = new_token()  # the length the SDK's own tokens have
    command = ("EVALSHA", CLAIM.sha, 2, done.claim_key, done.result_key, token, LEASE)
    packed = encode(*command)
    stored = client.get(done.result_key)  # the record: the token that completed it, and the value
    expected = b"$%d\r\n%s\r\n" % (len(stored), stored)

    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as redis-py sets it
    if round_trip(sock, packed) != expected:
        raise SystemExit("the floor's EVALSHA did not answer the stored value")

    order = {"order_id": f"order-{run_id}", "amount": 5}
    deco = idempotent(client, key=lambda order: order["order_id"], namespace=f"{NAMESPACE}-deco")(charge)
    deco(order)
    deco_nk = idempotent(
        client, key=lambda order: order["order_id"], namespace=f"{NAMESPACE}-deco-nk", keep_alive=False
    )(charge)
    deco_nk(order)
    deco_async = idempotent(async_client, key=lambda order: order["order_id"], namespace=f"{NAMESPACE}-adeco")(
        charge_async
    )
    deco_nk_async = idempotent(
        async_client, key=lambda order: order["order_id"], namespace=f"{NAMESPACE}-adeco-nk", keep_alive=False
    )(charge_async)
    async_order = {"order_id": f"aorder-{run_id}", "amount": 5}
    async_key = f"adone-{run_id}"

    async def async_prepare() -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        await deco_async(async_order)
        await deco_nk_async(async_order)
        claim = AsyncClaim(async_client, async_key, lease=LEASE, namespace=NAMESPACE)
        await claim.acquire()
        await claim.complete(RESULT)
        streams = []
        for _ in range(TASKS):
            reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            streams.append((reader, writer))
        return streams

    streams = loop.run_until_complete(async_prepare())
    return Setup(
        url,
        client,
        async_client,
        loop,
        key,
        command,
        packed,
        expected,
        sock,
        streams,
        order,
        deco,
        deco_async,
        deco_nk,
        deco_nk_async,
        async_key,
        async_order,
    )


def sync_contenders(s: Setup) -> list[Contender]:
    client, command, packed = s.client, s.command, s.packed
    pool = client.connection_pool
    held = pool.get_connection()  # a connection of its own, outside the pool, for the first rungs
    s.closers.append(held.disconnect)
    prepacked = pack(command, held.encoder)
    Claim(client, s.key, lease=LEASE, namespace=NAMESPACE).acquire()  # probe once, outside the timing
    direct = state_of(client).direct
    if direct is None:
        raise SystemExit("the SDK does not use its direct path on this client: the ladder would not apply")
    one_handle = Claim(client, s.key, lease=LEASE, namespace=NAMESPACE)
    if not isinstance(one_handle.acquire(), Completed):
        raise SystemExit("the duplicate key is not completed")
    stub = Stub()
    claim_reply = stub.record(lambda: Claim(client, s.key, lease=LEASE, namespace=NAMESPACE).acquire())
    deco_reply = stub.record(lambda: s.deco(s.order))

    def floor() -> object:
        return round_trip(s.sock, packed)

    def held_connection() -> object:
        held.send_packed_command(prepacked)
        return held.read_response()

    def with_pool() -> object:
        conn = pool.get_connection()
        try:
            conn.send_packed_command(prepacked)
            return conn.read_response()
        finally:
            pool.release(conn)

    def with_packing() -> object:
        conn = pool.get_connection()
        try:
            conn.send_packed_command(pack(command, conn.encoder))
            return conn.read_response()
        finally:
            pool.release(conn)

    return [
        Contender("floor (bare socket)", repeat(floor)),
        Contender("Claim.acquire", repeat(lambda: Claim(client, s.key, lease=LEASE, namespace=NAMESPACE).acquire())),
        Contender("@idempotent", repeat(lambda: s.deco(s.order))),
        Contender("@idempotent(keep_alive=False)", repeat(lambda: s.deco_nk(s.order))),
        Contender("redis-py execute_command EVALSHA", repeat(lambda: client.execute_command(*command))),
        # The ladder from the floor to Claim.acquire.
        Contender("held connection, pre-packed", repeat(held_connection)),
        Contender("+ pool get/release", repeat(with_pool)),
        Contender("+ packing", repeat(with_packing)),
        Contender("send_direct (+ Retry)", repeat(lambda: send_direct(direct, command))),
        Contender("Claim.acquire, one handle", repeat(one_handle.acquire)),
        # The stubbed SDK again, each call timed alone right after a bare round trip: its
        # CPU as it runs in place (caches cold after the wait), which the hot loop flatters.
        Contender(
            "stubbed Claim.acquire, after a round trip",
            behind(stub, claim_reply, floor, lambda: Claim(client, s.key, lease=LEASE, namespace=NAMESPACE).acquire()),
        ),
        Contender("stubbed @idempotent, after a round trip", behind(stub, deco_reply, floor, lambda: s.deco(s.order))),
    ]


def behind(
    stub: Stub, reply: object, wait: Callable[[], object], action: Callable[[], object]
) -> Callable[[int], float]:
    """``action`` with the send answering ``reply``, each call timed alone right after ``wait()``: µs per call."""

    def run(n: int) -> float:
        spent = 0.0
        with stub.answering(reply):
            for _ in range(n):
                wait()
                started = time.perf_counter()
                action()
                spent += time.perf_counter() - started
        return spent / n * 1e6

    return run


def async_contenders(s: Setup) -> list[Contender]:
    client, command, loop = s.async_client, s.command, s.loop
    handle = AsyncClaim(client, s.async_key, lease=LEASE, namespace=NAMESPACE)
    async_command = (*command[:3], handle.claim_key, handle.result_key, *command[5:])
    async_packed = encode(*async_command)
    # Its own record: the token that completed it differs from the sync key's.
    stored = loop.run_until_complete(client.get(handle.result_key))
    expected = b"$%d\r\n%s\r\n" % (len(stored), stored)

    async def floor(i: int) -> None:
        reader, writer = s.streams[i]
        writer.write(async_packed)
        if await read_reply(reader) != expected:
            raise SystemExit("the asyncio floor's EVALSHA did not answer the stored value")

    async def sdk(i: int) -> None:
        await AsyncClaim(client, s.async_key, lease=LEASE, namespace=NAMESPACE).acquire()

    async def deco(i: int) -> None:
        await s.deco_async(s.async_order)

    async def deco_nk(i: int) -> None:
        await s.deco_nk_async(s.async_order)

    async def raw(i: int) -> None:
        await client.execute_command(*async_command)

    # The ladder: each task's own connection (from a second pool, held), then the client's pool.
    pool = client.connection_pool
    spare = redis.asyncio.BlockingConnectionPool.from_url(s.url, max_connections=TASKS)

    async def take() -> list[Any]:
        await AsyncClaim(client, s.async_key, namespace=NAMESPACE).acquire()  # probe once, outside the timing
        return [await spare.get_connection() for _ in range(TASKS)]

    held = loop.run_until_complete(take())
    s.closers.append(lambda: loop.run_until_complete(spare.disconnect()))
    prepacked = pack(async_command, held[0].encoder)
    direct = state_of(client).direct
    if direct is None:
        raise SystemExit("the SDK does not use its direct path on this client: the ladder would not apply")

    async def held_connection(i: int) -> None:
        conn = held[i]
        await conn.send_packed_command(prepacked)
        await conn.read_response()

    async def with_pool(i: int) -> None:
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(prepacked)
            await conn.read_response()
        finally:
            await pool.release(conn)

    async def with_packing(i: int) -> None:
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(pack(async_command, conn.encoder))
            await conn.read_response()
        finally:
            await pool.release(conn)

    async def transport(i: int) -> None:
        await send_direct_async(direct, async_command)

    return [
        Contender("floor (bare sockets)", tasks(loop, floor)),
        Contender("AsyncClaim.acquire", tasks(loop, sdk)),
        Contender("@idempotent", tasks(loop, deco)),
        Contender("@idempotent(keep_alive=False)", tasks(loop, deco_nk)),
        Contender("redis-py execute_command EVALSHA", tasks(loop, raw)),
        Contender("held connection, pre-packed", tasks(loop, held_connection)),
        Contender("+ pool get/release", tasks(loop, with_pool)),
        Contender("+ packing", tasks(loop, with_packing)),
        Contender("send_direct_async (+ Retry)", tasks(loop, transport)),
    ]


def parse_pieces(reply: bytes) -> tuple[Callable[[], object], Callable[[], object]] | None:
    """redis-py's reader on a socket pair holding ``reply``, and the same pair read bare (its baseline).

    Reads through a connection object given the pair's socket: private to
    redis-py, so where that does not work this piece is left out.
    """
    ours, theirs = socket.socketpair()
    try:
        conn = redis.connection.Connection()
        conn._sock = theirs
        conn._parser.on_connect(conn)

        def parsed() -> object:
            ours.sendall(reply)
            return conn.read_response()

        def bare() -> object:
            ours.sendall(reply)
            return theirs.recv(65536)

        if parsed() != reply.split(b"\r\n")[1]:
            raise ValueError("unexpected parse")
    except Exception as exc:
        print(f"(reply parsing alone left out: {exc!r})")
        ours.close()
        theirs.close()
        return None
    return parsed, bare


def cpu_contenders(s: Setup) -> list[Contender]:
    client, key = s.client, s.key
    stub = Stub()
    claim_reply = stub.record(lambda: Claim(client, key, lease=LEASE, namespace=NAMESPACE).acquire())
    deco_reply = stub.record(lambda: s.deco(s.order))
    one_handle = Claim(client, key, lease=LEASE, namespace=NAMESPACE)
    pool = client.connection_pool
    encoder = pool.get_encoder()
    now = time.monotonic()

    def pool_cycle() -> None:
        pool.release(pool.get_connection())

    contenders = [
        Contender(
            "Claim.acquire, transport stubbed",
            stub.timed(claim_reply, lambda: Claim(client, key, lease=LEASE, namespace=NAMESPACE).acquire()),
        ),
        Contender("@idempotent, transport stubbed", stub.timed(deco_reply, lambda: s.deco(s.order))),
        Contender(
            "@idempotent(keep_alive=False), transport stubbed",
            stub.timed(stub.record(lambda: s.deco_nk(s.order)), lambda: s.deco_nk(s.order)),
        ),
        Contender("acquire() on one handle, stubbed", stub.timed(claim_reply, one_handle.acquire)),
        Contender("_acquire() (no event wrapper), stubbed", stub.timed(claim_reply, lambda: one_handle._acquire(None))),
        Contender("Claim(...) construction", repeat(lambda: Claim(client, key, lease=LEASE, namespace=NAMESPACE))),
        Contender(
            "_claim_outcome(reply)", repeat(lambda: one_handle._claim_outcome(claim_reply, None, sent_at=now, now=now))
        ),
        Contender("pool get_connection + release", repeat(pool_cycle)),
        Contender("pack(command)", repeat(lambda: pack(s.command, encoder))),
    ]
    s.profiles += [
        ("@idempotent duplicate, transport stubbed", lambda: s.deco(s.order), stub.answering(deco_reply)),
        (
            "Claim.acquire duplicate, transport stubbed",
            lambda: Claim(client, key, lease=LEASE, namespace=NAMESPACE).acquire(),
            stub.answering(claim_reply),
        ),
        ("redis-py pool get_connection + release", pool_cycle, contextlib.nullcontext()),
    ]
    astub = AsyncStub(s.loop)
    async_client = s.async_client

    def async_claim() -> Awaitable[object]:
        return AsyncClaim(async_client, s.async_key, lease=LEASE, namespace=NAMESPACE).acquire()

    def async_deco() -> Awaitable[object]:
        return s.deco_async(s.async_order)

    async_pool = async_client.connection_pool

    async def async_pool_cycle() -> None:
        await async_pool.release(await async_pool.get_connection())

    contenders += [
        Contender("AsyncClaim.acquire, transport stubbed", astub.timed(astub.record(async_claim), async_claim)),
        Contender("@idempotent (asyncio), transport stubbed", astub.timed(astub.record(async_deco), async_deco)),
        Contender("asyncio BlockingConnectionPool get + release, one task", astub.timed(None, async_pool_cycle)),
    ]
    pieces = parse_pieces(s.expected)
    if pieces is not None:
        parsed, bare = pieces
        contenders += [
            Contender("socket pair: send + redis-py read_response", repeat(parsed)),
            Contender("socket pair: send + bare recv", repeat(bare)),
        ]
    return contenders


def profiled(
    title: str, action: Callable[[], object], around: contextlib.AbstractContextManager[None], calls: int, top: int
) -> None:
    """Where ``action`` spends its own time under cProfile, by file and by function: where, not how much.

    cProfile's own cost per call inflates functions called often; read the order
    and the shares, and the unprofiled medians above for the totals.
    """
    profile = cProfile.Profile()
    with around:
        profile.enable()
        for _ in range(calls):
            action()
        profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # the raw table: (file, line, name) -> counts
    total = sum(entry[2] for entry in stats.values())
    by_file: dict[str, float] = {}
    for (filename, _line, name), entry in stats.items():
        where = name if filename == "~" else _short(filename)
        by_file[where] = by_file.get(where, 0.0) + entry[2]
    print(f"\n{title}: {total / calls * 1e6:.1f} µs per call under cProfile\n")
    print("| file (own time) | µs per call (profiled) | share |")
    print("|---|---|---|")
    for where, spent in sorted(by_file.items(), key=lambda item: item[1], reverse=True)[:top]:
        print(f"| {where} | {spent / calls * 1e6:.2f} | {spent / total:.0%} |")
    print("\n| function (own time) | µs per call (profiled) | share |")
    print("|---|---|---|")
    for (filename, line, name), entry in sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]:
        label = name if filename == "~" else f"{_short(filename)}:{line} {name}"
        print(f"| {label} | {entry[2] / calls * 1e6:.2f} | {entry[2] / total:.0%} |")


def _short(filename: str) -> str:
    """``package/module.py`` of a source path, for the profile tables."""
    path = Path(filename)
    return f"{path.parent.name}/{path.name}"


# --------------------------------------------------------------------------- measuring and reporting


def measure(groups: dict[str, list[Contender]], rounds: int, calls: dict[str, int]) -> None:
    for group, contenders in groups.items():
        for contender in contenders:  # warm up: connections open, caches filled
            contender.run(max(TASKS, calls[group] // 10))
    for round_ in range(rounds):
        for group, contenders in groups.items():
            shift = round_ % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                contender.us.append(contender.run(calls[group]))


def by_name(contenders: list[Contender]) -> dict[str, Contender]:
    return {c.name: c for c in contenders}


def ratios(mine: Contender, base: Contender) -> list[float]:
    return [a / b for a, b in zip(mine.us, base.us, strict=True)]


def differences(mine: Contender, base: Contender) -> list[float]:
    return [a - b for a, b in zip(mine.us, base.us, strict=True)]


def verdict(ratio: float, target: float) -> str:
    return f"<= {target:g}x: {'met' if ratio <= target else 'not met'}"


def report(groups: dict[str, list[Contender]]) -> list[str]:
    misses: list[str] = []
    print("\n## The duplicate path against the floor\n")
    print("| path | contender | µs per call (median) | x floor (median of rounds) | target |")
    print("|---|---|---|---|---|")
    main_rows = {
        "sync": [
            "floor (bare socket)",
            "Claim.acquire",
            "@idempotent",
            "@idempotent(keep_alive=False)",
            "redis-py execute_command EVALSHA",
        ],
        "asyncio": [
            "floor (bare sockets)",
            "AsyncClaim.acquire",
            "@idempotent",
            "@idempotent(keep_alive=False)",
            "redis-py execute_command EVALSHA",
        ],
    }
    for group, names in main_rows.items():
        table = by_name(groups[group])
        base = table[names[0]]
        label = group if group == "sync" else f"asyncio, {TASKS} tasks"
        for name in names:
            contender = table[name]
            ratio = statistics.median(ratios(contender, base))
            target = TARGETS.get((group, name))
            mark = "" if target is None else verdict(ratio, target)
            if target is not None and ratio > target:
                misses.append(f"{label} {name}: {ratio:.2f}x floor > {target:g}x")
            print(f"| {label} | {name} | {statistics.median(contender.us):.1f} | {ratio:.2f} | {mark} |")

    for group, names in main_rows.items():
        floor_us = by_name(groups[group])[names[0]].us
        spread = max(floor_us) / min(floor_us)
        print(
            f"\n{group} floor per round: {', '.join(f'{x:.1f}' for x in floor_us)} µs"
            + (f"  (max/min {spread:.2f}: a loaded machine, read these ratios with care)" if spread > 1.3 else "")
        )

    cpu = by_name(groups["cpu"])
    claim, deco = cpu["Claim.acquire, transport stubbed"], cpu["@idempotent, transport stubbed"]
    own = statistics.median(ratios(deco, claim))
    print("\n## The SDK's own CPU per duplicate (transport stubbed)\n")
    print("| contender | µs per call (median) |")
    print("|---|---|")
    print(f"| Claim.acquire | {statistics.median(claim.us):.2f} |")
    print(f"| @idempotent | {statistics.median(deco.us):.2f} |")
    deco_nk = cpu["@idempotent(keep_alive=False), transport stubbed"]
    print(f"| @idempotent(keep_alive=False) | {statistics.median(deco_nk.us):.2f} |")
    print(f"\n@idempotent / Claim.acquire own CPU: {own:.2f}x (target {verdict(own, OWN_CPU_TARGET)})")
    if own > OWN_CPU_TARGET:
        misses.append(f"own CPU @idempotent / Claim.acquire: {own:.2f}x > {OWN_CPU_TARGET:g}x")
    aclaim, adeco = cpu["AsyncClaim.acquire, transport stubbed"], cpu["@idempotent (asyncio), transport stubbed"]
    aown = statistics.median(ratios(adeco, aclaim))
    sync = by_name(groups["sync"])
    cold_claim, cold_deco = (
        sync["stubbed Claim.acquire, after a round trip"],
        sync["stubbed @idempotent, after a round trip"],
    )
    print(
        f"each call timed alone after a bare round trip (caches cold, as in place): Claim.acquire "
        f"{statistics.median(cold_claim.us):.2f} µs, @idempotent {statistics.median(cold_deco.us):.2f} µs: "
        f"{statistics.median(ratios(cold_deco, cold_claim)):.2f}x"
    )
    print(
        f"asyncio (one task): AsyncClaim.acquire {statistics.median(aclaim.us):.2f} µs, "
        f"@idempotent {statistics.median(adeco.us):.2f} µs: {aown:.2f}x (the target is set for sync; shown beside it)"
    )

    sync_ladder = [
        ("floor (bare socket)", "server + loopback + two system calls"),
        ("held connection, pre-packed", "redis-py's send and its reading/parsing of the reply"),
        ("+ pool get/release", "taking a connection from the pool and giving it back"),
        ("+ packing", "packing the command (the SDK's pack)"),
        ("send_direct (+ Retry)", "the SDK's transport: Retry wrapper, closures, maintenance check"),
        ("Claim.acquire, one handle", "acquire() itself: events wrapper, state, key choice, outcome"),
        ("Claim.acquire", "a new handle per call (validation, keys, token)"),
    ]
    async_ladder = [
        ("floor (bare sockets)", "server + loopback + the event loop's streams"),
        ("held connection, pre-packed", "redis-py's asyncio send and its reading/parsing of the reply"),
        ("+ pool get/release", "BlockingConnectionPool: taking a connection and giving it back"),
        ("+ packing", "packing the command (the SDK's pack)"),
        ("send_direct_async (+ Retry)", "the SDK's transport: tasks share round trips (one write per loop turn)"),
        ("AsyncClaim.acquire", "a new handle and acquire() itself: events wrapper, state, outcome"),
    ]
    for group, ladder, sdk, label in (
        ("sync", sync_ladder, "Claim.acquire", "sync"),
        ("asyncio", async_ladder, "AsyncClaim.acquire", f"asyncio, {TASKS} tasks"),
    ):
        table = by_name(groups[group])
        print(f"\n## What stands between {sdk} and the floor ({label}, same rounds)\n")
        print("| step | µs per call (median) | this step adds (median of per-round differences) | what the step adds |")
        print("|---|---|---|---|")
        previous = None
        for name, what in ladder:
            step = table[name]
            added = "" if previous is None else f"{statistics.median(differences(step, previous)):+.1f}"
            print(f"| {name} | {statistics.median(step.us):.1f} | {added} | {what} |")
            previous = step
        gap = statistics.median(differences(table[sdk], table[ladder[0][0]]))
        print(f"\n{sdk} - floor: {gap:.1f} µs per call (median of per-round differences)")

    print("\n## The pieces alone: CPU, no I/O\n")
    print("| piece | µs per call (median) |")
    print("|---|---|")
    for contender in groups["cpu"]:
        print(f"| {contender.name} | {statistics.median(contender.us):.2f} |")
    if "socket pair: send + bare recv" in cpu:
        parse = statistics.median(
            differences(cpu["socket pair: send + redis-py read_response"], cpu["socket pair: send + bare recv"])
        )
        print(f"\nreading/parsing one reply through redis-py, beyond a bare recv: {parse:.2f} µs")
    wrapper = statistics.median(
        differences(cpu["acquire() on one handle, stubbed"], cpu["_acquire() (no event wrapper), stubbed"])
    )
    print(f"the events wrapper of acquire(), unobserved: {wrapper:.2f} µs")

    print("\n" + ("targets not met:\n  " + "\n  ".join(misses) if misses else "all targets met"))
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    with server_url() as url:
        s = prepare(url)
        try:
            server = s.client.info("server")
            hiredis = getattr(redis.utils, "HIREDIS_AVAILABLE", False)
            print(
                f"redis-py {redis.__version__} ({'hiredis' if hiredis else 'pure-Python'} parser), "
                f"Python {sys.version.split()[0]}, redis-server {server.get('redis_version')}, "
                f"{args.rounds} rounds x {args.calls} calls per contender (CPU pieces: x3)"
            )
            groups = {
                "sync": sync_contenders(s),
                "asyncio": async_contenders(s),
                "cpu": cpu_contenders(s),
            }
            measure(groups, args.rounds, {"sync": args.calls, "asyncio": args.calls, "cpu": args.calls * 3})
            report(groups)
            print("\n## Where the CPU goes (cProfile)")
            for title, action, around in s.profiles:
                profiled(title, action, around, args.calls * 3, top=10)
        finally:
            close(s)


def close(s: Setup) -> None:
    for closer in s.closers:
        closer()
    s.sock.close()

    async def async_close() -> None:
        for _, writer in s.streams:
            writer.close()
            await writer.wait_closed()
        await s.async_client.aclose()

    s.loop.run_until_complete(async_close())
    s.loop.close()
    s.client.close()


if __name__ == "__main__":
    main()
