"""Django's door under both worlds, through Django's test clients: what a client gets on each path.

The project is ``tests/http/django_paths.py``, run once in a child process (Django's
settings are configured once per process): ``Client`` takes the WSGI path,
``AsyncClient`` the ASGI one, over fakeredis, and over a redis-server of this
module's own where Redis must be real (URLs serving both worlds, refused writes).
Each test reads its case's findings from that run.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.support import servers
from tests.support.asgi_server import ROOT

_ = importlib.import_module("django") if IN_CI else pytest.importorskip("django")
NOT_KEPT = "not-kept"


@pytest.fixture(scope="module")
def found() -> dict[str, Any]:
    """Every case's findings, from one child process running the project."""
    binary = servers.redis_server_binary()
    if binary is None:
        if IN_CI:
            pytest.fail("redis-server is not installed (make test installs it)")
        pytest.skip("redis-server is not installed (make test installs it)")
    server = servers.start_server(binary)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tests.http.django_paths", str(server.port)],
            capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    findings: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return findings


def case(found: dict[str, Any], name: str) -> dict[str, Any]:
    """One case's findings; a case that raised fails the test with its traceback."""
    got: dict[str, Any] = found[name]
    assert "error" not in got, got.get("error")
    return got


def logged(found: dict[str, Any], text: str) -> list[str]:
    """The door's log lines containing ``text``."""
    return [message for _, message in found["logs"] if text in message]


# --------------------------------------------------------------------------- what passes untouched


def test_a_get_a_keyless_post_an_unrouted_url_and_an_ignored_view_pass_unclaimed(found: dict[str, Any]) -> None:
    """The middleware claims nothing it should not: each runs its view (or Django's 404), nothing is stored."""
    got = case(found, "passing")
    assert got["get"]["status"] == 201
    assert [reply["body"] for reply in got["keyless"]] == ["order 2", "order 3"]  # run each time
    assert got["unrouted"] == 404
    assert got["webhook"] == [202, 202]
    assert found["runs"]["webhook"] == 2  # @idempotency_key("ignore"): a keyed duplicate runs again
    assert got["keys"] == 0


# --------------------------------------------------------------------------- WSGI: the middleware


def test_under_wsgi_a_duplicate_is_replayed_and_a_reused_key_is_422(found: dict[str, Any]) -> None:
    """Client: the first POST runs, its duplicate is replayed; the key with another body is key-reused."""
    got = case(found, "sync")
    first, again = got["replay"]
    assert (first["status"], again["status"], again["body"]) == (201, 201, first["body"])
    assert again["idempotent-replayed"] == "true"
    assert (got["reused"]["status"], got["reused"]["problem"]) == (422, "key-reused")


def test_under_wsgi_a_status_not_kept_is_given_back(found: dict[str, Any]) -> None:
    """A view raising Http404: Django's 404 is sent, the key given back, so the retry runs the view again."""
    assert case(found, "sync")["given_back"] == [404, 404]
    assert found["runs"]["missing"] == 4  # twice under WSGI, twice under ASGI


def test_under_wsgi_responses_not_kept_are_sent_marked_and_duplicates_told(found: dict[str, Any]) -> None:
    """Too large, an event stream, a StreamingHttpResponse: sent whole with Idempotent-Stored: false, then 422."""
    got = case(found, "sync")
    for name, body, why in (
        ("big", "b" * 80, "its body is larger than max_response_bytes=50"),
        ("events", "data: 1\n\n", "it is an event stream"),
        ("stream", "a\nb\nc\n", "it is a streamed response"),
    ):
        first, again = got[name]
        assert (first["status"], first["body"], first["idempotent-stored"]) == (200, body, "false"), name
        assert (again["status"], again["problem"]) == (422, NOT_KEPT), name
        assert f"({why})" in again["detail"], name
    assert (found["runs"]["big"], found["runs"]["event_stream"]) == (1, 1)


def test_under_wsgi_a_stream_cut_short_keeps_the_key_closed(found: dict[str, Any]) -> None:
    """A stream closed after its first chunk (the client left): logged, and a duplicate gets 422 abandoned."""
    got = case(found, "sync")["stream_cut"]
    assert (got["status"], got["problem"]) == (422, "abandoned")
    assert logged(found, "the streamed response was not sent whole (the client left)")
    assert found["runs"]["stream"] == 2  # the whole one and the cut one; neither duplicate ran


def test_under_wsgi_a_claim_lost_while_the_view_ran_is_503(found: dict[str, Any]) -> None:
    """The key gone when the view answered: 503 claim-lost with Retry-After, the answer not given out."""
    got = case(found, "sync")["lapsing"]
    assert (got["status"], got["problem"], got["retry-after"]) == (503, "claim-lost", "1")
    assert "goblin_claim.django" in {name for name, m in found["logs"] if "the claim was lost while the app ran" in m}


