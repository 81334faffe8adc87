"""The ``Idempotency-Key`` rules, once, for every HTTP front door (ASGI, WSGI, Django, Flask).

What is a key and whose it is, what a request's fingerprint covers, which
answers are kept, what a duplicate gets back, and the problem answers: all
decided here, in plain values. The doors (``goblin_claim.asgi``,
``goblin_claim.wsgi``, ``goblin_claim.django``, ``goblin_claim.flask``) only
read requests, hold the claim and write responses; none of them decides
anything this module decides. No redis and no web framework is imported here.

One envelope format for every door: a response stored by the WSGI middleware
is replayed by the ASGI one over the same Redis, and the reverse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import logging
import re
import threading
import traceback
import urllib.parse
import uuid
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any, Final, Literal, TypeVar, Union, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ._defaults import LEASE, TTL
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._protocol.checks import check_namespace, check_seconds, check_timeout, describe
from ._protocol.record import fingerprinted_token, holder_fp

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# RFC 9110 section 7.6.1, plus the pre-standard ones proxies still send.
HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
# Never stored: a cookie is a session, not an answer; the length is recomputed on replay.
NEVER_REPLAYED: Final = HOP_BY_HOP | {"set-cookie", "content-length"}
DEFAULT_NEVER_REPLAYED: Final = NEVER_REPLAYED | {
    # About this exchange, not the answer: the replay's own server says them anew.
    "date", "server", "age", "alt-svc", "server-timing", "x-request-id", "x-correlation-id", "traceparent",
    "tracestate", "idempotent-replayed", "idempotent-stored",
}  # fmt: skip
"""Response headers never stored or replayed by default (``replay_headers=None`` replays every other one)."""
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
"""A conservative allow-list for ``replay_headers=`` (by default every header outside the deny-list is replayed)."""

# Answers that did not come from the endpoint's work, or that ask the client to try
# again: keeping them would replay "not found" or "sign in" or "try again" for a day
# after the client fixed its request (Stripe keeps results only once an endpoint
# began executing), so the key is given back instead. 5xx are always given back.
DEFAULT_RELEASE_STATUSES: Final = frozenset({401, 403, 404, 405, 408, 425, 429})
"""Statuses answered but not kept (the key is given back, a retry runs), besides every 5xx."""
NO_BODY_STATUSES: Final = frozenset({*range(100, 200), 204, 304})
DEFAULT_STREAM_TYPES: Final = (
    "text/event-stream",
    "application/x-ndjson",
    "application/ndjson",
    "application/jsonl",
    "application/json-seq",
    "multipart/x-mixed-replace",
)
"""Content types passed through as they come (never buffered, never kept): duplicates get 422."""
RETRY_AFTER: Final = b"1"
MAX_KEY_LENGTH: Final = 255
# A larger body or response would not fit in one Redis value (proto-max-bulk-len, 512 MiB).
MAX_BYTES_LIMIT: Final = 256 * 1024 * 1024
# How long a response's store is retried through a dropped connection, at most.
STORE_WINDOW: Final = 10.0
REPLAYED_HEADER: Final = (b"idempotent-replayed", b"true")
UNSTORED_HEADER: Final = (b"idempotent-stored", b"false")

Headers = list[tuple[bytes, bytes]]
KeyRule = Literal["require", "accept", "ignore"]
"""What a route does with the key header: ``require`` it (400 without), ``accept`` it, ``ignore`` it (never claimed)."""
KEY_RULES: Final = ("require", "accept", "ignore")


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
    server cancelled or killed the request, after the app began; running it again
    could do its work twice, so duplicates are told instead.
    """

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_abandoned"] = "http_abandoned"
    fp: str
    reason: str


ENVELOPE: TypeAdapter[StoredResponse | UnstoredResponse | AbandonedRequest] = TypeAdapter(
    Annotated[
        Union[StoredResponse, UnstoredResponse, AbandonedRequest],  # noqa: UP007 -- 3.10
        Field(discriminator="kind"),
    ]
)


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Answer:
    """A whole response a door sends as it is: a problem, or a replay."""

    status: int
    headers: Headers
    body: bytes
    code: str = ""  # a problem's kind, the fragment of its documentation link


MISMATCH: Final = (
    "this idempotency key was already used with a different request body or query string; "
    "use a new key for a new request"
)
IN_FLIGHT: Final = "a request with this idempotency key is still being processed; retry after it finishes"
LOST: Final = (
    "this request ran, but its claim on the idempotency key lapsed and another request took it over; "
    "retry to get the stored response"
)
UNAVAILABLE: Final = "the idempotency store is unavailable, so the request was not run; retry later"
ABANDONED: Final = (
    "a request with this idempotency key started running but ended without a whole response, so whether it took "
    "effect is unknown; it is not run again: check the outcome, or use a new key to run it again"
)
RESULT_LOST: Final = (
    "the first request with this idempotency key completed, but its stored response is missing; "
    "an operator can reopen the key"
)
NO_OWNER: Final = (
    "this request has no owner for its idempotency key (the scope function found no user or tenant), so it was "
    "not run: authenticate, or have the idempotency middleware run after authentication"
)


