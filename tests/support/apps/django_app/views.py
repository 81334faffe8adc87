"""The views: each run counts itself in Redis (the test reads the counters from its own process).

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the counters'
prefix, ``GOBLIN_TEST_DELAY`` how long a view works. The sync view pushes its process id
to ``<namespace>:runs:sync:pids``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import redis
import redis.asyncio
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse

from goblin_claim.django import idempotency_key, idempotent_view
from tests.support.apps import answers

PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
NAMESPACE = os.environ["GOBLIN_TEST_NAMESPACE"]
COUNTERS = f"{NAMESPACE}:runs"
DELAY = float(os.environ.get("GOBLIN_TEST_DELAY", "1.5"))
_clients: dict[str, Any] = {}


def _sync() -> redis.Redis:
    if "sync" not in _clients:
        _clients["sync"] = redis.Redis(host="127.0.0.1", port=PORT)
    client: redis.Redis = _clients["sync"]
    return client


def health(request: HttpRequest) -> HttpResponse:
    """Answer GET: the server is up (safe methods pass the middleware untouched)."""
    return HttpResponse("ok")


def order_sync(request: HttpRequest) -> JsonResponse:
    """A sync view (Django runs it in a thread, which a disconnect does not stop): count, work, count the end."""
    items = json.loads(request.body)["items"]
    _sync().rpush(f"{COUNTERS}:sync:pids", os.getpid())
    run = _sync().incr(f"{COUNTERS}:sync")
    time.sleep(DELAY)
    _sync().incr(f"{COUNTERS}:sync:finished")
    return JsonResponse({"order": f"ord_{run}", "items": items}, status=201)


async def order_async(request: HttpRequest) -> JsonResponse:
    """An async view (Django cancels it when the client disconnects): count, work, count the end."""
    items = json.loads(request.body)["items"]
    client = _clients.get("async")
    if client is None:
        client = _clients["async"] = redis.asyncio.Redis(host="127.0.0.1", port=PORT)
    run = await client.incr(f"{COUNTERS}:async")
    await asyncio.sleep(DELAY)
    await client.incr(f"{COUNTERS}:async:finished")
    return JsonResponse({"order": f"ord_{run}", "items": items}, status=201)


@idempotent_view(required=True, scope=None)
def order_own(request: HttpRequest) -> JsonResponse:
    """A view with its own options (a key required, no scope): the middleware leaves it to its decorator."""
    run = _sync().incr(f"{COUNTERS}:own")
    return JsonResponse({"order": f"ord_{run}"}, status=201)


@idempotent_view(scope=lambda request: request.user.pk)
def order_misconfigured(request: HttpRequest) -> JsonResponse:
    """A view whose scope reads request.user, which no AuthenticationMiddleware set: it must never run."""
    run = _sync().incr(f"{COUNTERS}:misconfigured")
    return JsonResponse({"order": f"ord_{run}"}, status=201)


@idempotency_key("ignore")
def webhook(request: HttpRequest) -> JsonResponse:
    """A webhook its sender signs: the middleware never claims it, key or not."""
    run = _sync().incr(f"{COUNTERS}:webhook")
    return JsonResponse({"run": run}, status=201)


def answer(request: HttpRequest) -> HttpResponseBase:
    """``/answer`` (tests/support/apps/answers.py) in Django: a StreamingHttpResponse when asked for a stream."""
    asked = answers.asked(request.META.get("QUERY_STRING", ""))
    _sync().incr(answers.counter(NAMESPACE, asked.tag))
    asked.fail_if_asked()
    response: HttpResponseBase
    if asked.stream:
        response = StreamingHttpResponse(asked.chunks(), status=asked.status)
    else:
        response = HttpResponse(asked.body, status=asked.status)
    for name, value in asked.headers:
        response[name] = value
    return response


@idempotency_key("ignore")
def answer_ignored(request: HttpRequest) -> HttpResponseBase:
    """``/answer`` on a route that ignores the key."""
    return answer(request)