def test_under_wsgi_a_view_stopped_mid_request_keeps_the_key_closed(found: dict[str, Any]) -> None:
    """SystemExit in the view (gunicorn's timeout) goes on to the server; its duplicate gets 422 abandoned."""
    got = case(found, "sync")["stopped"]
    assert got != "no SystemExit"
    assert (got["status"], got["problem"]) == (422, "abandoned")
    assert logged(found, "the worker was stopped mid-request (SystemExit)")
    assert found["runs"]["stopped"] == 1


def test_a_view_failing_after_its_work_runs_again_or_once_with_server_errors_stored(found: dict[str, Any]) -> None:
    """Given back, Django's 500 runs the view twice; stored, it ran once and its retry gets a replayed 500.

    The middleware replays Django's own 500 page; decorated views (sync and async), whose
    exception passes through the door, replay the server-error problem.
    """
    got = case(found, "server_errors")
    assert [reply["status"] for reply in got["given_back"]] == [500, 500]
    assert got["given_back_runs"] == 2
    first, again = got["stored"]
    assert (first["status"], again["status"], again["body"]) == (500, 500, first["body"])
    assert again["idempotent-replayed"] == "true"
    assert got["stored_runs"] == 1
    for name in ("own", "own_async"):
        first, again = got[name]
        assert (first["status"], again["status"], again["problem"]) == (500, 500, "server-error"), name
        assert again["idempotent-replayed"] == "true", name
    assert (found["runs"]["transfer_own:failed"], found["runs"]["transfer_own_async:failed"]) == (1, 1)


def test_under_wsgi_a_duplicate_of_a_running_request_is_409(found: dict[str, Any]) -> None:
    """``wait=0``: a duplicate arriving while the first runs is told 409 in-flight; the view ran once."""
    got = case(found, "in_flight")
    assert (got["first"]["status"], got["first"]["body"]) == (201, "slow")
    assert (got["duplicate"]["status"], got["duplicate"]["problem"]) == (409, "in-flight")
    assert got["duplicate"]["retry-after"] == "1"
    assert found["runs"]["slow"] == 1


# --------------------------------------------------------------------------- a view's own options (WSGI)


def test_a_views_own_options_require_a_key_and_replay(found: dict[str, Any]) -> None:
    """``@idempotent_view(required=True)``: a keyless POST is 400 key-missing; a keyed one runs once."""
    got = case(found, "own_options")
    assert (got["required"]["status"], got["required"]["problem"]) == (400, "key-missing")
    first, again = got["required_keyed"]
    assert (first["body"], again["body"], again["idempotent-replayed"]) == ("own_required 1", "own_required 1", "true")


def test_a_views_scope_decides_whose_key_it_is(found: dict[str, Any]) -> None:
    """PermissionDenied from the scope is Django's 403; no owner is 403 no-owner; a failing scope is 500."""
    got = case(found, "own_options")
    assert got["stranger"] == 403
    assert (got["nobody"]["status"], got["nobody"]["problem"]) == (403, "no-owner")
    assert (got["broken"]["status"], got["broken"]["problem"]) == (500, "scope-failed")
    assert got["owners"] == ["scoped 1", "scoped 2", "scoped 1"]  # one key, two owners; ann's replayed
    assert logged(found, "raised RuntimeError: the session store is down")


def test_a_view_raising_gives_its_key_back(found: dict[str, Any]) -> None:
    """An exception from a decorated view: Django's 500, and the retry with the same key runs (now succeeding)."""
    got = case(found, "own_options")
    assert got["failing"][0] == 500
    assert (got["failing"][1]["status"], got["failing"][1]["body"]) == (201, "failing 1")
    assert found["runs"]["failing:failed"] == 1


def test_a_body_over_the_views_limit_is_413(found: dict[str, Any]) -> None:
    """``max_body_bytes=16`` on the view: a 53-byte body is refused before the view runs."""
    got = case(found, "own_options")["too_large"]
    assert (got["status"], got["problem"]) == (413, "body-too-large")
    assert got["detail"].startswith("53 bytes is more than the 16 bytes")
    assert "small_body" not in found["runs"]


# --------------------------------------------------------------------------- ASGI


def test_under_asgi_the_middleware_replays_refuses_and_gives_back_as_under_wsgi(found: dict[str, Any]) -> None:
    """AsyncClient with an asyncio client in the settings: GET and unrouted pass, replay, key-reused, 404 given back."""
    got = case(found, "async")
    assert (got["get"], got["unrouted"]) == (201, 404)
    first, again = got["replay"]
    assert (first["status"], again["body"], again["idempotent-replayed"]) == (201, first["body"], "true")
    assert (got["reused"]["status"], got["reused"]["problem"]) == (422, "key-reused")
    assert got["given_back"] == [404, 404]


