"""A Django project exercising the door through Django's test clients; run as a script it prints what each case saw.

``DJANGO_SETTINGS_MODULE=tests.http.django_paths``: settings, views and URLs in
one module. ``python -m tests.http.django_paths <redis port>`` runs every case
(``Client`` takes the WSGI path, ``AsyncClient`` the ASGI one) over fakeredis,
or over the redis-server at the port where Redis itself must be real (URLs,
refused writes), and prints one JSON object: each case's findings, or the error
it raised. Django's settings are configured once per process, hence a child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fakeredis
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import path

SECRET_KEY = "goblin-claim tests only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.http.django_paths"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["goblin_claim.django.IdempotencyMiddleware"]
DATABASES: dict[str, Any] = {}
USE_TZ = True
LOGGING_CONFIG = None
NS = "django-paths"
DOCS = "https://docs.example/problems"
GOBLIN_CLAIM_IDEMPOTENCY: dict[str, Any] = {
    "client": "tests.http.django_paths.sync_client", "namespace": NS, "problem_docs": DOCS,
}  # fmt: skip

SERVER = fakeredis.FakeServer()
RAW = fakeredis.FakeRedis(server=SERVER)
RUNS: dict[str, int] = {}
GATE = {"started": threading.Event(), "release": threading.Event()}
BEGAN: dict[str, asyncio.Event] = {}  # the async view's: set by the case that awaits it


def sync_client() -> fakeredis.FakeRedis:
    """The settings' client factory under WSGI: fakeredis."""
    return fakeredis.FakeRedis(server=SERVER)


def async_client() -> fakeredis.FakeAsyncRedis:
    """A client factory for ASGI: fakeredis, the same server."""
    return fakeredis.FakeAsyncRedis(server=SERVER)


UNREACHABLE: list[int] = []  # a port nobody listens on, chosen by case_fail_open


def unreachable_client() -> Any:
    """A sync client of a Redis out of reach: nothing listens on its port."""
    import redis

    return redis.Redis(host="127.0.0.1", port=UNREACHABLE[0], socket_connect_timeout=1, retry=None)


def unreachable_async_client() -> Any:
    """The asyncio twin of ``unreachable_client``."""
    import redis.asyncio

    return redis.asyncio.Redis(host="127.0.0.1", port=UNREACHABLE[0], socket_connect_timeout=1, retry=None)


def ran(name: str) -> int:
    """Count one run of the view ``name``; the run's number."""
    RUNS[name] = RUNS.get(name, 0) + 1
    return RUNS[name]


# --------------------------------------------------------------------------- views


def order(request: HttpRequest) -> HttpResponse:
    """A sync view: 201 with its run's number."""
    return HttpResponse(f"order {ran('order')}", status=201, content_type="text/plain")


async def order_async(request: HttpRequest) -> HttpResponse:
    """An async view: 201 with its run's number."""
    return HttpResponse(f"order {ran('order_async')}", status=201, content_type="text/plain")


def opened(request: HttpRequest) -> HttpResponse:
    """A sync view for the fail-open case: 201 with its run's number."""
    return HttpResponse(f"opened {ran('opened')}", status=201, content_type="text/plain")


async def opened_async(request: HttpRequest) -> HttpResponse:
    """The async twin of ``opened``."""
    return HttpResponse(f"opened {ran('opened_async')}", status=201, content_type="text/plain")


def missing(request: HttpRequest) -> HttpResponse:
    """A view raising Http404: Django answers 404, a status not kept."""
    ran("missing")
    raise Http404("no such order")


def big(request: HttpRequest) -> HttpResponse:
    """A body larger than max_response_bytes (set to 50 in the cases using it)."""
    ran("big")
    return HttpResponse(b"b" * 80, content_type="text/plain")


async def big_async(request: HttpRequest) -> HttpResponse:
    """The async twin of ``big``."""
    ran("big_async")
    return HttpResponse(b"b" * 80, content_type="text/plain")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    """A sync stream."""
    ran("stream")
    return StreamingHttpResponse(iter([b"a\n", "b\n", b"c\n"]), content_type="text/csv")


