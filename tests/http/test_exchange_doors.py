"""The exchange's decision tables through every HTTP door, each under its real server, over a real Redis.

One table, two halves: the request's intake (no key, a bad key, a method not
covered, a route that ignores the key, the scope) and the app's answer (kept,
given back, streamed, too large, a ``Set-Cookie``, a 5xx, an exception). Each row
sends a request and its retry with the same key to ``/answer``
(tests/support/apps/answers.py), which every door's app serves, and reads what both
got, how many times the endpoint ran (its committed work, counted in Redis), and
which warnings the door logged: every door decides alike, and says so alike. A
third table runs on each door served with ``server_errors="store"``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from goblin_claim import _http
from tests.conftest import unique
from tests.http.test_doors import DOORS as SERVED
from tests.http.test_doors import env_for, serve
from tests.support import servers
from tests.support.apps import answers

DOORS = {**SERVED, "asgi": ("uvicorn", "tests.support.apps.asgi_app:application")}
LOGGERS = {
    "wsgi": "goblin_claim.wsgi",
    "flask": "goblin_claim.flask",
    "django-wsgi": "goblin_claim.django",
    "django-asgi": "goblin_claim.django",
    "asgi": "goblin_claim.asgi",
    "aiohttp": "goblin_claim.aiohttp",
}
SCOPED = ("flask", "django-wsgi", "django-asgi", "aiohttp")  # the apps whose door has a scope function (X-User)
# The doors that see only the framework's own 500 response for an exception the view raised (Django's
# middleware): they keep that page. The others see the exception (Flask: its got_request_exception) and keep
# the server-error problem, while the server or framework answers the first request itself.
SEE_THE_500 = ("django-wsgi", "django-asgi")
TOO_LARGE = 1024 * 1024 + 1  # one byte over the default max_response_bytes


@dataclass(frozen=True)
class Row:
    """A request sent twice (the second with ``again_user``) and what both get.

    ``statuses``: the two statuses; ``runs``: how many times the endpoint ran;
    ``replayed``: the second is a replay (of the first's body, or for an exception on a
    door that sees no 500, of the ``server-error`` problem); ``unstored``: the first is
    marked ``Idempotent-Stored: false`` and the door warned once; ``unscoped``: what a
    door without a scope function does instead.
    """

    name: str
    statuses: tuple[int, int]
    runs: int
    query: str = ""
    method: str = "POST"
    path: str = "/answer"
    key: str | None = ""  # "": a fresh key; None: no header
    user: str | None = "alice"
    again_user: str | None = "alice"
    replayed: bool = False
    unstored: bool = False
    unscoped: dict[str, object] = field(default_factory=dict)


INTAKE = [
    Row("no key: passed through, run each time", (201, 201), 2, key=None),
    Row("a malformed key: 400, never run", (400, 400), 0, key='"a"b"'),
    Row("a method not covered: passed through", (201, 201), 2, method="PUT"),
    Row("a route that ignores the key: passed through", (201, 201), 2, path="/answer/ignored"),
    Row(
        "no owner: 403, never run",
        (403, 403),
        0,
        user=None,
        again_user=None,
        unscoped={"statuses": (201, 201), "runs": 1, "replayed": True},
    ),
    Row(
        "another owner's key: their own operation",
        (201, 201),
        2,
        again_user="bob",
        unscoped={"runs": 1, "replayed": True},
    ),
]
ANSWERS = [
    Row("a 2xx: stored and replayed", (201, 201), 1, replayed=True),
    Row("a 4xx the endpoint answers: stored", (409, 409), 1, "status=409", replayed=True),
    Row("a retry status: the key given back", (429, 429), 2, "status=429"),
    Row("a 5xx: the key given back", (503, 503), 2, "status=503"),
    Row("a 500 after the work: given back, the work runs again", (500, 500), 2, "status=500"),
    Row("an exception after the work: given back, the work runs again", (500, 500), 2, "raise=1"),
    Row("a Set-Cookie: stored, replayed without it", (201, 201), 1, "cookie=1", replayed=True),
    Row("a stream: passed through, then 422", (201, 422), 1, "stream=1", unstored=True),
    Row("too large: passed through, then 422", (201, 422), 1, f"size={TOO_LARGE}", unstored=True),
]


# server_errors="store": a 5xx after the endpoint's work is its answer; the work runs once.
STORED = [
    Row("store: a 500 after the work is replayed, the work ran once", (500, 500), 1, "status=500", replayed=True),
    Row("store: a 502 is replayed", (502, 502), 1, "status=502", replayed=True),
    Row("store: an exception after the work is a 500 replayed", (500, 500), 1, "raise=1", replayed=True),
    Row("store: a 503 is still given back", (503, 503), 2, "status=503"),
    Row("store: a retry status is still given back", (429, 429), 2, "status=429"),
    Row("store: a 2xx is stored as ever", (201, 201), 1, replayed=True),
]


@dataclass
class Door:
    """A served door: its name, URL, namespace, log file and a client for the run counters."""

    name: str
    url: str
    namespace: str
    log: Path
    redis: redis.Redis

    def warnings(self) -> list[str]:
        """The pass-through warnings the door logged so far, each checked for its logger and words."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        found = [line for line in lines if "passed through and not kept" in line]
        pattern = rf"{re.escape(LOGGERS[self.name])} WARNING key \S+: the \d+ response is passed through and not kept"
        pattern += r" for replay: .+; duplicates are answered 422"
        assert all(re.fullmatch(pattern, line) for line in found), found
        return found


