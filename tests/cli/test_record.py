"""The one record layout: a token's fingerprint and ``done <token> <value>``, as the CLI and the decorator read them."""

from __future__ import annotations

from goblin_claim import _http
from goblin_claim._decorator.fingerprint import FINGERPRINT_CHARS
from goblin_claim._protocol.record import fingerprinted_token, holder_fp, split_done, split_token


def test_a_fingerprinted_token_splits_back_into_owner_and_fingerprint() -> None:
    """The decorator's fingerprint (16 hex) and the doors' (32 hex) are the ones a token carries."""
    http_fp = _http.fingerprint(b"q", b"body")
    for fp in ("ab" * (FINGERPRINT_CHARS // 2), http_fp):
        token = fingerprinted_token(fp)
        owner, found = split_token(token.encode())
        assert found == fp
        assert token == f"{owner.decode()}.{fp}"
        assert holder_fp(token) == holder_fp(token.encode()) == holder_fp(f"done {token}") == fp
    assert _http.holder_fp(_http.claim_token(http_fp)) == http_fp


def test_a_token_without_a_fingerprint_is_all_owner() -> None:
    """A caller's own token with a dot in it is not taken for a fingerprint."""
    assert split_token(b"worker.3") == (b"worker.3", None)
    assert split_token(b"w-1." + b"ab" * 12) == (b"w-1." + b"ab" * 12, None)  # 24 hex: neither length
    assert holder_fp(None) is None
    assert holder_fp("worker.3") is None


def test_split_done_reads_a_completed_record() -> None:
    """``done <token> <value>``: the value may hold spaces; a marker without one has no value."""
    assert split_done(b"done w-1.abc the value  with spaces") == (b"w-1.abc", b"the value  with spaces")
    assert split_done(b"done w-1 ") == (b"w-1", b"")
    assert split_done(b"done w-1") == (b"w-1", None)
    assert split_done(b"w-1") is None
