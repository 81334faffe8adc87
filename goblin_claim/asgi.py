"""``IdempotencyMiddleware``: the ``Idempotency-Key`` header for any ASGI app, over ``AsyncClaim``.

A plain ASGI middleware (Starlette, FastAPI, Litestar, Quart, bare ASGI): it
imports no web framework, only redis-py, pydantic and the standard library::

    app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(...))

An intercepted request (POST or PATCH by default) that carries the header runs
the app once per key; every duplicate gets the first response back, byte for
byte, with ``Idempotent-Replayed: true``::

    request ─ key? ─ no ─► 400 (required=True), or passed through unguarded
       │
       read the body (up to max_body_bytes, else 413), fingerprint query and body
       │
    claim ──Claimed──► run the app (lease kept alive), buffer the response ─► store ─► send
       │                  ├─ raised (client still there), 5xx, 408, 425, 429 ─► key given back (release)
       │                  ├─ cancelled, client gone, no whole response ─► kept closed: abandoned
       │                  └─ too large or streamed (SSE, trailers, files) ─► passed through, marked unstored
       ├─Completed──► same fingerprint: replay; other: 422; marked unstored: 500; abandoned: 422
       ├─InFlight───► other fingerprint: 422; wait=0: 409; else wait for it
       └─Redis fails► 503 with Retry-After: the app never runs unguarded

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

Not guaranteed: a lease that lapses while the app runs (Redis unreachable for
longer than ``lease``) lets a retry run the app a second time; the late first
run is then answered 503 and its response is not stored, so every duplicate
agrees with the response that was. Responses to ``GET``, ``HEAD``, ``OPTIONS``
and ``TRACE`` are never intercepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from http import HTTPStatus
from typing import Annotated, Any, Final, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ._async import AsyncClaim
from ._core import DONE_PREFIX, WaitSchedule, check_namespace, check_seconds, check_timeout, client_kind, describe
from ._core import new_token as _new_token
from ._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ResultLostError,
    StillInFlightError,
)
from ._outcomes import Completed, InFlight
from ._server import to_the_end_async

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "ASGIApp",
    "IdempotencyMiddleware",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("goblin_claim.asgi")

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# RFC 9110 section 7.6.1, plus the pre-standard ones proxies still send.
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
# Never stored: a cookie is a session, not an answer; the length is recomputed on replay.
NEVER_REPLAYED: Final = HOP_BY_HOP | {"set-cookie", "content-length"}
DEFAULT_REPLAY_HEADERS: Final = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-location",
    "content-type",
    "etag",
    "expires",
    "last-modified",
    "link",
    "location",
    "vary",
)
"""Response headers stored with a response and replayed to duplicates, by default."""

# Answers that ask the client to try again: storing them would answer every retry
# with "try again" until the ttl ends, so the key is given back instead (as for 5xx).
RETRY_STATUSES: Final = frozenset({408, 425, 429})
RETRY_AFTER: Final = b"1"
MAX_KEY_LENGTH: Final = 255
# A larger body or response would not fit in one Redis value (proto-max-bulk-len, 512 MiB).
MAX_BYTES_LIMIT: Final = 256 * 1024 * 1024
# How long a response's store is retried through a dropped connection, at most.
STORE_WINDOW: Final = 10.0
REPLAYED_HEADER: Final = (b"idempotent-replayed", b"true")
UNSTORED_HEADER: Final = (b"idempotent-stored", b"false")


# --------------------------------------------------------------------------- what is stored

_STORED_CONFIG = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


class StoredResponse(BaseModel):
    """A first response, kept for duplicates: ``{"goblin":1,"kind":"http_response",...}``.

    Attributes:
        fp: The fingerprint of the first request's query string and body.
        status: Its status code.
        headers: The allow-listed response headers, names lower-case, in order (latin-1 text).
        body: The body, exactly (base64 in JSON).
    """

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_response"] = "http_response"
    fp: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class UnstoredResponse(BaseModel):
    """The first request ran, but its response was not kept (too large, streamed): duplicates are told so."""

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_unstored"] = "http_unstored"
    fp: str
    status: int
    reason: str


class AbandonedRequest(BaseModel):
    """The first request started running but ended without a whole response: what it did is unknown.

    Kept as the key's terminal outcome (fail closed): the client left, or the
    server cancelled the request, after the app began; running it again could do
    its work twice, so duplicates are told instead.
    """

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_abandoned"] = "http_abandoned"
    fp: str
    reason: str


_ENVELOPE: TypeAdapter[StoredResponse | UnstoredResponse | AbandonedRequest] = TypeAdapter(
    Annotated[
        Union[StoredResponse, UnstoredResponse, AbandonedRequest],  # noqa: UP007 -- 3.10
        Field(discriminator="kind"),
    ]
)


# --------------------------------------------------------------------------- the middleware


class IdempotencyMiddleware:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate.

    Args:
        app: The ASGI application to wrap.
        client: A ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``,
            or a function of no arguments returning one, called on the first
            intercepted request (for a client made in the app's lifespan). Give it a
            ``socket_timeout`` and, for many concurrent requests, a
            ``BlockingConnectionPool``. The middleware never closes it.
        required: Answer 400 when an intercepted request has no key; when false
            (the default), such a request passes through unguarded.
        methods: The methods intercepted. Safe methods (GET, HEAD, OPTIONS, TRACE)
            always pass through and may not be listed.
        header: The request header carrying the key. Its value is a bare token
            (Stripe's form) or a quoted structured-field string (the IETF draft's
            ``"..."``); 1 to 255 printable ASCII characters.
        lease: Seconds a crashed worker's claim blocks its key (renewed while the app runs).
        ttl: Seconds a response is kept and replayed.
        wait: Seconds a duplicate waits for a first request still running; ``0``
            (the default) answers 409 at once.
        scope: A function of the ASGI scope returning who the key belongs to (a user
            or tenant id), so one client's key never replays another's answer;
            ``None`` from it (or no function) is the shared, unscoped space.
        max_body_bytes: The largest request body fingerprinted; a larger one is
            answered 413 without running the app.
        max_response_bytes: The largest response body kept; a larger one is passed
            through whole, marked ``Idempotent-Stored: false``, and duplicates are
            answered 500 (it is not run again).
        replay_headers: The response headers stored and replayed (case-insensitive);
            ``set-cookie``, ``content-length`` and hop-by-hop headers are refused.
        namespace: Prefix of every Redis key the middleware writes; no braces.

    Example::

        app = FastAPI()
        app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(socket_timeout=2),
                           required=True, scope=lambda scope: scope["user"].identity)
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
        required: bool = False,
        methods: Iterable[str] = ("POST", "PATCH"),
        header: str = "Idempotency-Key",
        lease: int = 30,
        ttl: int = 86400,
        wait: float = 0.0,
        scope: Callable[[Scope], str | None] | None = None,
        max_body_bytes: int = 1024 * 1024,
        max_response_bytes: int = 1024 * 1024,
        replay_headers: Iterable[str] = DEFAULT_REPLAY_HEADERS,
        namespace: str = "goblin-http",
    ) -> None:
        self.app = app
        self._client: Any = None
        self._factory: Callable[[], Any] | None = None
        kind = client_kind(client)
        if kind is None and callable(client):
            self._factory = client
        else:
            _check_async_client(client)
            self._client = client
        if type(required) is not bool:
            raise InvalidArgumentTypeError(f"required must be True or False, not {describe(required)}")
        self.required = required
        self.methods = _check_methods(methods)
        if type(header) is not str or not header or not header.isascii() or not header.replace("-", "").isalnum():
            raise InvalidArgumentError(
                f"header must be a header name such as 'Idempotency-Key', not {describe(header)}"
            )
        self.header = header
        self._header_name = header.lower().encode("ascii")
        self.lease = check_seconds("lease", lease)
        self.ttl = check_seconds("ttl", ttl)
        self.wait = check_timeout("wait", wait)
        if scope is not None and not callable(scope):
            raise InvalidArgumentTypeError(f"scope must be a function of the ASGI scope or None, not {describe(scope)}")
        self.scope = scope
        self.max_body_bytes = _check_bytes("max_body_bytes", max_body_bytes)
        self.max_response_bytes = _check_bytes("max_response_bytes", max_response_bytes)
        self.replay_headers = _check_replay_headers(replay_headers)
        self._replay_names = frozenset(name.encode("latin-1") for name in self.replay_headers)
        self.namespace = check_namespace(namespace)

    # -- the ASGI entry point

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection: intercepted HTTP requests here, everything else passed to the app."""
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        values = [value for name, value in scope["headers"] if name.lower() == self._header_name]
        if not values:
            if self.required:
                await _problem(send, 400, f"this request needs an {self.header} header: a unique key per operation")
                return
            await self.app(scope, receive, send)
            return
        key, error = self._parse_key(values)
        if key is None:
            await _problem(send, 400, error)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await _problem(send, 413, self._too_large_detail(declared))
            return
        body = await self._read_body(receive, send)
        if body is None:
            return  # answered 413, or the client left before sending its body: nothing ran
        owner = self.scope(scope) if self.scope is not None else None
        if owner is not None and type(owner) is not str:
            raise InvalidArgumentTypeError(f"the scope function must return a str or None, not {describe(owner)}")
        fp = _fingerprint(scope.get("query_string", b""), body)
        name = json.dumps([scope["method"], scope["path"], owner, key], separators=(",", ":"))
        claim = AsyncClaim(
            self._resolve_client(), name, lease=self.lease, ttl=self.ttl, namespace=self.namespace,
            token=f"{_new_token()}.{fp}",
        )  # fmt: skip
        await self._handle(scope, _replaying(body, receive), send, claim, fp)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, claim: AsyncClaim, fp: str) -> None:
        try:
            outcome = await claim.acquire()
            holder = claim._holder
            if isinstance(outcome, InFlight):
                if _holder_fp(holder) not in (None, fp):
                    await _problem(send, 422, _MISMATCH)
                    return
                if self.wait == 0:
                    await _problem(send, 409, _IN_FLIGHT, retry=True)
                    return
                outcome = await claim.wait(timeout=self.wait)
        except StillInFlightError:
            await _problem(send, 409, f"{_IN_FLIGHT} (waited {self.wait:g}s)", retry=True)
            return
        except ResultLostError:
            await _problem(send, 500, _RESULT_LOST)
            return
        except GoblinClaimError as exc:  # Redis unreachable or refusing: never run the app unguarded
            logger.warning("%s: the idempotency claim failed, answering 503: %s", claim.key, exc)
            await _problem(send, 503, _UNAVAILABLE, retry=True)
            return
        except asyncio.CancelledError:
            # The claim (or wait()'s takeover) may have landed with its reply lost to the
            # cancellation: give this token's claim back, or the key stays blocked by
            # nobody for the whole lease. Owner-checked, so a no-op when it never landed.
            await to_the_end_async(_give_back(claim))
            raise
        if isinstance(outcome, Completed):
            await self._replay(send, outcome.value, fp)
            return
        exchange = _Exchange(self, claim, fp, receive, send)
        try:
            async with claim.keep_alive():
                exchange.started = True
                await self.app(scope, exchange.receive, exchange.send)
        except BaseException as exc:
            await to_the_end_async(exchange.settle(exc))
            raise
        await to_the_end_async(exchange.settle(None))

    async def _replay(self, send: Send, stored: bytes | str, fp: str) -> None:
        try:
            envelope = _ENVELOPE.validate_json(stored)
        except ValidationError:
            preview = describe(stored[:80])
            logger.error("idempotency store holds something that is not a stored response: %s", preview)
            await _problem(send, 500, f"the stored response for this key is unreadable (another writer?): {preview}")
            return
        if envelope.fp != fp:
            await _problem(send, 422, _MISMATCH)
            return
        if isinstance(envelope, AbandonedRequest):
            await _problem(send, 422, f"{_ABANDONED} ({envelope.reason})")
            return
        if isinstance(envelope, UnstoredResponse):
            await _problem(
                send, 500,
                f"the first request with this key was run and answered {envelope.status}, but its response was not "
                f"kept ({envelope.reason}); it is not run again: use a new key to run it again",
            )  # fmt: skip
            return
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in envelope.headers]
        headers.append((b"content-length", str(len(envelope.body)).encode()))
        headers.append(REPLAYED_HEADER)
        await send({"type": "http.response.start", "status": envelope.status, "headers": headers})
        await send({"type": "http.response.body", "body": envelope.body})

    # -- helpers

    def _resolve_client(self) -> Any:
        client = self._client
        if client is None:
            assert self._factory is not None
            made = self._factory()
            _check_async_client(made)
            self._client = client = made
        return client

    def _parse_key(self, values: list[bytes]) -> tuple[str | None, str]:
        if len(values) > 1:
            return None, f"send one {self.header} header, not {len(values)}"
        raw = values[0].strip()
        if len(raw) >= 2 and raw.startswith(b'"') and raw.endswith(b'"'):
            raw = raw[1:-1].replace(b'\\"', b'"').replace(b"\\\\", b"\\")  # an sf-string (RFC 8941)
        if not 0 < len(raw) <= MAX_KEY_LENGTH or not all(0x20 <= byte < 0x7F for byte in raw):
            return None, f"the {self.header} header must be 1 to {MAX_KEY_LENGTH} printable ASCII characters"
        return raw.decode("ascii"), ""

    def _too_large_detail(self, size: int | None) -> str:
        told = f"{size} bytes" if size is not None else "the body"
        return (
            f"{told} is more than the {self.max_body_bytes} bytes this server fingerprints for {self.header} "
            "requests; the request was not run"
        )

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _problem(send, 413, self._too_large_detail(None))
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
    while its client was still there. Anything else that ends without a kept
    response (a cancellation, a client gone, a response never finished) may have
    done its work, so the key is kept closed as an ``AbandonedRequest``.
    """

    __slots__ = (
        "_chunks", "_claim", "_fp", "_gone", "_mode", "_owner", "_receive", "_send", "_size", "_start", "_unstored",
        "ended", "started",
    )  # fmt: skip

    def __init__(self, owner: IdempotencyMiddleware, claim: AsyncClaim, fp: str, receive: Receive, send: Send) -> None:
        self._owner = owner
        self._claim = claim
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
                if self._mode == "pass" and self._unstored is not None:
                    await self._finish_unstored()
                self.ended = True
            await self._forward(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            status = message["status"]
            if status >= 500 or status in RETRY_STATUSES:
                self._mode = "pass"  # not kept: the key is given back when the app is done
                await self._forward(message)
                return
            reason = self._streamed(message)
            if reason is not None:
                await self._pass_unstored(reason)
            return
        if kind == "http.response.body" and self._start is not None:
            chunk = message.get("body", b"")
            if chunk:
                self._chunks.append(chunk)
                self._size += len(chunk)
            more = bool(message.get("more_body", False))
            if self._size > self._owner.max_response_bytes:
                await self._pass_unstored(
                    f"its body is larger than max_response_bytes={self._owner.max_response_bytes}", more=more
                )
            elif not more:
                await self._store_and_send()
            return
        # Anything else (http.response.pathsend, zerocopysend, trailers...) cannot be buffered.
        if self._start is not None:
            await self._pass_unstored(f"it was sent as {kind}")
            await self.send(message)
        else:
            await self._forward(message)

    def _streamed(self, start: Message) -> str | None:
        """Why a response cannot be kept, known from its start alone; ``None`` when it may be."""
        if start.get("trailers", False):
            return "it has trailers"
        limit = self._owner.max_response_bytes
        for name, value in start.get("headers", ()):
            lowered = name.lower()
            if lowered == b"content-length" and value.isdigit() and int(value) > limit:
                return f"its Content-Length {int(value)} is larger than max_response_bytes={limit}"
            if lowered == b"content-type" and value.lower().startswith(b"text/event-stream"):
                return "it is an event stream"
        return None

    async def _pass_unstored(self, reason: str, *, more: bool = True) -> None:
        """Send what was held back, marked unstored, and forward the rest as it comes."""
        assert self._start is not None
        self._mode = "pass"
        self._unstored = reason
        logger.warning(
            "%s %s: the response is passed through and not kept for replay: %s; duplicates are answered 500",
            self._claim.key, self._start["status"], reason,
        )  # fmt: skip
        start = dict(self._start)
        start["headers"] = [*start.get("headers", ()), UNSTORED_HEADER]
        await self._forward(start)
        if self._chunks or not more:
            if not more:
                await self._finish_unstored()
            await self._forward({"type": "http.response.body", "body": b"".join(self._chunks), "more_body": more})
            self.ended = not more
        self._chunks = []

    async def _finish_unstored(self) -> None:
        """Mark the key before the last of an unstored response goes out: a client that saw it and retries is told."""
        assert self._start is not None
        assert self._unstored is not None
        self._mode = "settled"
        marker = UnstoredResponse(fp=self._fp, status=self._start["status"], reason=self._unstored)
        await to_the_end_async(self._mark(marker))

    async def _store_and_send(self) -> None:
        """Store the whole response, then send it: a client that saw it and retries gets the replay."""
        assert self._start is not None
        self._mode = "settled"
        start, body = self._start, b"".join(self._chunks)
        self._chunks = []
        names = self._owner._replay_names
        kept = [
            (n.lower().decode("latin-1"), v.decode("latin-1"))
            for n, v in start.get("headers", ())
            if n.lower() in names
        ]
        envelope = StoredResponse(fp=self._fp, status=start["status"], headers=kept, body=body)
        # The app has answered: a cancellation now (the client left mid-store) must not
        # drop its answer, so the store lands first and the cancellation propagates after.
        stored = await to_the_end_async(self._store(envelope.model_dump_json().encode(), start["status"]))
        if stored == "lost":
            await _problem(self._forward, 503, _LOST, retry=True)
            self.ended = True
            return
        if stored == "failed":
            start = {**start, "headers": [*start.get("headers", ()), UNSTORED_HEADER]}
        await self._forward(start)
        await self._forward({"type": "http.response.body", "body": body})
        self.ended = True

    async def _store(self, payload: bytes, status: int) -> Literal["stored", "lost", "failed"]:
        """Store the response; failing that, keep the key closed with a small marker (fail closed)."""
        try:
            await self._complete(payload)
            return "stored"
        except ClaimLostError as exc:
            # Another request took the key over after this lease lapsed: the answer
            # that is (or will be) stored is theirs, so this one is not given out.
            logger.warning("%s: the claim was lost while the app ran; answering 503: %s", self._claim.key, exc)
            return "lost"
        except GoblinClaimError as exc:
            # The app ran: its answer is sent all the same, marked unstored.
            logger.warning("%s: the response could not be stored (%s); it will not be replayed", self._claim.key, exc)
            failure = exc
        if not isinstance(failure, ConnectionFailedError):
            # A refused write (maxmemory, a size limit) may still take a marker a few
            # bytes long; a connection that failed through the store window would not.
            reason = f"it could not be stored: {str(failure)[:200]}"
            await self._mark(UnstoredResponse(fp=self._fp, status=status, reason=reason))
        return "failed"

    async def _complete(self, payload: bytes) -> None:
        # Owner-checked and safe to send twice, so a dropped connection is retried
        # for a while (it also lands after the lease if nobody claimed the key since).
        schedule = WaitSchedule(min(float(self._claim.lease), STORE_WINDOW), self._claim.key)
        schedule.start(time.monotonic())
        while True:
            try:
                await self._claim.complete(payload)
                return
            except ConnectionFailedError:
                delay = schedule.next_delay(time.monotonic())
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _mark(self, marker: UnstoredResponse | AbandonedRequest) -> None:
        """Keep the key closed with ``marker``: duplicates are told, the request is not run again."""
        try:
            await self._complete(marker.model_dump_json().encode())
        except GoblinClaimError as exc:
            logger.warning(
                "%s: could not keep the key closed (%s); it frees itself after the lease and a retry runs again",
                self._claim.key, exc,
            )  # fmt: skip

    async def settle(self, error: BaseException | None) -> None:
        """After the app returned (or raised ``error``): keep a mark, fail closed, or give the key back."""
        mode, self._mode = self._mode, "settled"
        if mode == "settled":
            return
        if not self.started:
            await _give_back(self._claim)  # cancelled on the way in: the app never ran
            return
        if mode == "pass" and self._unstored is None:
            await _give_back(self._claim)  # a 5xx or a retry status: the app asks for a retry
            return
        if isinstance(error, Exception) and not self._gone:
            await _give_back(self._claim)  # the app failed while its client waited: a retry runs at once
            return
        # No whole response, yet the app ran (a sync Django view even finishes in its
        # thread after a disconnect): what it did is unknown, so it is never run again.
        reason = self._abandoned(error)
        logger.warning("%s: %s; the key is kept closed, duplicates are answered 422", self._claim.key, reason)
        await self._mark(AbandonedRequest(fp=self._fp, reason=reason))
        if mode == "buffer" and self._start is not None and error is None:
            # The app returned without finishing its response: send what it gave; the server tells the client.
            await self._forward(self._start)
            if self._chunks:
                await self._forward({"type": "http.response.body", "body": b"".join(self._chunks), "more_body": True})

    def _abandoned(self, error: BaseException | None) -> str:
        """Why the request ended without a whole response, for the marker and the log."""
        if error is not None and not isinstance(error, Exception):
            return "the request was cancelled after it began (the client disconnected or the server stopped)"
        if error is not None:
            return f"the client disconnected and the app raised {type(error).__name__}"
        if self._start is None:
            return "the app returned without a response (frameworks do this when the client disconnects)"
        return f"the app returned without finishing its {self._start['status']} response"


# --------------------------------------------------------------------------- small pieces

_MISMATCH: Final = (
    "this idempotency key was already used with a different request body or query string; "
    "use a new key for a new request"
)
_IN_FLIGHT: Final = "a request with this idempotency key is still being processed; retry after it finishes"
_LOST: Final = (
    "this request ran, but its claim on the idempotency key lapsed and another request took it over; "
    "retry to get the stored response"
)
_UNAVAILABLE: Final = "the idempotency store is unavailable, so the request was not run; retry later"
_ABANDONED: Final = (
    "a request with this idempotency key started running but ended without a whole response, so whether it took "
    "effect is unknown; it is not run again: check the outcome, or use a new key to run it again"
)
_RESULT_LOST: Final = (
    "the first request with this idempotency key completed, but its stored response is gone (evicted); "
    "an operator can reopen the key"
)


async def _give_back(claim: AsyncClaim) -> None:
    """Release ``claim`` if this token holds it (owner-checked, so a no-op otherwise)."""
    with contextlib.suppress(GoblinClaimError):  # if Redis is gone, the claim frees itself after its lease
        await claim.release()


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


def _fingerprint(query: bytes, body: bytes) -> str:
    # The query string's length first, so no split of query and body collides with another.
    digest = hashlib.sha256(len(query).to_bytes(8, "big"))
    digest.update(query)
    digest.update(body)
    return digest.hexdigest()[:32]


def _holder_fp(holder: object) -> str | None:
    """The fingerprint in a holder's token (``<token>.<fp>``, or ``done <token>.<fp>``), if any."""
    if holder is None:
        return None
    text = holder.decode("utf-8", "replace") if isinstance(holder, bytes) else str(holder)
    text = text.removeprefix(DONE_PREFIX)
    return text.rsplit(".", 1)[1] if "." in text else None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _problem(send: Send, status: int, detail: str, retry: bool = False) -> None:
    """Answer an RFC 9457 problem: ``application/problem+json`` with type, title, status and detail."""
    title = HTTPStatus(status).phrase
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if retry:
        headers.append((b"retry-after", RETRY_AFTER))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _check_async_client(client: object) -> None:
    if client_kind(client) is not True:
        raise InvalidArgumentTypeError(
            "IdempotencyMiddleware needs an asyncio client (redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster) "
            f"or a function of no arguments returning one, not {type(client).__module__}.{type(client).__qualname__}"
        )