_CODES: Final = {
    400: "key-invalid", 403: "no-owner", 409: "in-flight", 413: "body-too-large", 422: "key-reused",
    500: "result-unreadable", 503: "store-unavailable",
}  # fmt: skip


def problem(status: int, detail: str, *, retry: bool = False, code: str = "", docs: str | None = None) -> Answer:
    """An RFC 9457 problem: ``application/problem+json`` with type, title, status and detail.

    ``type`` is ``about:blank``, or ``<docs>#<code>`` with a documentation link
    (the Idempotency-Key draft's SHOULD): one anchor per kind of problem.
    """
    code = code or _CODES.get(status, "error")
    title = HTTPStatus(status).phrase
    kind = f"{docs}#{code}" if docs else "about:blank"
    body = json.dumps({"type": kind, "title": title, "status": status, "detail": detail}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if retry:
        headers.append((b"retry-after", RETRY_AFTER))
    return Answer(status, headers, body, code)


def documented(answer: Answer, docs: str | None) -> Answer:
    """``answer`` with its problem ``type`` linking to ``docs`` (a replay, or no link, is unchanged)."""
    if not docs or not answer.code:
        return answer
    detail = json.loads(answer.body)["detail"]
    retry = any(name == b"retry-after" for name, _ in answer.headers)
    return problem(answer.status, detail, retry=retry, code=answer.code, docs=docs)


def replay(stored: bytes | str, fp: str, accept_encoding: bytes | None = None) -> Answer:
    """What a duplicate gets for the value stored under its key (the first response, or a problem).

    A stored body compressed by something inside the middleware (``gzip`` or
    ``deflate``) is decompressed for a duplicate whose ``Accept-Encoding`` refuses
    that coding, so each client gets what it can read.
    """
    try:
        envelope = ENVELOPE.validate_json(stored)
    except ValidationError:
        # Never the stored bytes themselves: they may be another writer's secret.
        return problem(500, "the stored response for this key is unreadable (written by something else?)")
    if envelope.fp != fp:
        return problem(422, MISMATCH)
    if isinstance(envelope, AbandonedRequest):
        return problem(422, f"{ABANDONED} ({envelope.reason})", code="abandoned")
    if isinstance(envelope, UnstoredResponse):
        # 422, as for a reused key: no standard retrying client retries it, and it is final.
        return problem(
            422,
            f"the first request with this key was run and answered {envelope.status}, but its response was not "
            f"kept ({envelope.reason}); it is not run again: use a new key to run it again",
            code="not-kept",
        )
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in envelope.headers]
    body = envelope.body
    coding = next((value.strip().lower() for name, value in headers if name == b"content-encoding"), None)
    if coding in _DECODERS and not _accepts(accept_encoding, coding):
        assert coding is not None
        with contextlib.suppress(zlib.error):  # undecodable: replayed as it was stored
            body = _DECODERS[coding](body)
            headers = [(name, value) for name, value in headers if name != b"content-encoding"]
    if envelope.status not in NO_BODY_STATUSES:  # RFC 9110 section 8.6: never on 1xx, 204 or 304
        headers.append((b"content-length", str(len(body)).encode()))
    headers.append(REPLAYED_HEADER)
    return Answer(envelope.status, headers, body)


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)  # "deflate" as RFC 9110 defines it: zlib-wrapped
    except zlib.error:
        return zlib.decompress(body, -zlib.MAX_WBITS)  # the raw deflate some servers send


_DECODERS: Final[dict[bytes, Callable[[bytes], bytes]]] = {
    b"gzip": lambda body: zlib.decompress(body, 16 + zlib.MAX_WBITS),
    b"x-gzip": lambda body: zlib.decompress(body, 16 + zlib.MAX_WBITS),
    b"deflate": _inflate,
}


def _accepts(accept_encoding: bytes | None, coding: bytes) -> bool:
    """Whether ``Accept-Encoding`` admits ``coding`` (RFC 9110 section 12.5.3: no header admits any)."""
    if accept_encoding is None:
        return True
    weights: dict[bytes, float] = {}
    for item in accept_encoding.lower().split(b","):
        name, _, params = item.strip().partition(b";")
        weight = 1.0
        for param in params.split(b";"):
            key, _, value = param.strip().partition(b"=")
            if key == b"q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if name:
            weights[name.strip()] = weight
    alias = b"gzip" if coding == b"x-gzip" else coding
    weight = weights.get(coding, weights.get(alias, weights.get(b"*", 0.0)))
    return weight > 0


