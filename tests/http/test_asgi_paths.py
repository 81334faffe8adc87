"""The ASGI middleware's claim paths as a server drives it: duplicates that wait, records not ours, Redis failing.

Each test drives ``IdempotencyMiddleware`` with a scope, ``receive`` and ``send``
over fakeredis's asyncio client, or over a redis-server of the test's own where
Redis must refuse writes or vanish mid-request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis.asyncio

import goblin_claim
from goblin_claim import ConnectionFailedError
from goblin_claim._events import Event
from goblin_claim.asgi import IdempotencyMiddleware
from tests.support import servers

NS = "asgi-paths"
DOCS = "https://docs.example/problems"
App = Callable[[dict[str, Any], Any, Any], Any]


@dataclass
class Reply:
    """What a client got."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def problem(self) -> str:
        """The problem's documented code (its ``type`` anchor)."""
        assert self.headers["content-type"] == "application/problem+json"
        kind: str = json.loads(self.body)["type"]
        return kind.removeprefix(DOCS + "#")


async def serve(middleware: Any, body: bytes = b"{}", key: str = "k-1") -> Reply:
    """One POST /orders with ``body`` and the key, as a server runs it: the messages sent, gathered."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/orders", "raw_path": b"/orders", "query_string": b"", "root_path": "",
        "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"idempotency-key", key.encode()),
        ],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    headers = {name.decode().lower(): value.decode() for name, value in start.get("headers", [])}
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Reply(start["status"], headers, content)


def answering(*bodies: bytes, status: int = 201, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    """An ASGI app sending ``bodies`` as its body messages; its ``runs`` counts the runs."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        app.runs += 1  # type: ignore[attr-defined]
        await receive()
        await send({"type": "http.response.start", "status": status, "headers": headers or []})
        for index, chunk in enumerate(bodies):
            await send({"type": "http.response.body", "body": chunk, "more_body": index < len(bodies) - 1})

    app.runs = 0  # type: ignore[attr-defined]
    return app


def door(app: Any, client: Any, **options: Any) -> IdempotencyMiddleware:
    """The middleware around ``app``, its problems linked to DOCS so their codes show."""
    return IdempotencyMiddleware(app, client=client, namespace=NS, problem_docs=DOCS, **options)


def fake() -> fakeredis.FakeAsyncRedis:
    """A fresh fakeredis asyncio client of the test's own."""
    return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())


# --------------------------------------------------------------------------- duplicates that wait


def test_a_duplicate_waits_for_the_first_or_is_told_409_when_it_waited_out() -> None:
    """With ``wait``: a duplicate gets the first answer once it is stored, or 409 naming how long it waited."""

    async def scenario() -> None:
        client = fake()
        release = asyncio.Event()
        started = asyncio.Event()
        runs = 0

        async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
            nonlocal runs
            runs += 1
            await receive()
            started.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})

        first = asyncio.ensure_future(serve(door(slow, client)))
        await asyncio.wait_for(started.wait(), 10)
        impatient = await serve(door(slow, client, wait=0.2))
        patient = asyncio.ensure_future(serve(door(slow, client, wait=10)))
        await asyncio.sleep(0.1)
        release.set()
        made, replayed = await first, await patient
        assert (impatient.status, impatient.problem) == (409, "in-flight")
        assert json.loads(impatient.body)["detail"].endswith("(waited 0.2s)")
        assert (made.status, made.body) == (201, b"made")
        assert (replayed.status, replayed.body, replayed.headers["idempotent-replayed"]) == (201, b"made", "true")
        assert runs == 1

    asyncio.run(scenario())


