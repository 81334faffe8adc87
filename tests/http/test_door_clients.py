"""A door's client factory is called once per process, however many threads ask first; a wrong kind is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import fakeredis
import pytest

from goblin_claim import InvalidArgumentTypeError
from goblin_claim._clients.kinds import LazyClient, check_client
from goblin_claim.wsgi import IdempotencyMiddleware


def _app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [b"made"]


def test_a_factory_racing_threads_is_called_once() -> None:
    """Threads of a threaded server asking for the client at once share the one the factory made."""
    made: list[Any] = []

    def factory() -> Any:
        time.sleep(0.05)  # long enough for every thread to arrive while the first is inside
        made.append(fakeredis.FakeRedis())
        return made[-1]

    holder = LazyClient(factory, lambda client: check_client(client, False, "test"))
    start = threading.Barrier(8)
    got: list[Any] = []

    def ask() -> None:
        start.wait()
        got.append(holder.get())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert got == made * 8


def test_the_wsgi_door_resolves_its_factory_once_under_threads() -> None:
    """The WSGI door's factory, like @idempotent's, is called once by concurrent first requests."""
    calls: list[int] = []
    server = fakeredis.FakeServer()

    def factory() -> Any:
        calls.append(1)
        time.sleep(0.05)
        return fakeredis.FakeRedis(server=server)

    middleware = IdempotencyMiddleware(_app, client=factory, namespace="door-clients")
    start = threading.Barrier(6)

    def request(index: int) -> None:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/charges", "HTTP_IDEMPOTENCY_KEY": f"k-{index}",
            "CONTENT_LENGTH": "0", "wsgi.input": None,
        }  # fmt: skip
        start.wait()
        middleware(environ, lambda status, headers, exc_info=None: lambda data: None)

    threads = [threading.Thread(target=request, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]


def test_a_factory_of_the_wrong_kind_is_refused_on_first_use() -> None:
    """The check runs on the client made, with the door's message; nothing is kept, so the next call tries again."""
    holder = LazyClient(
        lambda: fakeredis.FakeAsyncRedis(), lambda client: check_client(client, False, "the door", "say so")
    )
    with pytest.raises(InvalidArgumentTypeError, match=r"^the door needs a sync client .*; say so$"):
        holder.get()
    with pytest.raises(InvalidArgumentTypeError):
        holder.get()


FORKED = """
import json, os, sys

import fakeredis

from goblin_claim._clients.kinds import LazyClient, check_client

made = []


def factory():
    made.append(os.getpid())
    return fakeredis.FakeRedis()


holder = LazyClient(factory, lambda client: check_client(client, False, "test"))
given = LazyClient(fakeredis.FakeRedis(), lambda client: check_client(client, False, "test"))
parents = holder.get(), given.get()  # made before the fork, as gunicorn's master does under --preload
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.close(read)
    seen = {
        "made_again": holder.get() is not parents[0],
        "given_kept": given.get() is parents[1],
        "made_in": made,
        "pid": os.getpid(),
    }
    os.write(write, json.dumps(seen).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as pipe:
    seen = json.loads(pipe.read())
os.waitpid(child, 0)
seen["parent"] = os.getpid()
seen["parent_kept"] = holder.get() is parents[0]
print(json.dumps(seen))
"""


def test_a_client_a_factory_made_before_a_fork_is_made_again_in_the_child() -> None:
    """A forked worker calls the factory again (the parent keeps its own); a client given as it is stays shared."""
    result = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["made_in"] == [seen["parent"], seen["pid"]]  # once in the parent, once in the child
    assert (seen["made_again"], seen["given_kept"], seen["parent_kept"]) == (True, True, True)
