"""aiohttp's door to the ``Idempotency-Key`` rules: an ``aiohttp.web`` middleware, with per-route rules.

::

    app = web.Application(middlewares=[IdempotencyMiddleware(client=redis.asyncio.Redis(socket_timeout=2))])

It runs once routing is done: a request no route matches passes through
unclaimed, and a handler marked ``@idempotency_key("ignore")`` is never claimed.
List your authentication's middleware before it, so ``scope`` sees the caller.
Every decision is the shared exchange's, and the stored envelopes are the other
doors': an aiohttp service and an ASGI one over one Redis replay each other's answers.

A response whose body is a payload (a file, an async generator) or a
``StreamResponse`` is passed through, not kept, and duplicates are answered 422.
Not guaranteed: such a response is marked unstored once the handler returned,
before it is sent (a client gone mid-stream is not told apart); a
``StreamResponse`` the handler prepared itself has gone out without the
``Idempotent-Stored: false`` header.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import _events, _http
from ._clients.transport import to_the_end_async
from ._drivers import http_aio
from ._drivers.aio import AsyncClaim
from ._http import UNSTORED_HEADER, Answer, idempotency_key

__all__ = ["IdempotencyMiddleware", "idempotency_key"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class IdempotencyMiddleware:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate (aiohttp).

    Args:
        client: An asyncio client (as for ``goblin_claim.asgi``), or a function of no arguments returning one.
        **options: The ASGI middleware's options; ``scope``, a ``routes`` function and a
            ``fingerprint`` function receive the ``web.Request``.
    """

    __middleware_version__ = 1

    def __init__(self, *, client: Any, **options: Any) -> None:
        self.options = _http.make_options(**options)
        self._door = http_aio.AsyncDoor(client, self.options, "goblin_claim.aiohttp.IdempotencyMiddleware")

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Handle one request: a keyed one claimed, everything else passed to ``handler``."""
        options, info = self.options, request.match_info
        if info.http_exception is not None or not _http.covers(options, request.method):
            return await handler(request)  # no route (its 404 or 405 is never kept), or a method not covered
        values = [value.encode("latin-1") for value in request.headers.getall(options.header, ())]
        _, key = _http.admit(options, request, request.path, _http.marked_rule(info.handler), values, "aiohttp")
        if key is None:
            return await handler(request)
        if isinstance(key, Answer):
            return _response(key, options.problem_docs)
        refused = _http.body_refused(options, request.content_length)
        body = b"" if refused else await request.read()  # kept by aiohttp for the handler
        refused = refused or _http.body_refused(options, None, len(body))
        kind, query = request.headers.get("Content-Type"), request.rel_url.raw_query_string.encode("latin-1")
        who = refused or _http.identify(options, request, _latin1(kind), query, body, "aiohttp", _http_error)
        if isinstance(who, Answer):
            return _response(who, options.problem_docs)
        claim = self._door.claim(request.method, request.path, who.owner, key, who.fp)
        with _events.observing("request", claim):
            opened = await http_aio.open_claim(options, claim, who.fp, _latin1(request.headers.get("Accept-Encoding")))
            if isinstance(opened, Answer):
                return _response(opened, options.problem_docs)
            if opened is not None:  # fail_open, Redis unreachable: the handler runs unclaimed
                return await handler(request)
            return await self._run(request, handler, claim, who.fp)

    async def _run(self, request: web.Request, handler: Handler, claim: AsyncClaim, fp: str) -> web.StreamResponse:
        keep = claim.keep_alive()
        await keep.__aenter__()
        raised: web.HTTPException | None = None
        try:
            response = await handler(request)
        except web.HTTPException as error:  # aiohttp's way to answer 4xx and 3xx: an answer like any other
            response = raised = error
        except BaseException as error:
            await to_the_end_async(keep.__aexit__(None, None, None))
            if isinstance(error, Exception):  # aiohttp answers it 500: a retry runs, or gets the 500 kept
                await to_the_end_async(http_aio.app_raised(self.options, claim, fp))
            else:  # cancelled (the client left, with handler_cancellation): the handler began
                await to_the_end_async(http_aio.abandon(claim, fp, "the request was cancelled after it began"))
            raise
        await to_the_end_async(keep.__aexit__(None, None, None))
        raw = (b"" if response.body is None else response.body) if isinstance(response, web.Response) else None
        body = bytes(raw) if isinstance(raw, (bytes, bytearray)) else None  # a Payload (a file, a generator) streams
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.headers.items()
        ]
        unbuffered = None if body is not None else f"it is a streamed {type(response).__name__}"
        action = _http.verdict(self.options, response.status, headers, unbuffered=unbuffered, size=len(body or b""))
        if action is _http.GIVE_BACK:
            await to_the_end_async(http_aio.give_back(claim))
        elif action.action == "pass":
            http_aio.passing_unstored("aiohttp", claim, response.status, action.reason)
            if not response.prepared:
                response.headers[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
            await to_the_end_async(http_aio.mark(claim, _http.unstored_payload(fp, response.status, action.reason)))
        else:
            payload = _http.stored_payload(fp, response.status, headers, self.options.keeps_header, body or b"")
            stored = await to_the_end_async(http_aio.store(claim, payload, response.status, fp))
            if stored == "lost":
                return _response(_http.claim_lost(), self.options.problem_docs)
            if stored == "failed":
                response.headers[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        if raised is not None:
            raise raised
        return response


def _http_error(error: Exception) -> bool:
    """An ``HTTPException`` a scope function raised on purpose (``web.HTTPUnauthorized``): aiohttp answers it."""
    return isinstance(error, web.HTTPException)


def _latin1(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def _response(answer: Answer, docs: str | None) -> web.Response:
    """An aiohttp response for a whole answer (a problem or a replay); aiohttp sets its Content-Length."""
    answer = _http.documented(answer, docs)
    response = web.Response(body=answer.body, status=answer.status)
    response.headers.clear()
    for name, value in answer.headers:
        if name != b"content-length":
            response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
    return response
