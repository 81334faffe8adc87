"""The ASGI application as a user deploys it: ``get_asgi_application()`` wrapped in IdempotencyMiddleware."""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio
from django.core.asgi import get_asgi_application

from goblin_claim.asgi import IdempotencyMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.apps.django_app.settings")
_PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])


def _client() -> Any:
    """The middleware's client, made on the first intercepted request, in the server's event loop."""
    pool = redis.asyncio.BlockingConnectionPool(host="127.0.0.1", port=_PORT, max_connections=32, socket_timeout=5)
    return redis.asyncio.Redis.from_pool(pool)


application = IdempotencyMiddleware(
    get_asgi_application(), client=_client, namespace=os.environ["GOBLIN_TEST_NAMESPACE"]
)