def _check_methods(methods: object) -> frozenset[str]:
    if isinstance(methods, str) or not isinstance(methods, Iterable):
        raise InvalidArgumentTypeError(
            f"methods must be a tuple of method names such as ('POST',), not {describe(methods)}"
        )
    chosen: set[str] = set()
    for method in methods:
        if type(method) is not str or not method.isalpha() or not method.isascii():
            raise InvalidArgumentTypeError(f"methods must hold method names such as 'POST', not {describe(method)}")
        if method.upper() in SAFE_METHODS:
            raise InvalidArgumentError(f"{method.upper()} is a safe method: it always passes through; leave it out")
        chosen.add(method.upper())
    if not chosen:
        raise InvalidArgumentError("methods=() intercepts nothing: leave the middleware out instead")
    return frozenset(chosen)


def _check_bytes(name: str, value: object) -> int:
    if type(value) is not int:
        raise InvalidArgumentTypeError(f"{name} must be an int of bytes, not {type(value).__name__} {describe(value)}")
    if not 0 < value <= MAX_BYTES_LIMIT:
        raise InvalidArgumentError(f"{name} must be from 1 to {MAX_BYTES_LIMIT} bytes, not {describe(value)}")
    return value


def _check_replay_headers(names: object) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise InvalidArgumentTypeError(
            f"replay_headers must be a tuple of header names such as ('content-type', 'etag'), not {describe(names)}"
        )
    chosen: list[str] = []
    for name in names:
        if type(name) is not str or not name or not name.isascii() or not name.replace("-", "").isalnum():
            raise InvalidArgumentTypeError(f"replay_headers must hold header names, not {describe(name)}")
        lowered = name.lower()
        if lowered in NEVER_REPLAYED:
            why = "is recomputed on replay" if lowered == "content-length" else "is never replayed"
            raise InvalidArgumentError(f"replay_headers names {name!r}, which {why}")
        if lowered not in chosen:
            chosen.append(lowered)
    return tuple(chosen)
