"""Events: every public operation ends in exactly one event with a closed outcome, on real servers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.cluster

import goblin_claim
from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    Completed,
    InFlight,
    PayloadMismatchError,
    StillInFlightError,
    _events,
    idempotent,
)
from goblin_claim._clients.transport import state_of
from tests.claim.test_wakeup import SlowPollingClaim
from tests.conftest import unique, wait_past_subscription
from tests.support.servers import HOST, RedisProcess

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A listener that keeps every event (listeners run on several threads)."""

    def __init__(self) -> None:
        self.events: list[_events.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: _events.Event) -> None:
        """Keep ``event``."""
        with self._lock:
            self.events.append(event)

    def of(self, operation: str, key: str | None = None) -> list[_events.Event]:
        """The events of ``operation`` (on ``key``), in order."""
        with self._lock:
            return [e for e in self.events if e.operation == operation and (key is None or e.key == key)]

    def outcomes(self, operation: str, key: str | None = None) -> list[str]:
        """The outcomes of ``operation`` (on ``key``), in order."""
        return [e.outcome for e in self.of(operation, key)]


@pytest.fixture
def events() -> Iterator[Recorder]:
    """A registered recorder, removed after the test."""
    recorder = Recorder()
    goblin_claim.add_listener(recorder)
    yield recorder
    goblin_claim.remove_listener(recorder)


@pytest.fixture
def client(redis_standalone: RedisProcess) -> Iterator[redis.Redis]:
    """A sync client on the session's standalone server."""
    made = redis_standalone.client()
    yield made
    made.close()


def test_each_operation_ends_in_one_event_with_its_outcome(client: redis.Redis, events: Recorder) -> None:
    """acquire, complete, release and forget each emit exactly one event whose outcome says what happened."""
    key = unique()
    first, second = Claim(client, key, lease=30), Claim(client, key, lease=30)
    assert isinstance(first.acquire(), Claimed)
    assert isinstance(second.acquire(), InFlight)
    first.complete(b"done")
    assert isinstance(second.acquire(), Completed)
    assert second.release() is False
    assert second.forget() is True
    assert second.forget() is False
    assert events.outcomes("acquire", key) == ["claimed", "in_flight", "completed"]
    assert events.outcomes("complete", key) == ["completed"]
    assert events.outcomes("release", key) == ["not_held"]
    assert events.outcomes("forget", key) == ["forgotten", "not_held"]
    # Stock redis-server 7: claims take its SET ... NX GET and forget its DEL, the rest the scripts
    # (no SET IFEQ, no DELIFEQ).
    assert [e.path for e in events.events if e.operation == "acquire"] == ["command"] * 3
    for event in events.events:
        assert event.outcome in _events.OUTCOMES
        assert event.namespace == "goblin"
        assert event.path == ("command" if event.operation in ("acquire", "forget") else "script")
        assert event.duration is not None
        assert 0 < event.duration < 5
        assert event.error is None
    assert len(events.events) == 7  # one per call, nothing more


def test_released_claim_and_extend_report_their_outcomes(client: redis.Redis, events: Recorder) -> None:
    """A release by the owner is released; an extend after it is claim_lost with the ClaimLostError."""
    key = unique()
    claim = Claim(client, key, lease=30)
    claim.acquire()
    claim.extend()
    assert claim.release() is True
    with pytest.raises(goblin_claim.ClaimLostError):
        claim.extend()
    assert events.outcomes("extend", key) == ["claimed", "claim_lost"]
    assert events.outcomes("release", key) == ["released"]
    assert isinstance(events.of("extend", key)[1].error, goblin_claim.ClaimLostError)


def test_fence_is_carried_by_the_claimed_event(client: redis.Redis, events: Recorder) -> None:
    """With fencing, the claimed event carries the same fence the Claimed outcome has."""
    claim = Claim(client, unique(), fencing=True)
    outcome = claim.acquire()
    assert isinstance(outcome, Claimed)
    assert outcome.fence is not None
    assert [e.fence for e in events.of("acquire")] == [outcome.fence]