async def stream_async(request: HttpRequest) -> StreamingHttpResponse:
    """An async generator's stream."""
    ran("stream_async")

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"a\n", b"b\n", b"c\n"):
            yield chunk

    return StreamingHttpResponse(chunks(), content_type="text/csv")


async def stream_sync_under_asgi(request: HttpRequest) -> StreamingHttpResponse:
    """An async view returning a sync stream (its chunks made in a thread under ASGI)."""
    ran("stream_sync_under_asgi")

    def rows() -> Iterator[bytes]:
        try:
            yield b"x\n"
            yield b"y\n"
        finally:
            ran("stream_sync_closed")

    return StreamingHttpResponse(rows(), content_type="text/csv")


class Plain(HttpResponseBase):
    """A response class of a project's own, neither HttpResponse nor streamed: its body is never read to store."""

    streaming = False

    def __init__(self, content: bytes) -> None:
        super().__init__(content_type="text/plain")
        self.content = content

    def __iter__(self) -> Iterator[bytes]:
        return iter([self.content])


def plain(request: HttpRequest) -> HttpResponseBase:
    """Answer with the project's own response class."""
    ran("plain")
    return Plain(b"plain")


def event_stream(request: HttpRequest) -> HttpResponse:
    """A whole response typed as an event stream: never kept."""
    ran("event_stream")
    return HttpResponse(b"data: 1\n\n", content_type="text/event-stream")


async def event_stream_async(request: HttpRequest) -> HttpResponse:
    """The async twin of ``event_stream``."""
    ran("event_stream_async")
    return HttpResponse(b"data: 1\n\n", content_type="text/event-stream")


def lapsing(request: HttpRequest) -> HttpResponse:
    """A view whose claim lapses (is gone) before it answers."""
    ran("lapsing")
    RAW.delete(*RAW.keys(f"{NS}:*"))
    return HttpResponse(b"made", status=201)


async def lapsing_async(request: HttpRequest) -> HttpResponse:
    """The async twin of ``lapsing``."""
    ran("lapsing_async")
    RAW.delete(*RAW.keys(f"{NS}:*"))
    return HttpResponse(b"made", status=201)


def stopped(request: HttpRequest) -> HttpResponse:
    """A view stopped mid-request (gunicorn's timeout raises SystemExit)."""
    ran("stopped")
    raise SystemExit(1)


def slow(request: HttpRequest) -> HttpResponse:
    """A view that holds its key until released."""
    ran("slow")
    GATE["started"].set()
    GATE["release"].wait(10)
    return HttpResponse(b"slow", status=201)


async def hanging(request: HttpRequest) -> HttpResponse:
    """An async view that never ends by itself (the client leaves, Django cancels it)."""
    ran("hanging")
    BEGAN["hanging"].set()
    await asyncio.sleep(30)
    return HttpResponse(b"late", status=201)


def filling(request: HttpRequest) -> HttpResponse:
    """A view after which Redis refuses writes (maxmemory reached)."""
    ran("filling")
    admin = __import__("redis").Redis(port=int(os.environ["GOBLIN_TEST_REDIS_PORT"]))
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    return HttpResponse(b"made", status=201)


async def filling_async(request: HttpRequest) -> HttpResponse:
    """The async twin of ``filling``."""
    return await asyncio.to_thread(filling, request)


def _own(name: str, options: dict[str, Any], is_async: bool = False) -> Callable[..., Any]:
    from goblin_claim.django import idempotent_view

    if is_async:

        async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if request.headers.get("X-Fail") == "yes":
                ran(name + ":failed")
                raise LookupError("the order table is gone")
            return HttpResponse(f"{name} {ran(name)}", status=201)

    else:

        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:  # type: ignore[misc]
            if request.headers.get("X-Fail") == "yes":
                ran(name + ":failed")
                raise LookupError("the order table is gone")
            return HttpResponse(f"{name} {ran(name)}", status=201)

    view.__name__ = name
    return idempotent_view(**options)(view)


def _ignored(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"webhook {ran('webhook')}", status=202)


