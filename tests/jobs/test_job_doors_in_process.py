"""The job doors in process, on fakeredis: Celery eagerly, Dramatiq on a StubBroker, arq as arq calls it, FastStream.

Also taskiq on its in-memory broker, and Huey's deliveries through ``huey.execute``.

Their option checks, a task that fails for good under enqueue_once, the in-flight
retry of an arq job without a job id, an arq job cancelled when its claim is lost, and an
interrupted key acked (or raised to a direct caller) under at_most_once; FastStream's handler under
its test broker.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
import time
from typing import Any

import pytest

from goblin_claim import (
    AsyncClaim,
    Claim,
    Claimed,
    ClaimLostError,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    StillInFlightError,
    current_claim,
)
from goblin_claim._events import key_digest
from goblin_claim.testing import fake_async_redis, fake_redis
from tests.conftest import unique

celery = pytest.importorskip("celery")
dramatiq = pytest.importorskip("dramatiq")
arq = pytest.importorskip("arq")
pytest.importorskip("faststream")
pytest.importorskip("taskiq")
pytest.importorskip("huey")

from dramatiq.brokers.stub import StubBroker  # noqa: E402
from faststream import Logger  # noqa: E402
from faststream.exceptions import AckMessage, NackMessage  # noqa: E402
from faststream.redis import RedisBroker, TestRedisBroker  # noqa: E402

import goblin_claim.dramatiq  # noqa: E402
from goblin_claim.arq import idempotent_job  # noqa: E402
from goblin_claim.celery import IdempotentTask  # noqa: E402
from goblin_claim.faststream import idempotent_handler  # noqa: E402


def eager_app() -> Any:
    """A Celery app that runs each task in the caller, as ``task_always_eager`` does in tests."""
    app = celery.Celery(unique("app"), broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    return app


# --------------------------------------------------------------------------- Celery


def test_a_task_that_fails_for_good_clears_its_enqueue_once_marker() -> None:
    """enqueue_once: a task that raises (no retry) deletes its first-message marker, so delay() sends it again."""
    app, client, runs = eager_app(), fake_redis(native=False), []
    name = unique("tasks.flaky")

    @app.task(base=IdempotentTask, name=name, idempotency={"client": client, "key": "event_id", "enqueue_once": True})
    def flaky(event_id: str) -> str:
        runs.append(event_id)
        if len(runs) == 1:
            raise ValueError("downstream refused")
        return f"charged {event_id}"

    marker = Claim(client, "evt-1", namespace=name).claim_key + ":task"
    first = flaky.delay("evt-1")
    assert first.state == "FAILURE"
    assert client.get(marker) is None  # cleared: the key may be sent again
    again = flaky.delay("evt-1")
    assert again.id != first.id
    assert again.get() == "charged evt-1"
    assert client.get(marker) == again.id.encode()
    assert runs == ["evt-1", "evt-1"]


def test_enqueue_once_sends_its_own_message_again_and_keeps_a_newer_marker() -> None:
    """The first message sent again (same id) goes out and replays; a failure of another id leaves the marker."""
    app, client, runs = eager_app(), fake_redis(native=False), []
    name = unique("tasks.once")

    @app.task(base=IdempotentTask, name=name, idempotency={"client": client, "key": "event_id", "enqueue_once": True})
    def once(event_id: str) -> str:
        runs.append(event_id)
        return f"done {event_id}"

    first = once.delay("evt-2")
    again = once.apply_async(("evt-2",), task_id=first.id)  # a redelivery of the first message
    assert again.id == first.id
    assert again.get() == "done evt-2"
    assert runs == ["evt-2"]
    marker = Claim(client, "evt-2", namespace=name).claim_key + ":task"
    once.on_failure(ValueError("x"), "another-id", ("evt-2",), {}, None)
    assert client.get(marker) == first.id.encode()  # not that message's marker: kept


def test_a_task_that_raises_without_enqueue_once_runs_again_on_the_next_message() -> None:
    """Without enqueue_once a failed task leaves no marker, and its claim is released: the next message runs."""
    app, client, runs = eager_app(), fake_redis(native=False), []
    name = unique("tasks.retry")

    @app.task(base=IdempotentTask, name=name, idempotency={"client": client, "key": "event_id"})
    def retried(event_id: str) -> str:
        runs.append(event_id)
        if len(runs) == 1:
            raise ValueError("downstream refused")
        return f"charged {event_id}"

    assert retried.delay("evt-6").state == "FAILURE"
    assert retried.delay("evt-6").get() == "charged evt-6"
    assert runs == ["evt-6", "evt-6"]
    assert client.exists(Claim(client, "evt-6", namespace=name).claim_key + ":task") == 0


@pytest.mark.parametrize(
    ("idempotency", "error", "said"),
    [
        (["key"], InvalidArgumentTypeError, "idempotency options must be a dict, not list"),
        ({"lease": 30}, InvalidArgumentError, "idempotency options need key="),
    ],
)
def test_a_tasks_idempotency_options_are_checked_when_it_first_runs(
    idempotency: Any, error: type[Exception], said: str
) -> None:
    """Options that are not a dict, or lack key=: the task's first run raises, naming the task."""
    app = eager_app()
    name = unique("tasks.bad")

    @app.task(base=IdempotentTask, name=name, idempotency=idempotency)
    def bad(event_id: str) -> str:
        return event_id

    with pytest.raises(error, match=f"task {name}: {said}"):
        bad("evt-3")


