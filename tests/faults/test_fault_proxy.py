"""The fault proxy itself: RESP framing, and each fault on a real redis-server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.conftest import unique
from tests.support.proxy import FaultProxy, ProtocolError, parse_request, reply_end
from tests.support.servers import HOST, RedisProcess

REPLIES = [
    b"+OK\r\n",
    b"-ERR no\r\n",
    b":42\r\n",
    b"$5\r\nhello\r\n",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n$1\r\na\r\n:1\r\n*1\r\n$0\r\n\r\n",
    b"_\r\n",
    b",3.14\r\n",
    b"#t\r\n",
    b"(3492890328409238509324850943850943825024385\r\n",
    b"!9\r\nSYNTAX no\r\n",
    b"=7\r\ntxt:abc\r\n",
    b"%2\r\n+a\r\n:1\r\n$1\r\nb\r\n~2\r\n:1\r\n:2\r\n",
    b"~1\r\n+x\r\n",
    b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
    b"|1\r\n+ttl\r\n:3600\r\n$3\r\nval\r\n",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_reply_end_finds_each_resp_reply_only_once_complete(reply: bytes) -> None:
    """Every RESP2/RESP3 reply type ends exactly at its last byte, and no prefix of it is complete."""
    assert reply_end(reply + b":1\r\n") == len(reply)
    assert all(reply_end(reply[:cut]) is None for cut in range(len(reply)))


def test_reply_end_walks_a_pipeline_of_replies() -> None:
    """Replies written back to back are found one after the other."""
    stream, pos, ends = b"".join(REPLIES), 0, []
    while (end := reply_end(stream, pos)) is not None:
        ends.append(end)
        pos = end
    assert pos == len(stream)
    assert len(ends) == len(REPLIES)


def test_parse_request_reads_arrays_pipelines_and_inline_commands() -> None:
    """Requests split anywhere stay incomplete; a pipeline is read one request at a time."""
    one = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\nv\r\nx\r\n"
    assert parse_request(one) == (len(one), [b"SET", b"k", b"v\r\nx"])
    assert all(parse_request(one[:cut]) is None for cut in range(len(one)))
    two = one + b"*1\r\n$4\r\nPING\r\n"
    assert parse_request(two, len(one)) == (len(two), [b"PING"])
    assert parse_request(b"PING now\r\n") == (10, [b"PING", b"now"])
    with pytest.raises(ProtocolError):
        parse_request(b"*1\r\n:1\r\n")


@pytest.fixture
def proxy(redis_standalone: RedisProcess) -> Iterator[FaultProxy]:
    """A proxy in front of the session's standalone server."""
    with FaultProxy(redis_standalone.port) as started:
        yield started


@pytest.mark.parametrize("protocol", [2, 3])
def test_lost_reply_is_resent_by_redis_py_after_the_server_ran_it(
    proxy: FaultProxy, redis_standalone: RedisProcess, protocol: int
) -> None:
    """A lost INCR reply: redis-py re-sends it, so the server runs it twice (RESP2 and RESP3)."""
    key = unique()
    client = redis.Redis(host=HOST, port=proxy.port, protocol=protocol)
    proxy.faults.lose_next_reply(b"INCR", key.encode())
    assert client.incr(key) == 2
    assert proxy.faults.count(b"INCR", key.encode()) == 2
    assert proxy.faults.lost(key.encode()) == 1
    assert proxy.faults.armed() == 0
    assert client.get(key) == b"2"
    client.close()


def test_lost_reply_without_retries_is_an_error_though_the_server_ran_it(proxy: FaultProxy) -> None:
    """With retries off, a lost reply is a ConnectionError, and the command did run once."""
    key = unique()
    client = redis.Redis(host=HOST, port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=2)
    proxy.faults.lose_next_reply(key.encode())
    with pytest.raises(redis.ConnectionError):
        client.incr(key)
    assert client.get(key) == b"1"
    client.close()


def test_dropped_request_never_reaches_the_server(proxy: FaultProxy) -> None:
    """A request cut before the server: an error with retries off, nothing run; retried once with them on."""
    key = unique()
    bare = redis.Redis(host=HOST, port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=2)
    proxy.faults.drop_before(key.encode())
    with pytest.raises(redis.ConnectionError):
        bare.incr(key)
    assert bare.get(key) is None
    assert proxy.faults.dropped(key.encode()) == 1
    default = redis.Redis(host=HOST, port=proxy.port)
    proxy.faults.drop_before(b"INCR", key.encode())
    assert default.incr(key) == 1
    assert proxy.faults.count(b"INCR", key.encode()) == 1
    bare.close()
    default.close()


def test_held_reply_times_the_client_out_and_is_never_delivered(proxy: FaultProxy) -> None:
    """A held reply: the client times out after socket_timeout; with retries on, the re-send answers."""
    key = unique()
    bare = redis.Redis(host=HOST, port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=0.3)
    proxy.faults.hold_next_reply(key.encode())
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        bare.incr(key)
    assert 0.25 < time.monotonic() - started < 5
    retrying = redis.Redis(host=HOST, port=proxy.port, socket_timeout=0.3)
    proxy.faults.hold_next_reply(key.encode())
    assert retrying.incr(key) == 3
    bare.close()
    retrying.close()


def test_pipelined_requests_lose_only_the_marked_reply(proxy: FaultProxy) -> None:
    """In one pipeline write, the replies before the marked request arrive; the marked one is lost."""
    key = unique()
    client = redis.Redis(host=HOST, port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=2)
    pipe = client.pipeline(transaction=False)
    pipe.set(key, "a")
    pipe.append(key, "-marked")
    pipe.append(key, "c")
    proxy.faults.lose_next_reply(b"-marked")
    with pytest.raises(redis.ConnectionError):
        pipe.execute()
    assert client.get(key) == b"a-markedc"  # the server ran all three
    client.close()


def test_stop_closes_every_connection_and_the_port(redis_standalone: RedisProcess) -> None:
    """After stop(), clients are cut and nothing listens on the proxy's port."""
    proxy = FaultProxy(redis_standalone.port).start()
    client = redis.Redis(host=HOST, port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=2)
    assert client.ping()
    assert proxy.connections() == 1
    proxy.stop()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(ConnectionRefusedError), socket.create_connection((HOST, proxy.port), timeout=1):
        pass
    client.close()


def test_stop_racing_a_connection_being_accepted_returns(
    redis_standalone: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() begins just as a connection is accepted: the proxy drops that connection and stop() returns."""
    proxy = FaultProxy(redis_standalone.port).start()
    upstream = (HOST, redis_standalone.port)
    connect = socket.create_connection

    def accepted_as_stop_begins(address: tuple[str, int], *args: object, **options: object) -> socket.socket:
        made = connect(address, *args, **options)  # type: ignore[arg-type]
        if tuple(address) == upstream:
            proxy._stopping.set()
        return made

    monkeypatch.setattr(socket, "create_connection", accepted_as_stop_begins)
    with connect((HOST, proxy.port), timeout=2) as client:
        deadline = time.monotonic() + 5
        while not proxy._stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy._stopping.is_set(), "the proxy never accepted the connection"
        stopper = threading.Thread(target=proxy.stop, daemon=True)
        stopper.start()
        stopper.join(15)
        assert not stopper.is_alive(), "stop() hung on the connection accepted while stopping"
        assert client.recv(1) == b""  # that connection was closed, not served
    assert proxy.connections() == 0
