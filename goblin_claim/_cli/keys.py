"""``goblin-claim inspect`` and ``forget``: one key's record, found by the operator's name for it."""

from __future__ import annotations

import argparse
import json
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

from .. import _http
from .._clients.families import RESPONSE_ERRORS
from .._decorator.codec import Codec, ErrorEnvelope, ResultEnvelope, UnstorableEnvelope
from .._errors import GoblinClaimError, InvalidArgumentError
from .._handle import CHECKPOINT_SUFFIX
from .._protocol.record import FENCE_SUFFIX, build_keys, split_done, split_token
from .connect import Client
from .findings import _text
from .scan import _TASK, claimed_at, held_parts

# --------------------------------------------------------------------------- inspect and forget


@dataclass
class KeyReport:
    """What a key's record holds, in words, and whether that is a problem."""

    state: str
    lines: list[str] = field(default_factory=list)
    problem: bool = False
    exists: bool = False  # the record, as forget() would delete it
    legacy: list[str] = field(default_factory=list)  # an older release's keys of the same key, still there
    marker: str | None = None  # the enqueue_once marker beside the record (Celery's, RQ's), when there is one
    checkpoint: str | None = None  # the progress an owner saved beside the record, when there is one
    todo: str = ""  # what the operator may do about the state, when it calls for something


def _ttl(ms: int) -> str:
    if ms == -1:
        return "no TTL (goblin-claim always sets one: another writer?)"
    return f"TTL {ms / 1000:.1f} s"


def _shown(raw: bytes | None) -> str:
    """A stored token or marker as text (bytes that are not UTF-8 as bytes)."""
    if raw is None:
        return "none"
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(raw)


def _describe_value(raw: bytes, fingerprint: str | None = None) -> list[str]:
    """A stored result, the decorator's JSON envelope decoded where it is one.

    ``fingerprint`` is the call fingerprint the record's token carries (an older
    envelope carries its own).
    """
    try:
        envelope = Codec[Any](Any).decode(raw, "")
    except GoblinClaimError:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return [f"  raw bytes: {raw[:200]!r}{' ...' if len(raw) > 200 else ''}"]
        return [f"  raw text: {text[:500]!r}{' ...' if len(text) > 500 else ''}"]
    fp = envelope.fp or fingerprint
    shown = f", call fingerprint {fp}" if fp else ""
    if isinstance(envelope, ResultEnvelope):
        value = json.dumps(envelope.value, indent=2, default=str)
        return [f"  @idempotent result{shown}:", *(f"    {line}" for line in value.splitlines())]
    if isinstance(envelope, ErrorEnvelope):
        error = envelope.error
        return [f"  @idempotent stored error{shown}: {error.type}: {error.message}"]
    assert isinstance(envelope, UnstorableEnvelope)
    return [f"  @idempotent unstorable result{shown} (duplicates get ResultNotSerializableError): {envelope.reason}"]


def _legacy_names(namespace: str, key: str) -> tuple[str, str]:
    """The names an older release's two-key layout gave ``key``: its claim key and its result key."""
    record = build_keys(namespace, key)[0]
    return record + ":claim", record + ":result"


