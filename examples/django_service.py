"""A one-file Django service whose POST views honour the Idempotency-Key header, through goblin_claim.django.

The middleware sits after authentication in ``MIDDLEWARE`` (here a small
header-reading one; in a real project ``AuthenticationMiddleware``), reads its
options from ``GOBLIN_CLAIM_IDEMPOTENCY``, and answers as the IETF draft says: a
missing key 400, a reused key with another body 422, a retry while the first
request runs 409, a retry after it finished the first response replayed
(``Idempotent-Replayed: true``). One view wears its own options. Runs on an
embedded fakeredis, or on REDIS_URL.

The demo serves the project over WSGI on a free loopback port in a thread, sends a
few requests, prints what came back, and stops:

    python examples/django_service.py
    REDIS_URL=redis://localhost:6379/0 python examples/django_service.py

The same settings serve under ASGI (``get_asgi_application()`` under uvicorn): with
a URL as the client, the middleware makes a sync or an asyncio client as needed.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import django
import httpx
import redis
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import path

NAMESPACE = "examples.django"
created: list[str] = []


def connect() -> Any:
    url = os.environ.get("REDIS_URL")
    if url:
        return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    from goblin_claim.testing import fake_redis

    return fake_redis(native=True)


CLIENT = connect()


class HeaderAuthMiddleware:
    # Stands in for AuthenticationMiddleware: the caller is the bearer token's name.
    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        request.user_name = request.headers.get("Authorization", "").removeprefix("Bearer ") or None  # type: ignore[attr-defined]
        return self.get_response(request)


settings.configure(
    DEBUG=False,
    SECRET_KEY="example only",
    ALLOWED_HOSTS=["127.0.0.1"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["goblin_claim.django.GoblinClaimConfig"],
    MIDDLEWARE=[f"{__name__}.HeaderAuthMiddleware", "goblin_claim.django.IdempotencyMiddleware"],
    GOBLIN_CLAIM_IDEMPOTENCY={
        "client": CLIENT,  # or "redis://..." (both worlds), or "myproject.redis.make_client"
        "required": True,
        "scope": lambda request: request.user_name,
        "namespace": NAMESPACE,
    },
    SILENCED_SYSTEM_CHECKS=["goblin_claim.W001"],  # the auth here is custom
)
django.setup()

from goblin_claim.django import idempotent_view  # noqa: E402 -- after settings.configure()


def create_order(request: HttpRequest) -> JsonResponse:
    items = json.loads(request.body)["items"]
    created.append(items[0])
    time.sleep(0.3)  # the database is slow
    return JsonResponse({"order_id": f"ord_{len(created)}", "items": items}, status=201)


@idempotent_view(ttl=3600, scope=None)  # this view's own options: one space for every caller
def create_refund(request: HttpRequest) -> JsonResponse:
    created.append("refund")
    return JsonResponse({"refund_id": f"ref_{len(created)}"}, status=201)


urlpatterns = [path("orders", create_order), path("refunds", create_refund)]


class Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any) -> None:
        pass  # the demo prints its own lines


def show(label: str, response: httpx.Response) -> None:
    replayed = response.headers.get("idempotent-replayed", "-")
    if "json" not in response.headers["content-type"]:
        print(f"{label:<24} -> status={response.status_code} replayed={replayed} (not claimed: no view matched)")
        return
    body: Any = response.json()
    detail = body.get("detail", body) if response.headers["content-type"] == "application/problem+json" else body
    print(f"{label:<24} -> status={response.status_code} replayed={replayed} {detail}")


def main() -> None:
    from django.core.wsgi import get_wsgi_application

    server = make_server("127.0.0.1", 0, get_wsgi_application(), server_class=Server, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(
        f"Serving on http://127.0.0.1:{server.server_port} with", os.environ.get("REDIS_URL") or "an embedded fakeredis"
    )
    for key in CLIENT.scan_iter(f"{NAMESPACE}:*"):  # a fresh story, also on a reused server
        CLIENT.delete(key)

    alice = {"Idempotency-Key": "k-1", "Authorization": "Bearer alice"}
    tea, coffee = {"items": ["tea"]}, {"items": ["coffee"]}
    with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=10) as http:
        first: list[httpx.Response] = []
        running = threading.Thread(target=lambda: first.append(http.post("/orders", json=tea, headers=alice)))
        running.start()
        time.sleep(0.1)
        show("retry while running", http.post("/orders", json=tea, headers=alice))
        running.join()
        show("first request", first[0])
        show("retry after it ended", http.post("/orders", json=tea, headers=alice))
        show("same key, new body", http.post("/orders", json=coffee, headers=alice))
        show("no key", http.post("/orders", json=tea, headers={"Authorization": "Bearer alice"}))
        show("no user", http.post("/orders", json=tea, headers={"Idempotency-Key": "k-2"}))
        show("unknown path", http.post("/nowhere", json=tea, headers=alice))
        bob = {**alice, "Authorization": "Bearer bob"}
        show("same key, other user", http.post("/orders", json=coffee, headers=bob))
        refund = {"Idempotency-Key": "r-1", "Authorization": "Bearer alice"}
        show("refund", http.post("/refunds", json={}, headers=refund))
        show("refund again, by bob", http.post("/refunds", json={}, headers={**refund, "Authorization": "Bearer bob"}))
    server.shutdown()
    thread.join()
    print(f"work done: {created}")
    assert created == ["tea", "coffee", "refund"]  # once for alice, once for bob, one refund


if __name__ == "__main__":
    main()
