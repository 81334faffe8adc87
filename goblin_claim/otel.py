"""OpenTelemetry for goblin-claim: spans, a duration histogram, counters and gauges.

Install the extra (``pip install goblin-claim[otel]``: the OpenTelemetry API
only; the application brings the SDK and its exporters), then call
``instrument()`` once at start-up. Until then nothing here runs: the hot paths
test one flag.

What ``instrument()`` turns on:

- An INTERNAL span per operation (``goblin_claim.acquire``, ``goblin_claim.complete``,
  ``goblin_claim.wait``, ``goblin_claim.call`` for a decorated call, ``goblin_claim.renew``
  for a keep-alive renewal, ...), current while the operation runs, so the spans
  of redis-py's own instrumentation (which sees every command: instrumented
  clients go through ``execute_command``) nest under it. Span events: ``lease lost``,
  ``taken over``, ``failed open``, ``script reloaded``, ``native fallback``, ``woken``.
  No ``db.*`` attributes: those belong to the Redis client's instrumentation.
- ``goblin_claim.operation.duration`` (histogram, seconds) with ``goblin_claim.operation``,
  ``goblin_claim.outcome``, ``goblin_claim.path`` (native or script),
  ``goblin_claim.namespace`` and ``error.type``.
- Counters ``goblin_claim.renewals`` (by outcome), ``goblin_claim.script_reloads``,
  ``goblin_claim.native_fallbacks`` and ``goblin_claim.fail_open_runs`` (work run without
  a claim under ``fail_open``, by operation, namespace and ``error.type``); observable
  gauges ``goblin_claim.keep_alives`` (live keep-alives) and ``goblin_claim.waiters``
  (callers in ``wait()``).

Keys, tokens and values are never attributes or span names; ``record_keys=True``
adds the key (``goblin_claim.key``) to spans, never to metrics. An error's
message names its keys, so spans carry only its type, never the message.

Renewals run on the renewer's threads (or a batch task) and report under the
trace context of the call that made the keep-alive, captured when it was made.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("goblin_claim.otel needs the OpenTelemetry API: pip install 'goblin-claim[otel]'") from exc

from . import _events
from ._events import Event

__all__ = ["instrument", "uninstrument"]

_SCOPE: Final = "goblin_claim"
# Constant span names, one per operation: never a key in a name.
_SPAN_NAMES: Final = {operation: f"goblin_claim.{operation}" for operation in _events.OPERATIONS}
_NOTICE_EVENTS: Final = {
    "script_reload": "script reloaded",
    "native_fallback": "native fallback",
    "wake": "woken",
}
# From 100 µs (a loopback round trip) to a minute of waiting.
_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BUCKETS_LONG: Final = (2.5, 5.0, 10.0, 30.0, 60.0)
# A fail-open run is counted by its operation (call or request), namespace and error type.
_FAIL_OPEN_ATTRIBUTES: Final = frozenset({"goblin_claim.operation", "goblin_claim.namespace", "error.type"})


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("goblin-claim")
    except Exception:  # not installed as a distribution (a source tree)
        return "0"


def _error_type(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


class _Bridge:
    """What ``_events`` hands every observed operation to while instrumented."""

    def __init__(self, tracer: trace.Tracer, meter: metrics.Meter, record_keys: bool) -> None:
        self._tracer = tracer
        self._record_keys = record_keys
        self._duration = meter.create_histogram(
            "goblin_claim.operation.duration",
            unit="s",
            description="How long each goblin-claim operation took, by outcome",
            explicit_bucket_boundaries_advisory=_BUCKETS + _BUCKETS_LONG,
        )
        self._renewals = meter.create_counter(
            "goblin_claim.renewals", unit="{renewal}", description="Keep-alive renewals, by outcome"
        )
        self._reloads = meter.create_counter(
            "goblin_claim.script_reloads", unit="{reload}", description="Scripts sent again after NOSCRIPT"
        )
        self._fallbacks = meter.create_counter(
            "goblin_claim.native_fallbacks",
            unit="{fallback}",
            description="Clients that fell back from the native commands to the scripts",
        )
        self._failed_open = meter.create_counter(
            "goblin_claim.fail_open_runs",
            unit="{run}",
            description="Work run without a claim because the server could not be reached (fail_open)",
        )
        meter.create_observable_gauge(
            "goblin_claim.keep_alives",
            callbacks=[self._observe_keepers],
            unit="{keep_alive}",
            description="Keep-alives renewing now",
        )
        meter.create_observable_gauge(
            "goblin_claim.waiters",
            callbacks=[self._observe_waiters],
            unit="{waiter}",
            description="Callers waiting in wait() for another owner's result",
        )

    @staticmethod
    def _observe_keepers(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [metrics.Observation(_events.live_keepers())]

    @staticmethod
    def _observe_waiters(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        return [metrics.Observation(_events.waiters)]

    def _metric_attributes(self, event: Event) -> dict[str, str]:
        attributes = {"goblin_claim.operation": event.operation, "goblin_claim.outcome": event.outcome}
        if event.path is not None:
            attributes["goblin_claim.path"] = event.path
        if event.namespace is not None:
            attributes["goblin_claim.namespace"] = event.namespace
        if event.error is not None:
            attributes["error.type"] = _error_type(event.error)
        return attributes

    def _finish_span(self, span: trace.Span, event: Event, attributes: dict[str, str]) -> None:
        span.set_attributes(attributes)
        if event.fence is not None:
            span.set_attribute("goblin_claim.fence", event.fence)
        if self._record_keys:
            span.set_attribute("goblin_claim.key", event.key)
        if event.outcome == "taken_over":
            span.add_event("taken over")
        elif event.outcome in ("lease_lost", "claim_lost"):
            span.add_event("lease lost")
        elif event.outcome == "failed_open":
            span.add_event("failed open")
        if event.error is not None:
            # The type only: an error's message names the keys.
            span.set_status(Status(StatusCode.ERROR, _error_type(event.error)))

    # -- the calls _events makes

    def begin(self, operation: str) -> tuple[trace.Span, object]:
        """Start ``operation``'s span and make it current."""
        span = self._tracer.start_span(_SPAN_NAMES[operation], kind=SpanKind.INTERNAL)
        return span, context.attach(trace.set_span_in_context(span))

    def end(self, handle: tuple[trace.Span, object], event: Event) -> None:
        """End the span ``begin`` started and record the duration."""
        span, token = handle
        context.detach(token)  # type: ignore[arg-type]  # the token attach() gave
        attributes = self._metric_attributes(event)
        self._finish_span(span, event, attributes)
        span.end()
        if event.duration is not None:
            self._duration.record(event.duration, attributes)
        if event.outcome == "failed_open":
            self._failed_open.add(1, {k: v for k, v in attributes.items() if k in _FAIL_OPEN_ATTRIBUTES})

    def end_batch(self, handle: tuple[trace.Span, object], count: int, error: BaseException | None) -> None:
        """End an ``acquire_many`` span: one span for the batch, one event (and record) per key."""
        span, token = handle
        context.detach(token)  # type: ignore[arg-type]
        span.set_attribute("goblin_claim.operation", "acquire_many")
        span.set_attribute("goblin_claim.batch_size", count)
        if error is not None:
            span.set_attribute("error.type", _error_type(error))
            span.set_status(Status(StatusCode.ERROR, _error_type(error)))
        span.end()

    def record(self, event: Event, owner: object) -> None:
        """An event emitted outside an ``Op``: a renewal (a span under its owner), or a batch's key."""
        attributes = self._metric_attributes(event)
        if event.duration is not None:
            self._duration.record(event.duration, attributes)
        if event.operation != "renew":
            return
        self._renewals.add(1, {"goblin_claim.outcome": event.outcome})
        parent = owner if isinstance(owner, context.Context) else None
        end = time.time_ns()
        start = end - int((event.duration or 0.0) * 1e9)
        span = self._tracer.start_span(_SPAN_NAMES["renew"], context=parent, kind=SpanKind.INTERNAL, start_time=start)
        self._finish_span(span, event, attributes)
        span.end(end_time=end)
        if event.outcome == "lease_lost" and parent is not None:
            # The owning call learns it on its own span too, while it is still running.
            owning = trace.get_current_span(parent)
            if owning.is_recording():
                owning.add_event("lease lost")

    def notice(self, event: Event) -> None:
        """A script reload, a native fallback or a wake-up: a counter and an event on the current span."""
        if event.operation == "script_reload":
            self._reloads.add(1)
        elif event.operation == "native_fallback":
            self._fallbacks.add(1)
        span = trace.get_current_span()
        if span.is_recording():
            attributes = {"goblin_claim.wake": event.outcome} if event.operation == "wake" else {}
            span.add_event(_NOTICE_EVENTS[event.operation], attributes)

    def capture(self) -> object:
        """The current context: a keep-alive's owner, for its renewals' spans."""
        return context.get_current()


def instrument(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    *,
    record_keys: bool = False,
) -> None:
    """Turn on goblin-claim's spans and metrics (see the module docstring).

    Args:
        tracer_provider: Where spans go; ``None`` uses the global provider.
        meter_provider: Where metrics go; ``None`` uses the global provider.
        record_keys: Add each operation's key to its span as ``goblin_claim.key``
            (keys can carry user data; off by default). Never on metrics.

    Calling it again replaces the providers. Example::

        goblin_claim.otel.instrument()
    """
    tracer = trace.get_tracer(_SCOPE, _version(), tracer_provider=tracer_provider)
    meter = metrics.get_meter(_SCOPE, _version(), meter_provider=meter_provider)
    _events.set_bridge(_Bridge(tracer, meter, record_keys))


def uninstrument() -> None:
    """Turn goblin-claim's spans and metrics off again; the hot paths test one flag once more."""
    _events.set_bridge(None)
