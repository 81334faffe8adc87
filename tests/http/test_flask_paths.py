"""Flask's extension through Flask's test client, over fakeredis: what each kind of request and response gets.

An app factory (``init_app``), per-route options and marks, the router's own
404 and 405, the body limits, a scope function's answers, responses that are
given back, passed through or streamed, a view stopped mid-request, and a claim
lost or a store refused while the view ran.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis

import goblin_claim
from goblin_claim._events import Event
from tests.conftest import IN_CI
from tests.support import servers

flask = importlib.import_module("flask") if IN_CI else pytest.importorskip("flask")

from goblin_claim.flask import Idempotency, idempotency_key  # noqa: E402 -- only with Flask installed

NS = "flask-paths"
DOCS = "https://docs.example/problems"
KEY = {"Idempotency-Key": "k-1"}


def problem(response: Any) -> str:
    """The documented problem code of a response (its ``type`` anchor)."""
    assert response.headers["Content-Type"] == "application/problem+json"
    kind: str = json.loads(response.data)["type"]
    return kind.removeprefix(DOCS + "#")


class Service:
    """A Flask app with the extension installed by ``init_app``, and a count of each view's runs."""

    def __init__(self, client: Any, **options: Any) -> None:
        self.runs: dict[str, int] = {}
        self.app = flask.Flask(__name__)
        self.idempotency = Idempotency(client=client, namespace=NS, problem_docs=DOCS, **options)
        self.idempotency.init_app(self.app)
        self.http = self.app.test_client()

    def count(self, name: str) -> int:
        """Count one run of the view ``name``; the run's number."""
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]


@pytest.fixture
def redis_client() -> Iterator[fakeredis.FakeRedis]:
    """A fresh fakeredis client of the test's own."""
    made = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield made
    made.close()


def test_an_app_factory_installs_the_extension_and_replays(redis_client: Any) -> None:
    """``Idempotency(client=...)`` then ``init_app(app)``: the first POST runs, its duplicate is replayed."""
    service = Service(redis_client)

    @service.app.post("/orders")
    def order() -> tuple[dict[str, int], int]:
        return {"order": service.count("order")}, 201

    first = service.http.post("/orders", json={"items": 1}, headers=KEY)
    again = service.http.post("/orders", json={"items": 1}, headers=KEY)
    assert (first.status_code, first.json) == (201, {"order": 1})
    assert (again.status_code, again.json, again.headers["Idempotent-Replayed"]) == (201, {"order": 1}, "true")
    assert service.app.extensions["goblin_claim"] is service.idempotency
    assert service.runs == {"order": 1}


