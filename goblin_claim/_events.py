"""Events: every public operation ends in one, for listeners, logs and OpenTelemetry.

One mechanism sees every operation: the ``Claim`` driver's public methods carry
``observe`` (their asyncio twins are generated from them), the decorator's flow
opens an ``Op`` for each call, the keep-alive reports renewals and lost leases,
and the waiter reports how it was woken. Each of them costs one flag test while
nothing listens: ``enabled`` is true only while a listener is registered or
``goblin_claim.otel.instrument()`` is on, and the clock is read only then. A
DEBUG level on an operation's logger turns the same path on for logging.

An event's ``outcome`` is one of ``OUTCOMES`` for an operation (``OPERATIONS``);
``NOTICES`` are events about something that happened inside one (a script
reloaded after NOSCRIPT, a fallback from the native commands, a waiter woken).

Logs name a key only by ``key_digest(key)`` (a correlation id, not a secret:
low-entropy keys can be guessed back from it); ``GOBLIN_CLAIM_LOG_KEYS=1`` in
the environment logs keys verbatim. Tokens, fingerprints, argument values and
results are never logged. The library adds no handlers.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, Final, NamedTuple, TypeVar

from ._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    InterruptedWorkError,
    InvalidArgumentTypeError,
    NotReplicatedError,
    PayloadMismatchError,
    ReplayedError,
    ResultLostError,
    ResultNotSerializableError,
    StillInFlightError,
)
from ._outcomes import Claimed, Completed, InFlight
from ._protocol.scripts import DELEX, DELIFEQ, NATIVE_COMMANDS, SET_IFEQ, SET_NX_GET

__all__ = [
    "NOTICES",
    "OPERATIONS",
    "OUTCOMES",
    "Event",
    "Op",
    "add_listener",
    "key_digest",
    "observe",
    "remove_listener",
]

OPERATIONS: Final = frozenset(
    {
        "acquire",
        "acquire_many",
        "complete",
        "extend",
        "release",
        "forget",
        "wait",
        "renew",
        "call",
        "request",
        "checkpoint",
    }
)
OUTCOMES: Final = frozenset(
    {
        "claimed",  # this caller owns the work (for extend and renew: still owns it)
        "completed",  # a replay of stored work (for complete: stored)
        "in_flight",
        "waited_completed",
        "taken_over",
        "wait_timeout",
        "lease_lost",
        "claim_lost",
        "result_lost",
        "payload_mismatch",
        "failed_open",  # the server could not be reached, and fail_open ran the work without a claim
        "unstorable",
        "released",
        "not_held",
        "forgotten",
        "not_replicated",
        "unavailable",
        "interrupted",  # at_most_once: an earlier attempt ended without a result, nothing runs it again
        "checkpointed",  # checkpoint(): the progress is stored
        "error",  # anything else: the event's error says what
    }
)
# operation -> its outcomes
NOTICES: Final = {
    "script_reload": frozenset({"reloaded"}),
    # owner_check: the server's own command (DELIFEQ, SET IFEQ, SET NX GET) refused, by an ACL or a server without it
    "native_fallback": frozenset({"fell_back", "owner_check"}),
    "wake": frozenset({"push", "poll"}),
}

# Whether anyone observes: a listener, or the OpenTelemetry bridge. Read on every operation.
enabled = False
_listeners: tuple[Callable[[Event], object], ...] = ()
# The OpenTelemetry bridge goblin_claim.otel.instrument() installs (see _Bridge there).
_otel: Any = None
# Waiters in wait() while observed, and the keep-alives made while observed, for the gauges.
waiters = 0
_waiters_lock = threading.Lock()
_keepers: weakref.WeakSet[Any] = weakref.WeakSet()
# The request (a middleware's Op) the current task or thread works for: its claim
# operations tell it their outcome, so the middleware needs one line, not one per step.
_REQUEST: ContextVar[Op | None] = ContextVar("goblin_claim_request", default=None)

LOG_KEYS: Final = os.environ.get("GOBLIN_CLAIM_LOG_KEYS", "") == "1"

_CLAIM_LOG = logging.getLogger("goblin_claim.claim")
CALL_LOG: Final = logging.getLogger("goblin_claim.idempotent")
_RENEW_LOG = logging.getLogger("goblin_claim.keepalive")
_SERVER_LOG = logging.getLogger("goblin_claim.server")
_WAKE_LOG = logging.getLogger("goblin_claim.wakeup")
_EVENTS_LOG = logging.getLogger("goblin_claim.events")
REQUEST_LOG: Final = logging.getLogger("goblin_claim.asgi")  # a request whose claim names no door's logger
_LOGS = {"call": CALL_LOG, "renew": _RENEW_LOG, "request": REQUEST_LOG}
_DEBUG: Final = logging.DEBUG

# Outcomes an operator must act on: logged at WARNING whether or not anything observes.
_WARN = {
    "lease_lost": "lease lost: another caller may run the work too",
    "taken_over": "took over a claim whose lease lapsed: its owner stalled or died",
    "claim_lost": "claim lost before the work was stored: another caller may have run it",
    "result_lost": "the work is completed but its result is gone (evicted?)",
    "unstorable": "the result cannot be stored: duplicates get an error, nothing runs again",
    "interrupted": "an at-most-once attempt ended without a result: nothing runs it again until it is forgotten",
}


class Event(NamedTuple):
    """What one operation came to.

    Attributes:
        operation: One of ``OPERATIONS`` (or of ``NOTICES``).
        outcome: One of ``OUTCOMES`` (or the notice's own).
        namespace: The key's namespace; ``None`` for handles made with ``from_keys``.
        key: The handle's key, verbatim (listeners are the application's own code).
        path: How the server was asked: ``"command"`` (its own commands: ``SET ... NX GET``,
            ``SET ... IFEQ``, ``DELIFEQ``, ``DELEX``), ``"native"`` (the module's
            ``GOBLIN.CLAIM`` / ``GOBLIN.CAD``) or ``"script"`` (Lua); ``None`` when unknown.
        duration: Seconds the operation took; ``None`` for notices.
        fence: With ``fencing=True``, the fence of a claim taken.
        error: The exception the operation raised, or ``None``; for ``failed_open``, the
            one that made it fail open (the work's own error goes to its caller).
    """

    operation: str
    outcome: str
    namespace: str | None
    key: str
    path: str | None
    duration: float | None
    fence: int | None
    error: BaseException | None


def add_listener(fn: Callable[[Event], object]) -> None:
    """Call ``fn(event)`` at the end of every operation, on the thread (or task) that ends it.

    ``fn`` must be synchronous and quick: renewals report from the renewer's own
    threads. A listener that raises is logged (``goblin_claim.events``), never
    propagated. Adding one listener twice keeps one.

    Example::

        goblin_claim.add_listener(lambda event: counts.update([event.outcome]))
    """
    global _listeners
    if not callable(fn):
        raise InvalidArgumentTypeError(f"a listener must be callable, not {type(fn).__name__}")
    if fn not in _listeners:
        _listeners = (*_listeners, fn)
    _refresh()


def remove_listener(fn: Callable[[Event], object]) -> None:
    """Stop calling ``fn``; harmless when it is not a listener."""
    global _listeners
    _listeners = tuple(listener for listener in _listeners if listener != fn)
    _refresh()


def set_bridge(bridge: object) -> None:
    """Install (or, with ``None``, remove) the OpenTelemetry bridge."""
    global _otel
    _otel = bridge
    _refresh()


def _refresh() -> None:
    global enabled
    enabled = bool(_listeners) or _otel is not None


def active(log: logging.Logger) -> bool:
    """Whether an operation logging to ``log`` is observed (listeners, OpenTelemetry or DEBUG logs)."""
    return enabled or log.isEnabledFor(_DEBUG)


def key_digest(key: str) -> str:
    """A short digest of ``key`` for logs: the same key always gives the same digest."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def namespace_of(claim: Any) -> str | None:
    """The namespace of a handle's keys (``<ns>:{<key>}:claim``); ``None`` for exact keys."""
    namespace, tagged, _ = claim.claim_key.partition(":{")
    return namespace if tagged else None


# The outcome an error comes to, the first class it is an instance of deciding.
_ERROR_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (StillInFlightError, "wait_timeout"),
    (InterruptedWorkError, "interrupted"),
    (ResultLostError, "result_lost"),
    (PayloadMismatchError, "payload_mismatch"),
    (ResultNotSerializableError, "unstorable"),
    (ClaimLostError, "claim_lost"),
    (NotReplicatedError, "not_replicated"),
    (ConnectionFailedError, "unavailable"),
    (ReplayedError, "completed"),  # a replay of the stored error
)


