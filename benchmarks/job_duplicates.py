"""How soon a job queue answers a duplicate once the first copy finishes: Celery, RQ, Dramatiq, arq.

Each trial sends a charge (a 30 s lease, 0.3 s of work) to real workers on a redis-server
of this script's own, then, while it runs, a duplicate of it. The duplicate waits for the
first copy in its worker slot and is woken by its completion. The figure is the time from
the first copy's function returning to the duplicate's job finishing in its worker (each
queue's own record: Celery's task_postrun, RQ's ended_at, Dramatiq's after_process_message,
arq's finish_time), beside the first copy's own finish, over the same interval. Without the
wait, the duplicate would come back when the lease left ran out, about 30 s later.

    python benchmarks/job_duplicates.py [--trials 20] [--queues celery,rq,dramatiq,arq]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import servers
from tests.support.apps.jobs.common import marked
from tests.support.queue_workers import Worker, charges, first_pid, python, wait_until

WORK = 0.3  # seconds the first copy's charge takes
ANSWER_TIMEOUT = 15.0  # well short of the 30 s lease: a duplicate sent back for later fails the trial


class Trial(NamedTuple):
    """One trial's instants (Unix time) and how long the duplicate took from being sent."""

    first_finished: float
    duplicate_started: float
    duplicate_finished: float
    answered_in: float


def _utc(moment: datetime.datetime | None) -> float:
    assert moment is not None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).timestamp()


def _marked_trial(
    data: redis.Redis,
    event: str,
    send: Callable[[str, int], Any],
    result: Callable[[Any], Any],
    job_id: Callable[[Any], str],
) -> Trial:
    """One trial on a queue whose instants its app marks (Celery, Dramatiq): ``send`` a charge, then its duplicate."""
    first = send(event, 5)
    first_pid(data, event)
    sent = time.monotonic()
    duplicate = send(event, 5)
    assert result(duplicate) == result(first)
    answered_in = time.monotonic() - sent
    return Trial(
        marked(data, "finished", job_id(first)), marked(data, "started", job_id(duplicate)),
        marked(data, "finished", job_id(duplicate)), answered_in,
    )  # fmt: skip


@contextlib.contextmanager
def _celery(env: dict[str, str], logs: Path, data: redis.Redis) -> Iterator[Callable[[str], Trial]]:
    app = importlib.import_module("tests.support.apps.jobs.celery_app")
    argv = python(
        "-m", "celery", "-A", "tests.support.apps.jobs.celery_app", "worker", "-P", "prefork", "-c", "2",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO", "-n", "bench@%h",
    )  # fmt: skip
    worker = Worker(argv, env, logs / "celery.log")
    try:
        worker.wait_for_log("ready.")

        def result(message: Any) -> Any:
            return message.get(timeout=ANSWER_TIMEOUT)

        yield lambda event: _marked_trial(data, event, app.charge30.delay, result, lambda message: message.id)
    finally:
        worker.stop()
        app.app.close()


@contextlib.contextmanager
def _rq(env: dict[str, str], logs: Path, data: redis.Redis) -> Iterator[Callable[[str], Trial]]:
    from rq import Queue
    from rq.job import Job, JobStatus
    from rq.serializers import JSONSerializer

    from tests.support.apps.jobs.rq_jobs import charge30

    def argv(n: int) -> list[str]:
        return python(
            "-m", "rq.cli", "worker", "--url", env["GC_JOBS_REDIS_URL"], "--serializer",
            "rq.serializers.JSONSerializer", "--name", f"bench-{n}-{os.getpid()}", "default",
        )  # fmt: skip

    workers = [Worker(argv(n), env, logs / f"rq-{n}.log") for n in (1, 2)]
    try:
        for made in workers:
            made.wait_for_log("Listening on")
        queue = Queue(connection=data, serializer=JSONSerializer)

        def finished(job: Job) -> bool:
            status = job.get_status(refresh=True)
            assert status != JobStatus.FAILED
            return status == JobStatus.FINISHED

        def trial(event: str) -> Trial:
            first = queue.enqueue(charge30, event, 5)
            first_pid(data, event)
            sent = time.monotonic()
            duplicate = queue.enqueue(charge30, event, 5)
            for job in (duplicate, first):
                wait_until(lambda job=job: finished(job), ANSWER_TIMEOUT, f"job {job.id}")
            answered_in = time.monotonic() - sent
            assert duplicate.return_value(refresh=True) == first.return_value(refresh=True)
            duplicate.refresh()
            first.refresh()
            return Trial(_utc(first.ended_at), _utc(duplicate.started_at), _utc(duplicate.ended_at), answered_in)

        yield trial
    finally:
        for made in workers:
            made.stop()