@pytest.fixture(scope="module", params=list(DOORS))
def door(
    request: pytest.FixtureRequest, redis_standalone: servers.RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    """One door served for the module's rows, its library log going to a file."""
    with _served(request.param, redis_standalone, tmp_path_factory) as served:
        yield served


@pytest.fixture(scope="module", params=list(DOORS))
def storing_door(
    request: pytest.FixtureRequest, redis_standalone: servers.RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    """One door served with ``server_errors="store"`` for the module's rows."""
    with _served(request.param, redis_standalone, tmp_path_factory, GOBLIN_TEST_SERVER_ERRORS="store") as served:
        yield served


@contextlib.contextmanager
def _served(
    name: str, redis_server: servers.RedisProcess, tmp_path_factory: pytest.TempPathFactory, **extra: str
) -> Iterator[Door]:
    namespace = unique(f"door-{name}")
    log = tmp_path_factory.mktemp("exchange") / "goblin.log"
    client = redis_server.client()
    env = env_for(redis_server, namespace, GOBLIN_TEST_LOG=str(log), **extra)
    try:
        with serve(name, env, doors=DOORS) as url:
            yield Door(name, url, namespace, log, client)
    finally:
        client.close()


@pytest.mark.parametrize("row", INTAKE + ANSWERS, ids=lambda row: row.name)
def test_every_door_decides_the_table_alike(door: Door, row: Row) -> None:
    """The row's two requests get its statuses; the endpoint ran ``runs`` times; a pass-through warned once."""
    _check(door, row)


@pytest.mark.parametrize("row", STORED, ids=lambda row: row.name)
def test_every_door_stores_server_errors_when_told(storing_door: Door, row: Row) -> None:
    """With ``server_errors="store"``, a 5xx (503 aside) or an exception after the work is replayed; it ran once."""
    _check(storing_door, row)


def _check(door: Door, row: Row) -> None:
    """Send the row's request and its retry to ``door``; check what both got, the runs, and the warnings."""
    expected = {"statuses": row.statuses, "runs": row.runs, "replayed": row.replayed}
    if door.name not in SCOPED:
        expected.update(row.unscoped)
    tag = uuid.uuid4().hex
    key = uuid.uuid4().hex if row.key == "" else row.key
    url = f"{door.url}{row.path}?tag={tag}" + (f"&{row.query}" if row.query else "")
    warned = len(door.warnings())
    first = _send(row.method, url, key, row.user)
    warned_first = len(door.warnings())
    again = _send(row.method, url, key, row.again_user)
    assert (first.status_code, again.status_code) == expected["statuses"], again.text
    assert int(door.redis.get(answers.counter(door.namespace, tag)) or 0) == expected["runs"]
    assert (again.headers.get("idempotent-replayed") == "true") is expected["replayed"]
    if expected["replayed"] and "raise=1" in row.query and door.name not in SEE_THE_500:
        # The exception went on to the server, which answered the first request; retries get the kept problem.
        assert again.headers["content-type"] == "application/problem+json"
        assert again.json()["detail"] == _http.SERVER_ERROR
    elif expected["replayed"]:
        assert again.content == first.content
        assert "set-cookie" not in again.headers  # never replayed: another client's session
    assert ("set-cookie" in first.headers) is ("cookie=1" in row.query)
    assert (first.headers.get("idempotent-stored") == "false") is row.unstored
    assert warned_first - warned == (1 if row.unstored else 0)  # the pass-through, said once, by every door
    assert len(door.warnings()) == warned_first
    if row.unstored:
        assert again.headers["content-type"] == "application/problem+json"
        assert "was not kept" in again.json()["detail"]


def _send(method: str, url: str, key: str | None, user: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if user is not None:
        headers["X-User"] = user
    return httpx.request(method, url, content=b'{"items": ["tea"]}', headers=headers, timeout=60)
