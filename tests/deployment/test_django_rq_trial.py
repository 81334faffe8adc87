"""A Django + RQ service run as a user runs it, under three SIGKILLs, then a late resend pass: every effect once.

The service is ``tests/support/apps/transfers``, built from the manual's pages alone:
gunicorn with two sync workers serving the Django door (``server_errors="store"``) on
``POST /api/transfers``, a webhook whose ``@idempotent`` function is keyed by its event's id
(through ``goblin_claim.django.client``), and a receipt job per transfer enqueued with
``enqueue_once`` and run by ``rq worker`` started with the command the RQ page gives (read
from the page), under a supervisor that starts it again 3 s after it dies. One
redis-server holds the claims, the queue and RQ's results, on an AOF written before each
reply (``appendfsync always``). Every side effect is a row in a sqlite ledger without a
UNIQUE constraint, so work that ran twice shows as two rows.

The load: TRANSFERS transfers and EVENTS events, each delivered SENDS times, the first
delivery of every fifth abandoned by its client (it gives up before the answer). Meanwhile:

1. the whole RQ worker is SIGKILLed mid-job (its process group and its work-horse's), a
   duplicate of the killed job queued behind it; the supervisor starts it again 3 s later;
2. a gunicorn worker is SIGKILLed mid-view, before the view's row (gunicorn starts another; after
   the row the HTTP page's "not guaranteed" applies, which only ``at_most_once`` closes);
3. redis-server is SIGKILLed while a transfer's view sits between its row and its enqueue,
   and restarted on its AOF once that enqueue failed: the view raises, Django answers 500,
   and the door keeps that answer;

and the REFUSED transfers fail after their row (a refused receipt address): 500, kept. Once
every lease has lapsed, every transfer, event and receipt is sent once more (the late pass).

One run, 75 to 95 s here (140 s once, on two cores loaded twice over): RQ's own 60 s before
it hands a dead worker's job back is most of it, and every other wait overlaps it. Then the
checks in turn: one ledger row per transfer, event and receipt; every answer an id ended
with equal to its first, the door's replays marked ``Idempotent-Replayed: true``; no key in
flight at the end (``goblin-claim scan``); every delayed retry back within the RQ page's
bounds, and each job's enqueue-to-end delay measured (the figure printed at the end of the run).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from goblin_claim import Claim
from goblin_claim._http import claim_name
from tests.conftest import IN_CI, server_binary
from tests.support import servers
from tests.support.asgi_server import ROOT, serve_gunicorn
from tests.support.queue_workers import Worker, wait_until

if not IN_CI:  # with CI set, a missing framework fails the module instead of skipping it
    for _needed in ("django", "gunicorn", "rq"):
        pytest.importorskip(_needed)

from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from tests.support.apps.transfers import ledger

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

TRANSFERS = 30
EVENTS = 30
SENDS = 3
ABANDONED = frozenset(range(4, max(TRANSFERS, EVENTS), 5))  # ids whose first delivery is given up on
REFUSED = frozenset({7, 17, 27})  # transfers failing after their row: a refused receipt address
RQ_KILLED, VIEW_KILLED, REDIS_KILLED = "t-00", "t-01", "t-02"  # the transfers the three SIGKILLs meet
SLOW = 0.6  # how long an abandoned delivery's run takes to answer, in seconds
GIVE_UP = 0.2  # its client's timeout
PATIENCE = 20.0  # every other delivery's timeout
RESTART_AFTER = 3.0  # the supervisor's pause before it starts a dead worker again (systemd's RestartSec=3)

SERVICE = "tests.support.apps.transfers"
JOB = f"{SERVICE}.jobs.send_receipt"
# Each claim's namespace: the Django door's default, and @idempotent's (the function's import name).
NAMESPACES = {"door": "goblin-http", "webhook": f"{SERVICE}.views.apply_event", "receipt": JOB}
# A round the duplicate began before the lapse waits no longer than the lease left: it ends by then, give or
# take a poll and the worker storing its Retry.
ROUND_SLACK = 3.0
# A job that can run starts once the worker is free (its previous job's end, or its start): a dequeue, a
# fork and, after a restart, the worker's start-up, on a loaded machine.
IDLE_SLACK = 5.0
RQ_PAGE = ROOT / "docs" / "guides" / "jobs" / "rq.md"

TRANSFER_IDS = [f"t-{n:02}" for n in range(TRANSFERS)]
EVENT_IDS = [f"evt-{n:02}" for n in range(EVENTS)]


def page_worker_command() -> list[str]:
    """The worker command the RQ page gives (its console block), run with this environment's ``rq``."""
    found = re.search(r"```console\n\$ (rq worker .*?)\n```", RQ_PAGE.read_text(), re.DOTALL)
    assert found, "the RQ page no longer shows an `rq worker` command"
    argv = shlex.split(found.group(1).replace("\\\n", " "))
    script = Path(sys.executable).parent / "rq"
    return [str(script), *argv[1:]] if script.exists() else [sys.executable, "-m", "rq.cli", *argv[1:]]


