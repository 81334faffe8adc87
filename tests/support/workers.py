"""Work run in child processes by the exactly-once tests (importable for spawn)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.cluster

from goblin_claim import current_claim, idempotent

HOST = "127.0.0.1"


def connect(port: int, cluster: bool) -> Any:
    """A sync client on the test server (a cluster client if ``cluster``)."""
    if cluster:
        return redis.cluster.RedisCluster(host=HOST, port=port)
    return redis.Redis(host=HOST, port=port)


def runs_key(namespace: str, item: str) -> str:
    """Where each execution of ``item`` is counted."""
    return f"{namespace}:runs:{{{item}}}"


def counted_work(client: Any, namespace: str, lease: int, wait: float, slow_first: float) -> Callable[[str], Any]:
    """The decorated function: counts each run in Redis, then returns who ran it.

    ``slow_first`` makes a first run sleep that long (to be killed mid-work);
    later runs of the same item finish at once.
    """

    @idempotent(client, key="item", namespace=namespace, lease=lease, wait=wait)
    def work(item: str) -> dict[str, Any]:
        run = client.incr(runs_key(namespace, item))
        time.sleep(slow_first if run == 1 else 0.002)
        return {"item": item, "pid": os.getpid(), "thread": threading.get_ident(), "run": run}

    return work


def every_thread_every_id(port: int, cluster: bool, namespace: str, ids: list[str], threads: int, out: str) -> None:
    """Each of ``threads`` threads calls the work for every id, in its own shuffled order."""
    client = connect(port, cluster)
    work = counted_work(client, namespace, lease=10, wait=60, slow_first=0.002)
    results: dict[str, list[Any]] = {item: [] for item in ids}
    lock = threading.Lock()

    def caller(seed: int) -> None:
        order = list(ids)
        random.Random(seed).shuffle(order)
        for item in order:
            result = work(item)
            with lock:
                results[item].append(result)

    pool = [threading.Thread(target=caller, args=(os.getpid() * 100 + n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


def hold_until_killed(port: int, cluster: bool, namespace: str, ids: list[str]) -> None:
    """Start the work for every id in parallel threads and stay in it (the test kills this process)."""
    client = connect(port, cluster)
    work = counted_work(client, namespace, lease=2, wait=0, slow_first=120)
    pool = [threading.Thread(target=work, args=(item,), daemon=True) for item in ids]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def step_key(namespace: str, item: str, step: int) -> str:
    """Where each run of step ``step`` of ``item`` is counted (its side effect)."""
    return f"{namespace}:step:{{{item}}}:{step}"


def stepped_work(
    client: Any, namespace: str, *, lease: int, wait: float, steps: int = 5, stop_after: int = 0,
    at_most_once: bool = False,
) -> Callable[[str], Any]:  # fmt: skip
    """The decorated function of the checkpoint tests: ``steps`` counted steps, each checkpointed once done.

    It resumes after the step its handle's last checkpoint names; with ``stop_after`` it
    stops once that step is checkpointed (sleeps, for the test to kill the process).
    """

    @idempotent(
        client, key="item", namespace=namespace, lease=lease, wait=wait, checkpoints=True, at_most_once=at_most_once
    )
    def work(item: str) -> dict[str, Any]:
        claim = current_claim()
        saved = claim.last_checkpoint
        resumed = None if saved is None else int(saved)
        for step in range(1 if resumed is None else resumed + 1, steps + 1):
            client.incr(step_key(namespace, item, step))  # the step's side effect
            claim.checkpoint(str(step))
            if step == stop_after:
                time.sleep(120)  # stopped here: the test kills the process
        return {"item": item, "resumed_after": resumed, "pid": os.getpid()}

    return work


def steps_until_killed(
    port: int, cluster: bool, namespace: str, item: str, stop_after: int, at_most_once: bool
) -> None:
    """Run the stepped work for ``item`` until step ``stop_after``, and stay there (the test kills this process)."""
    client = connect(port, cluster)
    stepped_work(client, namespace, lease=2, wait=0, stop_after=stop_after, at_most_once=at_most_once)(item)
