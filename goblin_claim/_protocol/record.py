"""The one-key record: its key, the owner's token and the fingerprint it carries, ``done <token> <value>``."""

from __future__ import annotations

import itertools
import os
import re
import secrets
from typing import Final

CLAIMED: Final = "CLAIMED"
_CLAIMED_REPLIES: Final = (CLAIMED.encode(), CLAIMED)

# What complete() leaves in claim_key. It contains a space, which no token may
# contain, so a completed claim never matches an owner check.
DONE_PREFIX: Final = "done "
_DONE_PREFIXES: Final = (DONE_PREFIX.encode(), DONE_PREFIX)  # as bytes and as str

# What the fence counter's key adds to the record's (fencing=True).
FENCE_SUFFIX: Final = ":fence"


def _new_token_prefix() -> None:
    global _token_prefix, _token_counter
    # 96 random bits in 16 URL-safe characters: a completed record with a short value
    # then stays within Redis's 44-byte embedded string (one allocation, not two).
    _token_prefix = secrets.token_urlsafe(12) + "-"
    _token_counter = itertools.count(1)


_token_prefix = ""
_token_counter = itertools.count(1)
_new_token_prefix()
# A forked child must not repeat its parent's tokens.
os.register_at_fork(after_in_child=_new_token_prefix)


def new_token() -> str:
    """A token unique to this handle: 96 random bits per process, then a counter.

    Cheaper than fresh randomness per call, and just as unique: the prefix is
    drawn again in every forked child.
    """
    return f"{_token_prefix}{next(_token_counter):x}"


# A token may carry the fingerprint of the call or request that holds the claim:
# ``<token>.<fp>``, fp 16 hex digits (``@idempotent``) or 32 (the HTTP doors), so an
# in-flight duplicate compares fingerprints in one reply. ``new_token()`` has no dot,
# and a token of the caller's own (``Claim(token=...)``) is one only if it ends so.
_TOKEN_FP: Final = re.compile(rb"\.([0-9a-f]{16}(?:[0-9a-f]{16})?)\Z")


def fingerprinted_token(fp: str) -> str:
    """A fresh token carrying ``fp`` (hex digits): ``<new_token()>.<fp>``."""
    return f"{new_token()}.{fp}"


def split_token(token: bytes) -> tuple[bytes, str | None]:
    """``(owner, fingerprint)`` of a token: who holds the claim, and the fingerprint it carries (``None``: none)."""
    found = _TOKEN_FP.search(token)
    if found is None:
        return token, None
    return token[: found.start()], found.group(1).decode("ascii")


def holder_fp(holder: object) -> str | None:
    """The fingerprint in a holder's reply, if any.

    ``<token>.<fp>`` while in flight and as a completed record's token; ``done
    <token>.<fp>`` in a two-key claim key (``Claim.from_keys``).
    """
    if holder is None:
        return None
    raw = holder if isinstance(holder, bytes) else str(holder).encode("utf-8", "surrogatepass")
    return split_token(raw.removeprefix(_DONE_PREFIXES[0]))[1]


def split_done(value: bytes) -> tuple[bytes, bytes | None] | None:
    """``(token, value)`` of a completed record ``done <token> <value>``; ``None`` for anything else.

    The value is ``None`` for a ``done <token>`` marker without one (not written
    by ``complete()``, or a head cut short before its value).
    """
    prefix = _DONE_PREFIXES[0]
    if not value.startswith(prefix):
        return None
    cut = value.find(b" ", len(prefix))
    if cut < 0:
        return value[len(prefix) :], None
    return value[len(prefix) : cut], value[cut + 1 :]


# --------------------------------------------------------------------------- keys


def _escape_tag(key: str) -> str:
    # Percent-escape the three characters that could end or empty the hash tag,
    # so the whole key is always the (non-empty) tag and distinct keys stay distinct.
    if "%" in key or "{" in key or "}" in key:
        return key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return key


def build_keys(namespace: str, key: str) -> tuple[str, str]:
    """The claim and result keys of ``key``: one key, ``<ns>:{<key>}``, returned as both.

    One key holds the whole record: the owner's token while the work runs, then
    ``done <token> <value>`` for the ttl (claim.lua, complete.lua). The hash tag
    ``{<key>}`` (braces and ``%`` in ``key`` percent-escaped) keeps the fence
    counter (``fencing=True``), ``<ns>:{<key>}:fence``, in the same cluster slot.
    """
    record = f"{namespace}:{{{_escape_tag(key)}}}"
    return record, record