def stored_payload(
    fp: str, status: int, headers: Iterable[tuple[bytes, bytes]], keep: Callable[[bytes], bool], body: bytes
) -> bytes:
    """The envelope of a whole response, keeping the headers ``keep`` (of a lower-case name) says are replayed."""
    kept = [(n.lower().decode("latin-1"), v.decode("latin-1")) for n, v in headers if keep(n.lower())]
    return StoredResponse(fp=fp, status=status, headers=kept, body=body).model_dump_json().encode()


def unstored_payload(fp: str, status: int, reason: str) -> bytes:
    """The marker of a response that ran but was not kept."""
    return UnstoredResponse(fp=fp, status=status, reason=reason).model_dump_json().encode()


def abandoned_payload(fp: str, reason: str) -> bytes:
    """The marker of a request that began and ended without a whole response."""
    return AbandonedRequest(fp=fp, reason=reason).model_dump_json().encode()


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    """Every door's options, validated once (see ``goblin_claim.asgi.IdempotencyMiddleware`` for each)."""

    required: bool
    methods: frozenset[str]
    header: str
    lease: int
    ttl: int
    wait: float
    scope: Callable[[Any], object] | None
    shared_scope: bool
    max_body_bytes: int
    max_response_bytes: int
    replay_headers: tuple[str, ...] | None
    never_replayed: frozenset[str]
    release_statuses: frozenset[int]
    stream_types: tuple[bytes, ...]
    problem_docs: str | None
    fingerprint: str | Callable[[Any], object]
    namespace: str
    routes: tuple[tuple[re.Pattern[str], KeyRule], ...] | Callable[[Any], object] = ()

    @property
    def header_name(self) -> bytes:
        """The key's header name, lower-case bytes (as ASGI servers give them)."""
        return self.header.lower().encode("ascii")

    def keeps_header(self, name: bytes) -> bool:
        """Whether a response header (lower-case name) is stored and replayed."""
        text = name.decode("latin-1")
        if text in self.never_replayed:
            return False
        return self.replay_headers is None or text in self.replay_headers

    def given_back(self, status: int) -> bool:
        """Whether an answer with ``status`` is sent but not kept (the key is given back)."""
        return status >= 500 or status in self.release_statuses


@dataclass(frozen=True)
class DoorOptions:
    """Every door's options as given, each with its default: declared here once for every door.

    The ASGI middleware's keyword arguments take their defaults from ``DEFAULTS``
    (and a test holds its signature to these fields); the WSGI middleware, Flask's
    ``Idempotency`` and Django's settings dict are read into this class by name.
    ``checked()`` validates them into ``Options``.
    """

    required: bool = False
    methods: Iterable[str] = ("POST", "PATCH")
    header: str = "Idempotency-Key"
    lease: int = LEASE
    ttl: int = TTL
    wait: float = 0.0
    # Functions of the request, whatever each door's request is (Any: a door's narrower annotation takes these).
    scope: Callable[[Any], Any] | None = None
    shared_scope: bool = False
    max_body_bytes: int = 1024 * 1024
    max_response_bytes: int = 1024 * 1024
    replay_headers: Iterable[str] | None = None
    never_replayed: Iterable[str] = DEFAULT_NEVER_REPLAYED
    release_statuses: Iterable[int] = DEFAULT_RELEASE_STATUSES
    stream_types: Iterable[str] = DEFAULT_STREAM_TYPES
    problem_docs: str | None = None
    fingerprint: str | Callable[[Any], Any] = "auto"
    namespace: str = "goblin-http"
    routes: Mapping[str, KeyRule] | Callable[[Any], Any] | None = None

    def over(self, given: Mapping[str, Any]) -> DoorOptions:
        """These options with ``given`` (by name) over them; an unknown name raises ``InvalidArgumentTypeError``."""
        unknown = sorted(set(given) - set(DOOR_OPTIONS))
        if unknown:
            raise InvalidArgumentTypeError(
                f"unknown option {unknown[0]!r}: the HTTP doors' options are {', '.join(DOOR_OPTIONS)}"
            )
        return dataclasses.replace(self, **given)

    def checked(self) -> Options:
        """Validate the options (every bad one raises a ``GoblinClaimError`` subclass)."""
        for name in ("required", "shared_scope"):
            if type(getattr(self, name)) is not bool:
                raise InvalidArgumentTypeError(f"{name} must be True or False, not {describe(getattr(self, name))}")
        header = self.header
        if type(header) is not str or not header or not header.isascii() or not header.replace("-", "").isalnum():
            raise InvalidArgumentError(
                f"header must be a header name such as 'Idempotency-Key', not {describe(header)}"
            )
        if self.scope is not None and not callable(self.scope):
            raise InvalidArgumentTypeError(
                f"scope must be a function of the request or None, not {describe(self.scope)}"
            )
        return Options(
            required=self.required,
            methods=_check_methods(self.methods),
            header=header,
            lease=check_seconds("lease", self.lease),
            ttl=check_seconds("ttl", self.ttl),
            wait=check_timeout("wait", self.wait),
            scope=self.scope,
            shared_scope=self.shared_scope,
            max_body_bytes=_check_bytes("max_body_bytes", self.max_body_bytes),
            max_response_bytes=_check_bytes("max_response_bytes", self.max_response_bytes),
            replay_headers=None if self.replay_headers is None else _check_replay_headers(self.replay_headers),
            never_replayed=NEVER_REPLAYED | frozenset(_check_header_names("never_replayed", self.never_replayed)),
            release_statuses=_check_statuses(self.release_statuses),
            stream_types=_check_stream_types(self.stream_types),
            problem_docs=_check_docs(self.problem_docs),
            fingerprint=_check_fingerprint(self.fingerprint),
            namespace=check_namespace(self.namespace),
            routes=_check_routes(self.routes),
        )