def test_a_waiting_duplicate_cancelled_leaves_the_key_to_the_first() -> None:
    """The client of a waiting duplicate left (its task cancelled): the first request's answer is still stored."""

    async def scenario() -> None:
        client = fake()
        release = asyncio.Event()
        started = asyncio.Event()

        async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
            slow.runs += 1  # type: ignore[attr-defined]
            await receive()
            started.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})

        slow.runs = 0  # type: ignore[attr-defined]
        first = asyncio.ensure_future(serve(door(slow, client)))
        await asyncio.wait_for(started.wait(), 10)
        waiting = asyncio.ensure_future(serve(door(slow, client, wait=30)))
        await asyncio.sleep(0.2)
        # Cancelled as a server cancels a request whose client left. On Python 3.10 a
        # cancellation that lands as a round trip ends can be dropped by the client
        # library's wait_for, with no trace for wait() to find (3.11+ counts it): the
        # server's cancellation is sent again until it takes, as the test is about the key.
        for _ in range(50):
            waiting.cancel()
            await asyncio.wait((waiting,), timeout=0.2)
            if waiting.done():
                break
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        assert (await first).status == 201
        again = await serve(door(slow, client))
        assert (again.status, again.body, again.headers["idempotent-replayed"]) == (201, b"made", "true")
        assert slow.runs == 1  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_done_record_without_a_value_is_500_result_lost() -> None:
    """A key another writer left "done" without a value: the duplicate is told 500 result-lost, nothing runs."""

    async def scenario() -> None:
        client = fake()
        app = answering(b"made")
        assert (await serve(door(app, client))).status == 201
        (name,) = await client.keys(f"{NS}:*")
        await client.set(name, b"done another-writer")
        reply = await serve(door(app, client))
        assert (reply.status, reply.problem) == (500, "result-lost")
        assert app.runs == 1

    asyncio.run(scenario())


# --------------------------------------------------------------------------- bodies the app sends


def test_an_empty_body_message_between_chunks_is_kept_out_of_the_stored_answer() -> None:
    """``body=b""`` with ``more_body`` (a flush) then the rest: stored whole and replayed byte for byte."""

    async def scenario() -> None:
        client = fake()
        app = answering(b"part one, ", b"", b"part two")
        first, again = await serve(door(app, client)), await serve(door(app, client))
        assert (first.status, first.body) == (201, b"part one, part two")
        assert (again.body, again.headers["idempotent-replayed"]) == (b"part one, part two", "true")
        assert app.runs == 1

    asyncio.run(scenario())


def test_a_single_body_over_the_limit_is_passed_whole_and_duplicates_told(caplog: pytest.LogCaptureFixture) -> None:
    """One last body message over ``max_response_bytes``: sent whole, Idempotent-Stored: false; then 422 not-kept."""

    async def scenario() -> None:
        client = fake()
        app = answering(b"r" * 80, status=200)
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            first = await serve(door(app, client, max_response_bytes=50))
        assert (first.status, first.body, first.headers["idempotent-stored"]) == (200, b"r" * 80, "false")
        again = await serve(door(app, client, max_response_bytes=50))
        assert (again.status, again.problem) == (422, "not-kept")
        assert "max_response_bytes=50" in json.loads(again.body)["detail"]
        assert app.runs == 1

    asyncio.run(scenario())
    assert any("passed through and not kept for replay" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- Redis failing


def test_redis_unreachable_is_503_and_the_app_never_runs(caplog: pytest.LogCaptureFixture) -> None:
    """No Redis to claim on: 503 store-unavailable with Retry-After, logged; the app never runs unguarded."""

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=servers.free_port(), socket_connect_timeout=1)
        app = answering(b"made")
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            reply = await serve(door(app, client))
        assert (reply.status, reply.problem) == (503, "store-unavailable")
        assert reply.headers["retry-after"]
        assert app.runs == 0
        await client.aclose()

    asyncio.run(scenario())
    assert any("the idempotency claim failed, answering 503" in r.getMessage() for r in caplog.records)


def test_redis_unreachable_with_fail_open_runs_the_app_once_per_delivery(caplog: pytest.LogCaptureFixture) -> None:
    """fail_open=True, no Redis: each delivery runs the app once, its answer passed through unkept; told each time."""
    seen: list[Event] = []

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=servers.free_port(), socket_connect_timeout=1, retry=None)
        app = answering(b"made", headers=[(b"x-made", b"1")])
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            replies = [await serve(door(app, client, fail_open=True)) for _ in range(2)]
        assert [(r.status, r.body, r.headers) for r in replies] == [(201, b"made", {"x-made": "1"})] * 2
        assert app.runs == 2
        refused = await serve(door(app, client))  # the default: 503, the app never runs unguarded
        assert (refused.status, refused.problem) == (503, "store-unavailable")
        assert app.runs == 2
        await client.aclose()

    goblin_claim.add_listener(seen.append)
    try:
        asyncio.run(scenario())
    finally:
        goblin_claim.remove_listener(seen.append)
    requests = [e for e in seen if e.operation == "request"]
    assert [e.outcome for e in requests] == ["failed_open", "failed_open", "unavailable"]
    assert all(isinstance(e.error, ConnectionFailedError) for e in requests[:2])
    opened = [r for r in caplog.records if "fail_open runs the work" in r.getMessage()]
    assert [(r.name, r.levelno) for r in opened] == [("goblin_claim.asgi", logging.WARNING)] * 2