# --------------------------------------------------------------------------- Dramatiq


def test_an_actor_without_idempotency_is_left_as_declared() -> None:
    """Under the Idempotency middleware, an actor declared without ``idempotency`` runs every message."""
    broker = StubBroker()
    broker.add_middleware(goblin_claim.dramatiq.Idempotency(fake_redis(native=False)))
    runs: list[str] = []

    @dramatiq.actor(broker=broker, actor_name=unique("plain"))
    def plain(event_id: str) -> None:
        runs.append(event_id)

    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    try:
        plain.send("evt-4")
        plain.send("evt-4")
        broker.join(plain.queue_name)
        worker.join()
    finally:
        worker.stop()
    assert runs == ["evt-4", "evt-4"]


# --------------------------------------------------------------------------- arq


def test_arq_refuses_a_plain_def() -> None:
    """Arq runs coroutine functions: decorating a plain def raises TypeError naming it."""
    with pytest.raises(TypeError, match=r"arq runs coroutine functions: .*charge is not an async def"):

        @idempotent_job(key="event_id")
        def charge(ctx: dict[str, Any], event_id: str) -> str:
            return event_id


def test_arq_job_in_flight_without_a_job_id_asks_arq_to_retry_later() -> None:
    """Called with a context that has no job_id while the key is held: arq's Retry, with the holder's lease left."""

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        ns = unique("arq")
        runs: list[str] = []

        @idempotent_job(key="event_id", namespace=ns, wait=0, lease=30)
        async def charge(ctx: dict[str, Any], event_id: str) -> str:
            runs.append(event_id)
            return event_id

        assert isinstance(await AsyncClaim(client, "evt-5", namespace=ns, lease=30).acquire(), Claimed)
        with pytest.raises(arq.worker.Retry) as retry:
            await charge({"redis": client}, "evt-5")
        assert 0 < retry.value.defer_score <= 31_000
        assert runs == []
        await client.aclose()

    asyncio.run(scenario())


def test_an_arq_job_whose_claim_is_lost_is_cancelled_and_raises_claim_lost() -> None:
    """The key taken by another token mid-job: the job is cancelled before its side effect; arq gets ClaimLostError."""

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        ns = unique("arq-lost")
        started = asyncio.Event()
        effects: list[str] = []
        seen: list[str] = []

        @idempotent_job(key="event_id", namespace=ns, lease=2, wait=0)
        async def charge(ctx: dict[str, Any], event_id: str) -> str:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            effects.append(event_id)
            return event_id

        job = asyncio.ensure_future(charge({"redis": client, "job_id": "j-1", "job_try": 1}, "evt-6"))
        await asyncio.wait_for(started.wait(), 10)
        claim_key = AsyncClaim(client, "evt-6", namespace=ns).claim_key
        await client.set(claim_key, "another-worker", ex=30)  # its lease lapsed and another worker took it
        with pytest.raises(ClaimLostError, match="was cancelled"):
            await asyncio.wait_for(job, 10)
        assert seen == ["cancelled"]
        assert effects == []
        assert await client.get(claim_key) == b"another-worker"  # left to its new owner
        await client.aclose()

    asyncio.run(scenario())


