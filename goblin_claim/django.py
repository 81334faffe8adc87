"""Django's door to the ``Idempotency-Key`` rules: a middleware (WSGI and ASGI), a per-view decorator, a check.

In ``settings.py``, after authentication, so a ``scope`` function sees ``request.user``::

    INSTALLED_APPS = [..., "goblin_claim.django.GoblinClaimConfig"]  # registers the system check
    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "goblin_claim.django.IdempotencyMiddleware",
        ...,
    ]
    # The project's client: the middleware, @idempotent_view and @idempotent(goblin_claim.django.client) use it.
    GOBLIN_CLAIM_CLIENT = "redis://localhost:6379/0?socket_timeout=2&socket_connect_timeout=2"
    GOBLIN_CLAIM_IDEMPOTENCY = {
        "required": True,
        "scope": lambda request: request.user.pk,
    }

The settings dict's keys are the ASGI middleware's keyword arguments
(``"required"``, ``"scope"``, ``"wait"``...), plus ``"client"`` for a client of
the middleware's own. One entry serves both worlds: under WSGI the middleware
claims through a sync client, under ASGI through an asyncio one (a URL gives
each its own; a client or a factory must be of the kind the server runs). It
acts once routing is done: a request no URL matches passes through unclaimed
(its 404 is never kept), and so does a view wearing its own
``@idempotent_view(...)`` options::

    @idempotent_view(required=True, ttl=3600)
    def charge(request): ...

    @idempotency_key("ignore")   # never claimed: with required=True in settings, no 400 here
    def webhook(request): ...

A plain view calling an ``@idempotent`` function answers its errors as the door
would with ``problem_response(exc)``.

Every decision (key, scope, fingerprint, what is kept, problem answers) is the
shared core's; the stored envelopes are the other doors', so a Django service and
a Starlette one over one Redis replay each other's answers.

Not guaranteed: under ASGI Django cancels an async view when its client leaves
and lets a sync view finish in its thread; either way the key is kept closed
(duplicates get 422), since what the view did is unknown.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import redis
import redis.asyncio
from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied, SuspiciousOperation
from django.core.signals import setting_changed
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.urls import Resolver404, resolve

from . import _defaults, _events, _http
from ._clients.families import adapt
from ._clients.kinds import check_client, client_kind
from ._clients.transport import to_the_end_async
from ._drivers import http_aio, http_sync
from ._drivers.aio import AsyncClaim
from ._drivers.sync import Claim
from ._errors import GoblinClaimError, InvalidArgumentTypeError
from ._http import UNSTORED_HEADER, Answer, Options, idempotency_key

__all__ = [
    "CLIENT_SETTING",
    "SETTING",
    "GoblinClaimConfig",
    "IdempotencyMiddleware",
    "async_client",
    "check_middleware_order",
    "client",
    "idempotency_key",
    "idempotent_view",
    "problem_response",
]

SETTING = "GOBLIN_CLAIM_IDEMPOTENCY"
"""The settings dict the middleware and the decorator read their options from."""
CLIENT_SETTING = "GOBLIN_CLAIM_CLIENT"
"""The project's client: a URL, a client, or a dotted path to a client or to a function of no arguments making one."""
_MIDDLEWARE = "goblin_claim.django.IdempotencyMiddleware"
_AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
_MARK = "_goblin_claim_idempotency"  # on a view wearing its own options: the middleware leaves it alone


def _url_clients(url: str, name: str) -> tuple[Any, Any, Any]:
    """The sync client, asyncio client and asyncio blocking pool classes for ``url``: valkey-py's for valkey://."""
    if not url.lower().startswith(("valkey://", "valkeys://")):
        return redis.Redis, redis.asyncio.Redis, redis.asyncio.BlockingConnectionPool
    try:
        import valkey
        import valkey.asyncio
    except ImportError:
        raise ImproperlyConfigured(f"{name}: a valkey:// URL needs valkey-py (goblin-claim[valkey])") from None
    return valkey.Valkey, valkey.asyncio.Valkey, valkey.asyncio.BlockingConnectionPool