def _views() -> list[Any]:
    from goblin_claim.django import idempotency_key

    def scope(request: HttpRequest) -> str | None:
        user = request.headers.get("X-User")
        if user == "stranger":
            raise PermissionDenied("not you")
        if user == "broken":
            raise RuntimeError("the session store is down")
        return user

    webhook = idempotency_key("ignore")(_ignored)

    def failing_routes(request: HttpRequest) -> str:
        raise LookupError("the routing table is gone")

    routed = _own("routed", {"routes": failing_routes})
    own_required = _own("own_required", {"required": True})
    own_async = _own("own_async", {"client": "tests.http.django_paths.async_client"}, is_async=True)
    own_async_required = _own(
        "own_async_required", {"client": "tests.http.django_paths.async_client", "required": True}, is_async=True
    )
    scoped = _own("scoped", {"scope": scope})
    scoped_async = _own("scoped_async", {"client": "tests.http.django_paths.async_client", "scope": scope}, True)
    failing = _own("failing", {})
    failing_async = _own("failing_async", {"client": "tests.http.django_paths.async_client"}, is_async=True)
    small_body = _own("small_body", {"max_body_bytes": 16})
    small_body_async = _own(
        "small_body_async", {"client": "tests.http.django_paths.async_client", "max_body_bytes": 16}, True
    )
    return [
        path("orders", order), path("orders-async", order_async), path("missing", missing), path("big", big),
        path("big-async", big_async), path("stream", stream), path("stream-async", stream_async),
        path("stream-sync-under-asgi", stream_sync_under_asgi), path("events", event_stream),
        path("events-async", event_stream_async), path("lapsing", lapsing), path("lapsing-async", lapsing_async),
        path("stopped", stopped), path("slow", slow), path("hanging", hanging), path("filling", filling),
        path("filling-async", filling_async), path("webhook", webhook), path("own-required", own_required),
        path("own-async", own_async), path("own-async-required", own_async_required), path("scoped", scoped),
        path("scoped-async", scoped_async), path("failing", failing), path("failing-async", failing_async),
        path("small-body", small_body), path("small-body-async", small_body_async), path("routed", routed),
        path("plain", plain), path("opened", opened), path("opened-async", opened_async),
    ]  # fmt: skip


def _failing_views() -> list[Any]:
    """``server_errors="store"``: a plain view failing after its work (the middleware's), and decorated ones."""

    def transfer(request: HttpRequest) -> HttpResponse:
        ran("transfer")  # the work, committed
        raise LookupError("the queue is down")

    stored_async = {"client": "tests.http.django_paths.async_client", "server_errors": "store"}
    return [
        path("transfer", transfer),
        path("transfer-own", _own("transfer_own", {"server_errors": "store"})),
        path("transfer-own-async", _own("transfer_own_async", stored_async, is_async=True)),
    ]


urlpatterns = [*_views(), *_failing_views()] if os.environ.get("DJANGO_SETTINGS_MODULE") == __name__ else []


# --------------------------------------------------------------------------- what a client saw


def seen(response: Any) -> dict[str, Any]:
    """A response as the tests compare it: status, the headers they read, the body and the problem's code."""
    headers = {name.lower(): value for name, value in response.items()}
    body = b"".join(response.streaming_content) if response.streaming else response.content
    got: dict[str, Any] = {"status": response.status_code, "body": body.decode("latin-1")}
    for name in ("idempotent-replayed", "idempotent-stored", "retry-after"):
        if name in headers:
            got[name] = headers[name]
    if headers.get("content-type") == "application/problem+json":
        problem = json.loads(body)
        got["problem"] = problem["type"].removeprefix(DOCS + "#")
        got["detail"] = problem["detail"]
    return got


async def aseen(response: Any) -> dict[str, Any]:
    """``seen`` for an AsyncClient response (an async stream is read with ``async for``)."""
    if response.streaming and response.is_async:
        chunks = [chunk async for chunk in response.streaming_content]
        response.streaming_content = iter(chunks)
    return seen(response)


KEY = {"Idempotency-Key": "k-1"}


def post(client: Any, url: str, body: bytes = b"{}", **headers: str) -> dict[str, Any]:
    """POST ``body`` as JSON with the key (unless ``headers`` says otherwise) through Django's test Client."""
    return seen(client.post(url, body, "application/json", headers={**KEY, **headers}))


async def apost(client: Any, url: str, body: bytes = b"{}", **headers: str) -> dict[str, Any]:
    """``post`` through the AsyncClient."""
    return await aseen(await client.post(url, body, "application/json", headers={**KEY, **headers}))


