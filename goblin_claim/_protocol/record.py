"""The one-key record: its key, the owner's token, the ``done <token> <value>`` marker and the fence counter."""

from __future__ import annotations

import itertools
import os
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
