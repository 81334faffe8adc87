"""A Flask service whose POST routes honour the Idempotency-Key header, through goblin_claim.flask.

The answers follow the IETF Idempotency-Key draft: a missing key is 400, a key
reused with a different body is 422, a retry while the first request is still
running is 409, and a retry after it finished replays the first response (with
``Idempotent-Replayed: true``). Keys are scoped per user (set by an auth hook that
runs first), so one user's key never replays another's answer; a request with no
user is refused without running. Runs on an embedded fakeredis, or on REDIS_URL.

The demo serves the app on a free loopback port in a thread, sends a few
requests, prints what came back, and stops:

    python examples/flask_service.py
    REDIS_URL=redis://localhost:6379/0 python examples/flask_service.py

To serve it for real: ``gunicorn 'examples.flask_service:create_app()'`` (from the repository root).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import redis
from flask import Flask, g, jsonify, request
from werkzeug.serving import WSGIRequestHandler, make_server

from goblin_claim.flask import Idempotency

NAMESPACE = "examples.flask"
created: list[str] = []


def connect() -> Any:
    url = os.environ.get("REDIS_URL")
    if url:
        # A socket timeout turns a hung Redis into a 503 instead of a hung request.
        return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    from goblin_claim.testing import fake_redis

    return fake_redis(native=True)


def create_app(client: Any = None) -> Flask:
    app = Flask(__name__)
    client = client if client is not None else connect()

    @app.before_request
    def authenticate() -> None:
        # Registered before the extension, so it runs first: the scope function sees g.user.
        g.user = request.headers.get("Authorization", "").removeprefix("Bearer ") or None

    Idempotency(app, client=client, required=True, scope=lambda _request: g.user, namespace=NAMESPACE)

    @app.post("/orders")
    def create_order() -> Any:
        items = request.get_json()["items"]
        created.append(items[0])
        time.sleep(0.3)  # the database is slow
        return jsonify(order_id=f"ord_{len(created)}", items=items, user=g.user), 201

    @app.get("/orders")
    def list_orders() -> Any:
        return jsonify(created=len(created))

    return app


def show(label: str, response: httpx.Response) -> None:
    replayed = response.headers.get("idempotent-replayed", "-")
    body: Any = response.json()
    detail = body.get("detail", body) if response.headers["content-type"] == "application/problem+json" else body
    print(f"{label:<24} -> status={response.status_code} replayed={replayed} {detail}")


class QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any) -> None:
        pass  # the demo prints its own lines


def main() -> None:
    client = connect()
    app = create_app(client)
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(
        f"Serving on http://127.0.0.1:{server.server_port} with", os.environ.get("REDIS_URL") or "an embedded fakeredis"
    )
    for key in client.scan_iter(f"{NAMESPACE}:*"):  # a fresh story, also on a reused server
        client.delete(key)

    alice = {"Idempotency-Key": "k-1", "Authorization": "Bearer alice"}
    tea, coffee = {"items": ["tea"]}, {"items": ["coffee"]}
    with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=10) as http:
        first: list[httpx.Response] = []
        running = threading.Thread(target=lambda: first.append(http.post("/orders", json=tea, headers=alice)))
        running.start()
        time.sleep(0.1)
        show("retry while running", http.post("/orders", json=tea, headers=alice))
        running.join()
        show("first request", first[0])
        show("retry after it ended", http.post("/orders", json=tea, headers=alice))
        show("same key, new body", http.post("/orders", json=coffee, headers=alice))
        show("no key", http.post("/orders", json=tea, headers={"Authorization": "Bearer alice"}))
        show("no user", http.post("/orders", json=tea, headers={"Idempotency-Key": "k-2"}))
        bob = {**alice, "Authorization": "Bearer bob"}
        show("same key, other user", http.post("/orders", json=coffee, headers=bob))
        show("GET passes through", http.get("/orders", headers=alice))
    server.shutdown()
    thread.join()
    print(f"orders created: {created}")
    assert created == ["tea", "coffee"]  # once for alice, once for bob


if __name__ == "__main__":
    main()