def page_bound() -> int:
    """The seconds within which the RQ page says a job killed with its whole worker is handed back (the suite's)."""
    found = re.search(r"the suite\s+holds it to (\d+) s", RQ_PAGE.read_text())
    assert found, "the RQ page no longer states its bound for a whole worker's death"
    return int(found.group(1))


# --------------------------------------------------------------------------- the fault points


@dataclass
class Points:
    """The service's fault points (``faults.py``), armed, watched and let go from here, through their files."""

    directory: Path

    def arm(self, point: str, key: str) -> None:
        """Arm ``point`` for ``key``: the first process to reach it stops there (or leaves a note)."""
        (self.directory / f"{point}-{key}.armed").touch()

    def reached(self, point: str, key: str) -> int | None:
        """The process that reached ``point`` for ``key``, if one did."""
        with contextlib.suppress(FileNotFoundError):
            return int((self.directory / f"{point}-{key}.pid").read_text())
        return None

    def when(self, point: str, key: str) -> float:
        """When ``point`` was reached for ``key`` (Unix time)."""
        return (self.directory / f"{point}-{key}.pid").stat().st_mtime

    def wait(self, point: str, key: str, timeout: float = 60) -> int:
        """The process that reached ``point`` for ``key``, once one has."""
        pid: int = wait_until(lambda: self.reached(point, key), timeout, f"{point} for {key}")
        return pid

    def release(self, point: str, key: str) -> None:
        """Let the process held at ``point`` for ``key`` go on."""
        (self.directory / f"{point}-{key}.go").touch()

    def release_all(self) -> None:
        """Let every held process go on (a failed run leaves none waiting)."""
        for taken in self.directory.glob("*.taken"):
            taken.with_suffix(".go").touch()


# --------------------------------------------------------------------------- the processes


class Store:
    """The service's one redis-server: an AOF fsynced before each reply; SIGKILLed, then restarted on it."""

    def __init__(self, binary: str) -> None:
        self.server = servers.start_server(binary, "--appendonly", "yes", "--appendfsync", "always")
        self.url = f"redis://{servers.HOST}:{self.server.port}/0"

    def kill(self) -> None:
        """SIGKILL it: nothing written but what its AOF holds."""
        self.server.process.send_signal(signal.SIGKILL)

    def restart(self) -> None:
        """Start it again on its port and directory: it loads its AOF."""
        self.server = servers.restart(self.server)

    def stop(self) -> None:
        """Stop the process of the moment by its PID."""
        self.server.stop()


class Supervisor:
    """Runs the RQ page's worker, and starts it again RESTART_AFTER seconds after it dies (``Restart=always``)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.argv = page_worker_command()
        self.env = env
        self.logs = logs
        self.workers: list[Worker] = []
        self.started: list[float] = []  # when each worker was started
        self.deaths: list[tuple[float, int | None]] = []  # when each died, and its exit status
        self._stopping = threading.Event()
        self._start().wait_for_log("Listening on")
        self._watch = threading.Thread(target=self._run, name="rq supervisor", daemon=True)
        self._watch.start()

    @property
    def current(self) -> Worker:
        """The worker started last (dead, until its restart)."""
        return self.workers[-1]

    def _start(self) -> Worker:
        self.started.append(time.time())
        self.workers.append(Worker(self.argv, self.env, self.logs / f"rq-worker-{len(self.workers)}.log"))
        return self.workers[-1]

    def _run(self) -> None:
        while not self._stopping.wait(0.05):
            status = self.current.process.poll()
            if status is not None:
                self.deaths.append((time.time(), status))
                if self._stopping.wait(RESTART_AFTER):
                    return
                self._start()

    def stop(self) -> None:
        """Stop watching, then stop every worker's process group by its PID."""
        self._stopping.set()
        self._watch.join(timeout=10)
        for worker in self.workers:
            worker.stop()


