"""The doors' options: declared once with their defaults (``DoorOptions``), validated into ``Options``."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from .._defaults import (
    HTTP_SERVER_ERRORS,
    HTTP_WAIT,
    LEASE,
    MAX_BODY_BYTES,
    MAX_RESPONSE_BYTES,
    REPLICA_TIMEOUT_MS,
    REPLICAS,
    TTL,
)
from .._errors import InvalidArgumentError, InvalidArgumentTypeError
from .._protocol.checks import check_flags, check_namespace, check_replicas, check_seconds, check_timeout, describe

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
# began executing), so the key is given back instead. A 503 says the server could not
# handle the request (RFC 9110 section 15.6.4): given back even when server_errors="store"
# keeps the other 5xx.
DEFAULT_RELEASE_STATUSES: Final = frozenset({401, 403, 404, 405, 408, 425, 429, 503})
"""Statuses answered but not kept (the key given back, a retry runs); every 5xx too unless ``server_errors="store"``."""
DEFAULT_STREAM_TYPES: Final = (
    "text/event-stream",
    "application/x-ndjson",
    "application/ndjson",
    "application/jsonl",
    "application/json-seq",
    "multipart/x-mixed-replace",
)
"""Content types passed through as they come (never buffered, never kept): duplicates get 422."""
# A larger body or response would not fit in one Redis value (proto-max-bulk-len, 512 MiB).
MAX_BYTES_LIMIT: Final = 256 * 1024 * 1024

ServerErrors = Literal["give back", "store"]
"""What becomes of a 5xx (or an exception the app raised): ``give back`` the key (a retry runs), or ``store`` it."""
SERVER_ERRORS: Final = ("give back", "store")
KeyRule = Literal["require", "accept", "ignore"]
"""What a route does with the key header: ``require`` it (400 without), ``accept`` it, ``ignore`` it (never claimed)."""
KEY_RULES: Final = ("require", "accept", "ignore")
FINGERPRINTS: Final = ("auto", "bytes", "json", "form", "multipart")
"""The built-in fingerprint strategies (``fingerprint=``); or a function of the request returning str or bytes."""


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
    server_errors: ServerErrors
    stream_types: tuple[bytes, ...]
    problem_docs: str | None
    fingerprint: str | Callable[[Any], object]
    namespace: str
    routes: tuple[tuple[re.Pattern[str], KeyRule], ...] | Callable[[Any], object] = ()
    replicas: int = REPLICAS
    replica_timeout_ms: int = REPLICA_TIMEOUT_MS
    fail_open: bool = False
    at_most_once: bool = False
    expose_holder: bool = False

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
    wait: float = HTTP_WAIT
    # Functions of the request, whatever each door's request is (Any: a door's narrower annotation takes these).
    scope: Callable[[Any], Any] | None = None
    shared_scope: bool = False
    max_body_bytes: int = MAX_BODY_BYTES
    max_response_bytes: int = MAX_RESPONSE_BYTES
    replay_headers: Iterable[str] | None = None
    never_replayed: Iterable[str] = DEFAULT_NEVER_REPLAYED
    release_statuses: Iterable[int] = DEFAULT_RELEASE_STATUSES
    # "store": a 5xx outside release_statuses is kept and replayed, as Stripe does (a retry never re-runs it).
    server_errors: ServerErrors = HTTP_SERVER_ERRORS
    stream_types: Iterable[str] = DEFAULT_STREAM_TYPES
    problem_docs: str | None = None
    fingerprint: str | Callable[[Any], Any] = "auto"
    namespace: str = "goblin-http"
    routes: Mapping[str, KeyRule] | Callable[[Any], Any] | None = None
    # The failover recipe's client side: a claim and its stored answer acknowledged by replicas (WAIT).
    replicas: int = REPLICAS
    replica_timeout_ms: int = REPLICA_TIMEOUT_MS
    # Run the app unclaimed when the claim cannot reach the server (at-least-once while it cannot).
    fail_open: bool = False
    # A request that began is never run again, even after its worker was killed: an interrupted key is answered 409.
    at_most_once: bool = False
    # The holder's token in a 409's problem details (in flight, interrupted): off, as a token may name a worker.
    expose_holder: bool = False

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
        check_flags(
            required=self.required, shared_scope=self.shared_scope, fail_open=self.fail_open,
            at_most_once=self.at_most_once, expose_holder=self.expose_holder,
        )  # fmt: skip
        header = self.header
        if type(header) is not str or not header or not header.isascii() or not header.replace("-", "").isalnum():
            raise InvalidArgumentError(
                f"header must be a header name such as 'Idempotency-Key', not {describe(header)}"
            )
        if self.scope is not None and not callable(self.scope):
            raise InvalidArgumentTypeError(
                f"scope must be a function of the request or None, not {describe(self.scope)}"
            )
        replicas, replica_timeout_ms = check_replicas(self.replicas, self.replica_timeout_ms)
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
            server_errors=_check_server_errors(self.server_errors),
            stream_types=_check_stream_types(self.stream_types),
            problem_docs=_check_docs(self.problem_docs),
            fingerprint=_check_fingerprint(self.fingerprint),
            namespace=check_namespace(self.namespace),
            routes=_check_routes(self.routes),
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
            fail_open=self.fail_open,
            at_most_once=self.at_most_once,
            expose_holder=self.expose_holder,
        )


DEFAULTS: Final = DoorOptions()
"""Every door option's default."""
DOOR_OPTIONS: Final = tuple(field.name for field in dataclasses.fields(DoorOptions))
"""The names of the doors' options, in order."""


def make_options(**given: Any) -> Options:
    """Validate the doors' options, given by name over their defaults (every bad one raises a ``GoblinClaimError``)."""
    return DEFAULTS.over(given).checked()


def check_rule(name: str, rule: object) -> KeyRule:
    """``rule`` if it is ``"require"``, ``"accept"`` or ``"ignore"``; else the error naming ``name``."""
    if type(rule) is str and rule in KEY_RULES:
        return cast(KeyRule, rule)
    raise InvalidArgumentError(f"{name} must be 'require', 'accept' or 'ignore', not {describe(rule)}")


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


def _check_server_errors(rule: object) -> ServerErrors:
    if type(rule) is not str:
        raise InvalidArgumentTypeError(f"server_errors must be the str 'give back' or 'store', not {describe(rule)}")
    if rule not in SERVER_ERRORS:
        raise InvalidArgumentError(f"server_errors must be 'give back' or 'store', not {describe(rule)}")
    return cast(ServerErrors, rule)


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