def http_key(
    method: str, path: str, value: str, owner: str | None = None, owner_type: str = "str"
) -> tuple[str, str, str]:
    """The default namespace, the stored key and a description of an HTTP door's request, named as the doors name it.

    Args:
        method: The request's method (any case).
        path: Its path as the client sent it, or its whole URL: the query string is left
            out (the doors fingerprint it, they do not key on it) and percent-escapes are
            decoded, as a server hands the path to the door.
        value: The ``Idempotency-Key`` header's value, a bare token or an sf-string (``"..."``).
        owner: What the door's ``scope`` function returned; ``None`` for no scope (or ``shared_scope``).
        owner_type: ``str``, ``int`` or ``uuid``: the type ``scope`` returned (``7`` and ``"7"`` are two owners).

    Raises:
        InvalidArgumentError: A request the doors never claim or would refuse: a safe method,
            a path without a leading ``/``, a malformed key, an empty or mistyped owner.
    """
    if owner == "":
        raise InvalidArgumentError("an empty --owner is no owner: leave --owner out for a door without scope=")
    if owner is None and owner_type != "str":
        raise InvalidArgumentError("--owner-type needs --owner")
    if method.upper() in _http.SAFE_METHODS:
        raise InvalidArgumentError(f"the doors never claim {method.upper()} (a safe method): it has no key")
    try:
        typed = None if owner is None else {"str": str, "int": int, "uuid": uuid.UUID}[owner_type](owner)
    except ValueError:
        raise InvalidArgumentError(
            f"--owner {owner!r} is not {'an int' if owner_type == 'int' else 'a UUID'}"
        ) from None
    options = _http.make_options(methods=(method,), scope=None if typed is None else lambda _request: typed)
    key = _http.parse_key(options.header, [value.encode()])
    if isinstance(key, _http.Answer):
        raise InvalidArgumentError(json.loads(key.body)["detail"])
    parts = urllib.parse.urlsplit(path)
    if not parts.path.startswith("/"):
        raise InvalidArgumentError(f"the path must begin with / (as in POST /payments), not {path!r}")
    (verb,), shown = options.methods, urllib.parse.unquote(parts.path)
    found = _http.owner_of(options, None)
    assert not isinstance(found, _http.Answer)  # only an empty owner is refused, and it was above
    said = f"{verb} {shown}, owner {'none' if found is None else repr(found)}, {options.header} {key!r}"
    if parts.query:
        said += " (its query string is in the fingerprint, not the key)"
    return options.namespace, _http.claim_name(verb, shown, found, key), said


def _operator_key(args: argparse.Namespace) -> tuple[str, str, str]:
    """The namespace and stored key that ``inspect``'s and ``forget``'s arguments name, and how to say them."""
    try:
        args.key.encode()
    except UnicodeEncodeError:  # bytes the shell passed that the locale does not decode
        raise InvalidArgumentError(f"the key {args.key!r} is not UTF-8 text") from None
    if args.http is None:
        if args.owner is not None or args.owner_type != "str":
            raise InvalidArgumentError("--owner names an HTTP door's key: give --http METHOD PATH too")
        return args.namespace or "goblin", args.key, repr(args.key)
    method, path = args.http
    namespace, key, said = http_key(method, path, args.key, args.owner, args.owner_type)
    return args.namespace or namespace, key, said


def inspect_key(client: Client, namespace: str, key: str) -> KeyReport:
    """What the record of ``key`` holds, in words (and whether an older release's keys are left)."""
    record = build_keys(namespace, key)[0]
    fence, marker, checkpoint = record + FENCE_SUFFIX, record + _TASK.decode(), record + CHECKPOINT_SUFFIX
    legacy = _legacy_names(namespace, key)
    pipe = client.pipeline(transaction=False)
    for name in (record, fence, *legacy, marker, checkpoint):
        pipe.type(name)
        pipe.pttl(name)
    replies = pipe.execute()
    kind, pttl = _text(replies[0]), int(replies[1])
    fence_type = _text(replies[2])
    value = client.get(record) if kind == "string" else None
    counter = client.get(fence) if fence_type == "string" else None
    first = client.get(marker) if _text(replies[-4]) == "string" else None
    saved = client.strlen(checkpoint) if _text(replies[-2]) == "string" else None
    report = KeyReport("", exists=kind != "none")
    lines = report.lines
    lines.append(f"key {key!r} in namespace {namespace!r}")
    _describe_record(report, key, record, kind, value, pttl, client)
    if saved is not None:
        report.checkpoint = checkpoint
        lines.append(
            f"checkpoint {checkpoint}: {saved} bytes, {_ttl(int(replies[-1]))} (the progress an owner saved: the next "
            "owner after a lapse resumes from it)"
        )
    if counter is not None:
        lines.append(f"fence   {fence}: {_shown(counter)} (the fence of the latest claim)")
    if first is not None:
        report.marker = marker
        lines.append(
            f"task    {marker}: {_shown(first)}, {_ttl(int(replies[-3]))} "
            "(enqueue_once's marker: the first Celery task's or RQ job's id)"
        )
    _describe_legacy(report, legacy, replies[4:-4])  # between the fence's replies and the marker's
    return report


