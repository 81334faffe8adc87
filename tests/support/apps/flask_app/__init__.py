"""A Flask service behind the Flask door, and a bare WSGI app behind the WSGI middleware, for gunicorn.

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix (the runs are counted under ``<namespace>:runs``), ``GOBLIN_TEST_DELAY``
how long a view works, ``GOBLIN_TEST_WAIT`` how long a duplicate waits;
``GOBLIN_TEST_AT_MOST_ONCE=1`` and ``GOBLIN_TEST_EXPOSE_HOLDER=1`` turn those options on,
``GOBLIN_TEST_LEASE`` sets the lease. Each run pushes its process id to
``<namespace>:runs:<view>:pids``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import redis
from flask import Flask, Response, g, jsonify, request

from goblin_claim.flask import Idempotency, idempotency_key
from goblin_claim.wsgi import IdempotencyMiddleware
from tests.support.apps import answers

PORT = int(os.environ["GOBLIN_TEST_REDIS_PORT"])
NAMESPACE = os.environ["GOBLIN_TEST_NAMESPACE"]
COUNTERS = f"{NAMESPACE}:runs"
DELAY = float(os.environ.get("GOBLIN_TEST_DELAY", "1.5"))
WAIT = float(os.environ.get("GOBLIN_TEST_WAIT", "0"))
# The options a test turns on through the environment (at most once, the holder named, a short lease).
UNIT = {
    "at_most_once": os.environ.get("GOBLIN_TEST_AT_MOST_ONCE") == "1",
    "expose_holder": os.environ.get("GOBLIN_TEST_EXPOSE_HOLDER") == "1",
    "lease": int(os.environ.get("GOBLIN_TEST_LEASE", "30")),
    "server_errors": answers.SERVER_ERRORS,
}
_counters = redis.Redis(host="127.0.0.1", port=PORT)
answers.log_to_file()


def work(name: str) -> int:
    """Count a run (and its process), work DELAY seconds, count its end."""
    _counters.rpush(f"{COUNTERS}:{name}:pids", os.getpid())
    run = int(_counters.incr(f"{COUNTERS}:{name}"))
    time.sleep(DELAY)
    _counters.incr(f"{COUNTERS}:{name}:finished")
    return run


def create_app() -> Flask:
    """The Flask service: an auth hook first (``X-User``), then the idempotency extension."""
    app = Flask(__name__)

    @app.before_request
    def authenticate() -> None:
        g.user_id = request.headers.get("X-User")

    idempotency = Idempotency(
        client=lambda: redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5),
        namespace=NAMESPACE, wait=WAIT, scope=lambda _request: g.user_id, **UNIT,
    )  # fmt: skip
    idempotency.init_app(app)

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.post("/orders/sync")
    def order_sync() -> Any:
        items = json.loads(request.get_data())["items"]
        return jsonify({"order": f"ord_{work('sync')}", "items": items}), 201

    @app.post("/orders/own")
    @idempotency.options(required=True, scope=None)
    def order_own() -> Any:
        return jsonify({"order": f"ord_{int(_counters.incr(f'{COUNTERS}:own'))}"}), 201

    @app.post("/webhook")
    @idempotency_key("ignore")
    def webhook() -> Any:
        return jsonify({"run": int(_counters.incr(f"{COUNTERS}:webhook"))}), 201

    @app.post("/orders/misconfigured")
    @idempotency.options(scope=lambda _request: g.tenant_id)  # no hook sets g.tenant_id
    def order_misconfigured() -> Any:
        return jsonify({"run": int(_counters.incr(f"{COUNTERS}:misconfigured"))}), 201

    @app.post("/uploads")
    def upload() -> Any:
        run = int(_counters.incr(f"{COUNTERS}:upload"))
        return jsonify({"upload": f"up_{run}", "size": len(request.files["file"].read())}), 201

    @app.post("/orders/stream")
    def order_stream() -> Response:
        run = int(_counters.incr(f"{COUNTERS}:stream"))

        def chunks() -> Iterable[bytes]:
            for _ in range(int(DELAY / 0.1)):
                yield f"run {run}\n".encode()
                time.sleep(0.1)
            _counters.incr(f"{COUNTERS}:stream:finished")

        return Response(chunks(), mimetype="application/x-ndjson")

    @app.route("/answer", methods=["POST", "PUT"])
    def answer() -> Response:
        return _answer()

    @app.route("/answer/ignored", methods=["POST", "PUT"])
    @idempotency_key("ignore")
    def answer_ignored() -> Response:
        return _answer()

    return app


def _answer() -> Response:
    """``/answer`` (tests/support/apps/answers.py) in Flask: a streamed response when asked for one."""
    asked = answers.asked(request.query_string.decode())
    _counters.incr(answers.counter(NAMESPACE, asked.tag))
    asked.fail_if_asked()
    return Response(asked.chunks() if asked.stream else asked.body, status=asked.status, headers=asked.headers)


def bare(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """A bare WSGI app: ``POST /orders/sync`` counts, works, answers 201; ``POST /webhook`` counts; ``/answer``.

    Anything else: 200 for ``/health``, else 404.
    """
    if environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/webhook":
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"run": int(_counters.incr(f"{COUNTERS}:webhook"))}).encode()]
    if environ["PATH_INFO"] in ("/answer", "/answer/ignored"):
        asked = answers.asked(environ.get("QUERY_STRING", ""))
        _counters.incr(answers.counter(NAMESPACE, asked.tag))
        asked.fail_if_asked()
        start_response(f"{asked.status} {HTTPStatus(asked.status).phrase}", asked.headers)
        return asked.chunks() if asked.stream else [asked.body]
    if environ["REQUEST_METHOD"] != "POST" or environ["PATH_INFO"] != "/orders/sync":
        found = environ["PATH_INFO"] == "/health"
        start_response("200 OK" if found else "404 Not Found", [("Content-Type", "text/plain")])
        return [b"ok" if found else b"not found"]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    items = json.loads(environ["wsgi.input"].read(length))["items"]
    body = json.dumps({"order": f"ord_{work('sync')}", "items": items}).encode()
    start_response("201 Created", [("Content-Type", "application/json"), ("X-Order", "yes")])
    return [body]


def create_wsgi() -> Any:
    """The bare WSGI app behind the WSGI middleware (a gunicorn factory)."""
    client = redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5)
    return IdempotencyMiddleware(
        bare,
        client=client,
        namespace=NAMESPACE,
        wait=WAIT,
        routes={"/webhook": "ignore", "/answer/ignored": "ignore"},
        **UNIT,
    )
