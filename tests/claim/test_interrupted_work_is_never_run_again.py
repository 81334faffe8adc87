"""At most once under a real ``kill -9``: an owner dies mid-work on 100 keys, and nothing runs any of them again.

A child process claims 100 keys with ``at_most_once=True`` (lease 2 s, one batch), runs the
side effect of every other key (an ``INCR`` outside the SDK's namespace) and is killed
with SIGKILL while it holds them all: 50 keys died after their side effect, 50 before.
While the lease lasts later callers are told the work is in flight, by the dead owner's
token; once it has passed, four threads (``acquire()`` and ``wait()``) and another process
try every key: each gets ``InterruptedWorkError`` naming the dead owner and when it
claimed, and no side effect runs twice. ``forget()`` reopens a key, and then it runs,
once. On a standalone redis-server and a cluster, with and without ``fencing=True``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from goblin_claim import Claim, Claimed, Completed, InFlight
from tests.conftest import unique
from tests.support import workers
from tests.support.servers import RedisProcess
from tests.support.unit_workers import claim_and_stay, effect_key, try_every_key

SPAWN = multiprocessing.get_context("spawn")
KEYS = 100


@pytest.fixture(params=["standalone", "cluster"])
def real(request: pytest.FixtureRequest) -> tuple[int, bool]:
    """(port, is_cluster) of a real server."""
    if request.param == "standalone":
        server: RedisProcess = request.getfixturevalue("redis_standalone")
        return server.port, False
    nodes: list[RedisProcess] = request.getfixturevalue("redis_cluster")
    return nodes[0].port, True


def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("fencing", [False, True], ids=["unfenced", "fenced"])
def test_an_owner_killed_mid_work_on_100_keys_is_never_run_again(
    real: tuple[int, bool], fencing: bool, tmp_path: Path
) -> None:
    """SIGKILL mid-work: each side effect at most once; every later caller gets InterruptedWorkError; forget reopens."""
    port, cluster = real
    client = workers.connect(port, cluster)
    namespace = unique("amo-kill")
    keys = [f"job-{n:03d}" for n in range(KEYS)]
    ready = f"ready:{namespace}"
    started = time.time()
    token = f"victim-{namespace}"  # the owner's identity, as a worker id would be
    victim = SPAWN.Process(target=claim_and_stay, args=(port, cluster, namespace, keys, fencing, token, ready))
    victim.start()
    try:
        _until(lambda: client.get(ready) is not None, 60, "the victim never claimed its keys")
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
    killed = time.time()

    # While its lease lasts the dead owner's work is in flight, by its token.
    early = Claim(client, keys[1], namespace=namespace, at_most_once=True, fencing=fencing).acquire()
    assert isinstance(early, InFlight)
    assert early.holder == token
    assert early.retry_after is not None
    time.sleep(early.retry_after + 0.2)  # past the lease

    out = tmp_path / "other-process.json"
    other = SPAWN.Process(target=try_every_key, args=(port, cluster, namespace, keys, fencing, "acquire", str(out)))
    other.start()
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def caller(how: str) -> None:
        got = try_every_key(port, cluster, namespace, keys, fencing, how)
        with lock:
            seen.append(got)

    threads = [threading.Thread(target=caller, args=(how,)) for how in ("acquire", "wait", "acquire", "wait")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    other.join(120)
    assert other.exitcode == 0
    seen.append(json.loads(out.read_text("utf-8")))

    effects = {key: int(client.get(effect_key(namespace, key)) or 0) for key in keys}
    assert effects == {key: 1 if n % 2 == 0 else 0 for n, key in enumerate(keys)}  # at most once, as it died
    assert len(seen) == 5
    for got in seen:
        assert set(got) == set(keys)
        for key in keys:
            assert got[key]["holder"] == token, (key, got[key])
            assert started - 2 <= got[key]["claimed_at"] <= killed + 2, (key, got[key], started, killed)

    # An operator reopens one that died before its side effect: it runs, once; then it is completed.
    reopened = keys[1]
    assert Claim(client, reopened, namespace=namespace).forget() is True
    handle = Claim(client, reopened, namespace=namespace, at_most_once=True, fencing=fencing)
    assert isinstance(handle.acquire(), Claimed)
    client.incr(effect_key(namespace, reopened))
    handle.complete(b"ran")
    again = try_every_key(port, cluster, namespace, [reopened, keys[3]], fencing, "acquire")
    assert again[reopened] == {"outcome": Completed.__name__}
    assert again[keys[3]]["holder"] == token
    assert int(client.get(effect_key(namespace, reopened))) == 1
    client.close()
