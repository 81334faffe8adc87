"""A Django project whose streamed views outlast two leases (lease=1): settings, views, URLs and both applications.

``DJANGO_SETTINGS_MODULE=tests.http.lease_django``; ``/stream`` streams from an
async generator, ``/stream-sync`` from a sync one (under ASGI too).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path

from tests.http.lease_apps import LEASE, NAMESPACE, PORT, STREAM_SECONDS, count_run, lines

SECRET_KEY = "goblin-claim tests only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.http.lease_django"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["goblin_claim.django.IdempotencyMiddleware"]
DATABASES: dict[str, Any] = {}
USE_TZ = True
LOGGING_CONFIG = None
GOBLIN_CLAIM_IDEMPOTENCY = {"client": f"redis://127.0.0.1:{PORT}/0", "namespace": NAMESPACE, "lease": LEASE}


def health(request: HttpRequest) -> HttpResponse:
    """The readiness check."""
    return HttpResponse(b"ok")


async def stream(request: HttpRequest) -> StreamingHttpResponse:
    """An async generator's stream."""
    run = await asyncio.to_thread(count_run)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(int(STREAM_SECONDS / 0.1)):
            yield f'{{"run": {run}}}\n'.encode()
            await asyncio.sleep(0.1)

    return StreamingHttpResponse(chunks(), content_type="application/x-ndjson")


def stream_sync(request: HttpRequest) -> StreamingHttpResponse:
    """A sync generator's stream."""
    return StreamingHttpResponse(lines(count_run()), content_type="application/x-ndjson")


urlpatterns = [path("health", health), path("stream", stream), path("stream-sync", stream_sync)]


def wsgi_application() -> Any:
    """The project under WSGI (a gunicorn factory)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.http.lease_django"
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def asgi_application() -> Any:
    """The project under ASGI (a uvicorn factory)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.http.lease_django"
    from django.core.asgi import get_asgi_application

    return get_asgi_application()
