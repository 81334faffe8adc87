"""The request's side: its key, its owner, its fingerprint, the claim's name and token, its size."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Final

from .._errors import InvalidArgumentTypeError
from .._protocol.checks import describe
from .._protocol.record import fingerprinted_token, holder_fp, split_token
from .answers import IN_FLIGHT, INTERRUPTED, MISMATCH, NO_OWNER, Answer, problem
from .failures import misconfigured
from .options import Options

MAX_KEY_LENGTH: Final = 255


def parse_key(header: str, values: list[bytes]) -> str | Answer:
    """The key in the header's ``values``, or the 400 that answers them.

    A bare token (Stripe's form) or an RFC 8941 sf-string (the IETF draft's
    ``"..."``), whose parameters (``"k";v=1``) are ignored; a malformed string is
    refused rather than guessed at.
    """
    if len(values) > 1:
        return problem(400, f"send one {header} header, not {len(values)}")
    raw = values[0].strip(b" \t")
    if raw.startswith(b'"'):
        parsed = _sf_string(raw)
        if parsed is None:
            return problem(400, f"the {header} header is not a well-formed structured-field string (RFC 8941)")
        raw = parsed
    if not 0 < len(raw) <= MAX_KEY_LENGTH or not all(0x20 <= byte < 0x7F for byte in raw):
        return problem(400, f"the {header} header must be 1 to {MAX_KEY_LENGTH} printable ASCII characters")
    return raw.decode("ascii")


_BARE_ITEM = (
    rb'(?:"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'  # an sf-string
    rb"|[A-Za-z*][!#$%&'*+\-.^_`|~:/0-9A-Za-z]*"  # a token
    rb"|-?[0-9]{1,15}(?:\.[0-9]{1,3})?|\?[01]|:[A-Za-z0-9+/=]*:)"  # a number, a boolean, a byte sequence
)
_PARAMETERS = re.compile(rb"(?: *; *[a-z*][a-z0-9_\-.*]*(?:=" + _BARE_ITEM + rb")?)* *")


def _sf_string(raw: bytes) -> bytes | None:
    """An RFC 8941 sf-string with optional parameters, unescaped; ``None`` when malformed."""
    out = bytearray()
    index = 1
    while True:
        if index >= len(raw):
            return None  # no closing quote
        byte = raw[index]
        if byte == 0x5C:  # a backslash escapes only DQUOTE and itself
            if index + 1 >= len(raw) or raw[index + 1] not in (0x22, 0x5C):
                return None
            out.append(raw[index + 1])
            index += 2
            continue
        if byte == 0x22:
            break
        if not 0x20 <= byte < 0x7F:
            return None
        out.append(byte)
        index += 1
    # Parameters (RFC 8941 section 3.1.2) are ignored, but they must be parameters.
    return bytes(out) if _PARAMETERS.fullmatch(raw[index + 1 :]) else None


def owner_of(
    options: Options, request: object, door: str = "http", passes: Callable[[Exception], bool] | None = None
) -> str | Answer | None:
    """Whose key this is: the scope function's answer as text, ``None`` (shared space), or the answer refusing it.

    With a scope function, ``None`` or an empty value fails closed (answered 403
    without running the app) unless ``shared_scope`` opts into a shared space: a
    middleware placed before authentication would otherwise hand one user's answer
    to another. A ``str``, an ``int`` (not ``bool``) or a ``UUID`` is accepted. A
    scope function that raises, or returns anything else, is answered 500
    (``scope-failed``, naming the cause and the fix, logged once) without
    running the app, except an exception ``passes`` lets through: the door's
    framework answers its own (Flask's ``abort(401)``, Django's ``PermissionDenied``).
    """
    if options.scope is None:
        return None
    try:
        owner = options.scope(request)
    except Exception as exc:
        if passes is not None and passes(exc):
            raise
        return misconfigured(door, "scope", options.scope, error=exc)
    if owner is None or owner == "":
        return None if options.shared_scope else problem(403, NO_OWNER)
    if type(owner) is str:
        return owner
    if type(owner) is int:
        return f"int:{owner}"  # never the same space as the string "7"
    if isinstance(owner, uuid.UUID):
        return f"uuid:{owner}"
    return misconfigured(door, "scope", options.scope, value=owner)


def request_fingerprint(
    options: Options, request: object, content_type: bytes | None, query: bytes, body: bytes
) -> str:
    """The fingerprint of a request's query string and body, by the configured strategy.

    ``auto`` (the default) picks by content type: JSON bodies are compared as
    canonical JSON (key order and spacing do not matter), form bodies by their
    fields, multipart bodies by each part's name, filename, type and content hash
    (not the boundary, which clients draw anew per request); anything else, or a
    body that does not parse as its type says, byte for byte.
    """
    strategy = options.fingerprint
    if callable(strategy):
        made = strategy(request)
        if not isinstance(made, (str, bytes)):
            raise InvalidArgumentTypeError(f"the fingerprint function must return str or bytes, not {describe(made)}")
        return fingerprint(b"fn", made.encode() if isinstance(made, str) else made)
    mime, _, params = (content_type or b"").partition(b";")
    mime = mime.strip().lower()
    if strategy == "auto":
        if mime == b"application/json" or (mime.startswith(b"application/") and mime.endswith(b"+json")):
            strategy = "json"
        elif mime == b"application/x-www-form-urlencoded":
            strategy = "form"
        elif mime == b"multipart/form-data":
            strategy = "multipart"
        else:
            strategy = "bytes"
    canonical: bytes | None = None
    if strategy == "json":
        canonical = _canonical_json(body)
    elif strategy == "form":
        canonical = _canonical_form(body)
    elif strategy == "multipart":
        canonical = _canonical_multipart(body, params)
    if canonical is None:
        return fingerprint(query, body)
    return fingerprint(query, f"{strategy}:".encode() + canonical)


def _canonical_json(body: bytes) -> bytes | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _canonical_form(body: bytes) -> bytes | None:
    try:
        fields = urllib.parse.parse_qsl(body.decode("latin-1"), keep_blank_values=True, strict_parsing=bool(body))
    except ValueError:
        return None
    # Field order between names does not matter; the order of one name's values does.
    return json.dumps(sorted(fields, key=lambda pair: pair[0])).encode()


def _canonical_multipart(body: bytes, params: bytes) -> bytes | None:
    boundary = None
    for param in params.split(b";"):
        name, _, value = param.strip().partition(b"=")
        if name.lower() == b"boundary":
            boundary = value.strip().strip(b'"')
    if not boundary:
        return None
    delimiter = b"--" + boundary
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        return None  # no closing delimiter: not the multipart body it claims to be
    parts: list[list[str]] = []
    for chunk in chunks[1:-1]:
        head, found, content = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not found:
            return None
        content = content.removesuffix(b"\r\n")
        disposition, kind = b"", b""
        for line in head.split(b"\r\n"):
            header, _, value = line.partition(b":")
            if header.strip().lower() == b"content-disposition":
                disposition = value.strip()
            elif header.strip().lower() == b"content-type":
                kind = value.strip().lower()
        field = _disposition_param(disposition, b"name")
        filename = _disposition_param(disposition, b"filename")
        parts.append([field, filename, kind.decode("latin-1"), hashlib.sha256(content).hexdigest()])
    parts.sort(key=lambda part: part[0])  # by field name, one name's parts kept in order
    return json.dumps(parts).encode()


def _disposition_param(disposition: bytes, wanted: bytes) -> str:
    for param in disposition.split(b";")[1:]:
        name, _, value = param.strip().partition(b"=")
        if name.lower() == wanted:
            return value.strip().strip(b'"').decode("latin-1")
    return ""


def fingerprint(query: bytes, body: bytes) -> str:
    """The request's fingerprint: its query string and body, exactly."""
    # The query string's length first, so no split of query and body collides with another.
    digest = hashlib.sha256(len(query).to_bytes(8, "big"))
    digest.update(query)
    digest.update(body)
    return digest.hexdigest()[:32]