# --------------------------------------------------------------------------- the cases


def case_passing(client_class: Any) -> dict[str, Any]:
    """What the middleware leaves alone: a GET, a keyless POST, an unrouted URL, a webhook marked ignore."""
    http = client_class()
    return {
        "get": seen(http.get("/orders")),
        "keyless": [seen(http.post("/orders", b"{}", "application/json")) for _ in range(2)],
        "unrouted": seen(http.post("/nowhere", b"{}", "application/json", headers=KEY))["status"],
        "webhook": [post(http, "/webhook")["status"] for _ in range(2)],
        "keys": len(RAW.keys(f"{NS}:*")),
    }


def case_sync(client_class: Any) -> dict[str, Any]:
    """The WSGI path: replays, a reused key, a status given back, passed responses, a lost claim, a stopped view."""
    http = client_class(raise_request_exception=False)
    found: dict[str, Any] = {"replay": [post(http, "/orders"), post(http, "/orders")]}
    found["reused"] = post(http, "/orders", b'{"other": 1}')
    found["given_back"] = [post(http, "/missing")["status"] for _ in range(2)]
    from django.test import override_settings

    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={**GOBLIN_CLAIM_IDEMPOTENCY, "max_response_bytes": 50}):
        small = client_class()
        found["big"] = [post(small, "/big"), post(small, "/big")]
    found["events"] = [post(http, "/events"), post(http, "/events")]
    found["stream"] = [post(http, "/stream"), post(http, "/stream")]
    cut = http.post("/stream", b"{}", "application/json", headers={"Idempotency-Key": "k-cut"})
    next(iter(cut.streaming_content))
    cut.close()
    found["stream_cut"] = post(http, "/stream", **{"Idempotency-Key": "k-cut"})
    found["lapsing"] = post(http, "/lapsing")
    try:
        post(http, "/stopped")
        found["stopped"] = "no SystemExit"
    except SystemExit:
        found["stopped"] = post(http, "/stopped")
    return found


def case_own_options(client_class: Any) -> dict[str, Any]:
    """Views wearing ``@idempotent_view``: their own options, scopes, body limits, an exception given back."""
    http = client_class(raise_request_exception=False)
    found: dict[str, Any] = {"required": seen(http.post("/own-required", b"{}", "application/json"))}
    found["required_keyed"] = [post(http, "/own-required"), post(http, "/own-required")]
    found["stranger"] = post(http, "/scoped", **{"X-User": "stranger"})["status"]
    found["nobody"] = post(http, "/scoped")
    found["broken"] = post(http, "/scoped", **{"X-User": "broken"})
    found["owners"] = [post(http, "/scoped", **{"X-User": u})["body"] for u in ("ann", "bob", "ann")]
    found["failing"] = [post(http, "/failing", **{"X-Fail": "yes"})["status"], post(http, "/failing")]
    found["too_large"] = post(http, "/small-body", b'{"items": "' + b"x" * 40 + b'"}')
    found["get"] = [seen(http.get("/own-required"))["status"] for _ in range(2)]
    found["routed"] = post(http, "/routed")
    found["plain"] = [post(http, "/plain"), post(http, "/plain")]
    return found


def case_in_flight(client_class: Any) -> dict[str, Any]:
    """A duplicate of a running request: 409 at once (wait=0), the view not run twice."""
    GATE["started"].clear()
    GATE["release"].clear()
    first: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: first.update(post(client_class(), "/slow")))
    worker.start()
    GATE["started"].wait(10)
    duplicate = post(client_class(), "/slow")
    GATE["release"].set()
    worker.join(10)
    return {"first": first, "duplicate": duplicate}