def test_native_path_is_reported(redis_native: RedisProcess, events: Recorder) -> None:
    """With GOBLIN.CLAIM / GOBLIN.CAD loaded: path=native for what they serve, command for the server's own commands.

    A one-key claim takes Redis 7's SET ... NX GET (command), a release GOBLIN.CAD (native), a
    two-key claim GOBLIN.CLAIM (native), complete the script (Redis 7 has no SET IFEQ).
    """
    client = redis_native.client()
    try:
        claim = Claim(client, unique())
        claim.acquire()
        claim.release()
        claim.acquire()
        claim.complete(b"v")
        claim_key = f"c:{{{unique()}}}"
        Claim.from_keys(client, claim_key, claim_key.replace("c:", "r:", 1)).acquire()
        assert [e.path for e in events.events] == ["command", "native", "command", "script", "native"]
    finally:
        client.close()


def test_the_server_s_own_commands_are_reported_as_command(valkey_standalone: RedisProcess, events: Recorder) -> None:
    """On Valkey 9 a plain one-key record goes by its own commands: every operation says path=command."""
    client = valkey_standalone.client()
    try:
        claim = Claim(client, unique())
        claim.acquire()
        claim.extend()
        claim.complete(b"v")
        Claim(client, claim.key).acquire()
        other = Claim(client, unique())
        other.acquire()
        other.release()
        other.forget()
        assert [(e.operation, e.path) for e in events.events] == [
            ("acquire", "command"), ("extend", "command"), ("complete", "command"), ("acquire", "command"),
            ("acquire", "command"), ("release", "command"), ("forget", "command"),
        ]  # fmt: skip
        fenced = Claim(client, unique(), fencing=True)
        fenced.acquire()
        fenced.complete(b"v")
        assert [e.path for e in events.events[-2:]] == ["script", "script"]  # fencing keeps the scripts
    finally:
        client.close()


def test_wait_outcomes(client: redis.Redis, events: Recorder) -> None:
    """wait() ends as waited_completed, taken_over (a lapsed lease) or wait_timeout, once per call."""
    done, lapsed, stuck = unique(), unique(), unique()
    owner = Claim(client, done, lease=30)
    owner.acquire()
    threading.Timer(0.2, owner.complete, args=(b"v",)).start()
    assert isinstance(Claim(client, done).wait(timeout=10), Completed)

    Claim(client, lapsed, lease=1).acquire()  # never completed, never renewed
    assert isinstance(Claim(client, lapsed).wait(timeout=10), Claimed)

    Claim(client, stuck, lease=30).acquire()
    with pytest.raises(StillInFlightError):
        Claim(client, stuck).wait(timeout=0.3)
    assert events.outcomes("wait", done) == ["waited_completed"]
    assert events.outcomes("wait", lapsed) == ["taken_over"]
    assert events.outcomes("wait", stuck) == ["wait_timeout"]
    assert isinstance(events.of("wait", stuck)[0].error, StillInFlightError)


def test_a_push_wakeup_is_reported_as_push(client: redis.Redis, events: Recorder) -> None:
    """A waiter woken by complete()'s announcement reports a wake event with outcome push."""
    # The waiter polls every 5 s, so on a loaded machine no poll ends its sleep before the
    # announcement does. Should the store land before its first look (a thread scheduled
    # late), it finds the result without sleeping, and no wake at all: another key then.
    for attempt in range(3):
        key = unique(f"push-{attempt}")
        owner = Claim(client, key, lease=30)
        owner.acquire()
        waiter = SlowPollingClaim(client, key)
        assert isinstance(wait_past_subscription(client, waiter, partial(owner.complete, b"v")), Completed)
        wakes = events.outcomes("wake", key)
        if wakes:
            break
    assert wakes == ["push"]
    assert set(wakes) <= _events.NOTICES["wake"]


def test_acquire_many_reports_each_key(client: redis.Redis, events: Recorder) -> None:
    """acquire_many emits one acquire_many event per key, with that key's own outcome."""
    done, fresh = unique(), unique()
    owner = Claim(client, done)
    owner.acquire()
    owner.complete(b"v")
    events.events.clear()
    Claim.acquire_many(client, [done, fresh])
    assert [(e.key, e.outcome) for e in events.of("acquire_many")] == [(done, "completed"), (fresh, "claimed")]
    assert len(events.events) == 2


def test_script_reload_after_a_flush_is_reported(client: redis.Redis, events: Recorder) -> None:
    """After SCRIPT FLUSH the next scripted claim reports a script_reload notice and still ends claimed."""
    Claim(client, unique()).acquire()  # the client is probed and its scripts loaded
    client.script_flush()
    key = unique()
    assert isinstance(Claim(client, key, native="never").acquire(), Claimed)
    assert events.outcomes("script_reload", key) == ["reloaded"]
    assert events.outcomes("acquire", key) == ["claimed"]


