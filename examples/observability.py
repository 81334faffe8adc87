"""Seeing what happens: the logs, events, spans and metrics an operator gets from goblin-claim.

A payment handler runs once per order; retries replay its result; one worker
"crashes" holding a claim, and a waiter takes the work over; an evicted result
is found. Each step shows up in:

- the standard ``logging`` lines (WARNING for what needs an operator, DEBUG per
  operation), with structured fields and keys only as digests;
- a listener's counts (``goblin_claim.add_listener``);
- OpenTelemetry spans and the duration histogram (``goblin_claim.otel.instrument``),
  read back here through the SDK's in-memory exporters.

Runs on an embedded fakeredis, or on the server in REDIS_URL:

    python examples/observability.py
    REDIS_URL=redis://localhost:6379/0 python examples/observability.py
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter

import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import goblin_claim
import goblin_claim.otel
from goblin_claim import Claim, ResultLostError, idempotent


def connect() -> redis.Redis:
    url = os.environ.get("REDIS_URL")
    if url:
        print(f"Using the Redis server at {url}")
        return redis.Redis.from_url(url)
    from goblin_claim.testing import fake_redis

    print("Using an embedded fakeredis (set REDIS_URL to use a real server)")
    return fake_redis(native=False)


class Fields(logging.Formatter):
    """A log format that shows the structured fields goblin-claim puts in ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        names = ("outcome", "namespace", "key_digest", "path", "native", "wakeup")
        shown = " ".join(f"{name}={getattr(record, name)}" for name in names if getattr(record, name, None) is not None)
        return f"  log {record.levelname:<7} {record.name:<24} {record.getMessage()}  [{shown}]"


def main() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(Fields())
    logging.getLogger("goblin_claim").addHandler(handler)  # the application's choice: the library adds none
    logging.getLogger("goblin_claim").setLevel(logging.INFO)

    counts: Counter[tuple[str, str]] = Counter()
    goblin_claim.add_listener(lambda event: counts.update([(event.operation, event.outcome)]))

    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    goblin_claim.otel.instrument(tracer_provider, MeterProvider(metric_readers=[metrics]))

    client = connect()
    run = f"{os.getpid()}-{time.time_ns()}"
    charged: Counter[str] = Counter()

    @idempotent(client, key="order", namespace="shop.charge", lease=2)
    def charge(order: str, amount: int) -> str:
        charged[order] += 1
        time.sleep(0.3)
        return f"receipt-{order}"

    print("\n== an order is charged, a retry replays it, a concurrent retry waits for it")
    order = f"ord-{run}"
    late = threading.Thread(target=charge, args=(order, 100))
    late.start()
    time.sleep(0.05)
    charge(order, 100)
    late.join()
    charge(order, 100)
    print(f"charged {order}: {charged[order]} time(s)")

    print("\n== a worker crashes holding a claim; the next caller takes the work over after the lease")
    crashed = f"ord-crashed-{run}"
    Claim(client, crashed, namespace="shop.charge", lease=1).acquire()  # and never completes
    print(f"took over: {type(Claim(client, crashed, namespace='shop.charge').wait(timeout=10)).__name__}")

    print("\n== a stored result is evicted while its claim says done")
    # A handle's one key holds its claim and its result together: evicted, the work is
    # simply free again. Exact keys (from_keys, shared with raw writers) keep two keys,
    # and the result alone can go.
    claim_key, result_key = f"shop.charge:{{ord-evicted-{run}}}:claim", f"shop.charge:{{ord-evicted-{run}}}:result"
    evicted = Claim.from_keys(client, claim_key, result_key)
    evicted.acquire()
    evicted.complete(b"receipt")
    client.delete(result_key)
    try:
        Claim.from_keys(client, claim_key, result_key).acquire()
    except ResultLostError as exc:
        print(f"the caller gets {type(exc).__name__}")

    print("\n== what the listener counted (operation, outcome)")
    for (operation, outcome), n in sorted(counts.items()):
        print(f"  {operation:<10} {outcome:<18} {n}")

    print("\n== spans (constant names, no keys)")
    for span in spans.get_finished_spans():
        attrs = span.attributes or {}
        events = ", ".join(e.name for e in span.events)
        print(
            f"  {span.name:<24} outcome={attrs.get('goblin_claim.outcome')}" + (f"  events: {events}" if events else "")
        )

    print("\n== goblin_claim.operation.duration (count by operation and outcome)")
    data = metrics.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "goblin_claim.operation.duration":
                    for point in metric.data.data_points:
                        a = point.attributes
                        print(f"  {a['goblin_claim.operation']:<10} {a['goblin_claim.outcome']:<18} {point.count}")
    goblin_claim.otel.uninstrument()
    print("\ndone")


if __name__ == "__main__":
    main()