DEFAULTS: Final = DoorOptions()
"""Every door option's default."""
DOOR_OPTIONS: Final = tuple(field.name for field in dataclasses.fields(DoorOptions))
"""The names of the doors' options, in order."""


def make_options(**given: Any) -> Options:
    """Validate the doors' options, given by name over their defaults (every bad one raises a ``GoblinClaimError``)."""
    return DEFAULTS.over(given).checked()


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


def _check_routes(routes: object) -> tuple[tuple[re.Pattern[str], KeyRule], ...] | Callable[[Any], object]:
    if routes is None:
        return ()
    if callable(routes):
        return routes
    if not isinstance(routes, Mapping):
        raise InvalidArgumentTypeError(
            "routes must map path patterns to 'require', 'accept' or 'ignore' (such as {'/webhooks/*': 'ignore'}), "
            f"or be a function of the request returning one of them or None, not {describe(routes)}"
        )
    chosen: list[tuple[re.Pattern[str], KeyRule]] = []
    for pattern, rule in routes.items():
        if type(pattern) is not str or not pattern.startswith("/"):
            raise InvalidArgumentError(f"routes holds path patterns beginning with '/', not {describe(pattern)}")
        # fnmatch's shell-style patterns: '*' also matches '/', so '/webhooks/*' covers every path below it.
        chosen.append((re.compile(fnmatch.translate(pattern)), check_rule(f"routes[{pattern!r}]", rule)))
    return tuple(chosen)


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


def _check_header_names(option: str, names: object) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise InvalidArgumentTypeError(f"{option} must be a collection of header names, not {describe(names)}")
    chosen: list[str] = []
    for name in names:
        if type(name) is not str or not name or not name.isascii() or not name.replace("-", "").isalnum():
            raise InvalidArgumentTypeError(f"{option} must hold header names, not {describe(name)}")
        chosen.append(name.lower())
    return chosen


def _check_stream_types(types: object) -> tuple[bytes, ...]:
    if isinstance(types, str) or not isinstance(types, Iterable):
        raise InvalidArgumentTypeError(
            f"stream_types must be a collection of content types such as ('text/event-stream',), not {describe(types)}"
        )
    chosen: list[bytes] = []
    for kind in types:
        if type(kind) is not str or "/" not in kind or not kind.isascii():
            raise InvalidArgumentTypeError(f"stream_types must hold content types, not {describe(kind)}")
        chosen.append(kind.strip().lower().encode("ascii"))
    return tuple(chosen)


def _check_fingerprint(strategy: object) -> str | Callable[[Any], object]:
    if callable(strategy):
        return strategy
    if strategy not in FINGERPRINTS:
        known = ", ".join(FINGERPRINTS)
        raise InvalidArgumentError(
            f"fingerprint must be one of {known} or a function of the request, not {describe(strategy)}"
        )
    assert isinstance(strategy, str)
    return strategy


def _check_docs(docs: object) -> str | None:
    if docs is None:
        return None
    if type(docs) is not str or not docs.startswith(("https://", "http://")) or "#" in docs:
        raise InvalidArgumentError(f"problem_docs must be an http(s) URL without a fragment, not {describe(docs)}")
    return docs


def _check_statuses(statuses: object) -> frozenset[int]:
    if isinstance(statuses, (str, bytes)) or not isinstance(statuses, Iterable):
        raise InvalidArgumentTypeError(
            f"release_statuses must be a set of status codes such as {{404, 409}}, not {describe(statuses)}"
        )
    chosen: set[int] = set()
    for status in statuses:
        if type(status) is not int or not 100 <= status <= 599:
            raise InvalidArgumentTypeError(
                f"release_statuses must hold status codes 100 to 599, not {describe(status)}"
            )
        chosen.add(status)
    return frozenset(chosen)


# --------------------------------------------------------------------------- which routes take a key