def test_native_fallback_is_reported(client: redis.Redis, events: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    """A client that believed its server native falls back to the scripts, reported once and warned."""
    Claim(client, unique()).acquire()
    state_of(client).native = frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD"})  # as if the module was unloaded
    key = unique()
    with caplog.at_level(logging.WARNING, logger="goblin_claim"):
        assert isinstance(Claim(client, key).acquire(), Claimed)
    assert events.outcomes("native_fallback", key) == ["fell_back"]
    assert [e.path for e in events.of("acquire", key)] == ["script"]
    assert any(r.name == "goblin_claim.server" and r.levelno == logging.WARNING for r in caplog.records)


def test_decorated_calls_report_run_replay_release_and_mismatch(client: redis.Redis, events: Recorder) -> None:
    """A decorated call ends in one call event: claimed, completed (replay), released (it raised), payload_mismatch."""
    runs: Counter[str] = Counter()
    namespace = unique("ns")

    @idempotent(client, key=lambda order, amount: order, namespace=namespace)
    def charge(order: str, amount: int) -> int:
        runs[order] += 1
        if amount < 0:
            raise ValueError("negative")
        return amount

    assert charge("a", 5) == 5
    assert charge("a", 5) == 5
    with pytest.raises(PayloadMismatchError):
        charge("a", 6)
    with pytest.raises(ValueError, match="negative"):
        charge("b", -1)
    assert runs == {"a": 1, "b": 1}  # exactly once for "a"
    calls = events.of("call")
    assert [(e.key, e.outcome) for e in calls] == [
        ("a", "claimed"),
        ("a", "completed"),
        ("a", "payload_mismatch"),
        ("b", "released"),
    ]
    assert all(e.namespace == namespace for e in calls)
    assert isinstance(calls[3].error, ValueError)
    assert isinstance(calls[2].error, PayloadMismatchError)


def test_decorated_duplicate_waits_and_reports_waited_completed(client: redis.Redis, events: Recorder) -> None:
    """A duplicate that arrives while the first call runs ends waited_completed; the function ran once."""
    runs = Counter[str]()
    started = threading.Event()

    @idempotent(client, key="order", namespace=unique("ns"), wait=20)
    def slow(order: str) -> str:
        runs[order] += 1
        started.set()
        time.sleep(0.5)
        return "ok"

    first = threading.Thread(target=slow, args=("x",))
    first.start()
    assert started.wait(10)
    assert slow("x") == "ok"
    first.join()
    assert runs["x"] == 1
    assert sorted(events.outcomes("call", "x")) == ["claimed", "waited_completed"]


def test_renewals_report_claimed_then_lease_lost(client: redis.Redis, events: Recorder) -> None:
    """Each keep-alive renewal ends in a renew event; one that finds the claim taken reports lease_lost."""
    key = unique()
    claim = Claim(client, key, lease=3)
    claim.acquire()
    with claim.keep_alive(interval=0.1) as keeper:
        deadline = time.monotonic() + 10
        while len(events.of("renew", key)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        client.set(claim.claim_key, "someone-else")  # an operator reassigned it
        while not keeper.lost and time.monotonic() < deadline:
            time.sleep(0.02)
    outcomes = events.outcomes("renew", key)
    assert keeper.lost
    assert outcomes[-1] == "lease_lost"
    assert outcomes[:-1] == ["claimed"] * keeper.renewals


def test_async_operations_and_calls_report_the_same(redis_standalone: RedisProcess, events: Recorder) -> None:
    """AsyncClaim and an async decorated call emit the same events as their sync twins."""
    runs = Counter[str]()

    async def main() -> None:
        client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port)
        try:
            key = unique()
            claim = AsyncClaim(client, key)
            assert isinstance(await claim.acquire(), Claimed)
            await claim.complete(b"v")
            assert isinstance(await AsyncClaim(client, key).acquire(), Completed)

            @idempotent(client, key="item", namespace=unique("ns"))
            async def work(item: str) -> str:
                runs[item] += 1
                return item

            assert await work("q") == "q"
            assert await work("q") == "q"
            assert events.outcomes("acquire", key) == ["claimed", "completed"]
            assert events.outcomes("complete", key) == ["completed"]
        finally:
            await client.aclose()

    asyncio.run(main())
    assert runs["q"] == 1
    assert events.outcomes("call", "q") == ["claimed", "completed"]


def test_a_listener_that_raises_is_logged_and_never_propagated(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing listener is logged on goblin_claim.events; the operation and the other listeners go on."""
    seen = Recorder()

    def broken(event: _events.Event) -> None:
        raise RuntimeError("listener bug")

    goblin_claim.add_listener(broken)
    goblin_claim.add_listener(seen)
    try:
        with caplog.at_level(logging.ERROR, logger="goblin_claim.events"):
            assert isinstance(Claim(client, unique()).acquire(), Claimed)
    finally:
        goblin_claim.remove_listener(broken)
        goblin_claim.remove_listener(seen)
    assert len(seen.events) == 1
    assert [r.name for r in caplog.records] == ["goblin_claim.events"]
    assert caplog.records[0].exc_info is not None


def test_removing_the_last_listener_turns_events_off(client: redis.Redis) -> None:
    """add_listener twice keeps one; remove_listener stops the calls and clears the enabled flag."""
    seen = Recorder()
    goblin_claim.add_listener(seen)
    goblin_claim.add_listener(seen)
    Claim(client, unique()).acquire()
    goblin_claim.remove_listener(seen)
    goblin_claim.remove_listener(seen)  # harmless
    Claim(client, unique()).acquire()
    assert len(seen.events) == 1
    assert _events.enabled is False
    with pytest.raises(TypeError):
        goblin_claim.add_listener("not callable")  # type: ignore[arg-type]


def test_cluster_operations_report_like_standalone(redis_cluster: list[RedisProcess], events: Recorder) -> None:
    """On a 3-primary cluster the same operations end in the same events."""
    client = redis.cluster.RedisCluster(host=HOST, port=redis_cluster[0].port)
    try:
        key = unique()
        claim = Claim(client, key)
        claim.acquire()
        claim.complete(b"v")
        Claim(client, key).acquire()
        assert events.outcomes("acquire", key) == ["claimed", "completed"]
        assert events.outcomes("complete", key) == ["completed"]
    finally:
        client.close()


HOLDER = """
import sys, time, redis
from goblin_claim import Claim
claim = Claim(redis.Redis(host=sys.argv[1], port=int(sys.argv[2])), sys.argv[3], lease=2)
print(type(claim.acquire()).__name__, flush=True)
time.sleep(60)
"""


def test_a_killed_owner_is_taken_over_once(client: redis.Redis, events: Recorder) -> None:
    """An owner process killed with SIGKILL: exactly one of four waiters takes over, reported taken_over."""
    key = unique()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, HOST, str(client.connection_pool.connection_kwargs["port"]), key],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "Claimed"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        results: list[object] = []

        def waiter() -> None:
            try:
                results.append(Claim(client, key, lease=30).wait(timeout=5))
            except StillInFlightError as exc:
                results.append(exc)

        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.1)
        for thread in threads:
            thread.join(30)
        # The winner never completes: the others time out or are still in flight.
        assert sum(isinstance(r, Claimed) for r in results) == 1
        assert events.outcomes("wait", key).count("taken_over") == 1
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_the_middleware_hook_reports_a_request(client: redis.Redis, events: Recorder) -> None:
    """observing("request", claim) ends in one request event with the outcome the middleware noted."""
    claim = Claim(client, unique())
    with _events.observing("request", claim) as op:
        op.note(Completed(key=claim.key, value=b"v"))
    with pytest.raises(PayloadMismatchError), _events.observing("request", claim):
        raise PayloadMismatchError("other body", key=claim.key)
    assert events.outcomes("request", claim.key) == ["completed", "payload_mismatch"]


def test_the_middleware_hook_costs_nothing_unobserved(client: redis.Redis) -> None:
    """With nothing observing, observing() hands back the shared do-nothing context, and no event is made."""
    claim = Claim(client, unique())
    with _events.observing("request", claim) as op:
        op.note(Completed(key=claim.key, value=b"v"))
    assert op is _events.observing("request", claim)
    assert not op


def test_a_request_takes_the_outcome_of_the_claim_operations_inside_it(client: redis.Redis, events: Recorder) -> None:
    """Wrapped around a request, observing() reports the outcome its acquire() or wait() came to, once."""
    key = unique()
    owner = Claim(client, key)
    with _events.observing("request", owner):
        owner.acquire()
    owner.complete(b"v")
    duplicate = Claim(client, key)
    with _events.observing("request", duplicate):
        duplicate.acquire()
    assert events.outcomes("request", key) == ["claimed", "completed"]
    assert events.outcomes("acquire", key) == ["claimed", "completed"]


def test_the_asgi_and_wsgi_middlewares_end_each_keyed_request_in_one_event(
    redis_standalone: RedisProcess, events: Recorder
) -> None:
    """A first request, its replay and a reused key with another body: request events claimed, completed, mismatch."""
    from goblin_claim.asgi import IdempotencyMiddleware as AsgiMiddleware
    from goblin_claim.wsgi import IdempotencyMiddleware as WsgiMiddleware

    runs = Counter[str]()

    def wsgi_app(environ: dict[str, object], start_response: object) -> list[bytes]:
        runs["wsgi"] += 1
        start_response("201 Created", [("content-type", "text/plain")])  # type: ignore[operator]
        return [b"made"]

    async def asgi_app(scope: dict[str, object], receive: object, send: object) -> None:
        runs["asgi"] += 1
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"made"})  # type: ignore[operator]

    def wsgi_call(middleware: WsgiMiddleware, key: str, body: bytes) -> str:
        import io

        status: list[str] = []
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "QUERY_STRING": "", "CONTENT_TYPE": "text/plain",
            "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body), "HTTP_IDEMPOTENCY_KEY": key,
        }  # fmt: skip
        b"".join(middleware(environ, lambda s, h, e=None: status.append(s)))  # type: ignore[arg-type]
        return status[0]

    async def asgi_call(middleware: AsgiMiddleware, key: str, body: bytes) -> int:
        sent: list[dict[str, object]] = []
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, object]:
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {
            "type": "http", "method": "POST", "path": "/orders", "query_string": b"",
            "headers": [(b"idempotency-key", key.encode()), (b"content-type", b"text/plain")],
        }  # fmt: skip
        await middleware(scope, receive, send)
        return int(sent[0]["status"])  # type: ignore[call-overload]

    sync_client = redis_standalone.client()
    wsgi = WsgiMiddleware(wsgi_app, client=sync_client, namespace=unique("ev-wsgi"))
    key = unique("req")
    statuses = [wsgi_call(wsgi, key, b"a"), wsgi_call(wsgi, key, b"a"), wsgi_call(wsgi, key, b"b")]
    assert [status.split()[0] for status in statuses] == ["201", "201", "422"]
    assert runs["wsgi"] == 1
    wsgi_outcomes = [e.outcome for e in events.of("request")]

    async def asgi_main() -> None:
        client = redis.asyncio.Redis(host=HOST, port=redis_standalone.port)
        asgi = AsgiMiddleware(asgi_app, client=client, namespace=unique("ev-asgi"))
        try:
            assert [await asgi_call(asgi, key, b"a"), await asgi_call(asgi, key, b"a")] == [201, 201]
            assert await asgi_call(asgi, key, b"b") == 422
        finally:
            await client.aclose()

    asyncio.run(asgi_main())
    sync_client.close()
    assert runs["asgi"] == 1
    assert wsgi_outcomes == ["claimed", "completed", "payload_mismatch"]
    assert [e.outcome for e in events.of("request")][3:] == ["claimed", "completed", "payload_mismatch"]


def test_the_flask_door_ends_each_keyed_request_in_one_event(redis_standalone: RedisProcess, events: Recorder) -> None:
    """Under Flask, a first request and its replay end in request events claimed and completed; the view ran once."""
    flask = pytest.importorskip("flask") if not os.environ.get("CI") else __import__("flask")
    from goblin_claim.flask import Idempotency

    app = flask.Flask(__name__)
    runs = Counter[str]()

    @app.post("/orders")
    def orders() -> tuple[str, int]:
        runs["flask"] += 1
        return "made", 201

    client = redis_standalone.client()
    Idempotency(app, client=client, namespace=unique("ev-flask"))
    key = unique("req")
    with app.test_client() as http:
        answers = [http.post("/orders", data=b"a", headers={"Idempotency-Key": key}) for _ in range(2)]
    client.close()
    assert [answer.status_code for answer in answers] == [201, 201]
    assert runs["flask"] == 1
    assert events.outcomes("request") == ["claimed", "completed"]