def _server_ms(client: Client, name: str) -> int | None:
    """The clock (TIME, ms) of the server holding ``name``: an at-most-once record's deadline is by that clock.

    ``None`` when the user may not run TIME.
    """
    node = getattr(client, "get_node_from_key", None)
    try:
        clock = client.time(target_nodes=node(name)) if callable(node) else client.time()
    except RESPONSE_ERRORS:
        return None
    return int(clock[0]) * 1000 + int(clock[1]) // 1000


def _describe_record(
    report: KeyReport, key: str, record: str, kind: str, value: bytes | None, pttl: int, client: Client
) -> None:
    """The record's line and state in ``report``: free, odd, done, held or interrupted."""
    lines = report.lines
    if kind == "none" or (kind == "string" and value is None):  # expired between the reads
        lines.append(f"record  {record}: none")
        report.state = "free: the next acquire() claims it"
    elif kind != "string":
        lines.append(f"record  {record}: a {kind}, not written by goblin-claim")
        report.state = f"odd: a {kind} where the record belongs; acquire() raises WrongTypeError"
        report.problem = True
    else:
        assert isinstance(value, bytes)
        done = split_done(value)
        token, stored = done if done is not None else (b"", None)
        if stored is not None:
            owner, fingerprint = split_token(token)
            lines.append(f"record  {record}: done by {_shown(owner)}, {len(stored)} bytes of value, {_ttl(pttl)}")
            lines += _describe_value(stored, fingerprint)
            kept = "for good" if pttl == -1 else f"{pttl / 1000:.0f} s more"
            report.state = f"done by {_shown(owner)}, kept {kept}: duplicates get the result"
        elif done is not None:
            lines.append(f"record  {record}: {_shown(value)}, {_ttl(pttl)}")
            report.state = (
                "odd: a done marker without a value, not written by this release's complete(): acquire() raises "
                f"ResultLostError; `goblin-claim forget {key}` reopens the key"
            )
            report.problem = True
        elif (held := held_parts(value)) is not None:
            _describe_held(report, key, record, pttl, held, _server_ms(client, record))
        else:
            lines.append(f"record  {record}: {_shown(value)}, {_ttl(pttl)}")
            if pttl == -1:
                report.state = f"held by {_shown(value)}, with no lease end: in flight until the record is deleted"
            else:
                report.state = f"held by {_shown(value)}, lease ends in {pttl / 1000:.1f} s: in flight"


def _describe_held(
    report: KeyReport, key: str, record: str, pttl: int, held: tuple[int, int, bytes], now_ms: int | None
) -> None:
    """An at-most-once record, read against the server's clock: in flight until its deadline, then interrupted."""
    deadline, claimed, token = held
    owner = _shown(split_token(token)[0])
    report.lines.append(f"record  {record}: held by {owner} at most once, claimed {claimed_at(claimed)}, {_ttl(pttl)}")
    if now_ms is None:
        report.state = (
            f"held by {owner} at most once: in flight or interrupted cannot be told, as this user may not run TIME "
            "(the server's clock, which the lease's deadline is read against)"
        )
        return
    if deadline > now_ms:
        report.state = (
            f"held by {owner}, lease ends in {(deadline - now_ms) / 1000:.1f} s: in flight, at most once (should the "
            "lease end without a result, the key reads interrupted and nothing runs it again)"
        )
        return
    report.state = (
        f"interrupted: the at-most-once attempt of {owner} ended without a result, its lease over "
        f"{(now_ms - deadline) / 1000:.1f} s ago; acquire() raises InterruptedWorkError and nothing runs it again"
    )
    report.todo = (
        f"find out whether the work took effect; then `goblin-claim forget {key}` lets it run again, or leave it "
        "until the TTL ends"
    )
    report.problem = True


def _describe_legacy(report: KeyReport, legacy: tuple[str, str], replies: list[Any]) -> None:
    """An older release's keys still there, in ``report``: ``replies`` their TYPE and PTTL, in turn."""
    lines = report.lines
    for index, name in enumerate(legacy):
        legacy_type, legacy_pttl = _text(replies[2 * index]), int(replies[2 * index + 1])
        if legacy_type == "none":
            continue
        report.legacy.append(name)
        lines.append(
            f"legacy  {name}: a {legacy_type}, {_ttl(legacy_pttl)}: written by an older release (two keys per key); "
            "this release neither reads nor deletes it, and callers of the two releases do not see each other's "
            "claims: run one release everywhere, then let it expire (or DEL it)"
        )
        report.problem = True