MARK: Final = "_goblin_claim_key"  # on an endpoint or view marked by idempotency_key(): its rule
OPT_KEY: Final = "idempotency_key"  # a Litestar handler's opt entry (``@post(..., idempotency_key="ignore")``)
Endpoint = TypeVar("Endpoint")
_marked = False  # set once any endpoint is marked: only then do the ASGI doors look a request's route up


def check_rule(name: str, rule: object) -> KeyRule:
    """``rule`` if it is ``"require"``, ``"accept"`` or ``"ignore"``; else the error naming ``name``."""
    if type(rule) is str and rule in KEY_RULES:
        return cast(KeyRule, rule)
    raise InvalidArgumentError(f"{name} must be 'require', 'accept' or 'ignore', not {describe(rule)}")


def idempotency_key(rule: KeyRule) -> Callable[[Endpoint], Endpoint]:
    """A route's own rule for the ``Idempotency-Key`` header, over the door's ``routes`` and ``required``.

    Marks the endpoint (a function, or the class of a class-based view) and returns
    it unchanged, so it may sit above or below the framework's route decorator.
    Every door reads it: Starlette and FastAPI endpoints, Litestar handlers (or
    their ``opt``: ``@post("/hook", idempotency_key="ignore")``), Django and Flask views.

    Args:
        rule: ``"require"`` (no key: 400, the endpoint does not run), ``"accept"``
            (a key is honoured, no key passes through), or ``"ignore"`` (never
            claimed, key or not: a webhook its sender signs, a health check).

    Returns:
        The decorator.

    Raises:
        InvalidArgumentError: ``rule`` is none of the three.

    Example::

        @app.post("/webhook")
        @idempotency_key("ignore")
        async def webhook(request: Request) -> Response: ...
    """
    checked = check_rule("idempotency_key()", rule)

    def mark(endpoint: Endpoint) -> Endpoint:
        global _marked
        try:
            setattr(endpoint, MARK, checked)
        except AttributeError:
            raise InvalidArgumentTypeError(
                f"idempotency_key() marks a function or a class, not {type(endpoint).__qualname__}"
            ) from None
        _marked = True
        return endpoint

    return mark


def any_marked() -> bool:
    """Whether any endpoint was marked by ``idempotency_key()`` in this process."""
    return _marked


def marked_rule(endpoint: object) -> KeyRule | None:
    """The rule ``idempotency_key()`` put on an endpoint or view (or on a class-based view's class), if any."""
    rule = getattr(endpoint, MARK, None)
    if rule is None:
        rule = getattr(getattr(endpoint, "view_class", None), MARK, None)  # Django's and Flask's as_view()
    return cast(KeyRule, rule) if type(rule) is str and rule in KEY_RULES else None


def key_rule(
    options: Options, request: object, path: str, marked: KeyRule | None, door: str = "http"
) -> KeyRule | Answer:
    """What this request's route does with the key: its own mark, else ``routes``, else ``required``.

    Args:
        options: The door's options.
        request: What a ``routes`` function receives (ASGI scope, WSGI environ, Django or Flask request).
        path: The path a pattern of ``routes`` is matched against (the one in the claim's key).
        marked: The rule found on the request's route (``idempotency_key()``, a Litestar ``opt``), if any.
        door: The door asking (its logger and its advice, should the ``routes`` function fail).

    Returns:
        The rule, or the 500 answering a ``routes`` function that raised or
        returned something else (``routes-failed``, logged once).
    """
    if marked is not None:
        return marked
    routes = options.routes
    if callable(routes):
        try:
            chosen = routes(request)
        except Exception as exc:
            return misconfigured(door, "routes", routes, error=exc)
        if chosen is not None:
            if type(chosen) is not str or chosen not in KEY_RULES:
                return misconfigured(door, "routes", routes, value=chosen)
            return cast(KeyRule, chosen)
    else:
        for pattern, rule in routes:
            if pattern.match(path):
                return rule
    return "require" if options.required else "accept"


def key_of(options: Options, rule: KeyRule, values: list[bytes]) -> str | Answer | None:
    """The request's key under ``rule``: the key, the answer refusing the request, or ``None`` to pass it through."""
    if rule == "ignore":
        return None
    if not values:
        if rule == "require":
            detail = f"this request needs an {options.header} header: a unique key per operation"
            return problem(400, detail, code="key-missing")
        return None
    return parse_key(options.header, values)


# --------------------------------------------------------------------------- a scope or routes function that fails

# Where each door's scope function must sit to see the caller: what ran before it is all it sees.
_PLACEMENT: Final = {
    "asgi": (
        "in Starlette and FastAPI, add the authentication middleware after this one (the last added runs first); "
        "in Litestar, list it before this one"
    ),
    "wsgi": "wrap this middleware inside the authentication middleware: auth(IdempotencyMiddleware(app, ...))",
    "django": "list goblin_claim.django.IdempotencyMiddleware after the authentication middleware in MIDDLEWARE",
    "flask": "register the authentication's before_request before Idempotency(app) or init_app(app)",
}
_logged: set[tuple[str, ...]] = set()
_logged_lock = threading.Lock()
_MAX_LOGGED: Final = 256  # causes remembered per process; past it, new causes are answered but not logged