def _made(setting: object, want_async: bool, name: str) -> Any:
    """The client ``setting`` names, for the world Django runs (``ImproperlyConfigured`` for the wrong kind).

    A URL makes a client of either kind, with ``URL_CLIENT_TIMEOUT`` as its socket and connect
    timeouts unless its query sets them; a dotted path is imported, and a factory called, here.
    """
    if isinstance(setting, str) and "://" in setting:
        sync_class, async_class, async_pool = _url_clients(setting, name)
        timeouts = {
            "socket_timeout": _defaults.URL_CLIENT_TIMEOUT,
            "socket_connect_timeout": _defaults.URL_CLIENT_TIMEOUT,
        }  # the URL's query wins (redis-py's from_url)
        if want_async:
            return async_class.from_pool(async_pool.from_url(setting, max_connections=64, timeout=10, **timeouts))
        return sync_class.from_url(setting, **timeouts)
    made = setting
    if isinstance(setting, str):
        module, _, attribute = setting.rpartition(".")
        try:
            made = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{name}: cannot import {setting!r} ({exc})") from exc
    made = adapt(made)  # a GLIDE client: its adapter
    if client_kind(made) is None and callable(made):
        made = adapt(made())
    world = "ASGI" if want_async else "WSGI"
    if name == CLIENT_SETTING:  # asked for by client() or async_client(), the middleware's or a decorator's
        asker = "async_client()" if want_async else "client()"
        user, hint = f"{name} for {asker}", f"{asker} serves the middleware under {world} and the functions given it"
    else:
        user = f"{name} under {world}"
        hint = f"Django runs this middleware under {world} here: give a client of that kind, or a URL for both"
    check_client(
        made, want_async, user, hint, also=" (or a redis:// or valkey:// URL, which serves both)",
        error=ImproperlyConfigured,
    )  # fmt: skip
    return made