def claim_name(method: str, path: str, owner: str | None, key: str) -> str:
    """The claim's key: method, path, owner and the client's key (one operation per endpoint and owner)."""
    return json.dumps([method, path, owner, key], separators=(",", ":"))


def claim_token(fp: str) -> str:
    """A fresh token carrying the request's fingerprint, so an in-flight duplicate is compared in one reply."""
    return fingerprinted_token(fp)


def in_flight(options: Options, holder: object, fp: str) -> Answer | None:
    """The answer to a duplicate of a request still running, or ``None`` when it should wait for it."""
    if holder_fp(holder) not in (None, fp):
        return problem(422, MISMATCH)
    if options.wait == 0:
        return problem(409, IN_FLIGHT, retry=True, extra=holder_member(options, holder))
    return None


def still_in_flight(options: Options, holder: str | None, waited: float | None = None) -> Answer:
    """The answer to a duplicate whose wait ended with the first request still running (``waited``: for how long)."""
    detail = IN_FLIGHT if waited is None else f"{IN_FLIGHT} (waited {waited:g}s)"
    return problem(409, detail, retry=True, extra=holder_member(options, holder))


def interrupted(options: Options, holder: str, claimed_at: str) -> Answer:
    """The answer to a request whose key's at-most-once attempt ended without a response: no Retry-After.

    ``claimed_at`` (RFC 3339, UTC) says when that attempt began; the holder's token
    only with ``expose_holder``.
    """
    extra = {"claimed_at": claimed_at, **holder_member(options, holder)}
    return problem(409, INTERRUPTED, code="interrupted", extra=extra)


def holder_member(options: Options, holder: object) -> dict[str, str]:
    """The ``holder`` extension member of a 409 (the holder's token, without its fingerprint), with ``expose_holder``.

    Off by default: a token may name a worker or a request.
    """
    if not options.expose_holder or holder is None or holder is False:
        return {}
    raw = holder if isinstance(holder, bytes) else str(holder).encode("utf-8", "surrogatepass")
    return {"holder": split_token(raw)[0].decode("utf-8", "replace")}


def too_large_detail(options: Options, size: int | None) -> str:
    """Why a request body is refused 413."""
    told = f"{size} bytes" if size is not None else "the body"
    return (
        f"{told} is more than the {options.max_body_bytes} bytes this server fingerprints for {options.header} "
        "requests; the request was not run"
    )


def declared_length(value: bytes | str | None) -> int | None:
    """A ``Content-Length`` value as an int, or ``None`` when absent or not a number."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return int(text) if text.isdigit() else None
