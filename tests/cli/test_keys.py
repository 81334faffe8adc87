"""``goblin-claim inspect``, ``forget`` and ``namespaces`` speak the operator's keys.

Records are written by the real doors as a service writes them (the ASGI door under
Starlette, the WSGI door, ``@idempotent``, the Celery and RQ doors, each called in
process) on real redis-servers; then the installed ``goblin-claim`` script runs as an
operator runs it, naming each key by the request, or by the function or task and the
key its arguments give.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from goblin_claim import Claim, Claimed, idempotent
from goblin_claim._protocol.record import build_keys
from tests.conftest import IN_CI, unique
from tests.support import servers

for _needed in ("starlette", "httpx", "celery", "rq"):
    if IN_CI:  # with CI set, a missing framework fails the tests instead of skipping them
        importlib.import_module(_needed)
    else:
        pytest.importorskip(_needed)

import httpx  # noqa: E402 -- only once the check above has passed
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import goblin_claim.asgi  # noqa: E402
import goblin_claim.wsgi  # noqa: E402
from goblin_claim.rq import idempotent_job  # noqa: E402
from tests.cli.invoke import url  # noqa: E402

SCRIPT = Path(sys.executable).parent / "goblin-claim"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator runs it."""
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=120, check=False)


# The module-level functions below are decorated as a service decorates its own: their
# default namespaces are their import names. Their client is the session's server.
_SERVER: list[servers.RedisProcess] = []
CHARGES: Counter[str] = Counter()
REFUNDS: Counter[str] = Counter()


def _client() -> redis.Redis:
    return _SERVER[0].client()


@idempotent(_client, key="order_id")
def charge(order_id: str, amount: int) -> dict[str, int]:
    """A decorated function under its default namespace, ``tests.cli.test_keys.charge``."""
    CHARGES[order_id] += 1
    return {"amount": amount}


@idempotent_job(_client, key="event_id")
def refund(event_id: int, amount: int) -> str:
    """An RQ job function, under its import name; its key is an int."""
    REFUNDS[str(event_id)] += 1
    return f"refunded {amount}"


@pytest.fixture
def stock(redis_standalone: servers.RedisProcess) -> Iterator[redis.Redis]:
    """A client on the stock standalone server, which the module-level functions use too."""
    _SERVER[:] = [redis_standalone]
    client = redis_standalone.client()
    yield client
    client.close()


# --------------------------------------------------------------------------- HTTP doors


def shop(client: redis.asyncio.Redis, runs: Counter[str]) -> Starlette:
    """A Starlette service behind the ASGI door, whose scope is the ``x-user`` header (a str owner)."""

    async def pay(request: Request) -> JSONResponse:
        runs[request.headers["x-user"]] += 1
        return JSONResponse({"paid": (await request.json())["amount"]}, status_code=201)

    app = Starlette(routes=[Route("/payments", pay, methods=["POST"])])
    app.add_middleware(
        goblin_claim.asgi.IdempotencyMiddleware,
        client=client,
        scope=lambda scope: dict(scope["headers"]).get(b"x-user", b"").decode() or None,
    )
    return app


def pay(port: int, runs: Counter[str], key: str, *users: str) -> list[int]:
    """POST /payments once per user through a fresh service and event loop; the statuses."""

    async def send() -> list[int]:
        client = redis.asyncio.Redis(host=servers.HOST, port=port)  # of this loop
        transport = httpx.ASGITransport(app=shop(client, runs))
        async with contextlib.aclosing(client), httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
            headers = {"idempotency-key": key, "content-type": "application/json"}
            answers = [
                await http.post("/payments", content=b'{"amount": 25}', headers={**headers, "x-user": user})
                for user in users
            ]
        return [answer.status_code for answer in answers]

    return asyncio.run(send())