def test_a_job_function_must_take_the_context_first() -> None:
    """An arq function without a first positional parameter is refused: arq passes the job's context there."""
    with pytest.raises(InvalidArgumentTypeError, match="must take the job's context as its first parameter"):

        @idempotent_job(key="event_id", client=fake_async_redis(native=False))
        async def charge(*, event_id: str) -> str:
            return event_id


# --------------------------------------------------------------------------- at most once, every door


def _interrupted(client: Any, namespace: str, key: str) -> None:
    """Leave ``key`` as a killed at-most-once owner leaves it: claimed, never completed, its 1 s lease over."""
    assert isinstance(Claim(client, key, namespace=namespace, lease=1, at_most_once=True).acquire(), Claimed)
    time.sleep(1.1)


def test_dramatiq_acks_an_interrupted_key_without_running_the_actor(caplog: pytest.LogCaptureFixture) -> None:
    """An at-most-once actor's message for an interrupted key is acked, not run nor retried, and logged by digest."""
    broker = StubBroker()
    client = fake_redis(native=False)
    broker.add_middleware(goblin_claim.dramatiq.Idempotency(client))
    runs: list[str] = []
    name = unique("once")

    @dramatiq.actor(broker=broker, actor_name=name, idempotency={"key": "event_id", "at_most_once": True})
    def once(event_id: str) -> None:
        runs.append(event_id)

    _interrupted(client, name, "evt-7")
    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="goblin_claim.dramatiq"):
            once.send("evt-7")
            broker.join(once.queue_name, fail_fast=True)
            worker.join()
    finally:
        worker.stop()
    assert runs == []
    [record] = [r for r in caplog.records if r.name == "goblin_claim.dramatiq"]
    assert record.levelno == logging.WARNING
    assert record.key_digest == key_digest("evt-7")  # type: ignore[attr-defined]
    assert f"key {key_digest('evt-7')} of {name}" in record.getMessage()
    assert "evt-7" not in record.getMessage()


def test_arq_completes_an_interrupted_job_and_raises_to_a_direct_caller(caplog: pytest.LogCaptureFixture) -> None:
    """An at-most-once arq job on an interrupted key returns None in a worker (logged); called bare, it raises."""

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        ns = unique("arq")
        runs: list[str] = []

        @idempotent_job(key="event_id", namespace=ns, wait=0, at_most_once=True)
        async def charge(ctx: dict[str, Any], event_id: str) -> str:
            runs.append(event_id)
            return event_id

        held = AsyncClaim(client, "evt-8", namespace=ns, lease=1, at_most_once=True)
        assert isinstance(await held.acquire(), Claimed)
        await asyncio.sleep(1.1)
        with caplog.at_level(logging.WARNING, logger="goblin_claim.arq"):
            assert await charge({"redis": client, "job_id": "j1"}, "evt-8") is None
        with pytest.raises(InterruptedWorkError):
            await charge({"redis": client}, "evt-8")
        assert runs == []
        await client.aclose()

    asyncio.run(scenario())
    acked = [r.name for r in caplog.records if "acked without running the work" in r.getMessage()]
    assert acked == ["goblin_claim.arq"]


def test_an_eager_celery_task_on_an_interrupted_key_raises_to_its_caller() -> None:
    """Run eagerly (no delivery to ack), an at-most-once task on an interrupted key raises InterruptedWorkError."""
    app, client, runs = eager_app(), fake_redis(native=False), []
    name = unique("tasks.once")

    @app.task(base=IdempotentTask, name=name, idempotency={"client": client, "key": "event_id", "at_most_once": True})
    def once(event_id: str) -> str:
        runs.append(event_id)
        return event_id

    _interrupted(client, name, "evt-9")
    with pytest.raises(InterruptedWorkError):
        once.apply(("evt-9",), throw=True)
    assert runs == []


# --------------------------------------------------------------------------- FastStream