def test_a_reachable_redis_decides_with_fail_open() -> None:
    """fail_open=True over a Redis that answers: the duplicate is replayed, in flight is 409; the app ran once."""

    async def scenario() -> None:
        client = fake()
        release = asyncio.Event()
        started = asyncio.Event()

        async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
            slow.runs += 1  # type: ignore[attr-defined]
            await receive()
            started.set()
            await release.wait()
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})

        slow.runs = 0  # type: ignore[attr-defined]
        first = asyncio.ensure_future(serve(door(slow, client, fail_open=True)))
        await asyncio.wait_for(started.wait(), 10)
        in_flight = await serve(door(slow, client, fail_open=True))
        release.set()
        assert (await first).body == b"made"
        again = await serve(door(slow, client, fail_open=True))
        assert (in_flight.status, in_flight.problem) == (409, "in-flight")
        assert (again.status, again.body, again.headers["idempotent-replayed"]) == (201, b"made", "true")
        assert slow.runs == 1  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_store_redis_refuses_sends_the_answer_marked_unstored(
    own_server: Callable[..., servers.RedisProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis out of memory once the app answered: sent with Idempotent-Stored: false; the marker refused too (409)."""
    server = own_server()
    admin = server.client()

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)

        async def filling(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})

        try:
            with caplog.at_level(logging.WARNING, logger="goblin_claim"):
                sent = await serve(door(filling, client, lease=5))
        finally:
            admin.config_set("maxmemory", 0)
        assert (sent.status, sent.body, sent.headers["idempotent-stored"]) == (201, b"made", "false")
        again = await serve(door(filling, client, lease=5))
        assert (again.status, again.problem) == (409, "in-flight")
        await client.aclose()

    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not be stored (ServerError)" in m for m in messages), messages
    assert any("could not keep the key closed (ServerError)" in m for m in messages), messages


def test_redis_gone_while_the_app_ran_sends_its_answer_marked_unstored(
    own_server: Callable[..., servers.RedisProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """The store is retried through the lease, then given up: the client gets the answer, Idempotent-Stored: false."""
    server = own_server()

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5, socket_timeout=0.5)

        async def stopping(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            await asyncio.to_thread(server.stop)
            await send({"type": "http.response.start", "status": 201, "headers": []})
            await send({"type": "http.response.body", "body": b"made"})

        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            reply = await serve(door(stopping, client, lease=3))
        assert (reply.status, reply.body, reply.headers["idempotent-stored"]) == (201, b"made", "false")

    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not be stored (ConnectionFailedError)" in m for m in messages), messages
    assert not any("could not keep the key closed" in m for m in messages)  # no marker tried on a dead connection


def test_an_app_failing_after_redis_went_away_raises_its_own_error(
    own_server: Callable[..., servers.RedisProcess],
) -> None:
    """Redis gone, the key cannot be given back (it frees itself after its lease): the error reaches the server."""
    server = own_server()

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5, socket_timeout=0.5)

        async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            await asyncio.to_thread(server.stop)
            raise LookupError("the order table is gone")

        with pytest.raises(LookupError, match="order table"):
            await serve(door(failing, client, lease=1))

    asyncio.run(scenario())


def test_a_status_not_kept_gives_the_key_back_before_its_last_body_goes_out() -> None:
    """A client that read the whole 503 and retries at once runs again: the key is free before the last body is sent."""
    client = fake()
    held: list[bool] = []

    async def busy(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"busy, ", "more_body": True})
        held.append(bool(await client.keys(f"{NS}:*")))
        await send({"type": "http.response.body", "body": b"try again", "more_body": False})
        held.append(bool(await client.keys(f"{NS}:*")))
        await asyncio.sleep(0.05)  # work after the answer: the retry need not wait for it

    reply = asyncio.run(serve(door(busy, client)))
    assert (reply.status, reply.body) == (503, b"busy, try again")
    assert "idempotent-stored" not in reply.headers
    assert held == [True, False]