def test_inspect_and_forget_take_an_asgi_doors_key_by_its_request(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """The method, path, owner and header value name the door's stored key: inspect shows it, forget reopens it."""
    key, runs, target = unique("order"), Counter[str](), url(redis_standalone)
    assert pay(redis_standalone.port, runs, key, "alice", "bob") == [201, 201]
    stored = f'goblin-http:{{["POST","/payments","alice","{key}"]}}'
    assert stock.exists(stored) == 1  # the door's own name for it, which no operator types
    plain = cli("inspect", key, "--url", target)
    assert plain.returncode == 0, plain.stderr
    assert "state   free" in plain.stdout
    assert "`goblin-claim namespaces` lists the namespaces in use" in plain.stdout
    assert "--http METHOD PATH" in plain.stdout
    found = cli("inspect", key, "--http", "POST", "/payments", "--owner", "alice", "--url", target)
    assert found.returncode == 0, found.stderr
    assert f"HTTP    POST /payments, owner 'alice', Idempotency-Key '{key}'\n" in found.stdout
    assert f"record  {stored}: done by " in found.stdout
    assert "state   done by " in found.stdout
    # The header's sf-string form, a lower-case method and a whole URL name the same key.
    again = cli("inspect", f'"{key}"', "--http", "post", "https://shop.example/payments?coupon=1", "--owner", "alice",
                "--url", target)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"record  {stored}: done by " in again.stdout
    assert "(its query string is in the fingerprint, not the key)" in again.stdout
    nobody = cli("inspect", key, "--http", "POST", "/payments", "--url", target)
    assert f'record  goblin-http:{{["POST","/payments",null,"{key}"]}}: none' in nobody.stdout
    gone = cli("forget", key, "--http", "POST", "/payments", "--owner", "alice", "--url", target)
    assert gone.returncode == 0, gone.stderr
    assert f"forgot POST /payments, owner 'alice', Idempotency-Key '{key}': deleted {stored}\n" in gone.stdout
    assert "it was: done by " in gone.stdout
    # Alice's request runs again; Bob's, another owner's key, is still replayed.
    assert pay(redis_standalone.port, runs, key, "alice", "bob") == [201, 201]
    assert runs == {"alice": 2, "bob": 1}


def refund_app(runs: Counter[str]) -> Callable[..., Any]:
    """A bare WSGI refund endpoint."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        runs[environ["PATH_INFO"]] += 1
        start_response("201 Created", [("content-type", "text/plain")])
        return [b"refunded"]

    return app


def post_wsgi(door: Callable[..., Any], key: str, user: str) -> str:
    """POST /api/refunds/r 1 (mounted at /api) through the WSGI door in process; the status line."""
    environ = {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "/api", "PATH_INFO": "/refunds/r 1", "QUERY_STRING": "",
        "SERVER_NAME": "shop", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""), "CONTENT_LENGTH": "0", "HTTP_IDEMPOTENCY_KEY": key, "HTTP_X_USER": user,
    }  # fmt: skip
    status: list[str] = []
    body = door(environ, lambda line, headers, exc_info=None: status.append(line))
    b"".join(body)
    getattr(body, "close", lambda: None)()
    return status[0]


def test_an_int_owner_a_mounted_path_and_an_escaped_path_name_the_wsgi_doors_key(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """--owner-type int is the scope's int (not the str), the path is the whole one, percent-escapes decoded."""
    key, runs, target = unique("refund"), Counter[str](), url(redis_standalone)
    door = goblin_claim.wsgi.IdempotencyMiddleware(
        refund_app(runs), client=stock, namespace="refunds", scope=lambda environ: int(environ["HTTP_X_USER"])
    )
    assert post_wsgi(door, key, "7") == "201 Created"
    stored = f'refunds:{{["POST","/api/refunds/r 1","int:7","{key}"]}}'
    assert stock.exists(stored) == 1
    form = ("--http", "POST", "/api/refunds/r%201", "--owner", "7", "--namespace", "refunds", "--url", target)
    found = cli("inspect", key, *form, "--owner-type", "int")
    assert found.returncode == 0, found.stderr
    assert f"record  {stored}: done by " in found.stdout
    assert "owner 'int:7'" in found.stdout
    text_owner = cli("inspect", key, *form)  # the str "7" is another owner: nothing stored for it
    assert f'record  refunds:{{["POST","/api/refunds/r 1","7","{key}"]}}: none' in text_owner.stdout
    assert cli("inspect", key, *form, "--owner-type", "uuid").returncode == 2  # "7" is no UUID
    gone = cli("forget", key, *form, "--owner-type", "int")
    assert gone.returncode == 0, gone.stderr
    assert f"deleted {stored}\n" in gone.stdout
    assert post_wsgi(door, key, "7") == "201 Created"
    assert runs == {"/refunds/r 1": 2}  # reopened: the refund ran again


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["inspect", "k", "--owner", "alice"], "--owner names an HTTP door's key: give --http METHOD PATH too"),
        (["inspect", "k", "--owner-type", "int"], "--owner names an HTTP door's key"),
        (["forget", "k", "--http", "GET", "/a"], "the doors never claim GET (a safe method): it has no key"),
        (["inspect", "k", "--http", "POST", "payments"], "the path must begin with /"),
        (["inspect", "k", "--http", "POST", "/a", "--owner", ""], "an empty --owner is no owner"),
        (["inspect", "k", "--http", "POST", "/a", "--owner-type", "int"], "--owner-type needs --owner"),
        (["inspect", "k", "--http", "POST", "/a", "--owner", "x", "--owner-type", "int"], "'x' is not an int"),
        (["inspect", '"a"b"', "--http", "POST", "/a"], "not a well-formed structured-field string"),
        (["inspect", "k" * 256, "--http", "POST", "/a"], "1 to 255 printable ASCII characters"),
        (["inspect", "k", "--http", "P0ST", "/a"], "method names such as 'POST', not 'P0ST'"),
        (["forget", "k\udcff"], "the key 'k\\udcff' is not UTF-8 text"),  # a byte the locale cannot decode
    ],
)
def test_a_key_the_doors_would_refuse_is_bad_usage(argv: list[str], said: str) -> None:
    """What a door refuses (a safe method, a malformed header, an empty owner) exits 2, saying why, unconnected."""
    done = cli(*argv, "--url", f"redis://{servers.HOST}:{servers.free_port()}/0")
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "cannot connect" not in done.stdout + done.stderr  # refused before connecting


