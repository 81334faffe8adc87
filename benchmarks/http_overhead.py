"""What each HTTP front door adds per request, against the same app without it, from one load-generator run.

Five doors, each as users deploy it, each beside the same app served bare:

- ``asgi``: Starlette under uvicorn, ``goblin_claim.asgi.IdempotencyMiddleware``;
- ``wsgi``: a bare WSGI app under gunicorn, ``goblin_claim.wsgi.IdempotencyMiddleware``;
- ``flask``: Flask under gunicorn, ``goblin_claim.flask.Idempotency``;
- ``django-wsgi``: Django under gunicorn, ``goblin_claim.django.IdempotencyMiddleware``;
- ``django-asgi``: the same Django project under uvicorn.

gunicorn runs one gthread worker (16 threads, keep-alive), uvicorn one process: one
core each. For every door the load generator (wrk when on PATH, else the built-in
asyncio keep-alive loop of benchmarks/asgi_overhead.py) drives three variants,
interleaved round by round: ``bare`` (the app without the door), ``first call`` (a
fresh key per request: claim, run, store) and ``replay`` (one key: the stored
answer). It prints the median requests per second, the median per-round ratio to
``bare`` and the time added per request at saturation. Machines here are noisy
(about 10%): read ratios, not absolute numbers.

    python benchmarks/http_overhead.py [--rounds 3] [--seconds 2] [--connections 16] [--doors flask,django-wsgi]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from asgi_overhead import BODY, WRK_SCRIPT, python_run, wrk_run  # noqa: E402 -- after the path setup
from overhead import server_url  # noqa: E402

from tests.support import servers  # noqa: E402

DOORS = ("asgi", "wsgi", "flask", "django-wsgi", "django-asgi")
VARIANTS = ("bare", "first call", "replay")
NAMESPACE = "bench-doors"
ANSWER = b'{"order_id":"ord_1","items":["tea"]}'


# --------------------------------------------------------------------------- the apps (imported by the servers)


def _url() -> str:
    return os.environ["BENCH_REDIS_URL"]


def wsgi_app(variant: str) -> Any:
    """The bare WSGI app, or behind the WSGI door (a gunicorn factory)."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))])
        return [ANSWER]

    if variant == "bare":
        return app
    import redis

    from goblin_claim.wsgi import IdempotencyMiddleware

    return IdempotencyMiddleware(app, client=redis.Redis.from_url(_url()), namespace=NAMESPACE, ttl=600)


def flask_app(variant: str) -> Any:
    """The Flask app, bare or with the Flask door (a gunicorn factory)."""
    import flask

    app = flask.Flask(__name__)

    @app.post("/orders")
    def orders() -> Any:
        flask.request.get_data()
        return flask.Response(ANSWER, status=201, mimetype="application/json")

    if variant != "bare":
        import redis

        from goblin_claim.flask import Idempotency

        Idempotency(app, client=redis.Redis.from_url(_url()), namespace=NAMESPACE, ttl=600)
    return app


def _django(variant: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False, SECRET_KEY="bench", ALLOWED_HOSTS=["*"], ROOT_URLCONF="http_overhead",
        MIDDLEWARE=[] if variant == "bare" else ["goblin_claim.django.IdempotencyMiddleware"],
        GOBLIN_CLAIM_IDEMPOTENCY={"client": _url(), "namespace": NAMESPACE, "ttl": 600}, LOGGING_CONFIG=None,
    )  # fmt: skip
    django.setup()


def _django_view(request: Any) -> Any:
    from django.http import HttpResponse

    response = HttpResponse(ANSWER, status=201, content_type="application/json")
    response["Content-Length"] = str(len(ANSWER))  # as CommonMiddleware would; the load loop reads it
    return response


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":  # Django's ROOT_URLCONF is this module
        from django.urls import path

        return [path("orders", _django_view)]
    raise AttributeError(name)


def django_wsgi(variant: str) -> Any:
    """The Django project under WSGI, bare or with the Django door (a gunicorn factory)."""
    _django(variant)
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def django_asgi_bare() -> Any:
    """The Django project under ASGI, bare (a uvicorn factory)."""
    _django("bare")
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


