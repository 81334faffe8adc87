"""Which route's mark the ASGI door applies, on Starlette and FastAPI apps called in-process (httpx's ASGITransport).

Marks on routes declared after an included router, a mount whose routes do not
match, and an app that sends a message of its own before its response.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import fakeredis
import pytest

from goblin_claim.asgi import IdempotencyMiddleware, idempotency_key
from tests.conftest import IN_CI


def _framework(name: str) -> Any:
    # With CI set, a missing framework fails the test instead of skipping it.
    return importlib.import_module(name) if IN_CI else pytest.importorskip(name)


httpx = _framework("httpx")
fastapi = _framework("fastapi")
starlette_routing = _framework("starlette.routing")
starlette_responses = _framework("starlette.responses")
starlette_applications = _framework("starlette.applications")

NS = "asgi-route-paths"
KEY = {"Idempotency-Key": "k-1"}


async def post(app: Any, path: str, headers: dict[str, str] | None = None) -> Any:
    """POST ``path`` with a JSON body through the app, in-process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(path, json={"items": 1}, headers=headers or {})


def test_a_mark_on_a_route_declared_after_an_included_router_is_applied() -> None:
    """FastAPI: the lookup passes an included router's routes that do not match and finds the later marked route."""
    app = fastapi.FastAPI()
    runs: list[str] = []
    api = fastapi.APIRouter()

    @api.post("/hook", status_code=201)
    async def hook() -> dict[str, str]:
        runs.append("hook")
        return {"hook": "taken"}

    app.include_router(api, prefix="/api")

    @app.post("/webhook", status_code=202)
    @idempotency_key("ignore")
    async def webhook() -> dict[str, str]:
        runs.append("webhook")
        return {"webhook": "taken"}

    app.add_middleware(IdempotencyMiddleware, client=fakeredis.FakeAsyncRedis(), namespace=NS, required=True)

    async def scenario() -> None:
        assert (await post(app, "/webhook")).status_code == 202  # ignored: no key needed, despite required=True
        assert (await post(app, "/webhook", KEY)).status_code == 202
        refused = await post(app, "/api/hook")
        assert (refused.status_code, refused.headers["content-type"]) == (400, "application/problem+json")
        assert (await post(app, "/api/hook", KEY)).status_code == 201
        replayed = await post(app, "/api/hook", KEY)
        assert replayed.headers["idempotent-replayed"] == "true"

    asyncio.run(scenario())
    assert runs == ["webhook", "webhook", "hook"]


def test_a_mount_whose_routes_do_not_match_leaves_the_doors_own_rules() -> None:
    """Starlette: a path under a mount that none of its routes takes gets the door's rule (400), not a mark inside."""
    Route, Mount = starlette_routing.Route, starlette_routing.Mount
    runs: list[str] = []

    @idempotency_key("ignore")
    async def hook(request: Any) -> Any:
        runs.append("hook")
        return starlette_responses.JSONResponse({"hook": "taken"}, status_code=202)

    app = starlette_applications.Starlette(routes=[Mount("/api", routes=[Route("/hook", hook, methods=["POST"])])])
    app.add_middleware(IdempotencyMiddleware, client=fakeredis.FakeAsyncRedis(), namespace=NS, required=True)

    async def scenario() -> None:
        assert (await post(app, "/api/hook")).status_code == 202  # the mark inside the mount applies
        refused = await post(app, "/api/other")
        assert (refused.status_code, refused.headers["content-type"]) == (400, "application/problem+json")
        assert (await post(app, "/api/other", KEY)).status_code == 404  # keyed: the router's 404, given back
        assert (await post(app, "/api/other", KEY)).status_code == 404

    asyncio.run(scenario())
    assert runs == ["hook"]


def test_a_message_sent_before_the_response_starts_is_forwarded_and_the_answer_still_kept() -> None:
    """An app sending ``http.response.debug`` first (as Starlette's templates do): it goes on, the answer is stored."""
    runs: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        runs.append(1)
        await receive()
        await send({"type": "http.response.debug", "info": {"template": "order.html"}})
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"made"})

    middleware = IdempotencyMiddleware(app, client=fakeredis.FakeAsyncRedis(), namespace=NS)

    async def once() -> list[dict[str, Any]]:
        scope = {
            "type": "http", "method": "POST", "path": "/orders", "raw_path": b"/orders", "query_string": b"",
            "root_path": "", "headers": [(b"idempotency-key", b"k-1"), (b"content-length", b"2")],
            "extensions": {"http.response.debug": {}},
        }  # fmt: skip
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await middleware(scope, receive, send)
        return sent

    first = asyncio.run(once())
    again = asyncio.run(once())
    assert [m["type"] for m in first] == ["http.response.debug", "http.response.start", "http.response.body"]
    assert first[0]["info"] == {"template": "order.html"}
    assert b"".join(m.get("body", b"") for m in first) == b"made"
    (start,) = [m for m in again if m["type"] == "http.response.start"]
    assert (start["status"], (b"idempotent-replayed", b"true") in start["headers"]) == (201, True)
    assert b"".join(m.get("body", b"") for m in again if m["type"] == "http.response.body") == b"made"
    assert runs == [1]
