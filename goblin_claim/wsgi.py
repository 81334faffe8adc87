"""``IdempotencyMiddleware``: the ``Idempotency-Key`` header for any WSGI app, over the sync ``Claim``.

A plain WSGI middleware (Flask, Django, Pyramid, Falcon, bare WSGI under
gunicorn, uWSGI, mod_wsgi, waitress): it imports no web framework::

    app = IdempotencyMiddleware(app, client=redis.Redis(socket_timeout=2))

The rules are the ASGI middleware's, decided once in one shared core (what a key
is, its scope, the fingerprint, what is kept, the problem answers), and the
stored answers are the same envelopes: a WSGI and an ASGI service over one Redis
replay each other's responses.

A request the app began is never run again: an app that raised while its
response was still unsent gives the key back (a retry runs; with
``server_errors="store"`` a 500 problem is kept for retries instead, and the
server answers the exception as ever), but a worker
stopped mid-request (gunicorn's ``timeout`` aborts it with ``SystemExit``), or a
client gone while a passed-through response streamed, keeps the key closed
(``http_abandoned``): duplicates get ``422``. A response is stored before its
first byte is handed to the server, so a client that leaves while it is sent
still finds it on retry.

Not guaranteed: a worker killed with SIGKILL before the response was stored in
Redis (while the app runs, even after it committed its work) leaves only its
claim, which lapses after ``lease``, and a retry then runs the app again
(renewals stop with the process, so choose ``lease`` above the server's own
timeout: a worker stalled longer than ``lease`` may be run twice). With
``at_most_once=True`` it is not run again: once the lease ends, the key is
answered ``409`` ``interrupted`` until ``ttl`` ends or it is forgotten.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from . import _events, _http
from ._drivers.http_sync import SyncDoor, abandon, app_raised, give_back, mark, open_claim, passing_unstored, store
from ._drivers.keepalive import KeepAlive
from ._drivers.sync import Claim
from ._http import DEFAULT_RELEASE_STATUSES, DEFAULT_REPLAY_HEADERS, UNSTORED_HEADER, Answer, Options

__all__ = ["DEFAULT_RELEASE_STATUSES", "DEFAULT_REPLAY_HEADERS", "IdempotencyMiddleware", "StartResponse", "WSGIApp"]

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class IdempotencyMiddleware:
    """Run each ``Idempotency-Key`` request once; replay its response to every duplicate (WSGI).

    Args:
        app: The WSGI application to wrap.
        client: A sync client (``redis.Redis``, ``redis.cluster.RedisCluster``, their
            valkey-py twins or GLIDE's ``glide_sync.GlideClient``), or a function
            of no arguments returning one (called on the first intercepted request,
            so a pre-forking server makes one per worker). Give it a ``socket_timeout``.
        **options: The ASGI middleware's options (``required``, ``routes``, ``methods``,
            ``header``, ``lease``, ``ttl``, ``wait``, ``scope``, ``shared_scope``,
            ``max_body_bytes``, ``max_response_bytes``, ``replay_headers``,
            ``release_statuses``, ``server_errors``, ``fingerprint``, ``namespace``, ``fail_open``, ``at_most_once``,
            ``expose_holder``); ``scope``, a ``routes``
            function and a ``fingerprint`` function receive the WSGI environ, ``routes``
            patterns match ``SCRIPT_NAME + PATH_INFO``.

    Example::

        app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, client=redis.Redis(socket_timeout=2), required=True)

    Not guaranteed: see the module docstring (a worker killed by SIGKILL, a stall
    longer than ``lease``, unless ``at_most_once=True``).
    """

    def __init__(self, app: WSGIApp, *, client: Any, **options: Any) -> None:
        self.app = app
        self.options = _http.make_options(**options)
        self._door = SyncDoor(client, self.options, "goblin_claim.wsgi.IdempotencyMiddleware")

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Handle one WSGI request: intercepted ones here, everything else passed to the app."""
        options = self.options
        if not _http.covers(options, environ.get("REQUEST_METHOD", "GET")):
            return self.app(environ, start_response)
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        raw = environ.get("HTTP_" + options.header.upper().replace("-", "_"))
        _, key = _http.admit(options, environ, path, None, [] if raw is None else [raw.encode("latin-1")], "wsgi")
        if key is None:
            return self.app(environ, start_response)
        if isinstance(key, Answer):
            return _send(start_response, key, options.problem_docs)
        body = _read_body(options, environ)
        if isinstance(body, Answer):
            return _send(start_response, body, options.problem_docs)
        environ["wsgi.input"] = io.BytesIO(body)  # the app reads the body already read
        environ["CONTENT_LENGTH"] = str(len(body))
        query = environ.get("QUERY_STRING", "").encode("latin-1")
        who = _http.identify(options, environ, _latin1(environ.get("CONTENT_TYPE")), query, body, "wsgi")
        if isinstance(who, Answer):
            return _send(start_response, who, options.problem_docs)
        claim = self._door.claim(environ["REQUEST_METHOD"], path, who.owner, key, who.fp)
        # One "request" event, taking the outcome of the claim's round trips inside it.
        with _events.observing("request", claim):
            opened = open_claim(options, claim, who.fp, _latin1(environ.get("HTTP_ACCEPT_ENCODING")))
            if isinstance(opened, Answer):
                return _send(start_response, opened, options.problem_docs)
            if opened is not None:  # fail_open, Redis unreachable: the app runs unclaimed, its response passes through
                return self.app(environ, start_response)
            return _Run(self, claim, who.fp).run(environ, start_response)