def test_faststream_handler_publishes_the_first_answer_to_a_duplicate() -> None:
    """Under FastStream's test broker, a duplicate runs nothing and its handler publishes the first answer again."""
    client = fake_async_redis(native=False)
    broker = RedisBroker()
    publisher, stream = broker.publisher(stream=unique("receipts")), unique("charges")
    runs: list[str] = []

    @broker.subscriber(stream=stream)
    @publisher
    # The logger is injected by FastStream: the fingerprint names the body's parameters alone.
    @idempotent_handler(client, key="event_id", namespace=unique("fs"), fingerprint=("event_id", "amount"))
    async def charge(event_id: str, amount: int, logger: Logger) -> dict[str, Any]:
        runs.append(event_id)
        return {"event_id": event_id, "charge_number": len(runs)}

    async def scenario() -> list[Any]:
        async with TestRedisBroker(broker) as test_broker:
            for _ in range(2):
                await test_broker.publish({"event_id": "evt-10", "amount": 5}, stream=stream)
            published = [call.args[0] for call in publisher.mock.call_args_list]  # read under the test broker
        await client.aclose()
        return published

    assert asyncio.run(scenario()) == [{"event_id": "evt-10", "charge_number": 1}] * 2
    assert runs == ["evt-10"]


def test_faststream_in_flight_nacks_and_interrupted_acks(caplog: pytest.LogCaptureFixture) -> None:
    """In flight past the wait: NackMessage; an interrupted at-most-once key: AckMessage, logged. Neither runs."""
    client, ns, runs = fake_redis(native=False), unique("fs"), []

    @idempotent_handler(client, key="event_id", namespace=ns, wait=0, at_most_once=True)
    def charge(event_id: str) -> str:  # a def handler (FastStream runs it in a thread), on a sync client
        runs.append(event_id)
        return event_id

    assert isinstance(Claim(client, "evt-11", namespace=ns, lease=30, at_most_once=True).acquire(), Claimed)
    with pytest.raises(NackMessage) as nacked:
        charge("evt-11")
    assert isinstance(nacked.value.__cause__, StillInFlightError)
    _interrupted(client, ns, "evt-12")
    with caplog.at_level(logging.WARNING, logger="goblin_claim.faststream"), pytest.raises(AckMessage) as acked:
        charge("evt-12")
    assert isinstance(acked.value.__cause__, InterruptedWorkError)
    assert runs == []
    [record] = [r for r in caplog.records if r.name == "goblin_claim.faststream"]
    assert record.key_digest == key_digest("evt-12")  # type: ignore[attr-defined]
    assert charge("evt-13") == "evt-13"
    assert charge.forget("evt-13") is True


def test_faststream_handler_resumes_after_the_checkpoint_of_a_crashed_attempt() -> None:
    """checkpoints=True: the delivery taking over a crashed attempt reads its checkpoint (current_claim) and resumes."""
    client, ns, stored = fake_async_redis(native=False), unique("fs"), []
    broker, stream = RedisBroker(), unique("batches")

    @broker.subscriber(stream=stream)
    @idempotent_handler(client, key="batch_id", namespace=ns, checkpoints=True)
    async def import_batch(batch_id: str, rows: list[str]) -> int:
        claim = current_claim()
        claim.ensure_held()
        for index in range(int(claim.last_checkpoint or 0), len(rows)):
            stored.append(rows[index])
            await claim.checkpoint(str(index + 1))  # an AsyncClaim: its checkpoint is a round trip
        return len(rows)

    async def scenario() -> None:
        crashed = AsyncClaim(client, "b-1", namespace=ns, lease=1, checkpoints=True)
        assert isinstance(await crashed.acquire(), Claimed)
        await crashed.checkpoint("2")  # two rows stored, then the process was killed
        await asyncio.sleep(1.1)
        async with TestRedisBroker(broker) as test_broker:
            await test_broker.publish({"batch_id": "b-1", "rows": ["a", "b", "c"]}, stream=stream)
        await client.aclose()

    asyncio.run(scenario())
    assert stored == ["c"]


