"""``goblin-claim scan``, ``stats`` and ``namespaces``: walking a keyspace with SCAN on every primary."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._clients.families import (
    RESPONSE_ERRORS,
)
from .._handle import CHECKPOINT_SUFFIX
from .._protocol.record import FENCE_SUFFIX, split_done, split_token
from .connect import Client, _primaries
from .findings import _text

# --------------------------------------------------------------------------- scan and stats

State = Literal["in-flight", "interrupted", "done", "odd"]
STATES: tuple[State, ...] = ("in-flight", "interrupted", "done", "odd")
DEFAULT_BATCH = 500
# Above this many keys (DBSIZE, summed over the primaries), stats samples unless --exact.
EXACT_UP_TO = 1_000_000
DEFAULT_SAMPLE = 100
# A record whose head reads differently before and after its TTL is read again,
# this many times in all; past that it is reported as changing.
_READS = 3
# How much of a record a walk reads: its marker and token, never a large value whole.
_HEAD = 1024

_ESCAPED = re.compile(r"%(25|7B|7D)")
_UNESCAPED = {"25": "%", "7B": "{", "7D": "}"}
_GLOB = re.compile(r"([*?\[\]\\])")
_FENCE = FENCE_SUFFIX.encode()
# enqueue_once (the Celery and RQ doors) keeps the first task's or job's id beside the record.
_TASK = b":task"
# checkpoints=True keeps the last progress an owner saved beside the record.
_CHECKPOINT = CHECKPOINT_SUFFIX.encode()
# Beside a record by design: never listed or counted on their own (the record speaks for them).
_BESIDE = (_FENCE, _TASK, _CHECKPOINT)
# An older release laid each key out on two keys, <ns>:{<key>}:claim and <ns>:{<key>}:result.
_LEGACY_SUFFIXES = (b":claim", b":result")
_SUFFIXES = (b"", *_BESIDE, *_LEGACY_SUFFIXES)
# An at-most-once record: "held <deadline_ms> <claimed_ms> <token>" (claim.lua).
_HELD = re.compile(rb"held (\d+) (\d+) (.+)\Z", re.DOTALL)


@dataclass(frozen=True)
class Entry:
    """One key of a namespace as ``scan`` lists it.

    Attributes:
        state: ``in-flight``, ``interrupted`` (an at-most-once attempt whose lease ended
            without a result), ``done`` or ``odd``.
        key: The idempotency key, as ``inspect`` and ``forget`` take it; for a name that is not
            laid out as this release lays out keys (an older release's two keys among them),
            the Redis key itself.
        ttl_ms: What is left of the lease (in flight) or of the retention (interrupted, done);
            ``-1`` for no TTL, ``None`` when none applies.
        holder: The holder token's owner part (never the call fingerprint after it), or ``None``.
        note: What is wrong, for odd keys.
        raises: What ``acquire()`` raises on this key (``WrongTypeError``, ``ResultLostError``,
            ``InterruptedWorkError``), ``None`` when it serves the key: such a key makes ``scan``
            and ``stats`` exit 1.
    """

    state: State
    key: str
    ttl_ms: int | None = None
    holder: str | None = None
    note: str = ""
    raises: str | None = None


def printable(raw: bytes) -> str:
    """``raw`` as text when it is printable UTF-8, else its ``repr`` (so a listing never carries control bytes)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return repr(raw)
    return text if text.isprintable() else repr(text)


def owner_part(token: bytes) -> str:
    """Who holds a claim: its token without the call fingerprint the decorator and the HTTP doors append.

    The fingerprint is a hash of the arguments, which a low-entropy argument lets
    anyone guess back: listings show only the part before it.
    """
    return printable(split_token(token)[0])


def scan_pattern(namespace: str) -> str:
    """The SCAN MATCH pattern of every key goblin-claim writes under ``namespace``."""
    return _GLOB.sub(r"\\\1", namespace) + ":{*"


def parse_name(name: bytes, prefix: bytes) -> tuple[bytes, bytes] | None:
    """(hash tag, suffix) of a name under ``prefix`` (``<ns>:{``), else ``None``.

    The suffix is ``b""`` for a record ``<ns>:{<tag>}``, ``b":fence"`` for its fence
    counter, ``b":task"`` for enqueue_once's marker (Celery, RQ), ``b":checkpoint"`` for the
    progress an owner saved (``checkpoints=True``), and ``b":claim"`` or
    ``b":result"`` for an older release's two keys.
    """
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    end = rest.find(b"}")
    # build_keys escapes braces out of the tag, so the first closing brace ends it.
    if end <= 0 or b"{" in rest[:end] or rest[end + 1 :] not in _SUFFIXES:
        return None
    return rest[:end], rest[end + 1 :]


def key_of(tag: bytes) -> str:
    """The idempotency key whose hash tag is ``tag`` (build_keys' percent-escapes undone)."""
    try:
        text = tag.decode("utf-8")
    except UnicodeDecodeError:
        return repr(tag)
    key = _ESCAPED.sub(lambda match: _UNESCAPED[match.group(1)], text)
    return key if key.isprintable() else repr(key)


def _left(pttl: int) -> int | None:
    return None if pttl == -2 else pttl


_NO_TTL = "no TTL: goblin-claim always sets one (another writer?)"


def classify(key: str, kind: str, pttl: int, head: bytes | None, now_ms: int | None = None) -> Entry | None:
    """The state of one record from its type, TTL and head, read together; ``None`` when it is gone.

    Args:
        key: The idempotency key, as shown.
        kind: TYPE of the record's key (``none``, ``string``, ``hash``...).
        pttl: PTTL of the record's key (-2 absent, -1 no TTL).
        head: The record's first bytes (up to 1024; enough for its marker and token), when it is a string.
        now_ms: The server's clock (TIME, in ms), which an at-most-once record's lease deadline
            is read against; ``None`` reads such a record as in flight.
    """
    if kind == "none":
        return None  # expired or forgotten since SCAN named it
    if kind != "string" or head is None:
        note = f"a {kind}, not written by goblin-claim: acquire() raises WrongTypeError"
        return Entry("odd", key, _left(pttl), None, note, "WrongTypeError")
    done = split_done(head)
    if done is not None:
        token, value = done
        if value is None and len(head) < _HEAD:
            return Entry(
                "odd",
                key,
                _left(pttl),
                owner_part(token),
                "a done marker without a value, not written by this release's complete(): acquire() raises "
                "ResultLostError until the TTL ends or `goblin-claim forget` reopens the key",
                "ResultLostError",
            )
        return Entry("done", key, _left(pttl), owner_part(token), _NO_TTL if pttl == -1 else "")
    held = _HELD.match(head)
    if held is not None:
        return held_entry(key, pttl, held, now_ms)
    return Entry(
        "in-flight", key, _left(pttl), owner_part(head), _NO_TTL + ", so it never frees itself" if pttl == -1 else ""
    )


def claimed_at(ms: int) -> str:
    """When an at-most-once attempt claimed its key (server clock, ms), as UTC text."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def held_parts(value: bytes) -> tuple[int, int, bytes] | None:
    """(deadline_ms, claimed_ms, token) of an at-most-once record ``held <deadline> <claimed> <token>``, or None."""
    held = _HELD.match(value)
    return None if held is None else (int(held.group(1)), int(held.group(2)), held.group(3))


def held_entry(key: str, pttl: int, held: re.Match[bytes], now_ms: int | None) -> Entry:
    """An at-most-once record: in flight until its lease deadline, interrupted once it passed (server clock)."""
    deadline, claimed, token = int(held.group(1)), int(held.group(2)), held.group(3)
    since = f"claimed {claimed_at(claimed)}"
    if now_ms is None:
        note = f"at most once, {since}; in flight or interrupted cannot be told: this user may not run TIME"
        return Entry("in-flight", key, None, owner_part(token), note)
    if deadline > now_ms:
        return Entry("in-flight", key, deadline - now_ms, owner_part(token), f"at most once, {since}")
    return Entry(
        "interrupted",
        key,
        _left(pttl),
        owner_part(token),
        f"at most once, {since}: its lease ended {(now_ms - deadline) / 1000:.1f} s ago without a result; acquire() "
        "raises InterruptedWorkError and nothing runs it again until `goblin-claim forget` or the TTL ends",
        "InterruptedWorkError",
    )


def legacy_entry(name: bytes, tag: bytes, suffix: bytes, pttl: int) -> Entry | None:
    """An older release's claim or result key, as ``scan`` lists it; ``None`` when it is gone."""
    if pttl == -2:
        return None
    part = suffix.lstrip(b":").decode()
    return Entry(
        "odd",
        printable(name),
        pttl,
        None,
        f"the {part} key of {key_of(tag)!r} in an older release's two-key layout: this release does not read it, "
        "and callers of the two releases do not see each other's claims; run one release everywhere, then let it "
        "expire (or DEL it)",
    )


@dataclass
class NodeTally:
    """What a walk saw on one primary: for stats' counts and their estimate."""

    node: str
    dbsize: int = 0
    examined: int = 0  # names SCAN returned (sampling scans without MATCH, so all of them)
    finished: bool = False  # SCAN's cursor came back to 0: every key was seen
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    raising: int = 0  # keys acquire() raises on (Entry.raises), among the odd ones


def _wrong_type(reply: object) -> bool:
    return isinstance(reply, RESPONSE_ERRORS) and str(reply).startswith("WRONGTYPE")


def _read_records(
    conn: Any, prefix: bytes, tags: Sequence[bytes]
) -> tuple[list[tuple[str, int, bytes | None] | None], int | None]:
    """TYPE, PTTL and head (GETRANGE) of each tag's record, and the node's clock (TIME): one round trip for the batch.

    Pipelined without MULTI (a node's keys span many slots, and a cluster refuses
    cross-slot transactions), so the head is read again after the TTL: a reading is
    kept only when both heads agree, which rules out a complete(), forget(), expiry
    or new claim landing between them (a record names its token, and a token is
    unique to its owner). ``None`` for a record that changed on every read. The clock,
    in ms, is the one an at-most-once record's deadline was written by (``None`` when the
    user may not run TIME).
    """
    readings: dict[bytes, tuple[str, int, bytes | None] | None] = dict.fromkeys(tags)
    pending = list(tags)
    now_ms: int | None = None
    for _ in range(_READS):
        if not pending:
            break
        pipe = conn.pipeline(transaction=False)
        for tag in pending:
            name = prefix + tag + b"}"
            pipe.type(name)
            pipe.getrange(name, 0, _HEAD - 1)
            pipe.pttl(name)
            pipe.getrange(name, 0, _HEAD - 1)
        pipe.time()
        replies = pipe.execute(raise_on_error=False)
        clock = replies.pop()  # NOPERM on TIME: at-most-once records read in flight, with a note
        now_ms = None if isinstance(clock, Exception) else int(clock[0]) * 1000 + int(clock[1]) // 1000
        changed = []
        for index, tag in enumerate(pending):
            kind, before, pttl, after = replies[4 * index : 4 * index + 4]
            for reply in (kind, pttl, before, after):
                if isinstance(reply, Exception) and not _wrong_type(reply):
                    raise reply  # NOPERM, MOVED...: the walk cannot go on
            kind = _text(kind)
            if _wrong_type(before) and _wrong_type(after):
                agree = kind not in ("none", "string")
                before = None
            else:
                # GETRANGE answers "" for a missing key: the type and the TTL say which it is.
                agree = before == after and isinstance(before, bytes)
                if int(pttl) == -2:
                    agree, kind, before = agree and before == b"", "none", None
                else:
                    agree = agree and kind == "string"
            if agree:
                readings[tag] = (kind, int(pttl), before)
            else:
                changed.append(tag)
        pending = changed
    return [readings[tag] for tag in tags], now_ms


def _entries(conn: Any, prefix: bytes, names: Sequence[bytes]) -> Iterator[Entry]:
    """The entries of one SCAN batch: each record once, and each name this release does not write."""
    tags: dict[bytes, None] = {}
    legacy: list[tuple[bytes, bytes, bytes]] = []
    for name in names:
        if not name.startswith(prefix):
            continue  # sampling scans without MATCH
        parsed = parse_name(name, prefix)
        if parsed is None:
            yield Entry("odd", printable(name), note="a key under the namespace that goblin-claim does not write")
            continue
        tag, suffix = parsed
        if suffix in _BESIDE:
            continue  # a fence counter, enqueue_once's marker, a checkpoint: beside the record by design
        if suffix:
            legacy.append((name, tag, suffix))
        else:
            tags[tag] = None
    if legacy:  # only while an older release's keys are left: one more round trip
        pipe = conn.pipeline(transaction=False)
        for name, _tag, _suffix in legacy:
            pipe.pttl(name)
        for (name, tag, suffix), pttl in zip(legacy, pipe.execute(), strict=True):
            entry = legacy_entry(name, tag, suffix, int(pttl))
            if entry is not None:
                yield entry
    readings, now_ms = _read_records(conn, prefix, list(tags)) if tags else ([], None)
    for tag, reading in zip(tags, readings, strict=True):
        key = key_of(tag)
        if reading is None:
            yield Entry("odd", key, note="it changed on every read (busy): look again with inspect")
            continue
        entry = classify(key, *reading, now_ms)
        if entry is not None:
            yield entry


def walk(
    client: Client,
    cluster: bool,
    namespace: str,
    batch: int = DEFAULT_BATCH,
    sample: int | None = None,
    tallies: list[NodeTally] | None = None,
) -> Iterator[Entry]:
    """Every key of ``namespace`` on every primary, with its state; read-only.

    Each primary is walked with SCAN, ``batch`` names at a time (``COUNT``), never KEYS,
    and each batch's records are read in one pipelined round trip (one more for an older
    release's keys, while any are left). SCAN may
    name a key twice when the server rehashes meanwhile, and keys written during the
    walk may or may not be seen: its guarantees, not a snapshot's.

    Args:
        client: A connected client (a cluster client on a cluster).
        cluster: Whether ``client`` is a cluster client.
        namespace: The namespace to walk.
        batch: SCAN's ``COUNT``: names per round trip.
        sample: Stop after this many SCAN batches per primary, scanning without MATCH so the
            tally knows how much of the keyspace it saw (``estimate`` scales by DBSIZE);
            ``None`` walks everything.
        tallies: A list that receives one ``NodeTally`` per primary, kept up to date as the walk goes.

    Yields:
        One entry per record (and per name under the namespace this release does not write).
    """
    prefix = f"{namespace}:{{".encode()
    match = None if sample is not None else scan_pattern(namespace)
    for node, conn in _primaries(client, cluster):
        tally = NodeTally(node, dbsize=int(conn.dbsize()))
        if tallies is not None:
            tallies.append(tally)
        cursor, batches = 0, 0
        while True:
            cursor, names = conn.scan(cursor, match=match, count=batch)
            batches += 1
            tally.examined += len(names)
            for entry in _entries(conn, prefix, names):
                tally.counts[entry.state] += 1
                tally.raising += entry.raises is not None
                yield entry
            if int(cursor) == 0:
                tally.finished = True
                break
            if sample is not None and batches >= sample:
                break


def estimate(tallies: Sequence[NodeTally]) -> tuple[dict[State, float], bool]:
    """Counts by state over ``tallies``, scaled by DBSIZE on primaries sampled only in part; and whether exact."""
    totals = dict.fromkeys(STATES, 0.0)
    exact = True
    for tally in tallies:
        scale = 1.0
        if not tally.finished:
            exact = False
            scale = tally.dbsize / tally.examined if tally.examined else 0.0
        for state in STATES:
            totals[state] += tally.counts[state] * scale
    return totals, exact


def namespaces(client: Client, cluster: bool, batch: int = DEFAULT_BATCH) -> dict[str, int]:
    """Every namespace holding keys laid out as goblin-claim lays them out, with its keys counted; read-only.

    One SCAN MATCH ``*:{*`` walk of every primary, names only (nothing is read): a key
    counts as ``scan`` lists it (a record, or an older release's claim or result key;
    not a fence counter, enqueue_once's marker or a checkpoint), so a namespace whose records are gone but
    a fence counter is left shows 0. Another application's keys named ``<x>:{<y>}``
    look the same and are counted too: ``scan --namespace`` reads them.
    """
    found: dict[str, int] = {}
    for _node, conn in _primaries(client, cluster):
        cursor = 0
        while True:
            cursor, names = conn.scan(cursor, match="*:{*", count=batch)
            for name in names:
                cut = name.find(b":{")  # a namespace has no braces: the first one opens the tag
                parsed = parse_name(name, name[: cut + 2]) if cut > 0 and b"{" not in name[:cut] else None
                if parsed is not None:
                    space = printable(name[:cut])
                    found[space] = found.get(space, 0) + (parsed[1] not in _BESIDE)
            if int(cursor) == 0:
                break
    return dict(sorted(found.items()))


def _shown_ttl(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms == -1:
        return "no TTL"
    return f"{ms / 1000:.1f} s"
