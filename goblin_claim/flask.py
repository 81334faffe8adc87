"""Flask's door to the ``Idempotency-Key`` rules: an extension, with per-route options.

::

    idempotency = Idempotency(app, client=redis.Redis(socket_timeout=2), scope=lambda request: g.user_id)
    # or, in an app factory: idempotency = Idempotency(client=...); idempotency.init_app(app)

    @app.post("/charges")
    @idempotency.options(required=True, ttl=3600)   # this route's own options
    def charge(): ...

    @app.post("/webhook")
    @idempotency_key("ignore")                      # never claimed, with a key or without
    def webhook(): ...

It acts in ``before_request``, once routing is done: a request no route matches
(a 404 or 405 from the router) passes through unclaimed; register your
authentication's ``before_request`` first, so ``scope`` sees who is calling.
Every decision (key, scope, fingerprint, what is kept, problem answers) is the
shared core's and the stored envelopes are the other doors', so a Flask service
and an ASGI one over one Redis replay each other's answers.

Not guaranteed: as for any WSGI app (``goblin_claim.wsgi``), a worker killed by
SIGKILL leaves its claim to lapse after ``lease``, and a retry then runs again
(with ``at_most_once=True`` it does not: the key is answered ``409`` ``interrupted``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, g, got_request_exception, request
from werkzeug.exceptions import HTTPException

from . import _events, _http
from ._drivers import http_sync
from ._drivers.sync import Claim
from ._http import UNSTORED_HEADER, Answer, Options, idempotency_key

__all__ = ["Idempotency", "idempotency_key"]

View = TypeVar("View", bound=Callable[..., Any])
_OPTIONS = "_goblin_claim_options"  # a route's own Options, set by Idempotency.options()
_STATE = "_goblin_claim_request"  # on flask.g: the claimed request, until its response is settled
_RAISED = "_goblin_claim_raised"  # on flask.g: the request raised, and Flask answers it 500 (got_request_exception)


class Idempotency:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate (Flask).

    Args:
        app: The Flask app, or ``None`` to call ``init_app`` later (app factories).
        client: A sync client (``redis.Redis``, ``redis.cluster.RedisCluster``, their
            valkey-py twins or GLIDE's ``glide_sync.GlideClient``), or a function of no
            arguments returning one (made on the first intercepted request).
        **options: The ASGI middleware's options; ``scope`` receives Flask's ``request``.

    Example::

        idempotency = Idempotency(app, client=redis.Redis(socket_timeout=2), required=True)
    """

    def __init__(self, app: Flask | None = None, *, client: Any, **options: Any) -> None:
        self._given = _http.DEFAULTS.over(options)
        self.defaults = self._given.checked()
        self._door = http_sync.SyncDoor(client, self.defaults, "goblin_claim.flask.Idempotency")
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Install the extension's request hooks on ``app``."""
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)
        got_request_exception.connect(_note_raised, app, weak=False)
        app.extensions["goblin_claim"] = self

    def options(self, **overrides: Any) -> Callable[[View], View]:
        """A route's own options, over the extension's (validated now, at decoration).

        Example::

            @app.post("/refunds")
            @idempotency.options(required=True, wait=5)
            def refund(): ...
        """
        chosen = self._given.over(overrides).checked()

        def decorate(view: View) -> View:
            setattr(view, _OPTIONS, chosen)
            return view

        return decorate

    # -- the hooks

    def _route_options(self, app: Flask) -> tuple[Options, _http.KeyRule | None]:
        """The view's options (its own, or the extension's) and its ``idempotency_key()`` mark."""
        view = app.view_functions.get(request.endpoint or "")
        own = getattr(view, _OPTIONS, None)
        return (own if isinstance(own, Options) else self.defaults), _http.marked_rule(view)

    def _before(self) -> Response | None:
        if request.routing_exception is not None or request.endpoint is None:
            return None  # no route: the router's 404 or 405 is never kept
        from flask import current_app

        options, marked = self._route_options(current_app)
        if not _http.covers(options, request.method):
            return None
        path = request.root_path + request.path
        values = [value.encode("latin-1") for value in request.headers.getlist(options.header)]
        _, key = _http.admit(options, request, path, marked, values, "flask")
        if key is None:
            return None
        if isinstance(key, Answer):
            return _response(key, options.problem_docs)
        refused = _http.body_refused(options, request.content_length)
        body = b"" if refused else request.get_data(cache=True)
        refused = refused or _http.body_refused(options, None, len(body))
        if refused:
            return _response(refused, options.problem_docs)
        kind = request.headers.get("Content-Type")
        who = _http.identify(options, request, _latin1(kind), request.query_string, body, "flask", _aborted)
        if isinstance(who, Answer):
            return _response(who, options.problem_docs)
        claim = self._door.claim(request.method, path, who.owner, key, who.fp, options)
        # One "request" event, from the claim to the settled response (after_request or teardown).
        op = _events.observing("request", claim)
        op.__enter__()
        try:
            opened = http_sync.open_claim(options, claim, who.fp, _latin1(request.headers.get("Accept-Encoding")))
        except BaseException as exc:
            op.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if opened is not None:  # an answer; or fail_open, Redis unreachable: the view runs unclaimed
            op.__exit__(None, None, None)
            return _response(opened, options.problem_docs) if isinstance(opened, Answer) else None
        keep = claim.keep_alive()
        keep.__enter__()
        setattr(g, _STATE, (claim, who.fp, keep, options, op))
        return None

    def _after(self, response: Response) -> Response:
        state = g.pop(_STATE, None)
        if state is None:
            return response
        claim, fp, keep, options, op = state
        with op:
            return self._settle(response, claim, fp, keep, options)

    def _settle(self, response: Response, claim: Claim, fp: str, keep: Any, options: Options) -> Response:
        if g.pop(_RAISED, False):
            # Flask's 500 for an exception the view raised: as any door's raised app, a retry runs, or gets a 500.
            keep.__exit__(None, None, None)
            http_sync.app_raised(options, claim, fp)
            return response
        status = response.status_code
        headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in response.headers.items()]
        streamed = "it is a streamed response" if response.is_streamed else None
        body = b"" if streamed else response.get_data()
        action = _http.verdict(options, status, headers, unbuffered=streamed, size=len(body))
        if action is _http.GIVE_BACK:
            keep.__exit__(None, None, None)
            http_sync.give_back(claim)
            return response
        if action.action == "pass":
            return _pass(response, claim, fp, keep, action.reason)
        keep.__exit__(None, None, None)
        stored = http_sync.store(
            claim, _http.stored_payload(fp, status, headers, options.keeps_header, body), status, fp
        )
        if stored == "lost":
            return _response(_http.claim_lost(), options.problem_docs)
        if stored == "failed":
            response.headers[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        return response

    def _teardown(self, error: BaseException | None) -> None:
        state = g.pop(_STATE, None)
        if state is None:
            return  # settled in after_request (or never claimed)
        claim, fp, keep, options, op = state
        op.__exit__(None if error is None else type(error), error, None)
        keep.__exit__(None, None, None)
        if isinstance(error, Exception):
            # Raised with PROPAGATE_EXCEPTIONS (testing, debug), where Flask makes no 500 for
            # after_request: as any door's raised app, a retry runs, or gets the 500 kept.
            http_sync.app_raised(options, claim, fp)
            return
        # after_request did not run: the request was stopped mid-view (SystemExit from
        # gunicorn's timeout, KeyboardInterrupt). The view began; it is never run again.
        what = type(error).__name__ if error is not None else "no response"
        http_sync.abandon(claim, fp, f"the worker was stopped mid-request ({what})")


def _pass(response: Response, claim: Claim, fp: str, keep: Any, reason: str) -> Response:
    """Send a response that is not kept, marked so; duplicates are told once it ended (or kept closed if not)."""
    http_sync.passing_unstored("flask", claim, response.status_code, reason)
    response.headers[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
    marker = _http.unstored_payload(fp, response.status_code, reason)
    if not response.is_streamed:
        keep.__exit__(None, None, None)
        http_sync.mark(claim, marker)
        return response
    response.response = _http.passed_through(
        response.response, keep, functools.partial(http_sync.mark, claim, marker),
        functools.partial(http_sync.abandon, claim, fp, _http.CUT_STREAM),
    )  # fmt: skip
    return response


def _note_raised(sender: Flask, **extra: Any) -> None:
    """``got_request_exception``: the request raised what no error handler answered; Flask answers it 500."""
    setattr(g, _RAISED, True)


def _aborted(error: Exception) -> bool:
    """An HTTP exception (``abort(401)``) a scope function raised on purpose: Flask answers it."""
    return isinstance(error, HTTPException)


def _latin1(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def _response(answer: Answer, docs: str | None) -> Response:
    """A Flask response for a whole answer (a problem or a replay)."""
    answer = _http.documented(answer, docs)
    response = Response(answer.body, status=answer.status)
    response.headers.clear()
    for name, value in answer.headers:
        response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
    return response
