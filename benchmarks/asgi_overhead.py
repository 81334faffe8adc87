"""What IdempotencyMiddleware adds per request, measured side by side in one run.

Two uvicorn processes serve the same Starlette app (POST /orders answering a small
JSON 201): one bare, one behind ``IdempotencyMiddleware`` on a redis-server. One
load generator drives four variants, interleaved round by round in rotating order:

- ``bare``: the app without the middleware;
- ``no key``: the middleware's app, requests without Idempotency-Key (passed through);
- ``first call``: a fresh key per request: claim, run the app, store the response;
- ``replay``: one key for every request: the stored response, replayed from Redis.

For each variant it prints the median requests per second over the rounds, the
median of the per-round ratios to ``bare``, and the time added per request at
saturation (``1/rps - 1/rps_bare``: the server is one process on one core).
Machines here are noisy (about 10%): read ratios, not absolute numbers.

The load generator is wrk (Debian's ``apt-get install wrk``) when it is on PATH,
else a built-in asyncio HTTP/1.1 keep-alive loop (which takes CPU from the same
two cores, so it reads lower). Uses the server in REDIS_URL, else starts a
redis-server on a free port; every server it starts is stopped at the end.

    python benchmarks/asgi_overhead.py [--rounds 5] [--seconds 3] [--connections 16] [--load wrk|python]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import server_url

from tests.support import servers

BODY = b'{"items":["tea"]}'
VARIANTS = ("bare", "no key", "first call", "replay")
REPLAY_KEY = "bench-replay-key"

WRK_SCRIPT = r"""
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  mode, prefix = args[1], args[2] .. "-" .. tid .. "-"
  counter = 0
  local headers = {["Content-Type"] = "application/json"}
  if mode == "same" then headers["Idempotency-Key"] = args[3] end
  fixed = wrk.format("POST", "/orders", headers, wrk.body)
end
function request()
  if mode ~= "fresh" then return fixed end
  counter = counter + 1
  return wrk.format("POST", "/orders", {["Content-Type"] = "application/json",
                                        ["Idempotency-Key"] = prefix .. counter}, wrk.body)