# --------------------------------------------------------------------------- the clients


@dataclass(frozen=True)
class Got:
    """What one delivery got: ``status`` None when no answer came (the client gave up, the connection was cut)."""

    status: int | None
    body: bytes = b""
    replayed: bool = False
    retry_after: float = 0.5

    @property
    def final(self) -> bool:
        """An answer the request ended with, rather than "try again" (none, 409 in flight, 503)."""
        return self.status is not None and self.status not in (409, 503)


def number(key: str) -> int:
    """An id's number: ``t-07`` is 7."""
    return int(key.rsplit("-", 1)[1])


def request_for(key: str) -> tuple[str, bytes, dict[str, str]]:
    """The path, body and headers of ``key``'s delivery (the same every time)."""
    n = number(key)
    slow = {"slow": SLOW} if n in ABANDONED else {}
    if key.startswith("evt-"):
        event = {"id": key, "type": "transfer.settled", "transfer": f"t-{n:02}", **slow}
        return "/webhooks/events", json.dumps(event).encode(), {"Content-Type": "application/json"}
    email = "payer@refused.invalid" if n in REFUSED else f"payer{n}@example.com"
    transfer = {"id": key, "amount": 100 + n, "email": email, **slow}
    headers = {"Content-Type": "application/json", "Idempotency-Key": f"key-{key}"}
    return "/api/transfers", json.dumps(transfer).encode(), headers


@dataclass
class Sender:
    """The service's clients: every delivery of each id and what it got, in order."""

    url: str
    got: dict[str, list[Got]] = field(default_factory=dict)

    def post(self, key: str, timeout: float = PATIENCE) -> Got:
        """Deliver ``key`` (a transfer ``t-NN`` under its Idempotency-Key, or an event ``evt-NN``) once."""
        path, body, headers = request_for(key)
        try:
            answer = httpx.post(f"{self.url}{path}", content=body, headers=headers, timeout=timeout)
        except httpx.HTTPError:
            got = Got(None)
        else:
            retry = answer.headers.get("retry-after")
            got = Got(
                answer.status_code, answer.content, answer.headers.get("idempotent-replayed") == "true",
                float(retry) if retry else 0.5,
            )  # fmt: skip
        self.got.setdefault(key, []).append(got)
        return got

    def deliver(self, key: str) -> None:
        """SENDS deliveries of ``key``, the first given up on for ABANDONED ids; after "try again", its Retry-After."""
        for send in range(SENDS):
            got = self.post(key, GIVE_UP if send == 0 and number(key) in ABANDONED else PATIENCE)
            if not got.final and send < SENDS - 1:
                time.sleep(got.retry_after)  # the client's pause before its next delivery, as the answer asked

    def until_final(self, key: str, timeout: float = 60) -> None:
        """Deliver ``key`` until it gets an answer it ends with (the late pass)."""
        deadline = time.monotonic() + timeout
        while not (got := self.post(key)).final:
            assert time.monotonic() < deadline, f"{key} never got a final answer: {self.got[key]}"
            time.sleep(got.retry_after)

    def finals(self, key: str) -> list[Got]:
        """The answers ``key``'s deliveries ended with, in order."""
        return [got for got in self.got.get(key, []) if got.final]


# --------------------------------------------------------------------------- what the run left