def test_under_asgi_responses_not_kept_are_sent_marked_and_duplicates_told(found: dict[str, Any]) -> None:
    """Too large, an event stream, an async stream, a sync stream made in a thread: sent unstored, then 422."""
    got = case(found, "async")
    for name, body in (
        ("big", "b" * 80),
        ("events", "data: 1\n\n"),
        ("stream", "a\nb\nc\n"),
        ("stream_sync", "x\ny\n"),
    ):
        first, again = got[name]
        assert (first["status"], first["body"], first["idempotent-stored"]) == (200, body, "false"), name
        assert (again["status"], again["problem"]) == (422, NOT_KEPT), name
    assert got["stream_sync_closed"] == 1  # the sync stream's iterator was closed once it ended
    # once here (its duplicate not run), once in the cut-stream case
    assert (found["runs"]["stream_async"], found["runs"]["stream_sync_under_asgi"]) == (2, 1)


def test_under_asgi_a_claim_lost_is_503_and_a_scope_separates_owners(found: dict[str, Any]) -> None:
    """The key gone when the async view answered: 503 claim-lost; a scope read in a thread gives each owner a run."""
    got = case(found, "async")
    assert (got["lapsing"]["status"], got["lapsing"]["problem"]) == (503, "claim-lost")
    assert "goblin_claim.django" in {name for name, m in found["logs"] if "the claim was lost while the app ran" in m}
    assert got["scoped"][0] != got["scoped"][1]


def test_async_views_own_options(found: dict[str, Any]) -> None:
    """``@idempotent_view`` on async views: key-missing, a replay, no owner, PermissionDenied, a failure given back."""
    got = case(found, "async_own")
    assert (got["required"]["status"], got["required"]["problem"]) == (400, "key-missing")
    first, again = got["replay"]
    assert (first["body"], again["body"], again["idempotent-replayed"]) == ("own_async 1", "own_async 1", "true")
    assert (got["nobody"]["status"], got["nobody"]["problem"]) == (403, "no-owner")
    assert (got["stranger"], got["owner"]) == (403, "scoped_async 1")
    assert got["failing"][0] == 500
    assert (got["failing"][1]["status"], got["failing"][1]["body"]) == (201, "failing_async 1")
    assert (got["too_large"]["status"], got["too_large"]["problem"]) == (413, "body-too-large")


def test_under_asgi_a_cancelled_view_keeps_its_key_closed(found: dict[str, Any]) -> None:
    """The client left and Django cancelled the async view: the view began, so a duplicate gets 422 abandoned."""
    got = case(found, "cancelled")
    assert got["cancelled"] is True
    assert (got["duplicate"]["status"], got["duplicate"]["problem"]) == (422, "abandoned")
    assert "the request was cancelled after it began" in got["duplicate"]["detail"]
    assert found["runs"]["hanging"] == 1


# --------------------------------------------------------------------------- a real Redis


def test_a_redis_and_a_valkey_url_serve_both_worlds(found: dict[str, Any]) -> None:
    """One URL in the settings: a sync client under WSGI, an asyncio one under ASGI; each replays."""
    got = case(found, "real_redis")
    for name in ("redis", "redis_async", "valkey", "valkey_async"):
        assert got[name] == [201, "true"], name


def test_a_store_redis_refuses_sends_the_answer_marked_unstored_in_both_worlds(found: dict[str, Any]) -> None:
    """Redis out of memory once the view ran: sent with Idempotent-Stored: false; the marker refused too, so 409."""
    got = case(found, "real_redis")
    for world in ("sync", "async"):
        sent, again = got["full_" + world]
        assert (sent["status"], sent["body"], sent["idempotent-stored"]) == (201, "made", "false"), world
        assert (again["status"], again["problem"]) == (409, "in-flight"), world
    refused = [name for name, m in found["logs"] if "could not be stored (ServerError)" in m]
    assert refused == ["goblin_claim.django"] * 2  # the door's own logger in both worlds
    assert found["runs"]["filling"] == 2


def test_redis_unreachable_with_fail_open_runs_the_view_once_per_delivery_in_both_worlds(found: dict[str, Any]) -> None:
    """fail_open in the settings, no Redis: each delivery runs the view, unkept; without it, 503 and no run."""
    got = case(found, "fail_open")
    for world in ("sync", "async"):
        assert [(r["status"], r["body"]) for r in got[world + "_open"]] == [(201, "opened 1"), (201, "opened 2")], world
        assert all("idempotent-replayed" not in r for r in got[world + "_open"]), world
        assert [(r["status"], r["problem"]) for r in got[world + "_closed"]] == [(503, "store-unavailable")] * 2, world
    assert (found["runs"]["opened"], found["runs"]["opened_async"]) == (2, 2)
    told = [name for name, m in found["logs"] if "fail_open runs the work" in m]
    assert told == ["goblin_claim.django"] * 4