class _ProjectClients:
    """``settings.GOBLIN_CLAIM_CLIENT``'s clients: made on first use, once per process (an asyncio one per loop).

    Never shared with a forked child (gunicorn's workers each make their own, also when
    its master made one under ``--preload``); made again after ``override_settings``
    changes the setting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: Any = None
        self._async: tuple[object, Any] | None = None  # (the event loop it was made in, the client)

    def get(self, want_async: bool) -> Any:
        """The sync client, or the asyncio client of the running event loop (made in it on its first use)."""
        if not want_async:
            made = self._sync
            if made is None:
                with self._lock:
                    if self._sync is None:
                        self._sync = _made(_client_setting(), False, CLIENT_SETTING)
                    made = self._sync
            return made
        try:
            loop: object = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        kept = self._async
        if kept is None or kept[0] is not loop:
            with self._lock:
                kept = self._async
                if kept is None or kept[0] is not loop:
                    kept = self._async = (loop, _made(_client_setting(), True, CLIENT_SETTING))
        return kept[1]

    def forget(self, **_: object) -> None:
        """Drop the clients made (a forked child's, or a changed setting's): the next use makes new ones."""
        self._lock = threading.Lock()
        self._sync = None
        self._async = None


def _client_setting() -> object:
    setting = getattr(settings, CLIENT_SETTING, None)
    if setting is None:
        raise ImproperlyConfigured(
            f"settings.{CLIENT_SETTING} is not set: give a redis:// or valkey:// URL, a client or a dotted path"
        )
    return setting


_PROJECT = _ProjectClients()
os.register_at_fork(after_in_child=_PROJECT.forget)


def _setting_changed(*, setting: str, **_: object) -> None:
    if setting == CLIENT_SETTING:
        _PROJECT.forget()


setting_changed.connect(_setting_changed, dispatch_uid="goblin_claim.django.client")


def client() -> Any:
    """The project's sync client, from ``settings.GOBLIN_CLAIM_CLIENT``: made on first use, once per process.

    A function of no arguments, so every door and decorator that takes a client or
    such a function takes it, and all of them share one client per process
    (the middleware, ``@idempotent_view``, ``@idempotent``, the job doors).
    The setting is read, its dotted path imported and its factory called on the
    first call in each process: a gunicorn worker makes its own after the fork.

    Example::

        @idempotent(goblin_claim.django.client, key="event_id")
        def handle(event_id: str) -> Receipt: ...

    Raises:
        ImproperlyConfigured: The setting is missing, or names no sync client (a URL serves both kinds).
    """
    return _PROJECT.get(False)


def async_client() -> Any:
    """The project's asyncio client, from ``settings.GOBLIN_CLAIM_CLIENT``: one per process and event loop.

    ``client()``'s twin for ``async def`` functions under ASGI, made in the running
    event loop on its first use there (a loop made for each test, or each request of
    an async view under WSGI, makes its own).

    Example::

        @idempotent(goblin_claim.django.async_client, key="event_id")
        async def handle(event_id: str) -> Receipt: ...

    Raises:
        ImproperlyConfigured: The setting is missing, or names no asyncio client.
    """
    return _PROJECT.get(True)


View = TypeVar("View", bound=Callable[..., Any])


class GoblinClaimConfig(AppConfig):
    """``"goblin_claim.django.GoblinClaimConfig"`` in ``INSTALLED_APPS``: ``manage.py check`` runs its check."""

    name = "goblin_claim.django"
    label = "goblin_claim"
    verbose_name = "goblin-claim idempotency"
    default = True


class _Door:
    """The options and clients one middleware or decorator claims through (clients made on first use)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        config = dict(config)
        own = config.pop("client", None)
        if own is None and getattr(settings, CLIENT_SETTING, None) is None:
            raise ImproperlyConfigured(
                f"{SETTING} needs a 'client', or settings.{CLIENT_SETTING}: a redis:// or valkey:// URL, a client or "
                "a dotted path"
            )
        try:
            self.options: Options = _http.make_options(**config)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{SETTING}: {exc}") from exc
        # Each world's client is made on its first request: a URL gives each its own; without a
        # client of its own, the door takes the project's (one per process, shared with the decorators).
        if own is None:
            sync_client: Any = client
            async_made: Any = async_client
        else:
            name = f"{SETTING}['client']"
            sync_client = functools.partial(_made, own, False, name)
            async_made = functools.partial(_made, own, True, name)
        self._sync = http_sync.SyncDoor(sync_client, self.options, _MIDDLEWARE)
        self._async = http_aio.AsyncDoor(async_made, self.options, _MIDDLEWARE)

    # -- the request's side, once for both worlds

    def _request(self, request: HttpRequest, marked: _http.KeyRule | None) -> tuple[str, bytes] | Answer | None:
        """``(key, body)`` of an intercepted request, an answer refusing it, or ``None`` to pass it through."""
        options = self.options
        if not _http.covers(options, request.method or ""):
            return None
        raw = request.META.get("HTTP_" + options.header.upper().replace("-", "_"))
        _, key = _http.admit(
            options, request, request.path, marked, [] if raw is None else [raw.encode("latin-1")], "django"
        )
        if key is None or isinstance(key, Answer):
            return key
        refused = _http.body_refused(options, _http.declared_length(request.META.get("CONTENT_LENGTH") or None))
        body = b"" if refused else request.body
        return refused or _http.body_refused(options, None, len(body)) or (key, body)

    def _identify(self, request: HttpRequest, body: bytes) -> _http.Identity | Answer:
        """Who the key belongs to and the request's fingerprint (a scope function may read the database)."""
        kind, query = request.META.get("CONTENT_TYPE"), request.META.get("QUERY_STRING", "").encode("latin-1")
        content_type = None if kind is None else kind.encode("latin-1")
        return _http.identify(self.options, request, content_type, query, body, "django", _answered_by_django)

    # -- WSGI (sync)

    def handle(
        self,
        request: HttpRequest,
        call: Callable[[HttpRequest], HttpResponseBase],
        marked: _http.KeyRule | None = None,
    ) -> HttpResponseBase:
        """Run ``call(request)`` once per key (sync), replaying its response to duplicates."""
        parsed = self._request(request, marked)
        if parsed is None:
            return call(request)
        if isinstance(parsed, Answer):
            return _response(parsed, self.options.problem_docs)
        who = self._identify(request, parsed[1])
        if isinstance(who, Answer):
            return _response(who, self.options.problem_docs)
        claim = self._sync.claim(request.method or "", request.path, who.owner, parsed[0], who.fp)
        # One "request" event, taking the outcome of the claim's round trips inside it.
        with _events.observing("request", claim):
            return self._claimed_sync(request, call, claim, who.fp)

    def _claimed_sync(
        self, request: HttpRequest, call: Callable[[HttpRequest], HttpResponseBase], claim: Claim, fp: str
    ) -> HttpResponseBase:
        opened = http_sync.open_claim(self.options, claim, fp, _accept(request))
        if isinstance(opened, Answer):
            return _response(opened, self.options.problem_docs)
        if opened is not None:  # fail_open, Redis unreachable: the view runs unclaimed, its response passes through
            return call(request)
        keep = claim.keep_alive()
        keep.__enter__()
        try:
            response = call(request)  # Django turns a view's exception into a 500 response
        except BaseException as error:
            keep.__exit__(None, None, None)
            if isinstance(error, Exception):  # raised through @idempotent_view (the middleware sees Django's 500)
                http_sync.app_raised(self.options, claim, fp)
            else:  # SystemExit (gunicorn's timeout): the view began, what it did is unknown
                http_sync.abandon(claim, fp, f"the worker was stopped mid-request ({type(error).__name__})")
            raise
        action = self._verdict(response)
        if action.action == "pass":
            return self._pass_sync(response, claim, fp, action.reason, keep)
        keep.__exit__(None, None, None)
        if action is _http.GIVE_BACK:
            http_sync.give_back(claim)
            return response
        assert isinstance(response, HttpResponse)
        stored = http_sync.store(claim, self._payload(fp, response), response.status_code, fp)
        return self._sent(response, stored)

    def _pass_sync(self, response: HttpResponseBase, claim: Claim, fp: str, reason: str, keep: Any) -> HttpResponseBase:
        http_sync.passing_unstored("django", claim, response.status_code, reason)
        response[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        marker = _http.unstored_payload(fp, response.status_code, reason)
        if not isinstance(response, StreamingHttpResponse):
            keep.__exit__(None, None, None)
            http_sync.mark(claim, marker)
            return response
        response.streaming_content = _http.passed_through(
            response.streaming_content, keep, functools.partial(http_sync.mark, claim, marker),
            functools.partial(http_sync.abandon, claim, fp, _http.CUT_STREAM),
        )  # fmt: skip
        return response

    # -- ASGI (async)

    async def ahandle(
        self,
        request: HttpRequest,
        call: Callable[[HttpRequest], Awaitable[HttpResponseBase]],
        marked: _http.KeyRule | None = None,
    ) -> HttpResponseBase:
        """Run ``await call(request)`` once per key (async), replaying its response to duplicates."""
        parsed = self._request(request, marked)
        if parsed is None:
            return await call(request)
        if isinstance(parsed, Answer):
            return _response(parsed, self.options.problem_docs)
        # The scope function may touch request.user, a lazy database read Django refuses in an event loop.
        if self.options.scope:
            who = await sync_to_async(self._identify)(request, parsed[1])
        else:
            who = self._identify(request, parsed[1])
        if isinstance(who, Answer):
            return _response(who, self.options.problem_docs)
        claim = self._async.claim(request.method or "", request.path, who.owner, parsed[0], who.fp)
        # One "request" event, taking the outcome of the claim's round trips inside it.
        with _events.observing("request", claim):
            return await self._claimed_async(request, call, claim, who.fp)

    async def _claimed_async(
        self,
        request: HttpRequest,
        call: Callable[[HttpRequest], Awaitable[HttpResponseBase]],
        claim: AsyncClaim,
        fp: str,
    ) -> HttpResponseBase:
        opened = await http_aio.open_claim(self.options, claim, fp, _accept(request))
        if isinstance(opened, Answer):
            return _response(opened, self.options.problem_docs)
        if opened is not None:  # fail_open, Redis unreachable: the view runs unclaimed, its response passes through
            return await call(request)
        # The lease is renewed until the response is settled: a streamed one, until its last chunk went out.
        keep = claim.keep_alive()
        await keep.__aenter__()
        try:
            response = await call(request)
        except BaseException as error:
            await to_the_end_async(keep.__aexit__(None, None, None))
            if isinstance(error, Exception):
                await to_the_end_async(http_aio.app_raised(self.options, claim, fp))
            else:  # cancelled: Django does this when the client disconnects; the view began
                cancelled = "the request was cancelled after it began (the client disconnected or the server stopped)"
                await to_the_end_async(http_aio.abandon(claim, fp, cancelled))
            raise
        action = self._verdict(response)
        if action.action == "pass" and isinstance(response, StreamingHttpResponse):
            return self._pass_async(response, claim, fp, action.reason, keep)
        await to_the_end_async(keep.__aexit__(None, None, None))
        if action is _http.GIVE_BACK:
            await to_the_end_async(http_aio.give_back(claim))
            return response
        if action.action == "pass":
            http_aio.passing_unstored("django", claim, response.status_code, action.reason)
            response[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
            await to_the_end_async(
                http_aio.mark(claim, _http.unstored_payload(fp, response.status_code, action.reason))
            )
            return response
        assert isinstance(response, HttpResponse)
        stored = await to_the_end_async(http_aio.store(claim, self._payload(fp, response), response.status_code, fp))
        return self._sent(response, stored)

    def _pass_async(
        self, response: StreamingHttpResponse, claim: AsyncClaim, fp: str, reason: str, keep: Any
    ) -> StreamingHttpResponse:
        """Pass a stream on as it is made (a sync one too, a chunk at a time), renewing the lease until it ends."""
        http_aio.passing_unstored("django", claim, response.status_code, reason)
        response[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        marker = _http.unstored_payload(fp, response.status_code, reason)
        inner = response.streaming_content
        chunks = inner if response.is_async else _async_chunks(inner)

        async def ended() -> None:
            await to_the_end_async(http_aio.mark(claim, marker))

        async def cut() -> None:
            await to_the_end_async(http_aio.abandon(claim, fp, _http.CUT_STREAM))

        response.streaming_content = _http.apassed_through(chunks, keep, ended, cut)
        return response

    # -- both

    def _verdict(self, response: HttpResponseBase) -> _http.Verdict:
        """What becomes of the view's response (Django's streamed and file responses cannot be held whole)."""
        unbuffered = None
        if isinstance(response, StreamingHttpResponse):
            unbuffered = "it is a streamed response"
        elif not isinstance(response, HttpResponse):
            unbuffered = f"it is a {type(response).__name__}"
        size = len(response.content) if isinstance(response, HttpResponse) else None
        return _http.verdict(
            self.options, response.status_code, _byte_headers(response), unbuffered=unbuffered, size=size
        )

    def _payload(self, fp: str, response: HttpResponse) -> bytes:
        return _http.stored_payload(
            fp, response.status_code, _byte_headers(response), self.options.keeps_header, response.content
        )

    def _sent(self, response: HttpResponseBase, stored: str) -> HttpResponseBase:
        if stored == "lost":
            return _response(_http.claim_lost(), self.options.problem_docs)
        if stored == "failed":
            response[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        return response


_END: Any = object()


async def _async_chunks(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A sync stream's chunks, each made in a thread: Django would otherwise read it whole before sending it."""
    iterator = iter(chunks)
    step = sync_to_async(functools.partial(next, iterator, _END))
    try:
        while True:
            chunk = await step()
            if chunk is _END:
                return
            yield chunk
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            await sync_to_async(close)()


def _answered_by_django(error: Exception) -> bool:
    """An exception Django answers itself (404, 403, 400), raised by a scope function on purpose."""
    return isinstance(error, (Http404, PermissionDenied, SuspiciousOperation, BadRequest))


def _accept(request: HttpRequest) -> bytes | None:
    value = request.META.get("HTTP_ACCEPT_ENCODING")
    return None if value is None else str(value).encode("latin-1")


def _byte_headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]


def _response(answer: Answer, docs: str | None) -> HttpResponse:
    """A Django response for a whole answer (a problem or a replay)."""
    answer = _http.documented(answer, docs)
    response = HttpResponse(answer.body, status=answer.status)
    del response["Content-Type"]
    for name, value in answer.headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response


def problem_response(error: GoblinClaimError, *, problem_docs: str | None = None) -> HttpResponse:
    """The doors' answer to ``error`` from a plain view: ``application/problem+json``, the same status and body.

    For a view calling an ``@idempotent`` function (a webhook keyed by its event's id,
    say) rather than leaving the claim to the middleware. One mapping, the doors' own:
    ``StillInFlightError`` is ``409`` ``in-flight`` with ``Retry-After``,
    ``InterruptedWorkError`` ``409`` ``interrupted`` with ``claimed_at`` and no
    ``Retry-After``, ``PayloadMismatchError`` ``422`` ``key-reused``, ``ClaimLostError``
    ``503`` ``claim-lost`` with ``Retry-After``, ``ResultLostError`` ``500`` ``result-lost``,
    ``UnreadableResultError`` ``500``, and a server unreachable, failing or refusing
    (``ConnectionFailedError``, ``ServerUnavailableError``, ``NotReplicatedError``...)
    ``503`` ``store-unavailable`` with ``Retry-After``.

    Args:
        error: What the call raised.
        problem_docs: The link of each problem's ``type`` (``<problem_docs>#<code>``); by
            default the settings dict's ``"problem_docs"``, if any (as the doors answer).
            The settings dict's ``"expose_holder"`` is read too.

    Example::

        def webhook(request):
            event = json.loads(request.body)
            try:
                receipt = record_event(event["id"], event)  # an @idempotent function
            except GoblinClaimError as exc:
                return problem_response(exc)
            return JsonResponse(receipt.model_dump())

    Raises:
        GoblinClaimError: ``error`` itself, when it is the caller's own, which no door answers:
            a bad argument, a result that cannot be stored, the function's own error replayed
            (``ReplayedError``), ``current_claim()`` outside a call.
        InvalidArgumentTypeError: ``error`` is no goblin-claim error.
    """
    if not isinstance(error, GoblinClaimError):
        raise InvalidArgumentTypeError(f"problem_response() answers a GoblinClaimError, not {type(error).__name__}")
    if isinstance(error, _http.CALLERS_OWN):
        raise error
    configured = getattr(settings, SETTING, None)
    shown = (
        {name: configured[name] for name in ("problem_docs", "expose_holder") if name in configured}
        if isinstance(configured, Mapping)
        else {}
    )
    if problem_docs is not None:
        shown["problem_docs"] = problem_docs
    options = _http.make_options(**shown)  # a bad problem_docs: InvalidArgumentError, naming it
    return _response(_http.failure_answer(options, error), options.problem_docs)


def _config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config = getattr(settings, SETTING, None)
    if config is None and not overrides and getattr(settings, CLIENT_SETTING, None) is None:
        raise ImproperlyConfigured(
            f"settings.{SETTING} is not set: give at least {{'client': 'redis://...'}}, or set {CLIENT_SETTING}"
        )
    if config is not None and not isinstance(config, Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING} must be a dict of options, not {type(config).__name__}")
    return {**(config or {}), **(overrides or {})}


class IdempotencyMiddleware:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate (Django).

    Sync and async capable: Django hands it the chain of the world it runs in.
    Reads ``settings.GOBLIN_CLAIM_IDEMPOTENCY`` once, when Django builds its
    middleware; a request is claimed only once its URL resolved to a view (a
    404 passes through), and a view wearing ``@idempotent_view`` is left to it.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        self._door = _Door(_config())

    def __call__(self, request: HttpRequest) -> Any:
        """Handle one request, in the world Django runs (a coroutine under ASGI)."""
        if self.async_mode:
            return self._acall(request)
        view = self._guarded(request)
        if view is None:
            return self.get_response(request)
        return self._door.handle(request, self.get_response, _http.marked_rule(view))

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        view = self._guarded(request)
        if view is None:
            response: HttpResponseBase = await self.get_response(request)
            return response
        return await self._door.ahandle(request, self.get_response, _http.marked_rule(view))

    def _guarded(self, request: HttpRequest) -> Callable[..., Any] | None:
        """The view it claims the request for (a method it intercepts, a URL that resolves, no own options), or None."""
        if request.method not in self._door.options.methods:
            return None
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return None  # no endpoint: its 404 is never kept
        return None if hasattr(match.func, _MARK) else match.func


def idempotent_view(**options: Any) -> Callable[[View], View]:
    """A view's own ``Idempotency-Key`` options, over ``settings.GOBLIN_CLAIM_IDEMPOTENCY``; sync or async views.

    Args:
        **options: Any option of the settings dict (``client`` included), overriding it for this view.

    Example::

        @idempotent_view(required=True, scope=lambda request: request.user.pk)
        def charge(request): ...
    """

    def decorate(view: View) -> View:
        door: list[_Door] = []

        def the_door() -> _Door:
            if not door:
                door.append(_Door(_config(options)))
            return door[0]

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
                async def call(req: HttpRequest) -> HttpResponseBase:
                    response: HttpResponseBase = await view(req, *args, **kwargs)
                    return response

                return await the_door().ahandle(request, call, _http.marked_rule(async_wrapped))

            setattr(async_wrapped, _MARK, True)
            return async_wrapped  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return the_door().handle(request, lambda req: view(req, *args, **kwargs), _http.marked_rule(wrapped))

        setattr(wrapped, _MARK, True)
        return wrapped  # type: ignore[return-value]

    return decorate


@checks.register()
def check_middleware_order(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: the middleware runs after authentication, and its settings dict is valid.

    Run by ``manage.py check`` (and ``runserver``, ``migrate``...), only when the middleware
    is in ``MIDDLEWARE``: ``goblin_claim.E001`` for the middleware listed before
    ``AuthenticationMiddleware``, ``goblin_claim.E002`` for settings it would refuse (the
    ``ImproperlyConfigured`` it raises when Django builds it), ``goblin_claim.W001`` for a
    ``scope`` with no Django authentication middleware (silence it for custom authentication).
    """
    middleware = list(getattr(settings, "MIDDLEWARE", None) or ())
    if _MIDDLEWARE not in middleware:
        return []
    found: list[checks.CheckMessage] = []
    mine = middleware.index(_MIDDLEWARE)
    if _AUTH in middleware and middleware.index(_AUTH) > mine:
        found.append(
            checks.Error(
                f"{_MIDDLEWARE} is listed before {_AUTH}: its scope function would not see request.user",
                hint=f"Move {_MIDDLEWARE} after {_AUTH} in MIDDLEWARE.",
                id="goblin_claim.E001",
            )
        )
    try:
        door = _Door(_config())
    except ImproperlyConfigured as exc:
        hint = f"Fix settings.{SETTING} (or {CLIENT_SETTING}): the middleware refuses to start with this error."
        found.append(checks.Error(str(exc), hint=hint, id="goblin_claim.E002"))
        return found
    if door.options.scope is not None and _AUTH not in middleware:
        found.append(
            checks.Warning(
                f"{SETTING} has a scope function but no {_AUTH} runs before {_MIDDLEWARE}",
                hint="List your authentication middleware before it (or silence goblin_claim.W001 if it is custom).",
                id="goblin_claim.W001",
            )
        )
    return found