def misconfigured(
    door: str, option: str, function: object, *, error: Exception | None = None, value: object = None
) -> Answer:
    """The 500 answering a request whose ``scope`` or ``routes`` function raised ``error`` or returned ``value``.

    Nothing ran and nothing was stored. The answer names the cause (the
    exception's type, and for a ``KeyError`` or ``AttributeError`` the missing
    name; or the type returned) and the fix. The server log has one line at
    ERROR with the exception's message and where it was raised, once per
    process for each function and cause, so a misconfigured service does not
    write a line per request.
    """
    name = f"{getattr(function, '__module__', None) or '?'}.{getattr(function, '__qualname__', repr(function))}"
    if error is not None:
        cause, kind = f"raised {_cause(error)}", type(error).__name__
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        told = f"raised {type(error).__name__}: {error}{where}"
    else:
        cause = kind = told = f"returned {type(value).__name__}"
    fix = _fix(door, option, error)
    code = f"{option}-failed"
    with _logged_lock:
        first = (door, option, name, kind) not in _logged and len(_logged) < _MAX_LOGGED
        if first:
            _logged.add((door, option, name, kind))
    if first:
        logging.getLogger(f"goblin_claim.{door}").error(
            "the %s function %s %s: every request it fails on is answered 500 (%s) without running the app, and "
            "this is logged once; %s",
            option, name, told, code, fix,
        )  # fmt: skip
    detail = f"the server's idempotency {option} function {cause}, so the request was not run and nothing was stored"
    return problem(500, f"{detail}; {fix}", code=code)


def _cause(error: Exception) -> str:
    """The exception's type, with the name a KeyError or AttributeError missed (never its whole message)."""
    # The message may hold what the client must not see (a database's address...), but a
    # short identifier that was missing is the misconfiguration itself: scope["user"].
    if isinstance(error, KeyError) and len(error.args) == 1 and _IDENTIFIER.fullmatch(str(error.args[0])):
        return f"KeyError({error.args[0]!r})"
    missing = getattr(error, "name", None)
    if isinstance(error, AttributeError) and isinstance(missing, str) and _IDENTIFIER.fullmatch(missing):
        return f"AttributeError (no attribute {missing!r})"
    return type(error).__name__


_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _fix(door: str, option: str, error: Exception | None) -> str:
    """How to fix a failing ``scope`` or ``routes`` function, in the words of ``door``."""
    if option == "routes":
        return "the routes function must return 'require', 'accept', 'ignore' or None (then required= decides)"
    if error is None:
        return (
            "return the caller's id as a str, int or UUID (user.id, not the user object), or None when there is "
            "no caller (answered 403)"
        )
    if door == "asgi" and (
        (isinstance(error, KeyError) and error.args[:1] == ("user",)) or "AuthenticationMiddleware" in str(error)
    ):
        return f"scope['user'] is set by an authentication middleware, which must run first: {_PLACEMENT[door]}"
    if door == "asgi" and isinstance(error, NotImplementedError):
        return (
            "Starlette's SimpleUser and UnauthenticatedUser have no identity: return user.display_name when "
            "user.is_authenticated (else None), or give your user class an identity property"
        )
    placement = _PLACEMENT.get(door, "run it after the authentication")
    return (
        f"the scope function runs before the app and sees only what ran before it ({placement}); it should return "
        "None for a request without a caller (answered 403)"
    )


# --------------------------------------------------------------------------- the request's side


def parse_key(header: str, values: list[bytes]) -> str | Answer:
    """The key in the header's ``values``, or the 400 that answers them.

    A bare token (Stripe's form) or an RFC 8941 sf-string (the IETF draft's
    ``"..."``), whose parameters (``"k";v=1``) are ignored; a malformed string is
    refused rather than guessed at.
    """
    if len(values) > 1:
        return problem(400, f"send one {header} header, not {len(values)}")
    raw = values[0].strip(b" \t")
    if raw.startswith(b'"'):
        parsed = _sf_string(raw)
        if parsed is None:
            return problem(400, f"the {header} header is not a well-formed structured-field string (RFC 8941)")
        raw = parsed
    if not 0 < len(raw) <= MAX_KEY_LENGTH or not all(0x20 <= byte < 0x7F for byte in raw):
        return problem(400, f"the {header} header must be 1 to {MAX_KEY_LENGTH} printable ASCII characters")
    return raw.decode("ascii")


_BARE_ITEM = (
    rb'(?:"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'  # an sf-string
    rb"|[A-Za-z*][!#$%&'*+\-.^_`|~:/0-9A-Za-z]*"  # a token
    rb"|-?[0-9]{1,15}(?:\.[0-9]{1,3})?|\?[01]|:[A-Za-z0-9+/=]*:)"  # a number, a boolean, a byte sequence
)
_PARAMETERS = re.compile(rb"(?: *; *[a-z*][a-z0-9_\-.*]*(?:=" + _BARE_ITEM + rb")?)* *")