end
"""


# --------------------------------------------------------------------------- the servers


def make_app(variant: str, redis_url: str) -> Any:
    import redis.asyncio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from goblin_claim.asgi import IdempotencyMiddleware

    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=64, timeout=30)
        state["redis"] = redis.asyncio.Redis.from_pool(pool)
        yield
        await state["redis"].aclose()

    async def orders(request: Request) -> Response:
        body = await request.body()
        return JSONResponse({"order_id": "ord_1", "items": ["tea"], "bytes": len(body)}, status_code=201)

    app = Starlette(routes=[Route("/orders", orders, methods=["POST"])], lifespan=lifespan)
    if variant == "middleware":
        app.add_middleware(IdempotencyMiddleware, client=lambda: state["redis"], namespace="bench-http", ttl=600)
    return app


def serve(variant: str, port: int, redis_url: str) -> None:
    import uvicorn

    uvicorn.run(
        make_app(variant, redis_url), host=servers.HOST, port=port, log_level="warning", access_log=False, ws="none"
    )


@contextlib.contextmanager
def app_server(variant: str, redis_url: str) -> Iterator[int]:
    port = servers.free_port()
    args = [sys.executable, __file__, "--serve", variant, "--port", str(port), "--redis-url", redis_url]
    process = subprocess.Popen(args)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection((servers.HOST, port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {variant} app server did not start")
            time.sleep(0.05)
        yield port
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --------------------------------------------------------------------------- the load


def wrk_run(script: str, port: int, mode: str, seconds: float, connections: int) -> tuple[float, int]:
    """Requests per second, and how many answers were not 2xx."""
    command = [
        "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script,
        f"http://{servers.HOST}:{port}/orders", "--", mode, secrets.token_hex(4), REPLAY_KEY,
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if rate is None:
        raise SystemExit(f"cannot read wrk's output:\n{output}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors:.*", output)
    if errors:
        print(f"   wrk: {errors.group(0)}")
    return float(rate.group(1)), int(bad.group(1)) if bad else 0


async def _python_load(port: int, mode: str, seconds: float, connections: int) -> tuple[float, int]:
    prefix = secrets.token_hex(4)
    deadline = time.perf_counter() + seconds
    counts = [0, 0]  # answers, non-2xx answers

    async def worker(index: int) -> None:
        reader, writer = await asyncio.open_connection(servers.HOST, port)
        sent = 0
        try:
            while time.perf_counter() < deadline:
                sent += 1
                key = {"fresh": f"{prefix}-{index}-{sent}", "same": REPLAY_KEY}.get(mode)
                head = "POST /orders HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(BODY)}\r\n" + (f"Idempotency-Key: {key}\r\n" if key else "") + "\r\n"
                writer.write(head.encode() + BODY)
                status_and_headers = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", status_and_headers)
                await reader.readexactly(int(length.group(1)) if length else 0)
                counts[0] += 1
                if not status_and_headers.startswith(b"HTTP/1.1 2"):
                    counts[1] += 1
        finally:
            writer.close()
            await writer.wait_closed()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return counts[0] / (time.perf_counter() - started), counts[1]


def python_run(script: str, port: int, mode: str, seconds: float, connections: int) -> tuple[float, int]:
    return asyncio.run(_python_load(port, mode, seconds, connections))


# --------------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per variant per round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    parser.add_argument("--serve", choices=("bare", "middleware"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve(options.serve, options.port, options.redis_url)
        return
    run = wrk_run if options.load == "wrk" else python_run
    try:
        import httptools  # noqa: F401 -- only asking which parser uvicorn picks

        parser_name = "httptools"
    except ImportError:
        parser_name = "h11"
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script_file:
        script_file.write(WRK_SCRIPT.replace("wrk.body", repr(BODY.decode())))
        script_file.flush()
        with server_url() as url, app_server("bare", url) as bare, app_server("middleware", url) as guarded:
            # variant -> (port, wrk mode)
            plan = {"bare": (bare, "none"), "no key": (guarded, "none"), "first call": (guarded, "fresh"),
                    "replay": (guarded, "same")}  # fmt: skip
            print(
                f"uvicorn ({parser_name}, 1 process) + Starlette, redis at {url}; load: {options.load} "
                f"with {options.connections} connections; {options.rounds} rounds x {options.seconds:g} s per variant"
            )
            for variant in VARIANTS:  # warm up every path (and store the replayed response)
                port, mode = plan[variant]
                run(script_file.name, port, mode, 1, options.connections)
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
            non_2xx: dict[str, int] = dict.fromkeys(VARIANTS, 0)
            for round_ in range(options.rounds):
                order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
                measured: dict[str, float] = {}
                for variant in order:
                    port, mode = plan[variant]
                    measured[variant], bad = run(script_file.name, port, mode, options.seconds, options.connections)
                    non_2xx[variant] += bad
                for variant in VARIANTS:
                    rates[variant].append(measured[variant])
                    ratios[variant].append(measured[variant] / measured["bare"])
                print(f"round {round_ + 1}: " + ", ".join(f"{v} {measured[v]:.0f}/s" for v in VARIANTS))
    bare_rate = statistics.median(rates["bare"])
    print(f"\n{'variant':<12} {'median req/s':>13} {'ratio to bare':>14} {'added per request':>18}")
    for variant in VARIANTS:
        rate = statistics.median(rates[variant])
        added = "-" if variant == "bare" else f"{(1 / rate - 1 / bare_rate) * 1e6:+.0f} us"
        ratio = statistics.median(ratios[variant])
        print(f"{variant:<12} {rate:>13.0f} {ratio:>14.2f} {added:>18}")
    if any(non_2xx.values()):
        print(f"\nnon-2xx answers (should be none): {non_2xx}")


if __name__ == "__main__":
    main()