# --------------------------------------------------------------------------- functions and jobs


def test_a_decorated_functions_key_is_named_by_the_function(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """--function <module>.<qualified name> and the key finds @idempotent's record; forget makes it run again."""
    order, target = unique("o"), url(redis_standalone)
    assert charge(order, 25) == {"amount": 25}
    assert cli("inspect", order, "--url", target).stdout.count("state   free") == 1
    found = cli("inspect", order, "--function", "tests.cli.test_keys.charge", "--url", target)
    assert found.returncode == 0, found.stderr
    assert f"record  tests.cli.test_keys.charge:{{{order}}}: done by " in found.stdout
    assert '"amount": 25' in found.stdout
    gone = cli("forget", order, "--function", "tests.cli.test_keys.charge", "--url", target)
    assert gone.returncode == 0, gone.stderr
    assert f"forgot {order!r}: deleted tests.cli.test_keys.charge:{{{order}}}" in gone.stdout
    assert charge(order, 25) == {"amount": 25}
    assert CHARGES[order] == 2


def test_an_rq_jobs_int_key_is_named_by_its_function_and_text(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """An RQ job function called as the worker calls it: --task <its import name> and the int key as text."""
    event, target = int(unique("").replace("-", "")), url(redis_standalone)  # digits: pid, then a counter
    assert refund(event, 3) == "refunded 3"
    found = cli("inspect", str(event), "--task", "tests.cli.test_keys.refund", "--url", target)
    assert found.returncode == 0, found.stderr
    assert f"record  tests.cli.test_keys.refund:{{{event}}}: done by " in found.stdout
    assert cli("forget", str(event), "--task", "tests.cli.test_keys.refund", "--url", target).returncode == 0
    assert refund(event, 3) == "refunded 3"
    assert REFUNDS[str(event)] == 2


def test_a_celery_tasks_key_and_its_enqueue_once_marker(
    redis_standalone: servers.RedisProcess, stock: redis.Redis
) -> None:
    """--task <the task's name>: inspect shows the record and Celery's marker, scan skips it, forget deletes both."""
    from celery import Celery

    from goblin_claim.celery import IdempotentTask

    app = Celery("cli-keys", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True  # delay() runs here, through the door's apply_async
    runs: Counter[str] = Counter()
    name, event, target = unique("payments.capture"), unique("evt"), url(redis_standalone)

    @app.task(base=IdempotentTask, name=name, idempotency={"client": stock, "key": "event_id", "enqueue_once": True})
    def capture(event_id: str, amount: int) -> int:
        runs[event_id] += 1
        return amount

    first = capture.delay(event, 5)
    assert first.get() == 5
    assert capture.delay(event, 5).id == first.id  # not sent: the first message's result
    record = build_keys(name, event)[0]
    assert stock.exists(record, record + ":task") == 2
    found = cli("inspect", event, "--task", name, "--url", target)
    assert found.returncode == 0, found.stderr
    assert f"record  {record}: done by " in found.stdout
    assert f"task    {record}:task: '" in found.stdout
    assert "enqueue_once's marker: the first Celery task's or RQ job's id" in found.stdout
    listed = cli("scan", "--json", "--namespace", name, "--url", target)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["key"] for line in listed.stdout.splitlines()] == [event]  # not the marker
    gone = cli("forget", event, "--task", name, "--url", target)
    assert gone.returncode == 0, gone.stderr
    assert f"deleted {record}:task: enqueue_once's marker" in gone.stdout
    assert stock.exists(record, record + ":task") == 0
    assert capture.delay(event, 5).id != first.id  # sent, and run, again
    assert runs == {event: 2}


# --------------------------------------------------------------------------- namespaces


def listed(*argv: str) -> list[dict[str, Any]]:
    """``goblin-claim namespaces --json``: each line's object (the command must exit 0)."""
    done = cli("namespaces", "--json", *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_namespaces_lists_each_namespace_with_its_keys(own_server: Callable[..., servers.RedisProcess]) -> None:
    """On a server of its own: nothing, then each namespace once with the keys scan lists (no fence or marker)."""
    server = own_server()
    target = url(server)
    empty = cli("namespaces", "--url", target)
    assert empty.returncode == 0, empty.stderr
    assert "0 namespaces, 0 keys\n" in empty.stdout
    assert listed("--url", target) == []
    nothing = cli("scan", "--url", target)  # the default namespace, goblin, is empty: say where to look
    assert (
        "0 keys: 0 in-flight, 0 interrupted, 0 done, 0 odd\n(`goblin-claim namespaces` lists the namespaces in use)"
        in nothing.stdout
    )
    client = server.client()
    try:
        door = goblin_claim.wsgi.IdempotencyMiddleware(refund_app(Counter()), client=client)
        assert post_wsgi(door, "order-42", "7") == "201 Created"
        for index in range(3):
            Claim(client, f"k{index}", lease=60).acquire()
        fenced = Claim(client, "f", namespace="fenced", fencing=True)
        assert isinstance(fenced.acquire(), Claimed)
        fenced.release()  # only its fence counter is left
        client.set("old:{evt}:claim", "done w", ex=60)  # an older release's two keys
        client.set("old:{evt}:result", "v", ex=60)
        client.set("app:{a{b}", "x")  # not laid out as goblin-claim lays keys out
        client.set("plain-key", "x")
        found = listed("--count", "2", "--url", target)
        assert found == [
            {"namespace": "fenced", "keys": 0},
            {"namespace": "goblin", "keys": 3},
            {"namespace": "goblin-http", "keys": 1},
            {"namespace": "old", "keys": 2},
        ]
        text = cli("namespaces", "--url", target)
        assert text.returncode == 0
        assert f"goblin-claim namespaces: {target}, standalone" in text.stdout
        assert "         3  goblin\n" in text.stdout
        assert "4 namespaces, 6 keys" in text.stdout
    finally:
        client.close()


def test_namespaces_and_the_operators_keys_on_a_cluster(redis_cluster: list[servers.RedisProcess]) -> None:
    """From any node: namespaces counts every primary's keys; an HTTP key is inspected and forgotten by its request."""
    client = redis.cluster.RedisCluster(host=servers.HOST, port=redis_cluster[0].port)
    try:
        spread, http = unique("spread"), unique("http")
        keys = [f"k{index}" for index in range(30)]
        for key in keys:
            Claim(client, key, namespace=spread, lease=60).acquire()
        assert len({client.get_node_from_key(build_keys(spread, key)[0]).name for key in keys}) == 3
        door = goblin_claim.wsgi.IdempotencyMiddleware(refund_app(Counter()), client=client, namespace=http)
        for index in range(5):
            assert post_wsgi(door, f"order-{index}", "7") == "201 Created"
        for node in redis_cluster:
            found = {entry["namespace"]: entry["keys"] for entry in listed("--url", url(node))}
            assert (found[spread], found[http]) == (30, 5)
        form = ("--http", "POST", "/api/refunds/r 1", "--namespace", http, "--url", url(redis_cluster[2]))
        inspected = cli("inspect", "order-3", *form)
        assert inspected.returncode == 0, inspected.stderr
        assert "state   done by " in inspected.stdout
        assert cli("forget", "order-3", *form).returncode == 0
        assert {entry["namespace"]: entry["keys"] for entry in listed("--url", url(redis_cluster[1]))}[http] == 4
    finally:
        client.close()
