"""Typing checks of the ASGI middleware: mypy --strict reads this file (make test); pytest never runs it.

Starlette and FastAPI type ``add_middleware`` by the middleware's own signature,
so a misspelt or mistyped option is a type error at the call.
"""

from __future__ import annotations

import redis.asyncio
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.types import ASGIApp as StarletteASGIApp

from goblin_claim.asgi import ASGIApp, IdempotencyMiddleware, Scope

app = Starlette()
app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), required=False)
app.add_middleware(IdempotencyMiddleware, client=lambda: redis.asyncio.Redis(), methods=("POST",), wait=2.0)
app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), requried=True)  # type: ignore[call-arg]
app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), lease="30")  # type: ignore[arg-type]

api = FastAPI()


def tenant(scope: Scope) -> str | None:
    """Whose keys these are: the tenant a router put in the scope's state."""
    state = scope.get("state") or {}
    return state.get("tenant")


api.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), scope=tenant, max_response_bytes=4096)
api.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), scope=len)  # an int owner is fine


def ratio(scope: Scope) -> float:
    """Not an owner: a float."""
    return 0.5


api.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), scope=ratio)  # type: ignore[arg-type]

# The middleware is itself an ASGI app, in its own terms and in Starlette's.
wrapped: ASGIApp = IdempotencyMiddleware(api, client=redis.asyncio.Redis())
as_starlette: StarletteASGIApp = wrapped