def _sf_string(raw: bytes) -> bytes | None:
    """An RFC 8941 sf-string with optional parameters, unescaped; ``None`` when malformed."""
    out = bytearray()
    index = 1
    while True:
        if index >= len(raw):
            return None  # no closing quote
        byte = raw[index]
        if byte == 0x5C:  # a backslash escapes only DQUOTE and itself
            if index + 1 >= len(raw) or raw[index + 1] not in (0x22, 0x5C):
                return None
            out.append(raw[index + 1])
            index += 2
            continue
        if byte == 0x22:
            break
        if not 0x20 <= byte < 0x7F:
            return None
        out.append(byte)
        index += 1
    # Parameters (RFC 8941 section 3.1.2) are ignored, but they must be parameters.
    return bytes(out) if _PARAMETERS.fullmatch(raw[index + 1 :]) else None


def owner_of(
    options: Options, request: object, door: str = "http", passes: Callable[[Exception], bool] | None = None
) -> str | Answer | None:
    """Whose key this is: the scope function's answer as text, ``None`` (shared space), or the answer refusing it.

    With a scope function, ``None`` or an empty value fails closed (answered 403
    without running the app) unless ``shared_scope`` opts into a shared space: a
    middleware placed before authentication would otherwise hand one user's answer
    to another. A ``str``, an ``int`` (not ``bool``) or a ``UUID`` is accepted. A
    scope function that raises, or returns anything else, is answered 500
    (``scope-failed``, naming the cause and the fix, logged once) without
    running the app, except an exception ``passes`` lets through: the door's
    framework answers its own (Flask's ``abort(401)``, Django's ``PermissionDenied``).
    """
    if options.scope is None:
        return None
    try:
        owner = options.scope(request)
    except Exception as exc:
        if passes is not None and passes(exc):
            raise
        return misconfigured(door, "scope", options.scope, error=exc)
    if owner is None or owner == "":
        return None if options.shared_scope else problem(403, NO_OWNER)
    if type(owner) is str:
        return owner
    if type(owner) is int:
        return f"int:{owner}"  # never the same space as the string "7"
    if isinstance(owner, uuid.UUID):
        return f"uuid:{owner}"
    return misconfigured(door, "scope", options.scope, value=owner)


FINGERPRINTS: Final = ("auto", "bytes", "json", "form", "multipart")
"""The built-in fingerprint strategies (``fingerprint=``); or a function of the request returning str or bytes."""


def request_fingerprint(
    options: Options, request: object, content_type: bytes | None, query: bytes, body: bytes
) -> str:
    """The fingerprint of a request's query string and body, by the configured strategy.

    ``auto`` (the default) picks by content type: JSON bodies are compared as
    canonical JSON (key order and spacing do not matter), form bodies by their
    fields, multipart bodies by each part's name, filename, type and content hash
    (not the boundary, which clients draw anew per request); anything else, or a
    body that does not parse as its type says, byte for byte.
    """
    strategy = options.fingerprint
    if callable(strategy):
        made = strategy(request)
        if not isinstance(made, (str, bytes)):
            raise InvalidArgumentTypeError(f"the fingerprint function must return str or bytes, not {describe(made)}")
        return fingerprint(b"fn", made.encode() if isinstance(made, str) else made)
    mime, _, params = (content_type or b"").partition(b";")
    mime = mime.strip().lower()
    if strategy == "auto":
        if mime == b"application/json" or (mime.startswith(b"application/") and mime.endswith(b"+json")):
            strategy = "json"
        elif mime == b"application/x-www-form-urlencoded":
            strategy = "form"
        elif mime == b"multipart/form-data":
            strategy = "multipart"
        else:
            strategy = "bytes"
    canonical: bytes | None = None
    if strategy == "json":
        canonical = _canonical_json(body)
    elif strategy == "form":
        canonical = _canonical_form(body)
    elif strategy == "multipart":
        canonical = _canonical_multipart(body, params)
    if canonical is None:
        return fingerprint(query, body)
    return fingerprint(query, f"{strategy}:".encode() + canonical)


def _canonical_json(body: bytes) -> bytes | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _canonical_form(body: bytes) -> bytes | None:
    try:
        fields = urllib.parse.parse_qsl(body.decode("latin-1"), keep_blank_values=True, strict_parsing=bool(body))
    except ValueError:
        return None
    # Field order between names does not matter; the order of one name's values does.
    return json.dumps(sorted(fields, key=lambda pair: pair[0])).encode()