# --------------------------------------------------------------------------- settings and the system check


def test_settings_the_door_refuses_are_improperly_configured(found: dict[str, Any]) -> None:
    """Unset, not a dict, no client, a bad or unknown option, a client of the wrong kind: each says what is wrong."""
    got = case(found, "settings")
    assert got["unset"] == (
        "settings.GOBLIN_CLAIM_IDEMPOTENCY is not set: give at least {'client': 'redis://...'}, "
        "or set GOBLIN_CLAIM_CLIENT"
    )
    assert got["not_a_dict"] == "settings.GOBLIN_CLAIM_IDEMPOTENCY must be a dict of options, not list"
    assert got["no_client"].startswith("GOBLIN_CLAIM_IDEMPOTENCY needs a 'client', or settings.GOBLIN_CLAIM_CLIENT")
    assert got["bad_option"].startswith("GOBLIN_CLAIM_IDEMPOTENCY: wait must be")
    assert got["unknown_option"].startswith("GOBLIN_CLAIM_IDEMPOTENCY: unknown option 'colour'")
    assert got["wrong_kind"].startswith("GOBLIN_CLAIM_IDEMPOTENCY['client'] under WSGI needs a sync client")


def test_the_system_check_reports_order_settings_and_scope(found: dict[str, Any]) -> None:
    """``manage.py check``: nothing without the middleware or when well placed; E001, E002, W001 otherwise."""
    got = case(found, "settings")
    assert (got["check_absent"], got["check_fine"], got["check_auth_before_scoped"]) == ([], [], [])
    assert [m[0] for m in got["check_auth_after"]] == ["goblin_claim.E001"]
    assert [m[0] for m in got["check_scope_without_auth"]] == ["goblin_claim.W001"]
    ((code, message),) = got["check_bad_setting"]
    assert code == "goblin_claim.E002"
    assert message.startswith("GOBLIN_CLAIM_IDEMPOTENCY: ttl must be")


def test_a_decorated_view_passes_a_get_and_answers_a_failing_routes_function(found: dict[str, Any]) -> None:
    """A GET to a decorated view runs it each time (sync and async); a routes function that raises is 500."""
    assert case(found, "own_options")["get"] == [201, 201]
    assert case(found, "async_own")["get"] == [201, 201]
    routed = case(found, "own_options")["routed"]
    assert (routed["status"], routed["problem"]) == (500, "routes-failed")
    assert "routed" not in found["runs"]


def test_a_response_class_of_the_projects_own_is_passed_unstored(found: dict[str, Any]) -> None:
    """An HttpResponseBase that is no HttpResponse: sent as it is, unstored; a duplicate is told 422."""
    first, again = case(found, "own_options")["plain"]
    assert (first["status"], first["body"], first["idempotent-stored"]) == (200, "plain", "false")
    assert (again["status"], again["problem"]) == (422, NOT_KEPT)
    assert "(it is a Plain)" in again["detail"]
    assert found["runs"]["plain"] == 1


def test_under_asgi_a_chunked_body_over_the_limit_is_413(found: dict[str, Any]) -> None:
    """No Content-Length (a chunked upload): the body is measured once read, and refused before the view runs."""
    got = case(found, "async_own")["chunked_too_large"]
    assert (got["status"], got["problem"]) == (413, "body-too-large")
    assert got["detail"].startswith("53 bytes is more than the 16 bytes")
    assert "small_body_async" not in found["runs"]


def test_under_asgi_a_stream_left_after_its_first_chunk_keeps_the_key_closed(found: dict[str, Any]) -> None:
    """The client read one chunk of an async stream and left: the key is kept closed, its duplicate gets 422."""
    got = case(found, "async_cut")
    assert got["first"] == "a\n"
    assert (got["duplicate"]["status"], got["duplicate"]["problem"]) == (422, "abandoned")
    assert "the streamed response was not sent whole" in got["duplicate"]["detail"]


def test_a_client_object_or_a_dotted_path_to_one_serves_as_the_setting(found: dict[str, Any]) -> None:
    """``"client"`` given as a client, or as a dotted path to a client (not a factory): it is used as it is."""
    got = case(found, "settings")
    assert got["instance"] == [201, "true"]
    assert got["dotted_instance"] == [201, "true"]


def test_a_valkey_url_without_valkey_py_is_improperly_configured(found: dict[str, Any]) -> None:
    """Without valkey-py installed a valkey:// URL is refused, naming the extra that brings it."""
    assert case(found, "settings")["valkey_missing"] == (
        "GOBLIN_CLAIM_IDEMPOTENCY['client']: a valkey:// URL needs valkey-py (goblin-claim[valkey])"
    )
