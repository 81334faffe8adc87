"""What is stored under a key (the response, or why none was kept), the payloads written, and ``replay()``.

One envelope format for every door: a response stored by the WSGI middleware
is replayed by the ASGI one over the same Redis, and the reverse.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterable
from typing import Annotated, Final, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .answers import ABANDONED, MISMATCH, UNREADABLE, Answer, problem

NO_BODY_STATUSES: Final = frozenset({*range(100, 200), 204, 304})
# How long a response's store is retried through a dropped connection, at most.
STORE_WINDOW: Final = 10.0
REPLAYED_HEADER: Final = (b"idempotent-replayed", b"true")
UNSTORED_HEADER: Final = (b"idempotent-stored", b"false")

_STORED_CONFIG = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


class StoredResponse(BaseModel):
    """A first response, kept for duplicates: ``{"goblin":1,"kind":"http_response",...}``.

    Attributes:
        fp: The fingerprint of the first request's query string and body.
        status: Its status code.
        headers: The allow-listed response headers, names lower-case, in order (latin-1 text).
        body: The body, exactly (base64 in JSON).
    """

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_response"] = "http_response"
    fp: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class UnstoredResponse(BaseModel):
    """The first request ran, but its response was not kept (too large, streamed): duplicates are told so."""

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_unstored"] = "http_unstored"
    fp: str
    status: int
    reason: str


class AbandonedRequest(BaseModel):
    """The first request started running but ended without a whole response: what it did is unknown.

    Kept as the key's terminal outcome (fail closed): the client left, or the
    server cancelled or killed the request, after the app began; running it again
    could do its work twice, so duplicates are told instead.
    """

    model_config = _STORED_CONFIG

    goblin: Literal[1] = 1
    kind: Literal["http_abandoned"] = "http_abandoned"
    fp: str
    reason: str


ENVELOPE: TypeAdapter[StoredResponse | UnstoredResponse | AbandonedRequest] = TypeAdapter(
    Annotated[
        Union[StoredResponse, UnstoredResponse, AbandonedRequest],  # noqa: UP007 -- 3.10
        Field(discriminator="kind"),
    ]
)


def replay(stored: bytes | str, fp: str, accept_encoding: bytes | None = None) -> Answer:
    """What a duplicate gets for the value stored under its key (the first response, or a problem).

    A stored body compressed by something inside the middleware (``gzip`` or
    ``deflate``) is decompressed for a duplicate whose ``Accept-Encoding`` refuses
    that coding, so each client gets what it can read.
    """
    try:
        envelope = ENVELOPE.validate_json(stored)
    except ValidationError:
        # Never the stored bytes themselves: they may be another writer's secret.
        return problem(500, UNREADABLE)
    if envelope.fp != fp:
        return problem(422, MISMATCH)
    if isinstance(envelope, AbandonedRequest):
        return problem(422, f"{ABANDONED} ({envelope.reason})", code="abandoned")
    if isinstance(envelope, UnstoredResponse):
        # 422, as for a reused key: no standard retrying client retries it, and it is final.
        return problem(
            422,
            f"the first request with this key was run and answered {envelope.status}, but its response was not "
            f"kept ({envelope.reason}); it is not run again: use a new key to run it again",
            code="not-kept",
        )
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in envelope.headers]
    body = envelope.body
    coding = next((value.strip().lower() for name, value in headers if name == b"content-encoding"), None)
    if coding in _DECODERS and not _accepts(accept_encoding, coding):
        assert coding is not None
        with contextlib.suppress(zlib.error):  # undecodable: replayed as it was stored
            body = _DECODERS[coding](body)
            headers = [(name, value) for name, value in headers if name != b"content-encoding"]
    if envelope.status not in NO_BODY_STATUSES:  # RFC 9110 section 8.6: never on 1xx, 204 or 304
        headers.append((b"content-length", str(len(body)).encode()))
    headers.append(REPLAYED_HEADER)
    return Answer(envelope.status, headers, body)


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)  # "deflate" as RFC 9110 defines it: zlib-wrapped
    except zlib.error:
        return zlib.decompress(body, -zlib.MAX_WBITS)  # the raw deflate some servers send


_DECODERS: Final[dict[bytes, Callable[[bytes], bytes]]] = {
    b"gzip": lambda body: zlib.decompress(body, 16 + zlib.MAX_WBITS),
    b"x-gzip": lambda body: zlib.decompress(body, 16 + zlib.MAX_WBITS),
    b"deflate": _inflate,
}


def _accepts(accept_encoding: bytes | None, coding: bytes) -> bool:
    """Whether ``Accept-Encoding`` admits ``coding`` (RFC 9110 section 12.5.3: no header admits any)."""
    if accept_encoding is None:
        return True
    weights: dict[bytes, float] = {}
    for item in accept_encoding.lower().split(b","):
        name, _, params = item.strip().partition(b";")
        weight = 1.0
        for param in params.split(b";"):
            key, _, value = param.strip().partition(b"=")
            if key == b"q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if name:
            weights[name.strip()] = weight
    alias = b"gzip" if coding == b"x-gzip" else coding
    weight = weights.get(coding, weights.get(alias, weights.get(b"*", 0.0)))
    return weight > 0


def stored_payload(
    fp: str, status: int, headers: Iterable[tuple[bytes, bytes]], keep: Callable[[bytes], bool], body: bytes
) -> bytes:
    """The envelope of a whole response, keeping the headers ``keep`` (of a lower-case name) says are replayed."""
    kept = [(n.lower().decode("latin-1"), v.decode("latin-1")) for n, v in headers if keep(n.lower())]
    return StoredResponse(fp=fp, status=status, headers=kept, body=body).model_dump_json().encode()


def unstored_payload(fp: str, status: int, reason: str) -> bytes:
    """The marker of a response that ran but was not kept."""
    return UnstoredResponse(fp=fp, status=status, reason=reason).model_dump_json().encode()


def abandoned_payload(fp: str, reason: str) -> bytes:
    """The marker of a request that began and ended without a whole response."""
    return AbandonedRequest(fp=fp, reason=reason).model_dump_json().encode()