class _Run:
    """One claimed WSGI request: run the app, buffer and store its response, or pass it through."""

    def __init__(self, owner: IdempotencyMiddleware, claim: Claim, fp: str) -> None:
        self._options = owner.options
        self._app = owner.app
        self._claim = claim
        self._fp = fp
        self._status: str | None = None
        self._headers: list[tuple[str, str]] = []
        self._chunks: list[bytes] = []

    def _start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        # Nothing is sent before the app returned its iterable and it was read (or
        # passed on), so a second call with exc_info simply replaces the first.
        self._status, self._headers = status, list(headers)
        return self._chunks.append  # the legacy write(): its bytes come first

    def run(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        keep = self._claim.keep_alive()
        keep.__enter__()
        iterator: Iterator[bytes] = iter(())  # the app's, once it returned
        result: Iterable[bytes] | None = None
        try:
            result = self._app(environ, self._start_response)
            iterator = iter(result)
            size = sum(len(chunk) for chunk in self._chunks)
            reason: str | None = None
            for chunk in iterator:
                if chunk:
                    self._chunks.append(chunk)
                    size += len(chunk)
                reason = self._pass_reason(size)
                if reason is not None:
                    break
            else:
                reason = self._pass_reason(size)
        except BaseException as error:
            _close(result)
            keep.__exit__(None, None, None)
            if isinstance(error, Exception):
                # The app failed before any byte was sent: a retry runs at once, or (server_errors="store") gets a 500.
                app_raised(self._options, self._claim, self._fp)
            else:
                # SystemExit (gunicorn's timeout), KeyboardInterrupt: the app began, what it did is unknown.
                abandon(self._claim, self._fp, f"the worker was stopped mid-request ({type(error).__name__})")
            raise
        if self._status is None:
            _close(result)
            keep.__exit__(None, None, None)
            abandon(self._claim, self._fp, "the app returned without calling start_response")
            raise RuntimeError("the WSGI app returned without calling start_response")
        if reason is None:
            _close(result)
            keep.__exit__(None, None, None)
            return self._store_and_send(start_response)
        return self._pass(start_response, reason, result, iterator, keep)

    def _status_code(self) -> int:
        assert self._status is not None
        return int(self._status.split(" ", 1)[0])

    def _byte_headers(self) -> list[tuple[bytes, bytes]]:
        return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in self._headers]

    def _pass_reason(self, size: int) -> str | None:
        """Why the response is passed through rather than stored (``"given back"`` for a status not kept)."""
        if self._status is None:
            return None
        action = _http.verdict(self._options, self._status_code(), self._byte_headers(), size=size)
        return "given back" if action is _http.GIVE_BACK else action.reason or None

    def _store_and_send(self, start_response: StartResponse) -> Iterable[bytes]:
        assert self._status is not None
        status, body = self._status_code(), b"".join(self._chunks)
        payload = _http.stored_payload(self._fp, status, self._byte_headers(), self._options.keeps_header, body)
        stored = store(self._claim, payload, status, self._fp)
        if stored == "lost":
            return _send(start_response, _http.claim_lost(), self._options.problem_docs)
        headers = self._headers
        if stored == "failed":
            headers = [*headers, _text(UNSTORED_HEADER)]
        start_response(self._status, headers)
        return [body]

    def _pass(
        self, start_response: StartResponse, reason: str, result: Any, iterator: Iterator[bytes], keep: KeepAlive
    ) -> Iterable[bytes]:
        assert self._status is not None
        unstored = None if reason == "given back" else reason
        headers = self._headers
        if unstored is not None:
            passing_unstored("wsgi", self._claim, self._status_code(), unstored)
            headers = [*headers, _text(UNSTORED_HEADER)]
        start_response(self._status, headers)
        return _Passing(self, unstored, list(self._chunks), result, iterator, keep)