async def case_async(client_class: Any) -> dict[str, Any]:
    """The ASGI path, the middleware given an asyncio client: the same answers as under WSGI."""
    from django.test import override_settings

    found: dict[str, Any] = {}
    setting = {**GOBLIN_CLAIM_IDEMPOTENCY, "client": "tests.http.django_paths.async_client"}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
        http = client_class()
        found["get"] = (await aseen(await http.get("/orders-async")))["status"]
        found["unrouted"] = (await http.post("/nowhere", b"{}", "application/json", headers=KEY)).status_code
        found["replay"] = [await apost(http, "/orders-async"), await apost(http, "/orders-async")]
        found["reused"] = await apost(http, "/orders-async", b'{"other": 1}')
        found["given_back"] = [(await apost(http, "/missing"))["status"] for _ in range(2)]
        found["events"] = [await apost(http, "/events-async"), await apost(http, "/events-async")]
        found["stream"] = [await apost(http, "/stream-async"), await apost(http, "/stream-async")]
        found["stream_sync"] = [
            await apost(http, "/stream-sync-under-asgi"), await apost(http, "/stream-sync-under-asgi"),
        ]  # fmt: skip
        found["stream_sync_closed"] = RUNS.get("stream_sync_closed")
        found["lapsing"] = await apost(http, "/lapsing-async")
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={**setting, "max_response_bytes": 50}):
        small = client_class()
        found["big"] = [await apost(small, "/big-async"), await apost(small, "/big-async")]
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={**setting, "scope": lambda request: request.headers["X-User"]}):
        scoped = client_class()
        found["scoped"] = [(await apost(scoped, "/orders-async", **{"X-User": u}))["body"] for u in ("ann", "bob")]
    return found


async def case_async_own(client_class: Any) -> dict[str, Any]:
    """Async views wearing ``@idempotent_view``: required, scoped, failing, a body too large, a cancelled view."""
    http = client_class(raise_request_exception=False)
    found: dict[str, Any] = {
        "required": await aseen(await http.post("/own-async-required", b"{}", "application/json")),
        "replay": [await apost(http, "/own-async"), await apost(http, "/own-async")],
        "nobody": await apost(http, "/scoped-async"),
        "stranger": (await apost(http, "/scoped-async", **{"X-User": "stranger"}))["status"],
        "owner": (await apost(http, "/scoped-async", **{"X-User": "ann"}))["body"],
        "failing": [(await apost(http, "/failing-async", **{"X-Fail": "yes"}))["status"]],
        "too_large": await apost(http, "/small-body-async", b'{"items": "' + b"x" * 40 + b'"}'),
    }
    found["failing"].append(await apost(http, "/failing-async"))
    found["get"] = [(await aseen(await http.get("/own-async")))["status"] for _ in range(2)]
    from django.test.client import FakePayload

    body = b'{"items": "' + b"y" * 40 + b'"}'
    chunked = await http.request(
        method="POST", path="/small-body-async", _body_file=FakePayload(body),
        headers=[(b"idempotency-key", b"k-chunked"), (b"content-type", b"application/json")],
    )  # fmt: skip  # a chunked upload, as uvicorn presents it: no content-length header
    found["chunked_too_large"] = await aseen(chunked)
    return found


async def case_cancelled(client_class: Any) -> dict[str, Any]:
    """An async view cancelled mid-request (the client left): the key is kept closed, a duplicate gets 422."""
    from django.test import override_settings

    setting = {**GOBLIN_CLAIM_IDEMPOTENCY, "client": "tests.http.django_paths.async_client"}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
        http = client_class()
        BEGAN["hanging"] = asyncio.Event()
        request = asyncio.ensure_future(http.post("/hanging", b"{}", "application/json", headers=KEY))
        await asyncio.wait_for(BEGAN["hanging"].wait(), 10)
        request.cancel()
        try:
            await request
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        return {"cancelled": cancelled, "duplicate": await apost(client_class(), "/hanging")}


async def read_one_chunk(client_class: Any) -> bytes:
    """Read the async stream's first chunk and leave (its generators are closed when the loop ends)."""
    from django.test import override_settings

    setting = {**GOBLIN_CLAIM_IDEMPOTENCY, "client": "tests.http.django_paths.async_client"}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
        response = await client_class().post(
            "/stream-async", b"{}", "application/json", headers={"Idempotency-Key": "k-cut"}
        )
        chunks = response.streaming_content.__aiter__()
        return bytes(await chunks.__anext__())


async def duplicate_of_the_cut_stream(client_class: Any) -> dict[str, Any]:
    """The duplicate of the stream read in part."""
    from django.test import override_settings

    setting = {**GOBLIN_CLAIM_IDEMPOTENCY, "client": "tests.http.django_paths.async_client"}
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
        return await apost(client_class(), "/stream-async", **{"Idempotency-Key": "k-cut"})


