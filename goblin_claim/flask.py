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

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from . import _events, _http
from ._drivers import http_sync
from ._drivers.sync import Claim
from ._http import UNSTORED_HEADER, Answer, Options, idempotency_key

__all__ = ["Idempotency", "idempotency_key"]

View = TypeVar("View", bound=Callable[..., Any])
_OPTIONS = "_goblin_claim_options"  # a route's own Options, set by Idempotency.options()
_STATE = "_goblin_claim_request"  # on flask.g: the claimed request, until its response is settled


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
        if request.method not in options.methods:
            return None
        rule = _http.key_rule(options, request, request.root_path + request.path, marked, "flask")
        if isinstance(rule, Answer):
            return _response(rule, options.problem_docs)
        raw = request.headers.getlist(options.header)
        key = _http.key_of(options, rule, [value.encode("latin-1") for value in raw])
        if key is None:
            return None
        if isinstance(key, Answer):
            return _response(key, options.problem_docs)
        declared = request.content_length
        if declared is not None and declared > options.max_body_bytes:
            return _response(_http.problem(413, _http.too_large_detail(options, declared)), options.problem_docs)
        body = request.get_data(cache=True)
        if len(body) > options.max_body_bytes:
            return _response(_http.problem(413, _http.too_large_detail(options, len(body))), options.problem_docs)
        owner = _http.owner_of(options, request, "flask", _aborted)
        if isinstance(owner, Answer):
            return _response(owner, options.problem_docs)
        kind = request.headers.get("Content-Type")
        fp = _http.request_fingerprint(
            options, request, None if kind is None else kind.encode("latin-1"), request.query_string, body
        )
        claim = self._door.claim(request.method, request.root_path + request.path, owner, key, fp, options)
        accept = request.headers.get("Accept-Encoding")
        # One "request" event, from the claim to the settled response (after_request or teardown).
        op = _events.observing("request", claim)
        op.__enter__()
        try:
            opened = http_sync.open_claim(options, claim, fp, None if accept is None else accept.encode("latin-1"))
        except BaseException as exc:
            op.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if isinstance(opened, Answer):
            if opened.code == "key-reused":
                op.note("payload_mismatch")
            op.__exit__(None, None, None)
            return _response(opened, options.problem_docs)
        if opened is not None:  # fail_open, Redis unreachable: the view runs unclaimed, its response passes through
            op.__exit__(None, None, None)
            return None
        keep = claim.keep_alive()
        keep.__enter__()
        setattr(g, _STATE, (claim, fp, keep, options, op))
        return None

    def _after(self, response: Response) -> Response:
        state = g.pop(_STATE, None)
        if state is None:
            return response
        claim, fp, keep, options, op = state
        with op:
            return self._settle(response, claim, fp, keep, options)

    def _settle(self, response: Response, claim: Claim, fp: str, keep: Any, options: Options) -> Response:
        status = response.status_code
        if options.given_back(status):
            keep.__exit__(None, None, None)
            http_sync.give_back(claim)
            return response
        headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in response.headers.items()]
        reason = "it is a streamed response" if response.is_streamed else _http.streamed_reason(options, headers)
        if reason is None:
            body = response.get_data()
            if len(body) > options.max_response_bytes:
                reason = f"its body is larger than max_response_bytes={options.max_response_bytes}"
        if reason is not None:
            return _pass(response, claim, fp, keep, reason)
        keep.__exit__(None, None, None)
        stored = http_sync.store(
            claim, _http.stored_payload(fp, status, headers, options.keeps_header, body), status, fp
        )
        if stored == "lost":
            return _response(_http.problem(503, _http.LOST, retry=True, code="claim-lost"), options.problem_docs)
        if stored == "failed":
            response.headers[UNSTORED_HEADER[0].decode()] = UNSTORED_HEADER[1].decode()
        return response

    def _teardown(self, error: BaseException | None) -> None:
        state = g.pop(_STATE, None)
        if state is None:
            return  # settled in after_request (or never claimed)
        claim, fp, keep, _options, op = state
        op.__exit__(None if error is None else type(error), error, None)
        keep.__exit__(None, None, None)
        # after_request did not run: the request was stopped mid-view (SystemExit from
        # gunicorn's timeout, KeyboardInterrupt). The view began; it is never run again.
        what = type(error).__name__ if error is not None else "no response"
        http_sync.abandon(claim, fp, f"the worker was stopped mid-request ({what})")


def _pass(response: Response, claim: Claim, fp: str, keep: Any, reason: str) -> Response:
    """Send a response that is not kept, marked so; duplicates are told once it ended (or kept closed if not)."""
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


def _aborted(error: Exception) -> bool:
    """An HTTP exception (``abort(401)``) a scope function raised on purpose: Flask answers it."""
    return isinstance(error, HTTPException)


def _response(answer: Answer, docs: str | None) -> Response:
    """A Flask response for a whole answer (a problem or a replay)."""
    answer = _http.documented(answer, docs)
    response = Response(answer.body, status=answer.status)
    response.headers.clear()
    for name, value in answer.headers:
        response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
    return response