def test_faststream_def_handler_replies_to_a_duplicate_request_with_the_first_reply() -> None:
    """A def handler (FastStream's thread pool) on a sync client: two requests, one run, the first reply twice."""
    client, runs = fake_redis(native=False), []
    broker, queue = RedisBroker(), unique("jobs")

    @broker.subscriber(list=queue)
    @idempotent_handler(client, key="event_id", namespace=unique("fs"))
    def charge(event_id: str) -> str:  # one parameter: FastStream hands it the whole body
        runs.append(event_id)
        return f"charged {event_id} (run {len(runs)})"

    async def scenario() -> list[Any]:
        async with TestRedisBroker(broker, connect_only=False) as test_broker:
            return [await (await test_broker.request("evt-14", list=queue)).decode() for _ in range(2)]

    assert asyncio.run(scenario()) == ["charged evt-14 (run 1)"] * 2
    assert runs == ["evt-14"]


# --------------------------------------------------------------------------- taskiq


def test_taskiq_refuses_a_plain_def_and_keeps_the_tasks_parameters() -> None:
    """A plain def is refused; an async def keeps its parameters, plus the keyword taskiq fills with its Context."""
    from taskiq import Context

    from goblin_claim.taskiq import idempotent_task as taskiq_task

    with pytest.raises(TypeError, match=r"goblin_claim.taskiq runs coroutine functions: .*charge is not an async def"):

        @taskiq_task(fake_async_redis(native=False), key="event_id")
        def charge(event_id: str) -> str:
            return event_id

    @taskiq_task(fake_async_redis(native=False), key="event_id")
    async def refund(event_id: str, *rest: int, **extra: str) -> str:
        return event_id

    params = inspect.signature(refund).parameters
    assert list(params) == ["event_id", "rest", "goblin_claim_context", "extra"]  # before **extra: a valid signature
    assert params["goblin_claim_context"].annotation is Context


def test_taskiq_acks_an_interrupted_key_and_raises_to_a_direct_caller(caplog: pytest.LogCaptureFixture) -> None:
    """In-memory broker: an at-most-once delivery of an interrupted key ends None, logged; called directly, raises."""
    from taskiq import InMemoryBroker

    from goblin_claim.taskiq import idempotent_task as taskiq_task

    async def scenario() -> tuple[Any, list[str]]:
        client = fake_async_redis(native=False)
        broker = InMemoryBroker()
        ns = unique("taskiq")
        runs: list[str] = []

        @broker.task(task_name=ns)
        @taskiq_task(client, key="event_id", namespace=ns, wait=0, at_most_once=True)
        async def charge(event_id: str) -> str:
            runs.append(event_id)
            return event_id

        held = AsyncClaim(client, "evt-10", namespace=ns, lease=1, at_most_once=True)
        assert isinstance(await held.acquire(), Claimed)
        await asyncio.sleep(1.1)
        await broker.startup()
        try:
            with caplog.at_level(logging.WARNING, logger="goblin_claim.taskiq"):
                result = await (await charge.kiq("evt-10")).wait_result(timeout=10)
            with pytest.raises(InterruptedWorkError):
                await charge("evt-10")
        finally:
            await broker.shutdown()
            await client.aclose()
        return result, runs

    result, runs = asyncio.run(scenario())
    assert not result.is_err
    assert result.return_value is None
    assert runs == []
    acked = [r.name for r in caplog.records if "acked without running the work" in r.getMessage()]
    assert acked == ["goblin_claim.taskiq"]


def test_a_taskiq_task_called_directly_in_flight_raises_with_the_lease_left() -> None:
    """Called directly (no delivery to send again) while another holds the key: StillInFlightError, nothing runs."""
    from goblin_claim.taskiq import idempotent_task as taskiq_task

    async def scenario() -> None:
        client = fake_async_redis(native=False)
        ns = unique("taskiq")
        runs: list[str] = []

        @taskiq_task(client, key="event_id", namespace=ns, wait=0)
        async def charge(event_id: str) -> str:
            runs.append(event_id)
            return event_id

        assert isinstance(await AsyncClaim(client, "evt-11", namespace=ns, lease=30).acquire(), Claimed)
        with pytest.raises(StillInFlightError) as caught:
            await charge("evt-11")
        assert caught.value.retry_after is not None
        assert 0 < caught.value.retry_after <= 30
        assert runs == []
        await client.aclose()

    asyncio.run(scenario())