def outcome_of_error(exc: BaseException) -> str:
    """The outcome an operation that raised ``exc`` came to."""
    for kind, outcome in _ERROR_OUTCOMES:
        if isinstance(exc, kind):
            return outcome
    return "error"


def _fields(event: Event) -> dict[str, object]:
    """A log record's structured fields (``extra``): no token, value or argument, the key as a digest."""
    fields: dict[str, object] = {
        "operation": event.operation,
        "outcome": event.outcome,
        "namespace": event.namespace,
        "key_digest": key_digest(event.key),
        "path": event.path,
        "duration": event.duration,
        "fence": event.fence,
        "error_type": None if event.error is None else type(event.error).__name__,
    }
    if LOG_KEYS:
        fields["key"] = event.key
    return fields


def _named(event: Event) -> str:
    return event.key if LOG_KEYS else key_digest(event.key)


def _log(log: logging.Logger, event: Event) -> None:
    """DEBUG for every operation; WARNING for what an operator must act on."""
    warning = _WARN.get(event.outcome)
    if warning is not None:
        log.warning("%s %s: %s", event.operation, _named(event), warning, extra=_fields(event))
    elif log.isEnabledFor(_DEBUG):
        log.debug("%s %s: %s", event.operation, _named(event), event.outcome, extra=_fields(event))