def scan(url: str, namespace: str) -> tuple[int, list[dict[str, Any]]]:
    """``goblin-claim scan --json`` of ``namespace``, as an operator runs it: its exit status and its keys."""
    done = subprocess.run(
        [sys.executable, "-m", "goblin_claim._cli", "scan", "--json", "--namespace", namespace, "--url", url],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def held(url: str, *names: str) -> list[str]:
    """The keys of the namespaces ``names`` (of NAMESPACES) whose claim is held (in flight) or was interrupted."""
    found = []
    for namespace in [NAMESPACES[name] for name in names]:
        _, keys = scan(url, namespace)
        found += [f"{namespace}: {key['key']} ({key['state']})" for key in keys if key["state"] != "done"]
    return found


def job(client: redis.Redis, job_id: str) -> Job:
    """RQ's job ``job_id`` as it is now."""
    return Job.fetch(job_id, connection=client, serializer=JSONSerializer)


def finished(client: redis.Redis, job_id: str) -> bool:
    """Whether the job ended FINISHED; it never ends FAILED or stopped on the way there."""
    found = job(client, job_id)
    status = found.get_status(refresh=True)
    assert status not in (JobStatus.CANCELED, JobStatus.STOPPED), f"job {job_id} is {status}"
    assert status != JobStatus.FAILED or found.retries_left, f"job {job_id} failed: {found.latest_result()}"
    return status == JobStatus.FINISHED


def all_finished(client: redis.Redis, pending: set[str]) -> bool:
    """Whether every job in ``pending`` finished; those that did are taken out of it (each is asked until then)."""
    pending -= {job_id for job_id in pending if finished(client, job_id)}
    return not pending


def at(moment: datetime.datetime | None) -> float:
    """An RQ timestamp (UTC, naive or not) as Unix time."""
    assert moment is not None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).timestamp()


def left(deadline: float) -> float:
    """The seconds from now until ``deadline`` (Unix time), at least one: a wait already due still looks once."""
    return max(deadline - time.time(), 1.0)


@dataclass(frozen=True)
class Timing:
    """One RQ job's history (Unix times): made, last (re)queued, last started, ended; its retries and run ends."""

    created: float
    enqueued: float
    started: float
    ended: float
    retries: int
    rounds: list[float]  # when each of its in-flight rounds ended (a RETRIED result)
    ends: list[float]  # when each of its runs ended (any result)

    @property
    def requeued(self) -> bool:
        """Whether RQ put it back: a Retry (counted), or the abandoned-job handling (requeued, uncounted)."""
        return self.retries > 0 or self.enqueued > self.created + 1


def timing(client: redis.Redis, job_id: str) -> Timing:
    """Job ``job_id``'s history, as RQ kept it."""
    made = job(client, job_id)
    results = made.results()
    return Timing(
        at(made.created_at), at(made.enqueued_at), at(made.started_at), at(made.ended_at),
        made.number_of_retries or 0, [at(r.created_at) for r in results if r.type == Result.Type.RETRIED],
        [at(r.created_at) for r in results],
    )  # fmt: skip


@dataclass
class Run:
    """What one run of the trial saw and left (times in Unix time; ``*_s`` in seconds since it began)."""

    sender: Sender
    points: Points
    rows: list[tuple[int, str, str]] = field(default_factory=list)  # the ledger: (row id, kind, id)
    scans: dict[str, tuple[int, list[dict[str, Any]]]] = field(default_factory=dict)  # by NAMESPACES' name
    receipts: dict[str, str] = field(default_factory=dict)  # transfer -> the receipt job its 201 named
    resent: dict[str, str] = field(default_factory=dict)  # transfer -> the late pass's receipt job
    duplicate: str = ""  # the killed job's duplicate
    returned: dict[str, Any] = field(default_factory=dict)  # job -> what it returned
    timings: dict[str, Timing] = field(default_factory=dict)  # every job RQ finished
    worker_starts: list[float] = field(default_factory=list)
    worker_deaths: int = 0
    rq_killed_at: float = 0.0
    lapse_at: float = 0.0  # when the killed job's claim lapsed
    view_lapse_at: float = 0.0  # when the killed view's claim lapsed
    view_killed_at: float = 0.0
    redis_killed_at: float = 0.0
    redis_back_at: float = 0.0
    load_s: float = 0.0
    late_s: float = 0.0
    ended_s: float = 0.0


def lapse(client: redis.Redis, killed_at: float, key: str, namespace: str) -> float:
    """When the claim on ``key`` lapses, its holder killed at ``killed_at``: nothing renews it, its TTL runs out."""
    left_ms = client.pttl(Claim(client, key, namespace=namespace).claim_key)
    assert left_ms > 0, f"no claim held on {key} in {namespace}"
    return killed_at + left_ms / 1000


