"""The exchange, decided once for every door: a request's parts in, a key or an answer out; an answer in, an action.

Pure functions over plain values (no I/O, no web framework): each door reads its
framework's request into these arguments and performs what comes back. The
intake, in the order every door follows it::

    covers(options, method)                   -> intercepted, or passed to the app untouched
    admit(options, request, path, marked, values, door)
                                              -> (the rule applied, the key, an answer (400, a failed
                                                 routes function), or None: passed to the app unclaimed)
    body_refused(options, declared, size)     -> the 413, or None (read the body, then ask again with its size)
    identify(options, request, content_type, query, body, door, passes)
                                              -> Identity(owner, fp), or an answer (403, a failed scope function)

and once the app has answered (status, headers, size, streamed or not)::

    verdict(options, status, headers, ...)    -> STORE, GIVE_BACK, or Verdict("pass", "because ...")

or once the app has raised instead, while its client waited (the framework answers
500 outside the door)::

    raised(options)                           -> None: give the key back, or the 500 to keep for it

Which answers are kept is decided there alone: a 5xx is given back, or kept and
replayed with ``server_errors="store"`` (``gives_back()``, and ``raised()`` for an
exception), so every door follows the option without a rule of its own. The door's
own answers (a 503 ``store-unavailable`` or ``claim-lost``) never reach them: they
are sent, never kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from .._errors import (
    ClaimLostError,
    GoblinClaimError,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoCurrentClaimError,
    PayloadMismatchError,
    ReplayedError,
    ResultLostError,
    ResultNotSerializableError,
    StillInFlightError,
    UnreadableResultError,
)
from .answers import LOST, MISMATCH, RESULT_LOST, SERVER_ERROR, UNAVAILABLE, UNREADABLE, Answer, documented, problem
from .options import KeyRule, Options
from .request import interrupted, owner_of, request_fingerprint, still_in_flight, too_large_detail
from .response import streamed_reason
from .routes import key_of, key_rule

# What a door logs (at WARNING, on ``goblin_claim.<door>``) when it passes a response through unstored.
UNSTORED_WARNING: Final = (
    "key %s: the %s response is passed through and not kept for replay: %s; duplicates are answered 422"
)


def covers(options: Options, method: str) -> bool:
    """Whether a request with ``method`` is intercepted at all (any other passes to the app untouched)."""
    return method in options.methods


def admit(
    options: Options, request: object, path: str, marked: KeyRule | None, values: list[bytes], door: str
) -> tuple[KeyRule | None, str | Answer | None]:
    """The rule applied to the request's route, and its key, the answer refusing it, or ``None`` to pass it unclaimed.

    Args:
        options: The options of the request's route.
        request: What a ``routes`` function receives (ASGI scope, WSGI environ, a framework's request).
        path: The path ``routes`` patterns match (the one in the claim's key).
        marked: The rule the request's route carries (``idempotency_key()``, a Litestar ``opt``), if any.
        values: The key header's values, as sent.
        door: The door asking (its logger and advice, should a ``routes`` function fail).
    """
    rule = key_rule(options, request, path, marked, door)
    if isinstance(rule, Answer):
        return None, rule
    return rule, key_of(options, rule, values)


def body_refused(options: Options, declared: int | None, size: int | None = None) -> Answer | None:
    """The 413 for a body larger than ``max_body_bytes`` (declared, or read), or ``None``: nothing has run yet.

    ``size`` is ``-1`` for a body known to be too large without its size (a
    chunked body cut at the limit).
    """
    limit = options.max_body_bytes
    if declared is not None and declared > limit:
        return problem(413, too_large_detail(options, declared))
    if size is not None and (size < 0 or size > limit):
        return problem(413, too_large_detail(options, None if size < 0 else size))
    return None


@dataclass(frozen=True, slots=True)
class Identity:
    """Whose key it is (``None``: the shared space) and the request's fingerprint: with the key, the claim."""

    owner: str | None
    fp: str


def identify(
    options: Options, request: object, content_type: bytes | None, query: bytes, body: bytes, door: str,
    passes: Callable[[Exception], bool] | None = None,
) -> Identity | Answer:  # fmt: skip
    """The owner and fingerprint of a request whose body was read, or the answer refusing it (403, 500).

    ``passes``: an exception of the scope function the door's framework answers
    itself (an HTTP exception raised on purpose), re-raised rather than answered 500.
    """
    owner = owner_of(options, request, door, passes)
    if isinstance(owner, Answer):
        return owner
    return Identity(owner, request_fingerprint(options, request, content_type, query, body))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a door does with an answer: ``store``, ``pass`` (through, unkept: ``reason`` says why), ``give back``.

    A status given back is sent, not kept, and the key is released: a retry runs.
    """

    action: Literal["store", "pass", "give back"]
    reason: str = ""


STORE: Final = Verdict("store")
GIVE_BACK: Final = Verdict("give back")


def gives_back(options: Options, status: int) -> bool:
    """Whether an answer with ``status`` is sent, not kept, and its key given back.

    A status in ``release_statuses``, and every 5xx unless ``server_errors="store"``:
    then a 5xx is kept like any answer the endpoint gave (the work it committed
    before failing is not run again), and a retry gets it replayed.
    """
    if status in options.release_statuses:
        return True
    return status >= 500 and options.server_errors == "give back"


def raised(options: Options) -> Answer | None:
    """What is kept for a request whose app raised while its client waited (``None``: nothing, the key is given back).

    With ``server_errors="store"``, the 500 its duplicates get (``server-error``):
    the exception goes on to the framework, which answers the first request itself
    (its own 500 page), and every retry is answered this problem, replayed, instead
    of running the app again. A door that sees the framework's 500 response instead
    of the exception (Django's middleware, WSGI around a Flask or Django app) keeps
    that response, by ``verdict()``.
    """
    if options.server_errors == "give back":
        return None
    return documented(problem(500, SERVER_ERROR, code="server-error"), options.problem_docs)


def verdict(
    options: Options, status: int, headers: Iterable[tuple[bytes, bytes]], *, unbuffered: str | None = None,
    trailers: bool = False, size: int | None = None,
) -> Verdict:  # fmt: skip
    """What becomes of an app's answer, from what is known of it so far.

    Args:
        options: The options of the request's route.
        status: The answer's status.
        headers: Its headers (lower-case or not).
        unbuffered: Why the door cannot hold the body whole, if it cannot (a framework's
            streamed response, a file sent by the server).
        trailers: Whether it announced trailers.
        size: The body's size so far (``None``: not read yet).

    Returns:
        ``GIVE_BACK`` for a status not kept (``gives_back()``), else ``Verdict("pass", why)`` for an
        answer that cannot be kept (streamed, a stream type, too large), else ``STORE``.
    """
    if gives_back(options, status):
        return GIVE_BACK
    reason = unbuffered or streamed_reason(options, headers, trailers)
    if reason is None and size is not None:
        reason = oversize(options, size)
    return STORE if reason is None else Verdict("pass", reason)


def oversize(options: Options, size: int) -> str | None:
    """Why a body of ``size`` bytes so far cannot be kept, or ``None``."""
    if size > options.max_response_bytes:
        return f"its body is larger than max_response_bytes={options.max_response_bytes}"
    return None


def claim_lost() -> Answer:
    """The answer to a request whose claim was lost before its response was stored: a retry gets the stored one."""
    return problem(503, LOST, retry=True, code="claim-lost")


# The errors no door meets: the caller's own (a bad argument, a result that cannot be stored, its own
# error replayed, current_claim() outside a call). Nobody answers them for it: they are raised.
CALLERS_OWN: Final = (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoCurrentClaimError,
    ReplayedError,
    ResultNotSerializableError,
)


def failure_answer(options: Options, error: GoblinClaimError, waited: float | None = None) -> Answer:
    """The problem answering a request whose claim (a door's, or an ``@idempotent`` call's) raised ``error``.

    What every door answers, and what a view answers with it (Django's ``problem_response``):

    - ``StillInFlightError``: ``409`` ``in-flight`` with ``Retry-After`` (``waited``: the
      seconds the duplicate waited, said in the detail);
    - ``InterruptedWorkError``: ``409`` ``interrupted``, ``claimed_at``, no ``Retry-After``;
    - ``PayloadMismatchError``: ``422`` ``key-reused``;
    - ``ClaimLostError``: ``503`` ``claim-lost`` with ``Retry-After`` (the retry gets the stored answer);
    - ``ResultLostError``: ``500`` ``result-lost``; ``UnreadableResultError``: ``500`` ``result-unreadable``;
    - any other (the server unreachable, failing, refusing, not replicating): ``503``
      ``store-unavailable`` with ``Retry-After``.

    The errors in ``CALLERS_OWN`` are the caller's to raise, not to answer.
    """
    if isinstance(error, StillInFlightError):
        return still_in_flight(options, error.holder, waited)
    if isinstance(error, InterruptedWorkError):
        return interrupted(options, error.holder, error.claimed_at.isoformat(timespec="milliseconds"))
    if isinstance(error, PayloadMismatchError):
        return problem(422, MISMATCH)
    if isinstance(error, ClaimLostError):
        return claim_lost()
    if isinstance(error, ResultLostError):
        return problem(500, RESULT_LOST, code="result-lost")
    if isinstance(error, UnreadableResultError):
        return problem(500, UNREADABLE)
    return problem(503, UNAVAILABLE, retry=True)