class _Passing:
    """A passed-through response: the server iterates it; the key is settled once.

    Ended whole, the key is settled before the last chunk goes out, so a client that
    saw it all and retries is told (an unstored response is marked: duplicates get
    422) or runs again (a status not kept gives the key back). Closed before its end
    (the client left), or broken by the app: ``close()`` gives the key back for a
    status not kept, else keeps it closed.
    """

    def __init__(
        self, run: _Run, unstored: str | None, held: list[bytes], result: Any, rest: Iterator[bytes],
        keep: KeepAlive,
    ) -> None:  # fmt: skip
        self._run = run
        self._unstored = unstored
        self._held = held
        self._result = result
        self._rest = rest
        self._keep = keep
        self._ended = False
        self._settled = False
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        held, self._held = self._held, []
        last: bytes | None = None
        for chunk in itertools.chain(held, self._rest):  # one chunk ahead: the last is known before it goes
            if last is not None:
                yield last
            last = chunk
        self._ended = True
        self._settle()
        if last is not None:
            yield last

    def _settle(self) -> None:
        """Give the key back (a status not kept), mark it (ended whole) or keep it closed (cut short): once."""
        if self._settled:
            return
        self._settled = True
        self._keep.__exit__(None, None, None)
        claim, fp = self._run._claim, self._run._fp
        if self._unstored is None:
            give_back(claim)
        elif self._ended:
            mark(claim, _http.unstored_payload(fp, self._run._status_code(), self._unstored))
        else:
            abandon(claim, fp, "the response was not sent whole (the client left, or the app failed mid-stream)")

    def close(self) -> None:
        """Called by the server once it is done with the response, whole or not."""
        if self._closed:
            return
        self._closed = True
        try:
            _close(self._result)
        finally:
            self._settle()


# --------------------------------------------------------------------------- small pieces


def _read_body(options: Options, environ: Environ) -> bytes | Answer:
    """The request body (up to ``max_body_bytes``), or the answer refusing it; nothing has run yet."""
    declared = _http.declared_length(environ.get("CONTENT_LENGTH") or None)
    stream = environ["wsgi.input"]
    refused = _http.body_refused(options, declared)
    if refused is not None:
        return refused
    if declared is not None:
        body = stream.read(declared) if declared else b""
        if len(body) < declared:  # the client left before sending its body: nothing ran
            return _http.problem(400, "the request body ended before its Content-Length")
        return bytes(body)
    if environ.get("wsgi.input_terminated"):  # a chunked body the server ends for us
        body = stream.read(options.max_body_bytes + 1)
        # Cut at the limit: its whole size is unknown.
        return _http.body_refused(options, None, -1 if len(body) > options.max_body_bytes else 0) or bytes(body)
    return b""  # no length and no terminated stream: WSGI says there is no body to read


def _send(start_response: StartResponse, answer: Answer, docs: str | None) -> list[bytes]:
    """Send a whole answer (a problem or a replay)."""
    answer = _http.documented(answer, docs)
    start_response(_status_line(answer.status), [_text(pair) for pair in answer.headers])
    return [answer.body]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _latin1(value: str | None) -> bytes | None:
    return None if value is None else value.encode("latin-1")


def _text(pair: tuple[bytes, bytes]) -> tuple[str, str]:
    return pair[0].decode("latin-1"), pair[1].decode("latin-1")


def _close(result: object) -> None:
    close = getattr(result, "close", None)
    if callable(close):
        close()