@contextlib.contextmanager
def _dramatiq(env: dict[str, str], logs: Path, data: redis.Redis) -> Iterator[Callable[[str], Trial]]:
    app = importlib.import_module("tests.support.apps.jobs.dramatiq_app")
    worker = Worker(
        python("-m", "dramatiq", "tests.support.apps.jobs.dramatiq_app", "--processes", "1", "--threads", "2"),
        env,
        logs / "dramatiq.log",
    )
    try:
        worker.wait_for_log("is ready for action")

        def result(message: Any) -> Any:
            return message.get_result(backend=app.backend, block=True, timeout=int(ANSWER_TIMEOUT * 1000))

        yield lambda event: _marked_trial(data, event, app.charge30.send, result, lambda message: message.message_id)
    finally:
        worker.stop()
        app.broker.close()


@contextlib.contextmanager
def _arq(env: dict[str, str], logs: Path, data: redis.Redis) -> Iterator[Callable[[str], Trial]]:
    import warnings

    from arq import create_pool

    # arq 0.28 passes redis-py an argument redis-py 6+ deprecates (arq pins redis<6).
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    app = importlib.import_module("tests.support.apps.jobs.arq_app")
    worker = Worker(python("-m", "arq", "tests.support.apps.jobs.arq_app.WorkerSettings"), env, logs / "arq.log")
    try:
        worker.wait_for_log("Starting worker")

        async def go(event: str) -> Trial:
            pool = await create_pool(
                app.redis_settings(), job_serializer=app.WorkerSettings.job_serializer, job_deserializer=json.loads
            )
            try:
                first = await pool.enqueue_job("charge30", event, 5)
                await asyncio.to_thread(first_pid, data, event)
                sent = time.monotonic()
                duplicate = await pool.enqueue_job("charge30", event, 5)
                assert first is not None
                assert duplicate is not None
                answers = [await job.result(timeout=ANSWER_TIMEOUT, poll_delay=0.01) for job in (duplicate, first)]
                answered_in = time.monotonic() - sent
                assert answers[0] == answers[1]
                one, two = await first.result_info(), await duplicate.result_info()
                assert one is not None
                assert two is not None
                return Trial(
                    one.finish_time.timestamp(), two.start_time.timestamp(), two.finish_time.timestamp(), answered_in
                )
            finally:
                await pool.aclose()

        yield lambda event: asyncio.run(go(event))
    finally:
        worker.stop()


QUEUES = {"celery": _celery, "rq": _rq, "dramatiq": _dramatiq, "arq": _arq}


def main() -> None:
    """Run the trials per queue and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--queues", default=",".join(QUEUES))
    args = parser.parse_args()
    binary = servers.redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server not found: run `make test` once")
    print(f"first copy's function returned -> job finished in its worker, {args.trials} trials, milliseconds")
    print(f"(30 s lease, {WORK} s of work; a duplicate sent back for the lease left would take about 30 s)")
    with servers.standalone(binary) as server, tempfile.TemporaryDirectory() as logs:
        url = f"redis://{servers.HOST}:{server.port}/0"
        env = {"GC_JOBS_REDIS_URL": url}
        os.environ.update(env)  # the apps read it at import
        data = redis.Redis.from_url(url)
        for name in args.queues.split(","):
            gaps: list[float] = []
            own: list[float] = []
            answered: list[float] = []
            with QUEUES[name](env, Path(logs), data) as trial:
                for n in range(args.trials):
                    event = f"bench-{name}-{n}"
                    data.set(f"pause:before:{event}", WORK)
                    result = trial(event)
                    returned = float(data.lindex(f"returned:{event}", 0))
                    assert charges(data, event) == 1, "the duplicate ran the work"
                    assert result.duplicate_started < returned, "the duplicate started after the first finished"
                    gaps.append((result.duplicate_finished - returned) * 1000)
                    own.append((result.first_finished - returned) * 1000)
                    answered.append(result.answered_in)
            print(
                f"  {name:9s} duplicate median {statistics.median(gaps):5.1f}  max {max(gaps):6.1f}"
                f"   | first copy median {statistics.median(own):5.1f}  max {max(own):6.1f}"
                f"   | duplicate sent -> answered, max {max(answered):.2f} s"
            )
        data.close()


if __name__ == "__main__":
    main()
