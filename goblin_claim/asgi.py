"""``IdempotencyMiddleware``: the ``Idempotency-Key`` header for any ASGI app, over ``AsyncClaim``.

A plain ASGI middleware (Starlette, FastAPI, Litestar, Quart, bare ASGI): it
imports no web framework, only redis-py, pydantic and the standard library::

    app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(...))

An intercepted request (POST or PATCH by default) that carries the header runs
the app once per key; every duplicate gets the first response back, byte for
byte, with ``Idempotent-Replayed: true``::

    request ─ route's rule (idempotency_key() mark, routes=, required=) ─ ignore ─► passed through
       │
       key? ─ no ─► 400 (require), or passed through unguarded (accept)
       │
       read the body (up to max_body_bytes, else 413), fingerprint query and body
       │
    claim ──Claimed──► run the app (lease kept alive), buffer the response ─► store ─► send
       │                  ├─ raised (client still there), 5xx, 408, 425, 429, 503 ─► key given back (release)
       │                  │      (server_errors="store": a 5xx but 503 stored, a raise kept as a 500 problem)
       │                  ├─ cancelled, client gone, no whole response ─► kept closed: abandoned
       │                  ├─ claim lost while the app runs ─► the app cancelled; 503 claim-lost, nothing kept
       │                  └─ too large or streamed (stream_types, trailers, files) ─► passed through, marked unstored
       ├─Completed──► same fingerprint: replay; other: 422; marked unstored: 422; abandoned: 422
       ├─InFlight───► other fingerprint: 422; wait=0: 409; else wait for it
       ├─interrupted► (at_most_once) 409 interrupted, no Retry-After: never run again
       └─Redis fails► 503 with Retry-After: the app never runs unguarded
                      (unreachable with fail_open=True: the app runs, its response passed through, not kept)

Cancellation is part of the contract: a claim whose round trip was cancelled is
released (its reply may have been lost after the server acted), and a store,
mark or release that began runs to its end before the cancellation propagates.
A request the app began is never run again: once it started, "no response" (a
client that disconnected, a cancelled task, Django returning without an answer)
is not "nothing happened", so its key is kept closed until ``ttl`` ends or
``forget()`` reopens it, and duplicates get ``422`` (a status no standard
retrying client retries, as for a reused key in the IETF Idempotency-Key draft).

Keys are scoped by method, path and the ``scope`` function (a user, a tenant),
so one key sent to two endpoints, or by two users, names two operations. Error
answers are ``application/problem+json`` (RFC 9457).

Each route requires the key, accepts it, or ignores it: ``required`` for every
route, ``routes=`` by path pattern or by a function, and an endpoint's own
``@idempotency_key("ignore")`` (a Litestar handler's ``opt``) over both.

Not guaranteed: a lease that lapses while the app runs (Redis unreachable for
longer than ``lease``) lets a retry run the app a second time. The first run is
cancelled once its keep-alive sees the loss (a renewal that finds the claim gone,
or none succeeding before the lease ends), at the app's next await, and answered
503; a response that ends after the loss is not stored either, so every duplicate
agrees with the response that was. Responses to ``GET``, ``HEAD``, ``OPTIONS``
and ``TRACE`` are never intercepted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Final, Literal

from . import _events, _http
from ._clients.transport import to_the_end_async
from ._drivers.aio import AsyncClaim
from ._drivers.http_aio import (
    AsyncDoor,
    _digest,
    abandon,
    app_raised,
    give_back,
    mark,
    open_claim,
    passing_unstored,
    store,
)
from ._drivers.keepalive import AsyncKeepAlive, stop_on_loss
from ._http import (
    DEFAULT_NEVER_REPLAYED,
    DEFAULT_RELEASE_STATUSES,
    DEFAULT_REPLAY_HEADERS,
    DEFAULT_STREAM_TYPES,
    DEFAULTS,
    UNSTORED_HEADER,
    AbandonedRequest,
    Answer,
    KeyRule,
    StoredResponse,
    UnstoredResponse,
    idempotency_key,
)

logger = logging.getLogger("goblin_claim.asgi")

__all__ = [
    "DEFAULT_NEVER_REPLAYED",
    "DEFAULT_RELEASE_STATUSES",
    "DEFAULT_REPLAY_HEADERS",
    "DEFAULT_STREAM_TYPES",
    "ASGIApp",
    "AbandonedRequest",
    "IdempotencyMiddleware",
    "KeyRule",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "StoredResponse",
    "UnstoredResponse",
    "idempotency_key",
]

# The response records every door shares are defined with the rules in _http; users meet
# them here, first, and that is the name repr() and help() show.
for _shared in (AbandonedRequest, StoredResponse, UnstoredResponse):
    _shared.__module__ = __name__

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# --------------------------------------------------------------------------- the middleware


class IdempotencyMiddleware:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate.

    Args:
        app: The ASGI application to wrap.
        client: An asyncio client (``redis.asyncio.Redis``,
            ``redis.asyncio.cluster.RedisCluster``, their valkey-py twins, or GLIDE's
            ``glide.GlideClient`` / ``glide.GlideClusterClient``), or a function of no
            arguments returning one, called on the first
            intercepted request (for a client made in the app's lifespan). Give it a
            ``socket_timeout`` and, for many concurrent requests, a
            ``BlockingConnectionPool``. The middleware never closes it.
        required: Answer 400 when an intercepted request has no key; when false
            (the default), such a request passes through unguarded. ``routes``
            and a route's own ``idempotency_key()`` mark decide before it.
        routes: Per-route rules over ``required``: a mapping of path patterns
            (shell-style, ``*`` also matching ``/``; the first that matches wins)
            to ``"require"``, ``"accept"`` or ``"ignore"``, such as
            ``{"/webhooks/*": "ignore"}``; or a function of the ASGI scope
            returning one of them, or ``None`` to leave it to ``required``. An
            endpoint marked ``@idempotency_key(...)`` (or a Litestar handler's
            ``opt``) decides for its route before both.
        methods: The methods intercepted. Safe methods (GET, HEAD, OPTIONS, TRACE)
            always pass through and may not be listed.
        header: The request header carrying the key. Its value is a bare token
            (Stripe's form) or an RFC 8941 sf-string (the IETF draft's ``"..."``,
            parameters ignored, a malformed one answered 400); 1 to 255 printable
            ASCII characters.
        lease: Seconds a crashed worker's claim blocks its key (renewed while the app runs).
        ttl: Seconds a response is kept and replayed.
        wait: Seconds a duplicate waits for a first request still running; ``0``
            (the default) answers 409 at once.
        scope: A function of the ASGI scope returning who the key belongs to (a user
            or tenant id: a ``str``, ``int`` or ``UUID``), so one client's key never
            replays another's answer; without a function every key is shared. One
            that raises (``scope["user"]`` without an authentication middleware
            before this one) or returns another type is answered 500
            (``scope-failed``, naming the cause and the fix) without running the
            app, and logged once; an HTTP exception it raises goes to the framework.
        max_body_bytes: The largest request body fingerprinted; a larger one is
            answered 413 without running the app.
        max_response_bytes: The largest response body kept; a larger one is passed
            through whole, marked ``Idempotent-Stored: false``, and duplicates are
            answered 422 (it is not run again; no standard retrying client retries 422).
        replay_headers: ``None`` (the default): every response header is stored and
            replayed but those in ``never_replayed``; or an allow-list of names
            (case-insensitive, such as ``DEFAULT_REPLAY_HEADERS``).
        never_replayed: Response headers never stored (``DEFAULT_NEVER_REPLAYED``:
            ``set-cookie``, hop-by-hop, ``content-length``, ``date``, ``server``, trace
            ids...); ``set-cookie``, ``content-length`` and hop-by-hop are always in it.
        release_statuses: Statuses sent but not kept: the key is given back and a
            retry runs (``DEFAULT_RELEASE_STATUSES``: 401, 403, 404, 405, 408, 425,
            429, 503; every other 5xx too, unless ``server_errors="store"``). A 4xx
            the endpoint itself answers (400, 409, 422...) is kept; pass ``()`` to
            keep 401-405 as well.
        server_errors: What becomes of a 5xx the app answers (outside
            ``release_statuses``) and of an exception it raises while its client waits.
            ``"give back"`` (the default): the key is given back and a retry runs the
            app again, so a view that committed its work before failing does it twice
            unless its work is one transaction that the failure rolled back.
            ``"store"`` (Stripe's choice): the 5xx is kept and replayed for ``ttl``,
            and an exception (which the framework answers 500 outside the door) is
            kept as a ``500`` ``server-error`` problem; a retry never runs the app
            again, and the client must send a new key to try once more.
        stream_types: Content types passed through as the app sends them, never
            buffered nor kept (``DEFAULT_STREAM_TYPES``: SSE, NDJSON, JSON Lines...);
            once such a response ended, duplicates are answered 422.
        shared_scope: With a ``scope`` function, ``None`` or ``""`` from it is answered
            403 without running the app (a middleware before authentication would
            otherwise share keys between users); ``True`` makes it a shared space.
        problem_docs: A URL documenting the problem answers: each answer's ``type``
            is then ``<problem_docs>#<code>`` (``key-missing``, ``key-invalid``,
            ``key-reused``, ``in-flight``, ``interrupted``, ``abandoned``, ``not-kept``, ``no-owner``,
            ``body-too-large``, ``store-unavailable``, ``claim-lost``, ``result-lost``,
            ``result-unreadable``) instead of ``about:blank``.
        fingerprint: What makes two requests with one key "the same request":
            ``"auto"`` (the default: JSON compared as canonical JSON, form and
            multipart bodies by their fields, anything else byte for byte, with
            the query string), ``"bytes"``, ``"json"``, ``"form"``, ``"multipart"``,
            or a function of the ASGI scope returning ``str`` or ``bytes``.
        namespace: Prefix of every Redis key the middleware writes; no braces.
        fail_open: When the claim cannot reach Redis (refused, timed out, or a server
            that cannot take it: ``LOADING``, ``READONLY``...), run the app anyway and
            pass its response through, not kept, instead of answering 503; logged at
            WARNING and counted (a ``failed_open`` event). At-least-once while Redis
            is unreachable, so only for requests harmless to repeat. A Redis that
            answers always decides: replays, 409, 422 as ever.
        at_most_once: Never run a request again once the app began it, even when its
            worker is killed before it answers (``SIGKILL``, an OOM kill, a lost host): once
            that attempt's lease ends, every request with its key is answered ``409``
            ``interrupted`` (no ``Retry-After``: retrying will not help) until ``ttl`` ends
            or an operator forgets the key. A duplicate while it runs is answered ``409``
            ``in-flight`` as before. A response not kept (a 5xx, a retry status) or an
            exception the app raised still gives the key back (with ``server_errors="give back"``).
        expose_holder: Put the holder's token in the ``holder`` member of a ``409``'s problem
            details (in flight and interrupted), to match with ``goblin-claim inspect``; off
            by default, as a token may name a worker or a request.

    Example::

        def user_id(scope: Scope) -> str | None:
            user = scope["user"]  # set by AuthenticationMiddleware, which runs first
            return user.display_name if user.is_authenticated else None  # None: 403

        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(socket_timeout=2),
                           required=True, scope=user_id, routes={"/webhooks/*": "ignore"})
        app.add_middleware(AuthenticationMiddleware, backend=...)  # added last: runs first

    Not guaranteed: duplicates of a request whose response was not stored (too
    large, Redis lost mid-request) do not get that response; a request the app
    began that ended without a whole response (client gone, cancelled) keeps its
    key closed, answered 422, until ``ttl`` ends or the key is forgotten; when
    Redis is unreachable even for that mark, the key frees itself after ``lease``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: Any,
        required: bool = DEFAULTS.required,
        methods: Iterable[str] = DEFAULTS.methods,
        header: str = DEFAULTS.header,
        lease: int = DEFAULTS.lease,
        ttl: int = DEFAULTS.ttl,
        wait: float = DEFAULTS.wait,
        scope: Callable[[Scope], str | int | uuid.UUID | None] | None = DEFAULTS.scope,
        shared_scope: bool = DEFAULTS.shared_scope,
        max_body_bytes: int = DEFAULTS.max_body_bytes,
        max_response_bytes: int = DEFAULTS.max_response_bytes,
        replay_headers: Iterable[str] | None = DEFAULTS.replay_headers,
        never_replayed: Iterable[str] = DEFAULTS.never_replayed,
        release_statuses: Iterable[int] = DEFAULTS.release_statuses,
        server_errors: Literal["give back", "store"] = DEFAULTS.server_errors,
        stream_types: Iterable[str] = DEFAULTS.stream_types,
        problem_docs: str | None = DEFAULTS.problem_docs,
        fingerprint: str | Callable[[Scope], str | bytes] = DEFAULTS.fingerprint,
        namespace: str = DEFAULTS.namespace,
        routes: Mapping[str, KeyRule] | Callable[[Scope], KeyRule | None] | None = DEFAULTS.routes,
        replicas: int = DEFAULTS.replicas,
        replica_timeout_ms: int = DEFAULTS.replica_timeout_ms,
        fail_open: bool = DEFAULTS.fail_open,
        at_most_once: bool = DEFAULTS.at_most_once,
        expose_holder: bool = DEFAULTS.expose_holder,
    ) -> None:
        self.app = app
        # The defaults above are DoorOptions' (tests/http/test_door_options.py holds the two together).
        self.options = options = _http.DoorOptions(
            required=required, methods=methods, header=header, lease=lease, ttl=ttl, wait=wait, scope=scope,
            shared_scope=shared_scope, max_body_bytes=max_body_bytes, max_response_bytes=max_response_bytes,
            replay_headers=replay_headers, never_replayed=never_replayed, release_statuses=release_statuses,
            server_errors=server_errors, stream_types=stream_types, problem_docs=problem_docs,
            fingerprint=fingerprint, namespace=namespace, routes=routes, replicas=replicas,
            replica_timeout_ms=replica_timeout_ms, fail_open=fail_open, at_most_once=at_most_once,
            expose_holder=expose_holder,
        ).checked()  # fmt: skip
        self._door = AsyncDoor(client, options, "goblin_claim.asgi.IdempotencyMiddleware")
        self.required = options.required
        self.methods = options.methods
        self.header = options.header
        self.lease = options.lease
        self.ttl = options.ttl
        self.wait = options.wait
        self.scope = options.scope
        self.max_body_bytes = options.max_body_bytes
        self.max_response_bytes = options.max_response_bytes
        self.replay_headers = options.replay_headers
        self.never_replayed = options.never_replayed
        self.release_statuses = options.release_statuses
        self.server_errors = options.server_errors
        self.namespace = options.namespace
        self._header_name = options.header_name

    # -- the ASGI entry point

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection: intercepted HTTP requests here, everything else passed to the app."""
        if scope["type"] != "http" or not _http.covers(self.options, scope["method"]):
            await self.app(scope, receive, send)
            return
        marked, endpoint = _route_rule(scope, self.app)
        values = [value for name, value in scope["headers"] if name.lower() == self._header_name]
        rule, key = _http.admit(self.options, scope, scope["path"], marked, values, "asgi")
        if isinstance(key, Answer):
            await _send_answer(send, key, self.options.problem_docs)
            return
        if rule is not None and endpoint is not _ROUTED and _http.any_marked():
            send = _checking_route(scope, endpoint, rule, send)  # says so when routing found another mark
        if key is None:
            await self.app(scope, receive, send)
            return
        refused = _http.body_refused(self.options, _content_length(scope))
        if refused is not None:
            await _send_answer(send, refused, self.options.problem_docs)
            return
        body = await self._read_body(receive, send)
        if body is None:
            return  # answered 413, or the client left before sending its body: nothing ran
        kind = _header(scope, b"content-type")
        who = _http.identify(self.options, scope, kind, scope.get("query_string", b""), body, "asgi", _http_exception)
        if isinstance(who, Answer):
            await _send_answer(send, who, self.options.problem_docs)
            return
        claim = self._door.claim(scope["method"], scope["path"], who.owner, key, who.fp)
        # One "request" event, taking the outcome of the claim's round trips inside it.
        with _events.observing("request", claim) as op:
            await self._handle(scope, _replaying(body, receive), send, claim, who.fp, op)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, claim: AsyncClaim, fp: str, op: _events.Op | _events._NoOp
    ) -> None:
        opened = await open_claim(self.options, claim, fp, _header(scope, b"accept-encoding"))
        if isinstance(opened, Answer):
            await _send_answer(send, opened, self.options.problem_docs)
            return
        if opened is not None:  # fail_open, Redis unreachable: the app runs unclaimed, its response passes through
            await self.app(scope, receive, send)
            return
        keeper = claim.keep_alive()
        exchange = _Exchange(self, claim, fp, receive, send, keeper)
        try:
            async with keeper:
                exchange.started = True
                # A lost claim cancels the app: not this request's key any more.
                await stop_on_loss(keeper, self.app(scope, exchange.receive, exchange.send))
        except BaseException as exc:
            if keeper._stopped_work:
                op.note("lease_lost")
                await to_the_end_async(exchange.lost())
                return
            await to_the_end_async(exchange.settle(exc))
            raise
        await to_the_end_async(exchange.settle(None))

    # -- helpers

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            refused = _http.body_refused(self.options, None, -1 if size > self.max_body_bytes else 0)
            if refused is not None:  # cut at the limit: its whole size is unknown
                await _send_answer(send, refused, self.options.problem_docs)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Exchange:
    """One claimed request's response: buffered and stored whole, or passed through unstored.

    Modes: ``buffer`` holds the start and the body until the last chunk, then
    stores and sends them; ``pass`` forwards each message as it comes (a 5xx or a
    retry status, whose key is given back; or a response too large or streamed,
    marked unstored once it ended).

    Once the app began (``started``), the key is given back only when the request
    itself says "try again": a 5xx or retry status, or an exception the app raised
    while its client was still there (with ``server_errors="store"``, a 5xx is kept
    like any answer and an exception as a 500 problem). Anything else that ends without a kept
    response (a cancellation, a client gone, a response never finished) may have
    done its work, so the key is kept closed as an ``AbandonedRequest``.
    """

    __slots__ = (
        "_chunks", "_claim", "_fp", "_gone", "_keeper", "_mode", "_owner", "_receive", "_send", "_size", "_start",
        "_unstored", "ended", "started",
    )  # fmt: skip

    def __init__(
        self, owner: IdempotencyMiddleware, claim: AsyncClaim, fp: str, receive: Receive, send: Send,
        keeper: AsyncKeepAlive,
    ) -> None:  # fmt: skip
        self._owner = owner
        self._claim = claim
        self._keeper = keeper  # renews the claim until the response is settled
        self._fp = fp
        self._receive = receive
        self._send = send
        self._start: Message | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._mode: Literal["buffer", "pass", "settled"] = "buffer"
        self._unstored: str | None = None  # why a passed-through response is not kept; None: give the key back
        self._gone = False  # the client disconnected (the app was told), or sending to it failed
        self.ended = False
        self.started = False

    async def receive(self) -> Message:
        """The ``receive`` the app sees, noting a disconnect (Django and Starlette listen for it)."""
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._gone = True
        return message

    async def _forward(self, message: Message) -> None:
        try:
            await self._send(message)
        except Exception:  # ASGI 2.4 servers raise OSError once the client left
            self._gone = True
            raise

    async def send(self, message: Message) -> None:
        """The ``send`` the app sees."""
        if self._mode != "buffer":
            kind = message["type"]
            if (
                kind == "http.response.body" and not message.get("more_body", False)
            ) or kind == "http.response.pathsend":
                if self._mode == "pass":
                    await self._settle_passed()
                self.ended = True
            await self._forward(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            action = _http.verdict(
                self._owner.options, message["status"], message.get("headers", ()),
                trailers=bool(message.get("trailers", False)),
            )  # fmt: skip
            if action is _http.GIVE_BACK:
                self._mode = "pass"  # not kept: the key is given back when the app is done
                await self._forward(message)
            elif action.action == "pass":
                await self._pass_unstored(action.reason)
            return
        if kind == "http.response.body" and self._start is not None:
            chunk = message.get("body", b"")
            if chunk:
                self._chunks.append(chunk)
                self._size += len(chunk)
            more = bool(message.get("more_body", False))
            reason = _http.oversize(self._owner.options, self._size)
            if reason is not None:
                await self._pass_unstored(reason, more=more)
            elif not more:
                await self._store_and_send()
            return
        # Anything else (http.response.pathsend, zerocopysend, trailers...) cannot be buffered.
        if self._start is not None:
            await self._pass_unstored(f"it was sent as {kind}")
            await self.send(message)
        else:
            await self._forward(message)

    async def _pass_unstored(self, reason: str, *, more: bool = True) -> None:
        """Send what was held back, marked unstored, and forward the rest as it comes."""
        assert self._start is not None
        self._mode = "pass"
        self._unstored = reason
        passing_unstored("asgi", self._claim, self._start["status"], reason)
        start = dict(self._start)
        start["headers"] = [*start.get("headers", ()), UNSTORED_HEADER]
        await self._forward(start)
        if self._chunks or not more:
            if not more:
                await self._settle_passed()
            await self._forward({"type": "http.response.body", "body": b"".join(self._chunks), "more_body": more})
            self.ended = not more
        self._chunks = []

    async def _settle_passed(self) -> None:
        """Before the last of a passed-through response goes out, so a client that saw it and retries is told.

        An unstored response marks the key (duplicates get 422); a status not kept
        gives it back (a retry runs). Either settles it: nothing left to renew, nor to lose.
        """
        assert self._start is not None
        self._mode = "settled"
        self._keeper._end()
        if self._unstored is None:
            await to_the_end_async(give_back(self._claim))
            return
        marker = _http.unstored_payload(self._fp, self._start["status"], self._unstored)
        await to_the_end_async(mark(self._claim, marker))

    async def _store_and_send(self) -> None:
        """Store the whole response, then send it: a client that saw it and retries gets the replay."""
        assert self._start is not None
        self._mode = "settled"
        start, body = self._start, b"".join(self._chunks)
        self._chunks = []
        payload = _http.stored_payload(
            self._fp, start["status"], start.get("headers", ()), self._owner.options.keeps_header, body
        )
        # The app has answered: a cancellation now (the client left mid-store) must not
        # drop its answer, so the store lands first and the cancellation propagates after.
        # The key is settled by this write: nothing left to renew, nor a loss to cancel the app for.
        self._keeper._end()
        stored = await to_the_end_async(store(self._claim, payload, start["status"], self._fp))
        if stored == "lost":
            await _send_answer(self._forward, _http.claim_lost(), self._owner.options.problem_docs)
            self.ended = True
            return
        if stored == "failed":
            start = {**start, "headers": [*start.get("headers", ()), UNSTORED_HEADER]}
        await self._forward(start)
        await self._forward({"type": "http.response.body", "body": body})
        self.ended = True

    async def settle(self, error: BaseException | None) -> None:
        """After the app returned (or raised ``error``): keep a mark, fail closed, or give the key back."""
        mode, self._mode = self._mode, "settled"
        if mode == "settled":
            return
        if not self.started:
            await give_back(self._claim)  # cancelled on the way in: the app never ran
            return
        if mode == "pass" and self._unstored is None:
            await give_back(self._claim)  # a status not kept (5xx, retry, not found...): a retry runs
            return
        if isinstance(error, Exception) and not self._gone:
            # The app failed while its client waited: a retry runs at once, or (server_errors="store") gets a 500.
            await app_raised(self._owner.options, self._claim, self._fp)
            return
        # No whole response, yet the app ran (a sync Django view even finishes in its
        # thread after a disconnect): what it did is unknown, so it is never run again.
        await abandon(self._claim, self._fp, self._abandoned(error))
        if mode == "buffer" and self._start is not None and error is None:
            # The app returned without finishing its response: send what it gave; the server tells the client.
            await self._forward(self._start)
            if self._chunks:
                await self._forward({"type": "http.response.body", "body": b"".join(self._chunks), "more_body": True})

    async def lost(self) -> None:
        """The claim was lost while the app ran, and the app was cancelled for it: answered as a lost store is.

        Nothing is kept, marked or given back: the key is another request's now (or
        free). A response the app had begun to pass through ends where it was cut.
        """
        mode, self._mode = self._mode, "settled"
        logger.warning("key %s: the claim was lost while the app ran; the app was cancelled", _digest(self._claim))
        if mode == "buffer":
            await _send_answer(self._forward, _http.claim_lost(), self._owner.options.problem_docs)
            self.ended = True

    def _abandoned(self, error: BaseException | None) -> str:
        """Why the request ended without a whole response, for the marker and the log."""
        if error is not None and not isinstance(error, Exception):
            return "the request was cancelled after it began (the client disconnected or the server stopped)"
        if error is not None:
            return f"the client disconnected and the app raised {type(error).__name__}"
        if self._start is None:
            return "the app returned without a response (frameworks do this when the client disconnects)"
        return f"the app returned without finishing its {self._start['status']} response"


# --------------------------------------------------------------------------- the route's own rule

_ROUTED: Final = object()  # the route was known when the middleware ran (Litestar): nothing to check later
_FULL: Final = 2  # starlette.routing.Match.FULL's value (NONE is 0, PARTIAL 1)
_DEPTH: Final = 8  # mounts inside mounts, at most


def _route_rule(scope: Scope, inner: object) -> tuple[KeyRule | None, object]:
    """The rule the request's route carries, if any, and the endpoint it was read from.

    Litestar routes before its middleware run: ``scope["route_handler"]`` is the
    handler, its ``opt`` (``idempotency_key="ignore"``) or its function's mark
    decide. Starlette and FastAPI route after an app-wide middleware, so the
    route is found here as their router will find it: the app's routes
    (``scope["app"].routes``, or the wrapped app's, ``inner``, when the
    middleware wraps the app from outside), each asked ``matches(scope)`` in
    order, mounts and included routers followed, the first full match's
    endpoint read for its ``idempotency_key()`` mark. Only once some endpoint
    was marked: without marks nothing is looked up.
    """
    handler = scope.get("route_handler")
    if handler is not None:
        opt = getattr(handler, "opt", None)
        if isinstance(opt, Mapping) and _http.OPT_KEY in opt:
            return _http.check_rule(f"the handler's opt[{_http.OPT_KEY!r}]", opt[_http.OPT_KEY]), _ROUTED
        return _http.marked_rule(getattr(handler, "fn", None)), _ROUTED
    if not _http.any_marked():
        return None, None
    endpoint = scope.get("endpoint")  # a route's own middleware (Route(..., middleware=[...])) runs after routing
    routes = getattr(scope.get("app", inner), "routes", None)
    if isinstance(routes, Sequence):
        try:
            found, predicted = _match(routes, dict(scope), 0)
        except Exception:  # a route type this lookup does not know: the door's own rules decide
            logger.debug("the route lookup failed; the routes= and required= options decide", exc_info=True)
        else:
            if found:
                endpoint = predicted
    return _http.marked_rule(endpoint), endpoint


def _match(routes: Iterable[Any], scope: Scope, depth: int) -> tuple[bool, object]:
    """``(True, endpoint)`` for the first route matching ``scope`` fully, as Starlette's router picks it."""
    for route in routes:
        candidates = getattr(route, "effective_candidates", None)
        if callable(candidates):  # FastAPI's included routers build their prefixed routes lazily
            found, endpoint = _match(candidates(), scope, depth + 1)
            if found:
                return found, endpoint
            continue
        matches = getattr(route, "matches", None)
        if not callable(matches):
            continue
        match, child = matches(dict(scope))  # a copy: matching must not touch the request's scope
        if getattr(match, "value", None) != _FULL:
            continue
        inner = getattr(route, "routes", None)  # a Mount or a Host: the mounted app's own routes decide
        if isinstance(inner, Sequence) and inner and depth < _DEPTH:
            found, endpoint = _match(inner, {**scope, **child}, depth + 1)
            if found:
                return found, endpoint
        return True, child.get("endpoint", getattr(route, "endpoint", None))
    return False, None


def _checking_route(scope: Scope, expected: object, rule: KeyRule, send: Send) -> Send:
    """``send``, checking once the app answers that its router chose the endpoint whose mark was applied."""
    checked = False

    async def checking(message: Message) -> None:
        nonlocal checked
        if not checked:
            checked = True
            routed = scope.get("endpoint")
            if routed is not None and routed is not expected:
                found = _http.marked_rule(routed)
                if found is not None and found != rule:
                    _missed_mark(routed, found, rule)
        await send(message)

    return checking


def _missed_mark(endpoint: object, found: KeyRule, rule: KeyRule) -> None:
    """Log once per endpoint that its mark was not seen before routing (its router hides its routes)."""
    name = f"{getattr(endpoint, '__module__', '?')}.{getattr(endpoint, '__qualname__', repr(endpoint))}"
    if name in _missed:
        return
    _missed.add(name)
    logger.error(
        "%s is marked idempotency_key(%r), but the middleware did not find its route before routing and applied "
        "%r: give the door routes={'<its path>': %r} for it (this router does not list its routes as Starlette's does)",
        name, found, rule, found,
    )  # fmt: skip


_missed: set[str] = set()


def _http_exception(error: Exception) -> bool:
    """An HTTP exception of the framework (Starlette's, FastAPI's, Litestar's), raised by a scope function on purpose.

    Litestar answers those raised in its middleware; Starlette's error middleware
    answers them 500, as it did before any door.
    """
    return isinstance(getattr(error, "status_code", None), int)


# --------------------------------------------------------------------------- small pieces


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then the connection's own messages."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    """The first value of a request header (``wanted`` in lower case)."""
    return next((value for name, value in scope["headers"] if name.lower() == wanted), None)


def _content_length(scope: Scope) -> int | None:
    return _http.declared_length(_header(scope, b"content-length"))


async def _send_answer(send: Send, answer: Answer, docs: str | None) -> None:
    """Send a whole answer (a problem or a replay)."""
    answer = _http.documented(answer, docs)
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})