def case_server_errors(client_class: Any, async_class: Any) -> dict[str, Any]:
    """A view failing after its work, with and without ``server_errors="store"``: how often it ran, what came back."""
    from django.test import override_settings

    found: dict[str, Any] = {}
    http = client_class(raise_request_exception=False)
    found["given_back"] = [post(http, "/transfer", **{"Idempotency-Key": "k-t1"}) for _ in range(2)]
    found["given_back_runs"] = RUNS.get("transfer", 0)
    with override_settings(GOBLIN_CLAIM_IDEMPOTENCY={**GOBLIN_CLAIM_IDEMPOTENCY, "server_errors": "store"}):
        stored = client_class(raise_request_exception=False)
        found["stored"] = [post(stored, "/transfer", **{"Idempotency-Key": "k-t2"}) for _ in range(2)]
    found["stored_runs"] = RUNS["transfer"] - found["given_back_runs"]
    found["own"] = [post(http, "/transfer-own", **{"X-Fail": "yes"}) for _ in range(2)]

    async def own_async() -> list[dict[str, Any]]:
        ahttp = async_class(raise_request_exception=False)
        return [await apost(ahttp, "/transfer-own-async", **{"X-Fail": "yes"}) for _ in range(2)]

    found["own_async"] = asyncio.run(own_async())
    return found


def case_real_redis(port: int) -> dict[str, Any]:
    """A redis:// and a valkey:// URL serve both worlds; Redis refusing the store: sent, marked unstored."""
    from django.test import AsyncClient, Client, override_settings

    found: dict[str, Any] = {}
    for scheme in ("redis", "valkey"):
        setting = {"client": f"{scheme}://127.0.0.1:{port}/0", "namespace": f"{NS}-{scheme}", "problem_docs": DOCS}
        with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
            found[scheme] = [post(Client(), "/orders")["status"], post(Client(), "/orders").get("idempotent-replayed")]

            async def both() -> list[Any]:
                return [await apost(AsyncClient(), "/orders-async"), await apost(AsyncClient(), "/orders-async")]

            first, again = asyncio.run(both())
            found[scheme + "_async"] = [first["status"], again.get("idempotent-replayed")]
    admin = __import__("redis").Redis(port=port)
    for world, url in (("sync", "/filling"), ("async", "/filling-async")):
        setting = {"client": f"redis://127.0.0.1:{port}/0", "namespace": f"{NS}-full-{world}", "problem_docs": DOCS}
        with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
            try:
                sent = post(Client(), url) if world == "sync" else asyncio.run(apost(AsyncClient(), url))
            finally:
                admin.config_set("maxmemory", 0)
            again = post(Client(), url) if world == "sync" else asyncio.run(apost(AsyncClient(), url))
        found["full_" + world] = [sent, again]
    return found


def case_fail_open() -> dict[str, Any]:
    """Redis out of reach in both worlds: with fail_open each delivery runs the view once; without it, 503."""
    from django.test import AsyncClient, Client, override_settings

    from tests.support.servers import free_port

    UNREACHABLE.append(free_port())
    found: dict[str, Any] = {}
    for fail_open in (True, False):
        name = "open" if fail_open else "closed"
        setting = {"namespace": NS + "-open", "problem_docs": DOCS, "fail_open": fail_open}
        with override_settings(
            GOBLIN_CLAIM_IDEMPOTENCY={**setting, "client": "tests.http.django_paths.unreachable_client"}
        ):
            found["sync_" + name] = [post(Client(), "/opened") for _ in range(2)]
        with override_settings(
            GOBLIN_CLAIM_IDEMPOTENCY={**setting, "client": "tests.http.django_paths.unreachable_async_client"}
        ):

            async def twice() -> list[dict[str, Any]]:
                return [await apost(AsyncClient(), "/opened-async") for _ in range(2)]

            found["async_" + name] = asyncio.run(twice())
    return found