def resend(run: Run, queue: Queue, key: str) -> None:
    """Enqueue transfer ``key``'s receipt again (once), when a delivery of it was answered 201."""
    finals = run.sender.finals(key)
    if key not in run.resent and finals and finals[0].status == 201:
        run.receipts[key] = json.loads(finals[0].body)["receipt_job"]
        run.resent[key] = queue.enqueue(JOB, key, 100 + number(key)).id


def run_trial(binary: str, directory: Path) -> Run:
    """Serve the service, load it, kill its three processes, wait out the leases, send everything again."""
    began = time.monotonic()
    points = Points(directory / "points")
    points.directory.mkdir()
    ledger_path = str(directory / "ledger.sqlite")
    ledger.create(ledger_path)
    bound = page_bound()
    with contextlib.ExitStack() as stack:
        store = Store(binary)
        stack.callback(lambda: store.stop())  # the store of the moment: a restart makes a new process
        env = {
            "REDIS_URL": store.url, "RQ_REDIS_URL": store.url, "TRIAL_DIR": str(points.directory),
            "TRIAL_LEDGER": ledger_path, "DJANGO_SETTINGS_MODULE": f"{SERVICE}.settings",
        }  # fmt: skip
        url = stack.enter_context(serve_gunicorn(f"{SERVICE}.wsgi:application", env=env, worker="sync", workers=2))
        # The RQ worker runs unmeasured: under `make test`'s coverage each job's work-horse would start a
        # measurement of its own (about a second more a job on two loaded cores, for 60 jobs on one worker);
        # tests/jobs/test_rq.py measures the same door's code.
        supervisor = Supervisor({**env, "COVERAGE_PROCESS_CONFIG": "", "COVERAGE_PROCESS_START": ""}, directory)
        stack.callback(supervisor.stop)
        load = stack.enter_context(ThreadPoolExecutor(6, thread_name_prefix="client"))
        faulted = stack.enter_context(ThreadPoolExecutor(3, thread_name_prefix="faulted-client"))
        stack.callback(points.release_all)  # the first thing done on the way out: no process stays held
        client = redis.Redis.from_url(store.url, socket_timeout=5)
        stack.callback(client.close)
        queue = Queue("payments", connection=client, serializer=JSONSerializer)
        run = Run(Sender(url), points)
        for key in TRANSFER_IDS:
            points.arm("enqueue-failed", key)  # a note (no hold) from any view whose enqueue failed after its row

        # 1. The whole RQ worker SIGKILLed mid-job, RQ_KILLED's receipt held before its row; the rest of the
        # load starts meanwhile, and a duplicate of the receipt waits behind it.
        points.arm("job-before-ledger", RQ_KILLED)
        deliveries: list[Future[None]] = [faulted.submit(run.sender.deliver, RQ_KILLED)]
        horse = points.wait("job-before-ledger", RQ_KILLED)
        loaded = itertools.chain.from_iterable(itertools.zip_longest(TRANSFER_IDS[3:], EVENT_IDS))
        deliveries += [load.submit(run.sender.deliver, key) for key in loaded if key is not None]
        run.duplicate = queue.enqueue(JOB, RQ_KILLED, 100).id
        worker = supervisor.current
        run.rq_killed_at = time.time()
        os.killpg(worker.process.pid, signal.SIGKILL)  # the worker and its scheduler
        os.killpg(horse, signal.SIGKILL)  # the work-horse leads a process group of its own
        worker.process.wait(timeout=10)
        run.lapse_at = lapse(client, run.rq_killed_at, RQ_KILLED, JOB)

        # 2. A gunicorn worker SIGKILLed mid-view, before its row: gunicorn starts another.
        points.arm("view-before-ledger", VIEW_KILLED)
        deliveries.append(faulted.submit(run.sender.deliver, VIEW_KILLED))
        gunicorn_worker = points.wait("view-before-ledger", VIEW_KILLED)
        run.view_killed_at = time.time()
        os.kill(gunicorn_worker, signal.SIGKILL)
        key = claim_name("POST", "/api/transfers", None, f"key-{VIEW_KILLED}")  # the door's claim of it
        run.view_lapse_at = lapse(client, run.view_killed_at, key, NAMESPACES["door"])

        # 3. redis-server SIGKILLed while a view sits between its row and its enqueue, restarted on its AOF
        # once the enqueue failed: the view raises, Django answers 500, the door keeps it (its store retried).
        points.arm("view-before-enqueue", REDIS_KILLED)
        deliveries.append(faulted.submit(run.sender.deliver, REDIS_KILLED))
        points.wait("view-before-enqueue", REDIS_KILLED)
        run.redis_killed_at = time.time()
        store.kill()
        points.release("view-before-enqueue", REDIS_KILLED)
        points.wait("enqueue-failed", REDIS_KILLED, timeout=30)
        store.restart()
        run.redis_back_at = time.time()
        for delivery in deliveries:
            delivery.result(timeout=120)
        run.load_s = time.monotonic() - began

        # The late pass, once the dead holders' leases have lapsed (the killed view's, gone from the door's
        # namespace, and the killed job's, which its duplicate takes over): every transfer and event delivered
        # until it gets the answer it ends with, and every receipt enqueued again, the receipts of the
        # transfers answered 201 so far at once, the others' once their late delivery is answered. The killed
        # job itself comes back meanwhile, through RQ.
        lapsed = max(run.lapse_at, run.view_lapse_at)
        wait_until(lambda: time.time() > lapsed and not held(store.url, "door", "webhook"), left(lapsed + 10), "lapses")
        run.late_s = time.monotonic() - began
        late = [load.submit(run.sender.until_final, key) for key in TRANSFER_IDS + EVENT_IDS]
        for key in TRANSFER_IDS:
            resend(run, queue, key)
        for delivery in late:
            delivery.result(timeout=120)
        for key in TRANSFER_IDS:
            resend(run, queue, key)
        every_job = [*run.receipts.values(), run.duplicate, *run.resent.values()]
        pending = set(every_job)
        # The killed job comes back by the bound, maybe behind the late pass's receipts: about sixty jobs on
        # one worker, a second or two each on two loaded cores (a work-horse imports the service each time).
        wait_until(lambda: all_finished(client, pending), left(run.rq_killed_at + bound) + 120, "every receipt job")
        run.ended_s = time.monotonic() - began

        run.rows = ledger.rows(ledger_path)
        run.scans = {name: scan(store.url, namespace) for name, namespace in NAMESPACES.items()}
        run.returned = {job_id: job(client, job_id).return_value() for job_id in every_job}
        finished_ids = FinishedJobRegistry(queue=queue).get_job_ids()  # with any job a failed view enqueued
        run.timings = {job_id: timing(client, job_id) for job_id in {*every_job, *finished_ids}}
        run.worker_starts, run.worker_deaths = supervisor.started, len(supervisor.deaths)
    return run