def _dispatch(event: Event) -> None:
    for listener in _listeners:
        try:
            listener(event)
        except Exception:  # a listener's failure is never the caller's
            _EVENTS_LOG.exception("listener %r raised on a %s event", listener, event.operation)


def emit(log: logging.Logger, event: Event, context: object = None) -> None:
    """Log ``event`` and hand it to the bridge and the listeners."""
    _log(log, event)
    bridge = _otel
    if bridge is not None:
        bridge.record(event, context)
    _dispatch(event)


class Op:
    """One operation in progress, made only while it is observed; ``with`` ends it.

    The bridge's span (if any) is the current one while the operation runs, so
    redis-py's own instrumentation nests its command spans under it.
    """

    __slots__ = (
        "_handle", "_log", "_of_claim", "_seen", "_token", "claim", "error", "fence", "final", "operation", "outcome",
        "started",
    )  # fmt: skip

    def __init__(self, operation: str, claim: Any, of_claim: bool = True) -> None:
        self.operation = operation
        self.claim = claim
        # The path reported is the one the driver recorded (``Script.went``): the claim's, or the operation's own.
        self._of_claim = of_claim
        if of_claim:
            claim._claim_path = None
        else:
            claim._path = None
        self.outcome: str | None = None
        self.final = False  # the outcome stands even if the operation raises (the function's own error)
        self.fence: int | None = None
        self.error: BaseException | None = None
        self._log = _log_of(operation, claim)
        self._seen: str | None = None  # for a request: the last outcome of a claim operation inside it
        self._token = _REQUEST.set(self) if operation == "request" else None
        if operation == "wait":
            global waiters
            with _waiters_lock:
                waiters += 1
        bridge = _otel
        self._handle = None if bridge is None else bridge.begin(operation)
        self.started = time.perf_counter()

    def __enter__(self) -> Op:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            if self.error is None:  # a failed_open call keeps the error that made it fail open
                self.error = exc
            if not self.final and not (self.outcome == "in_flight" and isinstance(exc, StillInFlightError)):
                self.outcome = outcome_of_error(exc)  # (in flight and told so at once: in_flight it stays)
        self.end()

    def note(self, value: object, *, waited: bool = False) -> None:
        """Set the outcome from what a step returned: an outcome value, or a str outcome."""
        if isinstance(value, Claimed):
            self.outcome = "taken_over" if waited else "claimed"
            self.fence = value.fence
        elif isinstance(value, Completed):
            self.outcome = "waited_completed" if waited else "completed"
        elif isinstance(value, InFlight):
            self.outcome = "in_flight"
        elif isinstance(value, str):
            self.outcome = value

    def settle(self, outcome: str) -> None:
        """Fix the outcome, whatever is raised next (the decorated function's own error)."""
        self.outcome = outcome
        self.final = True

    def end(self) -> None:
        """Emit the event (once)."""
        duration = time.perf_counter() - self.started
        if self.operation == "wait":
            global waiters
            with _waiters_lock:
                waiters -= 1
        if self._token is not None:
            _REQUEST.reset(self._token)
        elif self.operation in ("acquire", "wait"):
            request = _REQUEST.get()
            if request is not None and self.outcome is not None:
                request._seen = self.outcome
        claim = self.claim
        event = Event(
            self.operation,
            self.outcome or self._seen or "error",
            namespace_of(claim),
            claim.key,
            claim._claim_path if self._of_claim else claim._path,
            duration,
            self.fence,
            self.error,
        )
        bridge = _otel
        if bridge is not None and self._handle is not None:
            bridge.end(self._handle, event)
        _log(self._log, event)
        _dispatch(event)