def test_the_door_logs_a_request_s_event_on_its_own_logger(redis_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """DEBUG on ``goblin_claim.flask`` shows each keyed request's one line there, never on the WSGI door's logger."""
    service = Service(redis_client)

    @service.app.post("/orders")
    def order() -> tuple[dict[str, int], int]:
        return {"order": service.count("order")}, 201

    with caplog.at_level(logging.DEBUG, logger="goblin_claim"):
        for _ in range(2):
            service.http.post("/orders", json={}, headers=KEY)
    told = [(r.name, r.getMessage().split(": ")[-1]) for r in caplog.records if r.getMessage().startswith("request ")]
    assert told == [("goblin_claim.flask", "claimed"), ("goblin_claim.flask", "completed")]


def test_a_routes_own_options_override_the_extensions(redis_client: Any) -> None:
    """``@idempotency.options(required=True)`` on one route: it refuses a keyless POST; another route does not."""
    service = Service(redis_client)

    @service.app.post("/refunds")
    @service.idempotency.options(required=True)
    def refund() -> tuple[str, int]:
        service.count("refund")
        return "refunded", 201

    @service.app.post("/notes")
    def note() -> tuple[str, int]:
        service.count("note")
        return "noted", 201

    refused = service.http.post("/refunds", json={})
    assert (refused.status_code, problem(refused)) == (400, "key-missing")
    assert service.http.post("/notes", json={}).status_code == 201
    assert service.http.post("/notes", json={}).status_code == 201  # no key, none required: runs each time
    assert service.runs == {"note": 2}


def test_the_options_of_a_route_are_checked_at_decoration(redis_client: Any) -> None:
    """A bad option on ``options()`` fails when the route is declared, not on its first request."""
    service = Service(redis_client)
    with pytest.raises(ValueError, match="wait"):
        service.idempotency.options(wait=-1)


def test_the_routers_404_and_405_and_a_get_pass_unclaimed(redis_client: Any) -> None:
    """No route, a method the route refuses, or a safe method: Flask answers, nothing is claimed or kept."""
    service = Service(redis_client, required=True)

    @service.app.route("/orders", methods=["GET", "PUT"])
    def orders() -> str:
        service.count("orders")
        return "listed"

    assert service.http.post("/nowhere", json={}, headers=KEY).status_code == 404
    assert service.http.delete("/orders", headers=KEY).status_code == 405
    assert service.http.get("/orders").status_code == 200  # required, but GET is never intercepted
    assert service.runs == {"orders": 1}
    assert redis_client.keys(f"{NS}:*") == []


def test_a_route_marked_ignore_is_never_claimed(redis_client: Any) -> None:
    """``@idempotency_key("ignore")``: with ``required=True`` a keyless POST runs, and a keyed one runs every time."""
    service = Service(redis_client, required=True)

    @service.app.post("/webhook")
    @idempotency_key("ignore")
    def webhook() -> tuple[str, int]:
        service.count("webhook")
        return "taken", 202

    assert service.http.post("/webhook", json={}).status_code == 202
    assert service.http.post("/webhook", json={}, headers=KEY).status_code == 202
    assert service.http.post("/webhook", json={}, headers=KEY).status_code == 202
    assert service.runs == {"webhook": 3}


def test_a_failing_routes_function_is_500_and_the_view_never_runs(redis_client: Any, fresh_log: None) -> None:
    """A ``routes`` function that raises: 500 routes-failed, the view not run unguarded."""

    def routes(request: Any) -> str:
        raise LookupError("no table")

    service = Service(redis_client, routes=routes)

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        return "made", 201

    refused = service.http.post("/orders", json={}, headers=KEY)
    assert (refused.status_code, problem(refused)) == (500, "routes-failed")
    assert service.runs == {}


def test_bodies_over_the_limit_are_413_declared_or_streamed(redis_client: Any) -> None:
    """Content-Length over ``max_body_bytes``, or a chunked body found larger once read: 413, the view never run."""
    service = Service(redis_client, max_body_bytes=16)

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        return "made", 201

    declared = service.http.post("/orders", data=b"x" * 64, headers=KEY, content_type="text/plain")
    assert (declared.status_code, problem(declared)) == (413, "body-too-large")
    assert "64 bytes" in json.loads(declared.data)["detail"]
    chunked = service.http.post(
        "/orders",
        input_stream=io.BytesIO(b"y" * 64),
        headers={**KEY, "Transfer-Encoding": "chunked", "Content-Type": "text/plain"},
        environ_overrides={"wsgi.input_terminated": True},  # as gunicorn marks a chunked body it ends
    )
    assert (chunked.status_code, problem(chunked)) == (413, "body-too-large")
    assert service.runs == {}


def test_a_scope_function_answers_who_may_claim(redis_client: Any) -> None:
    """The scope's ``abort(401)`` is Flask's 401; no owner is 403 no-owner; owners do not share keys."""
    service = Service(redis_client, scope=lambda request: who(request))

    def who(request: Any) -> str | None:
        user = request.headers.get("X-User")
        if user == "stranger":
            flask.abort(401)
        return user

    @service.app.post("/orders")
    def order() -> tuple[dict[str, int], int]:
        return {"order": service.count("order")}, 201

    assert service.http.post("/orders", json={}, headers={**KEY, "X-User": "stranger"}).status_code == 401
    nobody = service.http.post("/orders", json={}, headers=KEY)
    assert (nobody.status_code, problem(nobody)) == (403, "no-owner")
    ann = service.http.post("/orders", json={}, headers={**KEY, "X-User": "ann"})
    bob = service.http.post("/orders", json={}, headers={**KEY, "X-User": "bob"})
    assert (ann.json, bob.json) == ({"order": 1}, {"order": 2})  # one key, two owners: two operations
    assert service.runs == {"order": 2}


def test_a_key_reused_with_another_body_is_422(redis_client: Any) -> None:
    """The same key with a different body: 422 key-reused, the view not run again."""
    service = Service(redis_client)

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        return "made", 201

    assert service.http.post("/orders", json={"items": 1}, headers=KEY).status_code == 201
    reused = service.http.post("/orders", json={"items": 2}, headers=KEY)
    assert (reused.status_code, problem(reused)) == (422, "key-reused")
    assert service.runs == {"order": 1}


def test_a_status_not_kept_gives_the_key_back(redis_client: Any) -> None:
    """A 409 listed in ``release_statuses``: sent, not kept; the retry with the same key runs again."""
    service = Service(redis_client, release_statuses={409})

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        return "busy", 409

    assert service.http.post("/orders", json={}, headers=KEY).status_code == 409
    assert service.http.post("/orders", json={}, headers=KEY).status_code == 409
    assert service.runs == {"order": 2}
    assert redis_client.keys(f"{NS}:*") == []


def test_a_large_response_is_passed_unstored_and_duplicates_are_told(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A body over ``max_response_bytes``: sent whole with Idempotent-Stored: false; a duplicate gets 422 not-kept."""
    service = Service(redis_client, max_response_bytes=50)

    @service.app.post("/reports")
    def report() -> tuple[bytes, int]:
        service.count("report")
        return b"r" * 80, 200

    first = service.http.post("/reports", json={}, headers=KEY)
    assert (first.status_code, first.data, first.headers["Idempotent-Stored"]) == (200, b"r" * 80, "false")
    again = service.http.post("/reports", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (422, "not-kept")
    assert "max_response_bytes=50" in json.loads(again.data)["detail"]
    assert service.runs == {"report": 1}


def test_a_streamed_response_is_passed_on_and_marked_once_it_ended(redis_client: Any) -> None:
    """A generator response is streamed as made, unstored; once read whole, a duplicate gets 422 not-kept."""
    service = Service(redis_client)

    @service.app.post("/export")
    def export() -> Any:
        service.count("export")

        def rows() -> Iterator[str]:
            yield "row 1\n"
            yield "row 2\n"

        return flask.Response(rows(), mimetype="text/csv")

    first = service.http.post("/export", json={}, headers=KEY)
    assert (first.status_code, first.data, first.headers["Idempotent-Stored"]) == (200, b"row 1\nrow 2\n", "false")
    again = service.http.post("/export", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (422, "not-kept")
    assert "streamed" in json.loads(again.data)["detail"]
    assert service.runs == {"export": 1}


def test_a_stream_cut_short_keeps_the_key_closed(redis_client: Any) -> None:
    """The client left mid-stream (the response closed unread): the key is kept closed, a duplicate gets 422."""
    service = Service(redis_client)

    @service.app.post("/export")
    def export() -> Any:
        service.count("export")
        return flask.Response(iter([b"a\n", b"b\n", b"c\n"]), mimetype="text/csv")

    response = service.http.post("/export", json={}, headers=KEY, buffered=False)
    assert next(iter(response.response)) == b"a\n"
    response.close()
    again = service.http.post("/export", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (422, "abandoned")
    assert service.runs == {"export": 1}


def test_a_view_stopped_mid_request_keeps_the_key_closed(redis_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """SystemExit in the view (gunicorn's timeout): no after_request; teardown keeps the key closed (422)."""
    service = Service(redis_client)

    @service.app.post("/orders")
    def order() -> str:
        service.count("order")
        raise SystemExit(1)

    with caplog.at_level(logging.WARNING, logger="goblin_claim"), pytest.raises(SystemExit):
        service.http.post("/orders", json={}, headers=KEY)
    assert any("the worker was stopped mid-request (SystemExit)" in r.getMessage() for r in caplog.records)
    again = service.http.post("/orders", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (422, "abandoned")
    assert service.runs == {"order": 1}


@pytest.mark.parametrize("propagate", [False, True], ids=["flask-500", "propagated"])
@pytest.mark.parametrize(("server_errors", "runs"), [("give back", 2), ("store", 1)])
def test_a_view_that_raises_gives_the_key_back_or_keeps_a_500(
    redis_client: Any, propagate: bool, server_errors: str, runs: int
) -> None:
    """A view raising after its work: Flask's 500 (or, propagated, the exception) gives back or keeps a 500."""
    service = Service(redis_client, server_errors=server_errors)
    service.app.config["PROPAGATE_EXCEPTIONS"] = propagate

    @service.app.post("/transfers")
    def transfer() -> str:
        service.count("transfer")  # the work, committed
        raise LookupError("the queue is down")

    def send() -> Any:
        if not propagate:
            return service.http.post("/transfers", json={}, headers=KEY)
        with pytest.raises(LookupError):
            service.http.post("/transfers", json={}, headers=KEY)
        return None

    first = send()
    assert first is None or first.status_code == 500
    if server_errors == "store":
        again = service.http.post("/transfers", json={}, headers=KEY)
        assert (again.status_code, problem(again), again.headers["Idempotent-Replayed"]) == (
            500, "server-error", "true",
        )  # fmt: skip
    else:
        send()  # given back: the retry runs the view again
    assert service.runs == {"transfer": runs}


def test_a_500_the_view_returns_is_replayed_when_server_errors_are_stored(redis_client: Any) -> None:
    """server_errors="store": a 500 the view answered after its work is kept and replayed; one run."""
    service = Service(redis_client, server_errors="store")

    @service.app.post("/transfers")
    def transfer() -> tuple[str, int]:
        return f"failed after run {service.count('transfer')}", 500

    first = service.http.post("/transfers", json={}, headers=KEY)
    again = service.http.post("/transfers", json={}, headers=KEY)
    assert (first.status_code, again.status_code, again.data) == (500, 500, b"failed after run 1")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert service.runs == {"transfer": 1}


def test_a_claim_lost_while_the_view_ran_is_503(redis_client: Any) -> None:
    """The key gone when the view finished (its lease lapsed): 503 claim-lost, the view's answer not given out."""
    service = Service(redis_client)

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        redis_client.delete(*redis_client.keys(f"{NS}:*"))
        return "made", 201

    lost = service.http.post("/orders", json={}, headers=KEY)
    assert (lost.status_code, problem(lost)) == (503, "claim-lost")
    assert lost.headers["Retry-After"]
    assert service.runs == {"order": 1}


def test_redis_unreachable_with_fail_open_runs_the_view_once_per_delivery(caplog: pytest.LogCaptureFixture) -> None:
    """fail_open=True, no Redis: each delivery runs the view once, its answer passed through; a route without: 503."""
    client = redis.Redis(host="127.0.0.1", port=servers.free_port(), socket_connect_timeout=1, retry=None)
    service = Service(client, fail_open=True)

    @service.app.post("/notes")
    def note() -> tuple[str, int]:
        return f"noted {service.count('note')}", 201

    @service.app.post("/charges")
    @service.idempotency.options(fail_open=False)
    def charge() -> tuple[str, int]:
        service.count("charge")
        return "charged", 201

    seen: list[Event] = []
    goblin_claim.add_listener(seen.append)
    try:
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            notes = [service.http.post("/notes", json={}, headers=KEY) for _ in range(2)]
            refused = service.http.post("/charges", json={}, headers=KEY)
    finally:
        goblin_claim.remove_listener(seen.append)
    assert [(r.status_code, r.data) for r in notes] == [(201, b"noted 1"), (201, b"noted 2")]
    assert all("Idempotent-Replayed" not in r.headers for r in notes)
    assert (refused.status_code, problem(refused)) == (503, "store-unavailable")
    assert service.runs == {"note": 2}
    assert [e.outcome for e in seen if e.operation == "request"] == ["failed_open", "failed_open", "unavailable"]
    opened = [r for r in caplog.records if "fail_open runs the work" in r.getMessage()]
    assert [(r.name, r.levelno) for r in opened] == [("goblin_claim.flask", logging.WARNING)] * 2


def test_a_store_redis_refuses_sends_the_answer_marked_unstored(
    own_server: Callable[..., servers.RedisProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis out of memory once the view ran: its answer is sent with Idempotent-Stored: false, and logged."""
    server = own_server()
    admin = server.client()
    service = Service(server.client(), lease=5)

    @service.app.post("/orders")
    def order() -> tuple[str, int]:
        service.count("order")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        return "made", 201

    try:
        with caplog.at_level(logging.WARNING, logger="goblin_claim"):
            sent = service.http.post("/orders", json={}, headers=KEY)
    finally:
        admin.config_set("maxmemory", 0)
    assert (sent.status_code, sent.data, sent.headers["Idempotent-Stored"]) == (201, b"made", "false")
    assert any("could not be stored (ServerError)" in r.getMessage() for r in caplog.records)
    again = service.http.post("/orders", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (409, "in-flight")  # the marker was refused too: held until its lease
    assert service.runs == {"order": 1}


def test_a_large_body_without_content_length_is_measured_and_passed_unstored(redis_client: Any) -> None:
    """A response whose Content-Length was dropped: its body is measured; over the limit it is sent, unstored."""
    service = Service(redis_client, max_response_bytes=50)

    @service.app.post("/reports")
    def report() -> Any:
        service.count("report")
        response = flask.Response(b"r" * 80, status=200)
        del response.headers["Content-Length"]
        return response

    first = service.http.post("/reports", json={}, headers=KEY)
    assert (first.status_code, first.data, first.headers["Idempotent-Stored"]) == (200, b"r" * 80, "false")
    again = service.http.post("/reports", json={}, headers=KEY)
    assert (again.status_code, problem(again)) == (422, "not-kept")
    assert "its body is larger than max_response_bytes=50" in json.loads(again.data)["detail"]
    assert service.runs == {"report": 1}


def test_the_extension_given_the_app_installs_itself(redis_client: Any) -> None:
    """``Idempotency(app, client=...)``: the hooks are on ``app`` at once."""
    app = flask.Flask(__name__)
    runs: list[int] = []

    @app.post("/orders")
    def order() -> tuple[str, int]:
        runs.append(1)
        return "made", 201

    Idempotency(app, client=redis_client, namespace=NS)
    http = app.test_client()
    assert http.post("/orders", json={}, headers=KEY).status_code == 201
    assert http.post("/orders", json={}, headers=KEY).headers["Idempotent-Replayed"] == "true"
    assert runs == [1]