def case_settings() -> dict[str, Any]:
    """Settings the door refuses, each with its ImproperlyConfigured message; the system check's findings."""
    from django.core.exceptions import ImproperlyConfigured
    from django.test import Client, override_settings

    from goblin_claim.django import check_middleware_order

    def replayed(setting: Any) -> list[Any]:
        with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
            return [post(Client(), "/orders")["status"], post(Client(), "/orders").get("idempotent-replayed")]

    def refused(setting: Any) -> str:
        try:
            with override_settings(GOBLIN_CLAIM_IDEMPOTENCY=setting):
                Client().post("/orders", b"{}", "application/json", headers=KEY)
        except ImproperlyConfigured as exc:
            return str(exc)
        return "accepted"

    found: dict[str, Any] = {
        "unset": refused(None),
        "not_a_dict": refused(["redis://"]),
        "no_client": refused({"namespace": NS}),
        "bad_option": refused({"client": "tests.http.django_paths.sync_client", "wait": -1}),
        "unknown_option": refused({"client": "tests.http.django_paths.sync_client", "colour": "blue"}),
        "wrong_kind": refused({"client": "tests.http.django_paths.async_client"}),
        "instance": replayed({"client": fakeredis.FakeRedis(server=SERVER), "namespace": NS + "-instance"}),
        "dotted_instance": replayed({"client": "tests.http.django_paths.RAW", "namespace": NS + "-dotted"}),
    }
    hidden = {name: sys.modules.get(name) for name in ("valkey", "valkey.asyncio")}
    sys.modules.update(dict.fromkeys(hidden))  # as if valkey-py were not installed: its import fails
    try:
        found["valkey_missing"] = refused({"client": "valkey://127.0.0.1:1/0"})
    finally:
        for name, module in hidden.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    auth = "django.contrib.auth.middleware.AuthenticationMiddleware"
    door = "goblin_claim.django.IdempotencyMiddleware"
    good = {"client": "redis://127.0.0.1:1/0"}
    scoped = {**good, "scope": lambda request: request.user.pk}
    checks = {
        "absent": ([], good),
        "fine": ([door], good),
        "auth_after": ([door, auth], good),
        "auth_before_scoped": ([auth, door], scoped),
        "scope_without_auth": ([door], scoped),
        "bad_setting": ([door], {"client": "redis://127.0.0.1:1/0", "ttl": 0}),
    }
    for name, (middleware, setting) in checks.items():
        with override_settings(MIDDLEWARE=middleware, GOBLIN_CLAIM_IDEMPOTENCY=setting):
            found["check_" + name] = [[m.id, m.msg] for m in check_middleware_order()]
    return found


def main() -> None:
    """Run every case; print one JSON object of their findings (or their errors)."""
    import django

    django.setup()
    from django.test import AsyncClient, Client

    port = int(sys.argv[1])
    os.environ["GOBLIN_TEST_REDIS_PORT"] = str(port)
    records: list[list[str]] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append([record.name, record.getMessage()])  # type: ignore[method-assign]
    logging.getLogger("goblin_claim").addHandler(handler)
    logging.getLogger("goblin_claim").setLevel(logging.WARNING)
    cases: dict[str, Callable[[], Any]] = {
        "passing": lambda: case_passing(Client),
        "sync": lambda: case_sync(Client),
        "own_options": lambda: case_own_options(Client),
        "in_flight": lambda: case_in_flight(Client),
        "async": lambda: asyncio.run(case_async(AsyncClient)),
        "async_own": lambda: asyncio.run(case_async_own(AsyncClient)),
        "cancelled": lambda: asyncio.run(case_cancelled(AsyncClient)),
        "async_cut": lambda: {
            "first": asyncio.run(read_one_chunk(AsyncClient)).decode(),
            "duplicate": asyncio.run(duplicate_of_the_cut_stream(AsyncClient)),
        },
        "server_errors": lambda: case_server_errors(Client, AsyncClient),
        "real_redis": lambda: case_real_redis(port),
        "fail_open": case_fail_open,
        "settings": case_settings,
    }
    found: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            found[name] = case()
        except BaseException:  # reported to the test, which fails naming it
            found[name] = {"error": traceback.format_exc()}
    found["runs"] = RUNS
    found["logs"] = records
    print(json.dumps(found))


if __name__ == "__main__":
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.http.django_paths"
    from tests.http import django_paths  # the settings module's copy: its views count in its RUNS

    django_paths.main()