# --------------------------------------------------------------------------- Huey


def _fake_huey() -> Any:
    """A RedisHuey on fakeredis, its messages and results as JSON."""
    from huey import RedisHuey

    from tests.support.apps.jobs.huey_app import JSONSerializer

    return RedisHuey(
        unique("huey"), connection_pool=fake_redis(native=False).connection_pool, serializer=JSONSerializer()
    )


def test_huey_needs_a_redis_huey() -> None:
    """A Huey whose storage is not Redis is refused: the copy a killed consumer leaves lives in Redis's schedule."""
    from huey import MemoryHuey

    from goblin_claim.huey import idempotent_task as huey_task

    with pytest.raises(TypeError, match=r"goblin_claim\.huey needs a RedisHuey, not MemoryHuey"):
        huey_task(MemoryHuey(), key="event_id")


def test_a_huey_delivery_keeps_its_copy_only_while_it_runs() -> None:
    """A delivery schedules its copy (same id, due past the lease), takes it back as it ends; an interrupt keeps it."""
    from goblin_claim.huey import idempotent_task as huey_task

    huey = _fake_huey()
    seen: list[int] = []
    stop = {"now": False}

    @huey_task(huey, key="event_id", namespace=unique("huey"), lease=5, huey_options={"name": unique("charge")})
    def charge(event_id: str) -> str:
        seen.append(huey.scheduled_count())
        if stop["now"]:
            raise KeyboardInterrupt  # the consumer stopping mid-task
        return f"charged {event_id}"

    task = charge.s("evt-12")
    assert huey.execute(task) == "charged evt-12"
    assert seen == [1]  # its copy, while it ran
    assert huey.scheduled_count() == 0  # taken back as it ended
    assert huey.result(task.id) == "charged evt-12"

    stop["now"] = True
    stopped = charge.s("evt-13")
    huey.execute(stopped)  # Huey catches the interrupt: the task is not finished
    [left] = huey.scheduled()
    assert left.id == stopped.id
    assert left.args == ["evt-13"]  # the same task, for the next consumer's scheduler
    delay = (left.eta - datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)).total_seconds()
    assert 4 < delay <= 5.1  # just past the 5 s lease


def test_huey_acks_an_interrupted_key_and_call_local_raises(caplog: pytest.LogCaptureFixture) -> None:
    """An at-most-once delivery of an interrupted key completes without running, logged; call_local raises."""
    from goblin_claim.huey import idempotent_task as huey_task

    huey = _fake_huey()
    client = huey.storage.conn
    ns = unique("huey")
    runs: list[str] = []

    @huey_task(huey, key="event_id", namespace=ns, at_most_once=True, huey_options={"name": unique("once")})
    def once(event_id: str) -> str:
        runs.append(event_id)
        return event_id

    _interrupted(client, ns, "evt-14")
    with caplog.at_level(logging.WARNING, logger="goblin_claim.huey"):
        assert huey.execute(once.s("evt-14")) is None
    assert huey.scheduled_count() == 0
    with pytest.raises(InterruptedWorkError):
        once.call_local("evt-14")
    assert runs == []
    acked = [r.name for r in caplog.records if "acked without running the work" in r.getMessage()]
    assert acked == ["goblin_claim.huey"]


def test_a_huey_delivery_in_flight_is_retried_after_the_lease_left_without_spending_a_retry() -> None:
    """A delivery finding the key held raises RetryTask: Huey reschedules the task after the lease left, none spent."""
    from goblin_claim.huey import idempotent_task as huey_task

    huey = _fake_huey()
    ns = unique("huey")

    @huey_task(huey, key="event_id", namespace=ns, wait=0, huey_options={"name": unique("held"), "retries": 1})
    def held(event_id: str) -> str:
        return event_id

    assert isinstance(Claim(huey.storage.conn, "evt-15", namespace=ns, lease=20).acquire(), Claimed)
    task = held.s("evt-15")
    huey.execute(task)
    [again] = huey.scheduled()  # the retry alone: the delivery's own copy was taken back
    assert again.id == task.id
    assert again.retries == 1  # none spent
    delay = (again.eta - datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)).total_seconds()
    assert 15 < delay <= 20.1
