"""The observability tests' telemetry: goblin-claim instrumented into in-memory OpenTelemetry providers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import goblin_claim
import goblin_claim.otel
from goblin_claim._events import Event


@dataclass
class Telemetry:
    """The in-memory exporters an instrumented test reads back."""

    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans (named ``name``), in end order."""
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` collected now."""
        data = self.metrics.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found += list(item.data.data_points)
        return found


def start_telemetry(record_keys: bool = False) -> tuple[Telemetry, MeterProvider]:
    """goblin-claim instrumented into fresh in-memory providers: what they record, and the meter provider."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    goblin_claim.otel.instrument(tracer_provider, meter_provider, record_keys=record_keys)
    return Telemetry(exporter, reader, tracer_provider), meter_provider


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    """goblin-claim instrumented into fresh SDK providers for one test."""
    telemetry, meter_provider = start_telemetry()
    yield telemetry
    goblin_claim.otel.uninstrument()
    telemetry.tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event emitted while the test runs (a list's append is atomic across the renewer's threads)."""
    seen: list[Event] = []
    goblin_claim.add_listener(seen.append)
    yield seen
    goblin_claim.remove_listener(seen.append)