def test_a_django_and_rq_service_under_three_sigkills_does_each_thing_once_and_answers_alike(
    tmp_path: Path, figures: Callable[[str], None]
) -> None:
    """Three SIGKILLs and a late resend: one row per effect, equal answers, no key held, retries in bounds."""
    run = run_trial(server_binary("redis"), tmp_path)
    runs = Counter((kind, key) for _, kind, key in run.rows)
    row_of = {(kind, key): row for row, kind, key in run.rows}

    # Every side effect once: no second row for anything, every transfer and event booked.
    assert [item for item, count in runs.items() if count > 1] == []
    assert sorted(key for kind, key in runs if kind == "transfer") == TRANSFER_IDS
    assert sorted(key for kind, key in runs if kind == "event") == EVENT_IDS

    # Every answer an id ended with is its first; the door's after the first are marked as replays. A
    # transfer answers 500 when its enqueue failed after its row (REFUSED, REDIS_KILLED, and any other
    # enqueue the restart failed), and that 500 is what every later delivery gets: the row stays one.
    failed_after_row = {key for key in TRANSFER_IDS if run.points.reached("enqueue-failed", key) is not None}
    for key in TRANSFER_IDS + EVENT_IDS:
        first, *later = run.sender.finals(key)
        assert [(got.status, got.body) for got in later] == [(first.status, first.body)] * len(later), key
        if key in EVENT_IDS:
            assert (first.status, json.loads(first.body)["row"]) == (200, row_of["event", key]), key
            continue
        assert all(got.replayed for got in later), key
        assert first.status == (500 if key in failed_after_row else 201), key
        if first.status == 201:
            assert json.loads(first.body)["row"] == row_of["transfer", key], key
    refused = {f"t-{n:02}" for n in REFUSED}
    assert refused | {REDIS_KILLED} <= failed_after_row
    outage = failed_after_row - refused - {REDIS_KILLED}
    for key in outage:  # only while the store was down
        assert run.redis_killed_at <= run.points.when("enqueue-failed", key) <= run.redis_back_at + 15, key

    # Each receipt sent once (a transfer answered 500 may have enqueued its receipt before it failed), and
    # every copy of its job, the killed one, its duplicate, the late one, returned that one run's receipt.
    sent = {key for kind, key in runs if kind == "receipt"}
    assert set(run.receipts) <= sent <= set(TRANSFER_IDS)
    for key, job_id in [*run.receipts.items(), (RQ_KILLED, run.duplicate), *run.resent.items()]:
        receipt = {"transfer_id": key, "amount": 100 + number(key), "row": row_of["receipt", key]}
        assert run.returned[job_id] == receipt, key

    # No key in flight at the end: every claim of every namespace done, none interrupted or odd.
    for name, (status, keys) in run.scans.items():
        assert (status, {key["state"] for key in keys}) == (0, {"done"}), name
    assert len(run.scans["door"][1]) == TRANSFERS
    assert sorted(key["key"] for key in run.scans["webhook"][1]) == EVENT_IDS
    assert {key["key"] for key in run.scans["receipt"][1]} == sent

    # Every delayed retry within the RQ page's bounds. The killed job is handed back to its Retry by RQ's
    # abandoned-job handling (requeued: its enqueued_at moves) within the page's bound; its duplicate takes
    # the work over the first time it comes round after the lapse (the lease and a round: none of its
    # rounds ends past the lapse); and every job RQ put back ran at its turn once it could run (handed back
    # or requeued; the duplicate, once the lapse came): the worker never sat idle meanwhile, and no job
    # enqueued after that ran before it. No retry waited on a scheduler.
    bound = page_bound()
    killed, duplicate = run.timings[run.receipts[RQ_KILLED]], run.timings[run.duplicate]
    requeued = killed.enqueued - run.rq_killed_at
    free = [end for timed in run.timings.values() for end in timed.ends] + run.worker_starts
    idle = {}  # a job put back -> how long the worker sat idle while it could have run
    overtaken = {}  # a job put back -> the jobs enqueued once it could run that started before it
    for job_id, timed in run.timings.items():
        if timed.requeued:
            ready = max([end for end in timed.ends if end < timed.started], default=timed.enqueued)
            if job_id == run.duplicate:
                ready = max(ready, run.lapse_at)
            idle[job_id] = timed.started - max([ready, *(moment for moment in free if moment <= timed.started)])
            overtaken[job_id] = [
                other
                for other, then in run.timings.items()
                if then.enqueued > ready + 1 and then.started < timed.started
            ]
    delays = sorted(timed.ended - timed.created for job_id, timed in run.timings.items() if job_id not in idle)
    figures(
        f"django+rq trial: {TRANSFERS} transfers and {EVENTS} events x{SENDS}, three SIGKILLs: the killed job "
        f"requeued {requeued:.1f} s after its worker's death (the RQ page's bound {bound} s) and ended at "
        f"{killed.ended - run.rq_killed_at:.1f} s; its duplicate went round {len(duplicate.rounds)} time(s), "
        f"the lapse at {run.lapse_at - run.rq_killed_at:.1f} s, ended at "
        f"{duplicate.ended - run.rq_killed_at:.1f} s; {len(idle)} jobs put back, the worker idle before one at "
        f"most {max(idle.values()):.1f} s; the other {len(delays)} jobs' enqueue-to-end median "
        f"{delays[len(delays) // 2]:.1f} s, max {delays[-1]:.1f} s; redis down "
        f"{run.redis_back_at - run.redis_killed_at:.1f} s ({len(outage)} more enqueues failed with it); "
        f"{run.worker_deaths} worker deaths; load done at {run.load_s:.0f} s, late pass from {run.late_s:.0f} s, "
        f"all done at {run.ended_s:.0f} s"
    )
    assert 0 < requeued <= bound
    assert [moment for moment in duplicate.rounds if moment > run.lapse_at + ROUND_SLACK] == []
    assert {job_id: gap for job_id, gap in idle.items() if gap > IDLE_SLACK} == {}
    assert {job_id: others for job_id, others in overtaken.items() if others} == {}
