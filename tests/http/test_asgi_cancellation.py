"""IdempotencyMiddleware under asyncio cancellation at every await, on a real redis-server.

A cancellation (a client gone, a server stopping, ``asyncio.timeout``) may land at
any await of a request. Whatever it hits, the key is never left claimed by nobody:
it is free (the app never began, or asked for a retry) or closed (the response
stored, or the request marked abandoned because the app began), and a request the
app began is never run again. Two sweeps: one cancels the request's task after
0, 1, 2, ... event-loop turns until a request finishes uncancelled (every point
where the flow really suspends, on redis-py's own connections); the other cancels
it at the Nth Redis command, before it is sent, while it is on the wire, or once
the server answered, for N = 1, 2, ... until no command is left.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
import redis.asyncio

from goblin_claim import AsyncClaim
from goblin_claim._http import make_options, request_fingerprint
from goblin_claim._protocol.record import DONE_PREFIX
from goblin_claim.asgi import IdempotencyMiddleware, Message, Scope
from tests.conftest import unique
from tests.support import servers

Flow = Literal["first", "duplicate", "takeover", "5xx", "no response"]
FLOWS: tuple[Flow, ...] = ("first", "duplicate", "takeover", "5xx", "no response")
BODY = b'{"items":["tea"]}'


@dataclass
class App:
    """An app that suspends a few times, counting the runs the middleware started."""

    status: int = 201
    answer: bool = True
    runs: int = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """Read the body, suspend, answer ``status`` in two chunks (or return without answering)."""
        self.runs += 1  # before the first await: the middleware began the app
        while (await receive()).get("more_body", False):
            pass
        await asyncio.sleep(0)
        if not self.answer:
            return
        await send(
            {"type": "http.response.start", "status": self.status, "headers": [(b"content-type", b"text/plain")]}
        )
        await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"run ", "more_body": True})
        await send({"type": "http.response.body", "body": str(self.runs).encode()})


async def request(middleware: IdempotencyMiddleware, key: str) -> list[Message]:
    """One POST with ``key``; ``receive`` and ``send`` suspend once each, as a server's do."""
    scope: Scope = {
        "type": "http", "method": "POST", "path": "/orders", "query_string": b"",
        "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"application/json")],
    }  # fmt: skip
    pending = [{"type": "http.request", "body": BODY, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        await asyncio.sleep(0)
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client stays until it is answered
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        await asyncio.sleep(0)
        sent.append(message)

    await middleware(scope, receive, send)
    return sent


@dataclass
class Setting:
    """One flow on one key: the app, the middleware, and how the key was prepared."""

    flow: Flow
    client: Any
    namespace: str
    key: str = field(default_factory=lambda: unique("req"))
    app: App = field(default_factory=App)
    middleware: IdempotencyMiddleware = field(init=False)
    # The same request, as the middleware's token says (a JSON body: its canonical fingerprint).
    foreign: str = f"a-crashed-owner.{request_fingerprint(make_options(), None, b'application/json', b'', BODY)}"

    def __post_init__(self) -> None:
        if self.flow == "5xx":
            self.app.status = 503
        if self.flow == "no response":
            self.app.answer = False
        wait = 5.0 if self.flow == "takeover" else 0.0
        self.middleware = IdempotencyMiddleware(self.app, client=self.client, namespace=self.namespace, wait=wait)
        name = json.dumps(["POST", "/orders", None, self.key], separators=(",", ":"))
        self.handle = AsyncClaim(self.client, name, namespace=self.namespace)

    async def prepare(self) -> None:
        """Put the key in the state the flow starts from."""
        if self.flow == "duplicate":
            await request(self.middleware, self.key)
            assert self.app.runs == 1
        elif self.flow == "takeover":
            # A crashed owner's claim, lapsing in 50 ms: the request waits, then takes over.
            await self.client.set(self.handle.claim_key, self.foreign, px=50)

    async def holder(self) -> str | None:
        """Who holds the key: None (free), ``done <token> <envelope>`` (closed), or a token."""
        value = await self.client.get(self.handle.claim_key)
        return value.decode() if isinstance(value, bytes) else value

    async def check(self, label: object) -> None:
        """After a cancelled request: the key is free or closed, never held by the request that is gone."""
        holder = await self.holder()
        ran = self.app.runs - (1 if self.flow == "duplicate" else 0)
        assert ran in (0, 1), (label, ran)
        if holder is not None and not holder.startswith(DONE_PREFIX):
            # Only the crashed owner's own claim may still be there, until it lapses.
            assert self.flow == "takeover", (label, holder)
            assert holder == self.foreign, (label, holder)
        if ran and self.flow != "5xx":
            # The app began: it is never run again, so its key is closed (stored or abandoned).
            assert holder is not None, label
            assert holder.startswith(DONE_PREFIX), (label, holder)
            # The one key's record, ``done <token> <envelope>``: a stored answer or the abandoned marker.
            envelope = holder.split(" ", 2)[2] if holder.count(" ") >= 2 else "{}"
            assert json.loads(envelope).get("kind") in ("http_response", "http_abandoned"), (label, holder)
        # A retry (uncancelled) runs the app only if it never began, or if it asked for a retry.
        before = self.app.runs
        sent = await request(self.middleware, self.key)
        status = sent[0]["status"] if sent else None  # None: the app answered nothing
        if self.flow == "5xx":
            # Given back (it answered 503), or kept closed (cancelled before it answered).
            assert (status, self.app.runs) in ((503, before + 1), (422, before)), (label, status, self.app.runs)
        elif ran:
            assert (status, self.app.runs) in ((201, 1), (422, 1)), (label, status, self.app.runs)  # replay or closed
        else:
            assert self.app.runs == 1, (label, status, self.app.runs)  # the one run is the retry's
            assert status == (None if self.flow == "no response" else 201), (label, status)


def client_for(server: servers.RedisProcess, cls: type[Any] = redis.asyncio.Redis) -> Any:
    """An asyncio client with a blocking pool, as the README advises for servers."""
    pool = redis.asyncio.BlockingConnectionPool(host=servers.HOST, port=server.port, max_connections=16, timeout=10)
    return cls.from_pool(pool)


async def run_cancelled(work: Callable[[], Awaitable[Any]], turns: int) -> Literal["hit", "missed", "finished"]:
    """Run ``work()`` as a task cancelled after ``turns`` loop turns.

    Returns "hit" when the cancellation reached it, "finished" when it was done
    before the cancellation was due, and "missed" when it was cancelled but
    finished anyway: Python 3.11's ``asyncio.wait_for`` (redis-py's socket writes)
    drops a cancellation that arrives as the write completes.
    """
    task = asyncio.ensure_future(work())
    done_first = False

    async def cancel() -> None:
        nonlocal done_first
        for _ in range(turns):
            await asyncio.sleep(0)  # exactly one turn of the event loop
        done_first = task.done()
        task.cancel()

    canceller = asyncio.ensure_future(cancel())
    try:
        await task
    except asyncio.CancelledError:
        return "hit"
    finally:
        await canceller
    return "finished" if done_first else "missed"


# A takeover sleeps until the crashed owner's lease lapses: thousands of idle loop
# turns, each a point where nothing happens. The command sweep covers it instead.
@pytest.mark.parametrize("flow", [flow for flow in FLOWS if flow != "takeover"])
def test_a_cancellation_at_every_loop_turn_never_blocks_a_key_or_reruns_a_started_request(
    flow: Flow, redis_standalone: servers.RedisProcess
) -> None:
    """Cancelled after each number of loop turns in turn: the key is free or closed, a begun app never reruns."""

    async def main() -> int:
        client = client_for(redis_standalone)
        namespace = unique("asgi-cancel")
        hit = quiet = 0
        try:
            for turns in range(3000):
                setting = Setting(flow, client, namespace)
                await setting.prepare()
                result = await run_cancelled(lambda s=setting: request(s.middleware, s.key), turns)  # type: ignore[misc]
                if result == "hit":
                    hit, quiet = hit + 1, 0
                elif result == "finished":
                    quiet += 1
                    if quiet == 20:  # done before the cancellation 20 times running: past the last await
                        return hit
                await setting.check(turns)
        finally:
            await client.aclose()
        raise AssertionError("the request never finished uncancelled")

    hit = asyncio.run(main())
    # The flow suspended, and was cancelled, at several points (a replay has one round trip).
    assert hit >= (2 if flow == "duplicate" else 4), hit


class Cancelling(redis.asyncio.Redis):  # type: ignore[type-arg]
    """Cancels ``target`` at its ``at``-th command: before it is sent, on the wire, or once answered.

    Overriding ``execute_command`` makes goblin-claim send through it, so every
    round trip (the claim, wait()'s polls, the store, a release) is counted,
    whichever task sends it; only ``target`` is cancelled.
    """

    target: asyncio.Task[Any] | None = None
    at = 0
    when: Literal["before", "on the wire", "answered"] = "before"
    seen = 0
    fired = False

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Count the command; cancel the target at the chosen one."""
        target = self.target
        if target is None:  # the test's own reads and writes, before and after the request
            return await super().execute_command(*args, **options)
        self.seen += 1
        if self.seen != self.at:
            return await super().execute_command(*args, **options)
        self.fired = True
        mine = asyncio.current_task() is target
        if self.when == "answered":
            reply = await super().execute_command(*args, **options)
            target.cancel()
            if mine:
                await asyncio.sleep(0)  # delivered here: the server acted, its reply is lost
            return reply
        target.cancel()
        if self.when == "before" and mine:
            await asyncio.sleep(0)  # delivered before anything is sent
        return await super().execute_command(*args, **options)


@pytest.mark.parametrize("when", ["before", "on the wire", "answered"])
@pytest.mark.parametrize("flow", FLOWS)
def test_a_cancellation_at_every_redis_command_never_blocks_a_key_or_reruns_a_started_request(
    flow: Flow, when: Literal["before", "on the wire", "answered"], redis_standalone: servers.RedisProcess
) -> None:
    """Cancelled at the Nth Redis command (unsent, on the wire, answered): the key is free or closed, no rerun."""

    async def main() -> int:
        client = client_for(redis_standalone, Cancelling)
        namespace = unique("asgi-cancel")
        try:
            await AsyncClaim(client, "warm-up", namespace=namespace).forget()  # first use: probe and scripts
            for at in range(1, 100):
                setting = Setting(flow, client, namespace)
                await setting.prepare()
                client.seen, client.at, client.when, client.fired = 0, at, when, False
                task = asyncio.ensure_future(request(setting.middleware, setting.key))
                client.target = task
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                finally:
                    client.target = None
                if not client.fired:
                    return at - 1  # no command left to cancel at
                await setting.check((when, at))
        finally:
            await client.aclose()
        raise AssertionError("the flow kept sending commands")

    commands = asyncio.run(main())
    # The claim, and (but for a replay, one round trip) the store, mark or release after it.
    assert commands >= (1 if flow == "duplicate" else 2), commands