def _canonical_multipart(body: bytes, params: bytes) -> bytes | None:
    boundary = None
    for param in params.split(b";"):
        name, _, value = param.strip().partition(b"=")
        if name.lower() == b"boundary":
            boundary = value.strip().strip(b'"')
    if not boundary:
        return None
    delimiter = b"--" + boundary
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        return None  # no closing delimiter: not the multipart body it claims to be
    parts: list[list[str]] = []
    for chunk in chunks[1:-1]:
        head, found, content = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not found:
            return None
        content = content.removesuffix(b"\r\n")
        disposition, kind = b"", b""
        for line in head.split(b"\r\n"):
            header, _, value = line.partition(b":")
            if header.strip().lower() == b"content-disposition":
                disposition = value.strip()
            elif header.strip().lower() == b"content-type":
                kind = value.strip().lower()
        field = _disposition_param(disposition, b"name")
        filename = _disposition_param(disposition, b"filename")
        parts.append([field, filename, kind.decode("latin-1"), hashlib.sha256(content).hexdigest()])
    parts.sort(key=lambda part: part[0])  # by field name, one name's parts kept in order
    return json.dumps(parts).encode()


def _disposition_param(disposition: bytes, wanted: bytes) -> str:
    for param in disposition.split(b";")[1:]:
        name, _, value = param.strip().partition(b"=")
        if name.lower() == wanted:
            return value.strip().strip(b'"').decode("latin-1")
    return ""


def fingerprint(query: bytes, body: bytes) -> str:
    """The request's fingerprint: its query string and body, exactly."""
    # The query string's length first, so no split of query and body collides with another.
    digest = hashlib.sha256(len(query).to_bytes(8, "big"))
    digest.update(query)
    digest.update(body)
    return digest.hexdigest()[:32]


def claim_name(method: str, path: str, owner: str | None, key: str) -> str:
    """The claim's key: method, path, owner and the client's key (one operation per endpoint and owner)."""
    return json.dumps([method, path, owner, key], separators=(",", ":"))


def claim_token(fp: str) -> str:
    """A fresh token carrying the request's fingerprint, so an in-flight duplicate is compared in one reply."""
    return fingerprinted_token(fp)


def in_flight(options: Options, holder: object, fp: str) -> Answer | None:
    """The answer to a duplicate of a request still running, or ``None`` when it should wait for it."""
    if holder_fp(holder) not in (None, fp):
        return problem(422, MISMATCH)
    if options.wait == 0:
        return problem(409, IN_FLIGHT, retry=True)
    return None


def too_large_detail(options: Options, size: int | None) -> str:
    """Why a request body is refused 413."""
    told = f"{size} bytes" if size is not None else "the body"
    return (
        f"{told} is more than the {options.max_body_bytes} bytes this server fingerprints for {options.header} "
        "requests; the request was not run"
    )


def declared_length(value: bytes | str | None) -> int | None:
    """A ``Content-Length`` value as an int, or ``None`` when absent or not a number."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return int(text) if text.isdigit() else None


# --------------------------------------------------------------------------- the response's side


def streamed_reason(options: Options, headers: Iterable[tuple[bytes, bytes]], trailers: bool = False) -> str | None:
    """Why a response cannot be kept, known from its start alone; ``None`` when it may be."""
    if trailers:
        return "it has trailers"
    limit = options.max_response_bytes
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-length" and value.isdigit() and int(value) > limit:
            return f"its Content-Length {int(value)} is larger than max_response_bytes={limit}"
        if lowered == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            if kind in options.stream_types:
                return "it is an event stream" if kind == b"text/event-stream" else f"it is a {kind.decode()} stream"
    return None


CUT_STREAM: Final = "the streamed response was not sent whole (the client left)"


def passed_through(
    chunks: Iterable[bytes | str], keep: AbstractContextManager[object], ended: Callable[[], None],
    cut: Callable[[], None],
) -> Iterator[bytes]:  # fmt: skip
    """A streamed response that is not kept, passed on as the app makes it, its lease kept alive until it ends.

    ``keep`` (the claim's keep-alive, entered) is exited once the last chunk went
    out, or once the stream was cut short (the client left, the app failed
    mid-stream); then ``ended()`` (the key is marked unstored) or ``cut()`` (it is
    kept closed as abandoned) runs. The sync doors' one pass-through (Django
    under WSGI, Flask); ``apassed_through`` is Django's under ASGI.
    """
    whole = False
    try:
        for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else chunk.encode()
        whole = True
    finally:
        keep.__exit__(None, None, None)
        (ended if whole else cut)()


async def apassed_through(
    chunks: AsyncIterable[bytes | str], keep: AbstractAsyncContextManager[object],
    ended: Callable[[], Awaitable[None]], cut: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:  # fmt: skip
    """``passed_through`` for an asyncio door: the lease is renewed until the stream ended or was cut."""
    whole = False
    try:
        async for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else chunk.encode()
        whole = True
    finally:
        await keep.__aexit__(None, None, None)
        await (ended if whole else cut)()
