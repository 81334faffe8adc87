"""Exactly once under real concurrency: processes, threads, tasks and SIGKILL, counted in Redis."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from goblin_claim import idempotent
from tests.conftest import Backend, unique
from tests.support import workers
from tests.support.servers import RedisProcess

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(params=["standalone", "cluster"])
def real(request: pytest.FixtureRequest) -> tuple[int, bool]:
    """(port, is_cluster) of a real server."""
    if request.param == "standalone":
        server: RedisProcess = request.getfixturevalue("redis_standalone")
        return server.port, False
    nodes: list[RedisProcess] = request.getfixturevalue("redis_cluster")
    return nodes[0].port, True


def runs(client: Any, namespace: str, ids: list[str]) -> dict[str, int]:
    """How many times each id ran."""
    return {item: int(client.get(workers.runs_key(namespace, item)) or 0) for item in ids}


@pytest.mark.slow
def test_processes_and_threads_run_each_id_once(real: tuple[int, bool], tmp_path: Path) -> None:
    """8 processes x 4 threads, every thread asking for each of 200 ids: each runs once, all answers equal."""
    port, cluster = real
    namespace, ids = unique("ns"), [f"id-{n}" for n in range(200)]
    outs = [str(tmp_path / f"out-{n}.json") for n in range(8)]
    procs = [
        SPAWN.Process(target=workers.every_thread_every_id, args=(port, cluster, namespace, ids, 4, out))
        for out in outs
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
        assert proc.exitcode == 0
    answers: dict[str, list[Any]] = {item: [] for item in ids}
    for out in outs:
        for item, results in json.loads(Path(out).read_text()).items():
            answers[item].extend(results)
    client = workers.connect(port, cluster)
    assert runs(client, namespace, ids) == dict.fromkeys(ids, 1)
    for item, results in answers.items():
        assert len(results) == 32
        assert all(result == results[0] for result in results), item
        assert results[0]["item"] == item
    client.close()


@pytest.mark.slow
def test_sigkill_mid_work_is_taken_over(real: tuple[int, bool]) -> None:
    """A worker killed with SIGKILL mid-work on 20 ids: each completes, runs at most twice, every answer right."""
    port, cluster = real
    namespace, ids = unique("ns"), [f"job-{n}" for n in range(20)]
    client = workers.connect(port, cluster)
    victim = SPAWN.Process(target=workers.hold_until_killed, args=(port, cluster, namespace, ids))
    victim.start()
    deadline = time.monotonic() + 60
    while runs(client, namespace, ids) != dict.fromkeys(ids, 1):
        assert time.monotonic() < deadline, "the victim never started its work"
        time.sleep(0.05)
    time.sleep(2.5)  # past one lease: the victim's keep-alive has been renewing
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    assert victim.exitcode == -signal.SIGKILL

    work = workers.counted_work(client, namespace, lease=2, wait=20, slow_first=0)
    answers: dict[str, list[Any]] = {item: [] for item in ids}
    lock = threading.Lock()

    def rescue(item: str) -> None:
        result = work(item)
        with lock:
            answers[item].append(result)

    threads = [threading.Thread(target=rescue, args=(item,)) for item in ids for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = runs(client, namespace, ids)
    assert all(1 <= n <= 2 for n in counts.values()), counts
    for item in ids:
        assert len(answers[item]) == 3
        assert all(answer == answers[item][0] for answer in answers[item])
        assert answers[item][0]["item"] == item
        assert answers[item][0]["pid"] == os.getpid()  # the victim never finished anything
        assert work(item) == answers[item][0]  # completed: replayed, not rerun
    assert runs(client, namespace, ids) == counts
    client.close()


@pytest.mark.slow
def test_thousand_tasks_on_fifty_ids(backend: Backend) -> None:
    """1000 asyncio tasks over 50 ids: each id runs exactly once and every task gets its answer."""

    async def scenario() -> tuple[dict[str, int], list[tuple[str, str]]]:
        client = backend.async_()
        namespace = unique("ns")
        counts: dict[str, int] = {}

        async def work(item: str) -> str:
            counts[item] = counts.get(item, 0) + 1
            await client.incr(workers.runs_key(namespace, item))
            await asyncio.sleep(0.01)
            return f"answer:{item}"

        wrapped = idempotent(client, key="item", namespace=namespace, wait=30)(work)
        items = [f"id-{n % 50}" for n in range(1000)]
        answers = await asyncio.gather(*(wrapped(item) for item in items))
        stored = {f"id-{n}": int(await client.get(workers.runs_key(namespace, f"id-{n}"))) for n in range(50)}
        await client.aclose()
        assert stored == counts
        return counts, list(zip(items, answers, strict=True))

    counts, answers = asyncio.run(scenario())
    assert counts == {f"id-{n}": 1 for n in range(50)}
    assert all(answer == f"answer:{item}" for item, answer in answers)