def django_asgi_door() -> Any:
    """The Django project under ASGI with the Django door (a uvicorn factory)."""
    _django("door")
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


# --------------------------------------------------------------------------- the servers


def _command(door: str, variant: str, port: int) -> list[str]:
    guarded = variant != "bare"
    bind = ["--bind", f"{servers.HOST}:{port}", "--log-level", "warning", "-k", "gthread", "--threads", "16", "-w", "1"]
    if door == "asgi":
        return [sys.executable, str(ROOT / "benchmarks" / "asgi_overhead.py"), "--serve",
                "middleware" if guarded else "bare", "--port", str(port), "--redis-url", _url()]  # fmt: skip
    if door in ("wsgi", "flask", "django-wsgi"):
        factory = {"wsgi": "wsgi_app", "flask": "flask_app", "django-wsgi": "django_wsgi"}[door]
        target = f"http_overhead:{factory}({'door' if guarded else 'bare'!r})"
        return [sys.executable, "-m", "gunicorn", target, *bind]
    target = f"http_overhead:django_asgi_{'door' if guarded else 'bare'}"
    return [sys.executable, "-m", "uvicorn", target, "--factory", "--host", servers.HOST, "--port", str(port),
            "--log-level", "warning", "--no-access-log", "--lifespan", "off"]  # fmt: skip


@contextlib.contextmanager
def app_server(door: str, variant: str) -> Iterator[int]:
    port = servers.free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    process = subprocess.Popen(_command(door, variant, port), cwd=ROOT / "benchmarks", env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection((servers.HOST, port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {door} {variant} server did not start")
            time.sleep(0.05)
        yield port
    finally:
        process.send_signal(signal.SIGTERM if door != "asgi" else signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --------------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per variant per round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--doors", default=",".join(DOORS))
    parser.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    options = parser.parse_args()
    run = wrk_run if options.load == "wrk" else python_run
    doors = [door for door in options.doors.split(",") if door]
    results: dict[str, dict[str, tuple[float, float]]] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script, server_url() as url:
        script.write(WRK_SCRIPT.replace("wrk.body", repr(BODY.decode())))
        script.flush()
        os.environ["BENCH_REDIS_URL"] = url
        print(f"redis at {url}; load: {options.load}, {options.connections} connections; "
              f"{options.rounds} rounds x {options.seconds:g} s per variant")  # fmt: skip
        for door in doors:
            with app_server(door, "bare") as bare, app_server(door, "door") as guarded:
                plan = {"bare": (bare, "none"), "first call": (guarded, "fresh"), "replay": (guarded, "same")}
                for variant in VARIANTS:  # warm up (and store the replayed answer)
                    run(script.name, *plan[variant], 1, options.connections)
                rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
                ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for round_ in range(options.rounds):
                    order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
                    measured: dict[str, float] = {}
                    for variant in order:
                        measured[variant], bad = run(script.name, *plan[variant], options.seconds, options.connections)
                        if bad:
                            print(f"   {door} {variant}: {bad} non-2xx answers")
                    for variant in VARIANTS:
                        rates[variant].append(measured[variant])
                        ratios[variant].append(measured[variant] / measured["bare"])
                results[door] = {v: (statistics.median(rates[v]), statistics.median(ratios[v])) for v in VARIANTS}
                print(f"{door}: " + ", ".join(f"{v} {results[door][v][0]:.0f}/s" for v in VARIANTS))
    print(f"\n{'door':<12} {'variant':<11} {'median req/s':>13} {'ratio to bare':>14} {'added per request':>18}")
    for door, by_variant in results.items():
        bare_rate = by_variant["bare"][0]
        for variant, (rate, ratio) in by_variant.items():
            added = "-" if variant == "bare" else f"{(1 / rate - 1 / bare_rate) * 1e6:+.0f} us"
            print(f"{door:<12} {variant:<11} {rate:>13.0f} {ratio:>14.2f} {added:>18}")


if __name__ == "__main__":
    main()