class _NoOp:
    """What ``observing`` gives while nothing observes: every step does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoOp:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        return None

    def __bool__(self) -> bool:
        return False

    def note(self, value: object, *, waited: bool = False) -> None:
        """Nothing observes."""

    def settle(self, outcome: str) -> None:
        """Nothing observes."""


_NOTHING: Final = _NoOp()


def current_request() -> Op | None:
    """The observed request (a door's ``"request"`` operation) the current task or thread works for, if any."""
    return _REQUEST.get()


def failed_open(log: logging.Logger, operation: str, claim: Any, error: BaseException, op: Op | None) -> None:
    """The claim's round trip could not reach the server, and ``fail_open`` runs the work without a claim.

    A WARNING on ``log`` whether or not anything observes; ``op`` (the observed
    call or request, if any) comes to ``failed_open`` with ``error``, whatever the
    work does next, for the listeners and OpenTelemetry.
    """
    event = Event(operation, "failed_open", namespace_of(claim), claim.key, None, None, None, error)
    log.warning(
        "%s %s: no claim could be made, the server is out of reach (%s): fail_open runs the work without one, "
        "so it may run more than once",
        operation, _named(event), type(error).__name__, extra=_fields(event),
    )  # fmt: skip
    if op is not None:
        op.settle("failed_open")
        op.error = error


def observing(operation: str, claim: Any) -> Op | _NoOp:
    """A context for an operation outside the driver (the ASGI middleware's ``"request"``).

    A request's outcome is the last outcome of the claim's ``acquire()`` or
    ``wait()`` inside it (claimed, completed, in_flight, waited_completed,
    taken_over, wait_timeout, result_lost...), unless ``op.note`` says otherwise
    (``op.note("payload_mismatch")``) or the block raises.

    Example::

        with _events.observing("request", claim) as op:
            answer = await open_claim(options, claim, fp)
    """
    if active(_log_of(operation, claim)):
        return Op(operation, claim)
    return _NOTHING


def _log_of(operation: str, claim: Any) -> logging.Logger:
    """The logger ``operation`` reports on: a request's is its door's (a door's claim carries it as ``log``)."""
    if operation == "request":
        log: logging.Logger = getattr(claim, "log", REQUEST_LOG)
        return log
    return _LOGS.get(operation, _CLAIM_LOG)


# The server's own commands the probe may find (PEXPIRETIME, a marker, left out).
_OWN_COMMANDS: Final = (SET_NX_GET, SET_IFEQ, DELIFEQ, DELEX)
# The driver operations whose event reports the claim's path; the others report their own call's.
_OF_CLAIM: Final = frozenset({"acquire", "wait"})
_RESULTS: dict[str, Callable[[object], str | None]] = {
    "complete": lambda _: "completed",
    "extend": lambda _: "claimed",
    "release": lambda released: "released" if released else "not_held",
    "forget": lambda forgot: "forgotten" if forgot else "not_held",
    "checkpoint": lambda _: "checkpointed",
}

F = TypeVar("F", bound=Callable[..., Any])


def quiet_failure(operation: str, claim: Any, exc: GoblinClaimError) -> None:
    """An unobserved operation failed: only what an operator must act on is logged."""
    outcome = outcome_of_error(exc)
    if outcome in _WARN:
        event = Event(operation, outcome, namespace_of(claim), claim.key, None, None, None, exc)
        _log(_log_of(operation, claim), event)


def _quiet_takeover(claim: Any, outcome: Claimed) -> None:
    event = Event("wait", "taken_over", namespace_of(claim), claim.key, None, None, outcome.fence, None)
    _log(_CLAIM_LOG, event)


def _finish(op: Op, result: object) -> object:
    if op.operation in _RESULTS:
        op.note(_RESULTS[op.operation](result))
    else:
        op.note(result, waited=op.operation == "wait")
    return result


def observe(operation: str) -> Callable[[F], F]:
    """Make a driver method end in one event; unobserved, it costs one flag test and a call.

    Works on ``def`` and ``async def`` alike, so ``_drivers/sync.py`` and its generated
    twin carry the same line.
    """
    of_claim = operation in _OF_CLAIM
    takeover = operation == "wait"

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not enabled and not _CLAIM_LOG.isEnabledFor(_DEBUG):
                    try:
                        result = await fn(self, *args, **kwargs)
                    except GoblinClaimError as exc:
                        quiet_failure(operation, self, exc)
                        raise
                    if takeover and type(result) is Claimed:
                        _quiet_takeover(self, result)
                    return result
                with Op(operation, self, of_claim) as op:
                    return _finish(op, await fn(self, *args, **kwargs))

            return run_async  # type: ignore[return-value]  # the same signature, by wraps

        @functools.wraps(fn)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not enabled and not _CLAIM_LOG.isEnabledFor(_DEBUG):
                try:
                    result = fn(self, *args, **kwargs)
                except GoblinClaimError as exc:
                    quiet_failure(operation, self, exc)
                    raise
                if takeover and type(result) is Claimed:
                    _quiet_takeover(self, result)
                return result
            with Op(operation, self, of_claim) as op:
                return _finish(op, fn(self, *args, **kwargs))

        return run  # type: ignore[return-value]  # the same signature, by wraps

    return decorate


def observe_batch(fn: F) -> F:
    """``observe`` for ``acquire_many`` (a classmethod's function): one event per key, one span."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(cls: Any, client: Any, keys: Iterable[str], **options: Any) -> Any:
            if not enabled and not _CLAIM_LOG.isEnabledFor(_DEBUG):
                return await fn(cls, client, keys, **options)
            keys = list(keys)
            bridge = _otel
            handle = None if bridge is None else bridge.begin("acquire_many")
            started = time.perf_counter()
            try:
                result = await fn(cls, client, keys, **options)
            except BaseException as exc:
                _end_batch(bridge, handle, cls, client, keys, options, exc, started)
                raise
            _end_batch(bridge, handle, cls, client, keys, options, result, started)
            return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(cls: Any, client: Any, keys: Iterable[str], **options: Any) -> Any:
        if not enabled and not _CLAIM_LOG.isEnabledFor(_DEBUG):
            return fn(cls, client, keys, **options)
        keys = list(keys)
        bridge = _otel
        handle = None if bridge is None else bridge.begin("acquire_many")
        started = time.perf_counter()
        try:
            result = fn(cls, client, keys, **options)
        except BaseException as exc:
            _end_batch(bridge, handle, cls, client, keys, options, exc, started)
            raise
        _end_batch(bridge, handle, cls, client, keys, options, result, started)
        return result

    return run  # type: ignore[return-value]


_BATCH_OUTCOMES: Final[dict[type, str]] = {Claimed: "claimed", Completed: "completed", InFlight: "in_flight"}


def _end_batch(
    bridge: Any, handle: Any, cls: Any, client: Any, keys: list[str], options: dict[str, Any], result: object,
    started: float,
) -> None:  # fmt: skip
    if bridge is not None and handle is not None:
        bridge.end_batch(handle, len(keys), result if isinstance(result, BaseException) else None)
    if isinstance(result, BaseException):
        try:
            pairs: list[tuple[Any, object]] = [(cls(client, key, **options), result) for key in keys]
        except Exception:
            return  # bad options: the error itself says so, there is no claim to report on
    else:
        pairs = result  # type: ignore[assignment]
    duration = time.perf_counter() - started
    for claim, outcome in pairs:
        if isinstance(outcome, BaseException):
            name, fence, error = outcome_of_error(outcome), None, outcome
        else:
            name = _BATCH_OUTCOMES.get(type(outcome), "error")
            fence = outcome.fence if isinstance(outcome, Claimed) else None
            error = None
        event = Event(
            "acquire_many", name, namespace_of(claim), claim.key, claim._claim_path,
            duration, fence, error,
        )  # fmt: skip
        emit(_CLAIM_LOG, event)


# -- what the keep-alive, the waiter and the server state report


def owner() -> object:
    """The owning call's trace context, captured when a keep-alive is made (only while observed)."""
    bridge = _otel
    return None if bridge is None else bridge.capture()


def track(keeper: object) -> None:
    """Count ``keeper`` in the live keep-alives gauge while it renews."""
    _keepers.add(keeper)


def live_keepers() -> int:
    """Keep-alives made while observed that still renew."""
    return sum(1 for keeper in list(_keepers) if not keeper._stopped)


def renewal(
    claim: Any, outcome: str, duration: float | None, context: object, error: BaseException | None, path: str | None
) -> None:
    """A keep-alive renewal's event: ``claimed`` (renewed), ``lease_lost`` or ``unavailable`` (retried).

    ``path`` is the one the keep-alive's last renewal took (``None`` before any).
    A lost lease and a failing renewal are logged at WARNING whether or not anything observes.
    """
    event = Event("renew", outcome, namespace_of(claim), claim.key, path, duration, None, error)
    if outcome == "unavailable":
        _RENEW_LOG.warning(
            "renew %s: renewal failing (%s), retried while the lease lasts",
            _named(event),
            "no reply in time" if error is None else type(error).__name__,
            extra=_fields(event),
        )
        if enabled:
            bridge = _otel
            if bridge is not None:
                bridge.record(event, context)
            _dispatch(event)
        return
    if outcome == "lease_lost" or enabled or _RENEW_LOG.isEnabledFor(_DEBUG):
        emit(_RENEW_LOG, event, context)


def notice(claim: Any, operation: str, outcome: str) -> None:
    """Something that happened inside an operation: a script reload, a native fallback, a wake-up."""
    event = Event(operation, outcome, namespace_of(claim), claim.key, None, None, None, None)
    if operation == "native_fallback" and outcome == "owner_check":
        # Expected with an ACL that names its commands without DELIFEQ: nothing to warn about.
        _SERVER_LOG.info(
            "%s: the server or this user's ACL refuses its built-in owner check; the script from now on",
            _named(event),
            extra=_fields(event),
        )
    elif operation == "native_fallback":
        _SERVER_LOG.warning(
            "%s: a server lacks the native commands after all; Lua scripts from now on",
            _named(event),
            extra=_fields(event),
        )
    elif operation == "script_reload":
        _SERVER_LOG.info("%s: the server lost its scripts (restart, SCRIPT FLUSH): sent again", _named(event))
    elif _WAKE_LOG.isEnabledFor(_DEBUG):
        _WAKE_LOG.debug("wait %s: woken by %s", _named(event), outcome, extra=_fields(event))
    if enabled:
        bridge = _otel
        if bridge is not None:
            bridge.notice(event)
        _dispatch(event)


def probed(client: object, native: frozenset[str] | None, direct: bool) -> None:
    """INFO, once per client: what the probe found (the module's commands, the server's own)."""
    found = native or frozenset()
    module = sorted(found & set(NATIVE_COMMANDS))
    own = sorted(found & set(_OWN_COMMANDS))
    _SERVER_LOG.info(
        "%s: %s; %s; commands go %s",
        type(client).__name__,
        f"native {', '.join(module)}" if module else "no native commands",
        f"its own {', '.join(own)}, else Lua scripts" if own else "Lua scripts",
        "straight through the pool" if direct else "through execute_command",
        extra={"native": module, "commands": own, "direct": direct},
    )


def wakeups_found(client: object, push: bool, why: str = "") -> None:
    """INFO, once per subscriber: whether waiters are woken by push or only poll."""
    if push:
        _WAKE_LOG.info("%s: waiters are woken by pub/sub", type(client).__name__, extra={"wakeup": "push"})
    else:
        _WAKE_LOG.info(
            "%s: waiters poll (%s)", type(client).__name__, why or "pub/sub unavailable", extra={"wakeup": "poll"}
        )
