"""What checking "what ran is what replays" all the way down costs, side by side in one run.

Two sides, the same code but for one step: "walk" is the shipped check (both values
walked together, exact types and values all the way down); "==" judges the same
round trip as before it, by one ``type(back) is type(value) and back == value``.

- codec: ``Codec.encode_result`` for several result shapes (no Redis);
- decorator: first calls of a sync ``@idempotent`` function returning a small dict,
  on one connection to a redis-server (two round trips each: claim and complete).

Rounds interleave the sides (alternating which goes first); the script prints each
side's median and the median of the per-round ratios. Machines here are noisy: read
the ratios. Uses the server in REDIS_URL, else starts a redis-server on a free port.

    python benchmarks/replay_check.py [--rounds 9] [--calls 1000]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pydantic
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from goblin_claim import idempotent
from goblin_claim._decorator import codec as _envelope

_ids = itertools.count()


class Receipt(pydantic.BaseModel):
    """A typical model result."""

    txn: str
    amount: Decimal
    at: datetime.datetime
    lines: list[dict[str, float]]


NOW = datetime.datetime(2026, 11, 29, 12, 30, tzinfo=datetime.timezone.utc)
SHAPES: list[tuple[str, Any, Any]] = [
    ("unannotated small dict", Any, {"order": "o-1", "amount": 5, "ok": True}),
    ("dict[str, Any] small", dict[str, Any], {"order": "o-1", "amount": 5, "ok": True}),
    ("model with nested lines", Receipt, Receipt(txn="t", amount=Decimal("9.5"), at=NOW, lines=[{"a": 1.5}] * 5)),
    ("dict[str, float] x10", dict[str, float], {f"k{i}": i + 0.5 for i in range(10)}),
    ("list[int] x1000", list[int], list(range(1000))),
    ("list[float] x1000", list[float], [i + 0.5 for i in range(1000)]),
    (
        "list[dict[str, Any]] x100",
        list[dict[str, Any]],
        [{"id": i, "name": f"n{i}", "tags": ["a"]} for i in range(100)],
    ),
]


def equal_only(back: Any, value: Any) -> str | None:
    """The judgment before the walk: the same type on top, and ``==``."""
    return None if type(back) is type(value) and back == value else "differs"


@contextmanager
def judged_by(side: str) -> Iterator[None]:
    """Run the codec with the walk ("walk") or with ``equal_only`` ("==")."""
    shipped = _envelope._difference
    if side == "==":
        _envelope._difference = equal_only
    try:
        yield
    finally:
        _envelope._difference = shipped


def compare(title: str, unit: str, run: Callable[[], float], rounds: int) -> None:
    """Interleave the two sides for ``rounds`` rounds and print medians and the ratio."""
    for side in ("walk", "=="):  # warm up, and prove both store it
        with judged_by(side):
            run()
    results: dict[str, list[float]] = {"walk": [], "==": []}
    for round_ in range(rounds):
        for side in ("walk", "==") if round_ % 2 == 0 else ("==", "walk"):
            with judged_by(side):
                results[side].append(run())
    ratio = statistics.median(w / e for w, e in zip(results["walk"], results["=="], strict=True))
    walk, eq = statistics.median(results["walk"]), statistics.median(results["=="])
    print(f"  {title:<30} {walk:>10.2f} {eq:>10.2f} {unit:<6} walk/== {ratio:.2f}")


def bench_codec(rounds: int, calls: int) -> None:
    print("codec: encode_result, microseconds per call (lower is better)")
    for name, annotation, value in SHAPES:
        codec: _envelope.Codec[Any] = _envelope.Codec(annotation)

        def run(codec: _envelope.Codec[Any] = codec, value: Any = value) -> float:
            started = time.perf_counter()
            for _ in range(calls):
                codec.encode_result(value, None, "bench")
            return (time.perf_counter() - started) / calls * 1e6

        compare(name, "µs", run, rounds)


def bench_decorator(url: str, rounds: int, calls: int) -> None:
    print(f"decorator: sync @idempotent first calls on one connection, {calls} per round (higher is better)")
    client = redis.Redis.from_url(url)
    try:

        def charge(order_id: str) -> dict[str, Any]:
            return {"order": order_id, "amount": 5, "ok": True}

        wrapped = idempotent(client, key="order_id", namespace="bench-replay", ttl=60, keep_alive=False)(charge)

        def run() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                wrapped(f"o-{next(_ids)}")
            return calls / (time.perf_counter() - started)

        compare("first call, small dict", "ops/s", run, rounds)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    print(f"pydantic {pydantic.VERSION}, redis-py {redis.__version__}, Python {sys.version.split()[0]}")
    print(f"  {'':<30} {'walk':>10} {'==':>10}")
    bench_codec(args.rounds, args.calls)
    with server_url() as url:
        bench_decorator(url, args.rounds, args.calls)


if __name__ == "__main__":
    main()
