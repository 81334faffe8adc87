"""Answers a door sends whole: ``Answer``, the RFC 9457 ``problem()`` and the words of each problem."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

RETRY_AFTER: Final = b"1"

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Answer:
    """A whole response a door sends as it is: a problem, or a replay."""

    status: int
    headers: Headers
    body: bytes
    code: str = ""  # a problem's kind, the fragment of its documentation link


MISMATCH: Final = (
    "this idempotency key was already used with a different request body or query string; "
    "use a new key for a new request"
)
IN_FLIGHT: Final = "a request with this idempotency key is still being processed; retry after it finishes"
LOST: Final = (
    "this request ran, but its claim on the idempotency key was lost before its response was stored (its lease "
    "lapsed, or another request holds the key); "
    "retry to get the stored response"
)
UNAVAILABLE: Final = "the idempotency store is unavailable, so the request was not run; retry later"
ABANDONED: Final = (
    "a request with this idempotency key started running but ended without a whole response, so whether it took "
    "effect is unknown; it is not run again: check the outcome, or use a new key to run it again"
)
INTERRUPTED: Final = (
    "a request with this idempotency key started running under at-most-once and ended without a response (its "
    "worker stopped, or lost the key), so whether it took effect is unknown; it is not run again, and retrying will "
    "not help: check the outcome, then use a new key to run it again, or ask the operator to reopen this one"
)
UNREADABLE: Final = "the stored response for this key is unreadable (written by something else?)"
RESULT_LOST: Final = (
    "the first request with this idempotency key completed, but its stored response is missing; "
    "an operator can reopen the key"
)
SERVER_ERROR: Final = (
    "the first request with this idempotency key failed with a server error after it began, and that failure is "
    "kept as its answer, so it is not run again: check whether it took effect, then use a new key to run it again"
)
NO_OWNER: Final = (
    "this request has no owner for its idempotency key (the scope function found no user or tenant), so it was "
    "not run: authenticate, or have the idempotency middleware run after authentication"
)


# A problem type's own title, where it has a type of its own (problem_docs): about:blank's is the status phrase.
_TITLES: Final = {"interrupted": "Interrupted request"}
# The members every problem has; any other is an extension member (RFC 9457 section 3.2).
_MEMBERS: Final = frozenset({"type", "title", "status", "detail"})

_CODES: Final = {
    400: "key-invalid", 403: "no-owner", 409: "in-flight", 413: "body-too-large", 422: "key-reused",
    500: "result-unreadable", 503: "store-unavailable",
}  # fmt: skip


def problem(
    status: int, detail: str, *, retry: bool = False, code: str = "", docs: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> Answer:  # fmt: skip
    """An RFC 9457 problem: ``application/problem+json`` with type, title, status and detail.

    ``type`` is ``about:blank`` (its title the status phrase), or ``<docs>#<code>`` with a
    documentation link (the Idempotency-Key draft's SHOULD): one anchor per kind of
    problem, and its own title where it has one. ``extra``: extension members.
    """
    code = code or _CODES.get(status, "error")
    title = _TITLES.get(code, HTTPStatus(status).phrase) if docs else HTTPStatus(status).phrase
    kind = f"{docs}#{code}" if docs else "about:blank"
    members = {"type": kind, "title": title, "status": status, "detail": detail}
    body = json.dumps({**members, **extra} if extra else members).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if retry:
        headers.append((b"retry-after", RETRY_AFTER))
    return Answer(status, headers, body, code)


def documented(answer: Answer, docs: str | None) -> Answer:
    """``answer`` with its problem ``type`` linking to ``docs`` (a replay, or no link, is unchanged)."""
    if not docs or not answer.code:
        return answer
    body = json.loads(answer.body)
    extra = {name: value for name, value in body.items() if name not in _MEMBERS}
    retry = any(name == b"retry-after" for name, _ in answer.headers)
    return problem(answer.status, body["detail"], retry=retry, code=answer.code, docs=docs, extra=extra)
