"""The refused-command rule as a table: what each refusal of each command sent leads to, with no server."""

from __future__ import annotations

import pytest
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from goblin_claim._protocol.refusals import (
    ANSWER,
    COMMAND,
    GIVE_UP,
    NATIVE,
    RELOAD,
    RESEND,
    SCRIPT,
    Refusal,
    after_refusal,
    path_of_sent,
)
from goblin_claim._protocol.scripts import DEL_KEYS, DELEX, DELIFEQ, PEXPIRETIME, SET_IFEQ, SET_NX_GET

MODULE = frozenset({"GOBLIN.CLAIM", "GOBLIN.CAD"})
VALKEY9 = frozenset({DELIFEQ, SET_IFEQ, SET_NX_GET, PEXPIRETIME, DEL_KEYS})
BOTH_DELETES = VALKEY9 | {DELEX}

NOSCRIPT = NoScriptError("No matching script. Please use EVAL.")
EVALSHA_DENIED = NoPermissionError("User app has no permissions to run the 'evalsha' command")
EVAL_DENIED = NoPermissionError("User app has no permissions to run the 'eval' command")
SET_DENIED = NoPermissionError("User app has no permissions to run the 'set' command")
UNKNOWN = ResponseError("unknown command 'GOBLIN.CLAIM', with args beginning with: 'c:{k}'")
CLUSTER_UNKNOWN = ResponseError("Command # 1 (GOBLIN.CAD c:{k} t) doesn't exist in Redis commands")
UNKNOWN_DELIFEQ = ResponseError("unknown command 'DELIFEQ', with args beginning with: 'c:{k}' 't'")
SYNTAX = ResponseError("syntax error")
OOM = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
WRONGTYPE = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

RELOADED = ("script_reload", "reloaded")
MODULE_GONE = ("native_fallback", "fell_back")
CHECK_GONE = ("native_fallback", "owner_check")

# sent, refusal, NOSCRIPT?, mode, what the server was known to have -> what follows
TABLE: list[tuple[str, BaseException, str, frozenset[str] | None, Refusal]] = [
    # A script: a lost cache is sent again as its text; an ACL without scripting gives up.
    (SCRIPT, NOSCRIPT, "auto", VALKEY9, Refusal(RELOAD, VALKEY9, RELOADED, SCRIPT)),
    (SCRIPT, NOSCRIPT, "never", None, Refusal(RELOAD, None, RELOADED, SCRIPT)),
    (SCRIPT, EVALSHA_DENIED, "auto", VALKEY9, Refusal(GIVE_UP, VALKEY9, None, SCRIPT)),
    (SCRIPT, EVAL_DENIED, "auto", frozenset(), Refusal(GIVE_UP, frozenset(), None, SCRIPT)),
    (SCRIPT, WRONGTYPE, "auto", VALKEY9, Refusal(ANSWER, VALKEY9, None, SCRIPT)),
    (SCRIPT, OOM, "auto", VALKEY9, Refusal(ANSWER, VALKEY9, None, SCRIPT)),
    # A module command the server (or a cluster client's table) does not know: scripts from now on.
    (NATIVE, UNKNOWN, "auto", MODULE | VALKEY9, Refusal(RESEND, frozenset(), MODULE_GONE, SCRIPT)),
    (NATIVE, CLUSTER_UNKNOWN, "auto", MODULE, Refusal(RESEND, frozenset(), MODULE_GONE, SCRIPT)),
    (NATIVE, UNKNOWN, "always", MODULE, Refusal(ANSWER, MODULE, None, NATIVE)),  # required: no fallback
    (NATIVE, WRONGTYPE, "auto", MODULE, Refusal(ANSWER, MODULE, None, NATIVE)),
    # The server's own commands: one it cannot take goes, with what it vouched for.
    (SET_NX_GET, SYNTAX, "auto", VALKEY9, Refusal(RESEND, frozenset({DELIFEQ, SET_IFEQ}), CHECK_GONE, SCRIPT)),
    (SET_IFEQ, SYNTAX, "auto", VALKEY9, Refusal(RESEND, VALKEY9 - {SET_IFEQ}, CHECK_GONE, SCRIPT)),
    (SET_IFEQ, SET_DENIED, "always", VALKEY9, Refusal(RESEND, VALKEY9 - {SET_IFEQ}, CHECK_GONE, SCRIPT)),
    (DELIFEQ, UNKNOWN_DELIFEQ, "auto", VALKEY9, Refusal(RESEND, VALKEY9 - {DELIFEQ, SET_IFEQ}, CHECK_GONE, SCRIPT)),
    (DELIFEQ, UNKNOWN_DELIFEQ, "auto", BOTH_DELETES, Refusal(RESEND, BOTH_DELETES - {DELIFEQ}, CHECK_GONE, SCRIPT)),
    (DELEX, SET_DENIED, "auto", BOTH_DELETES, Refusal(RESEND, BOTH_DELETES - {DELEX}, CHECK_GONE, SCRIPT)),
    # SET refused under maxmemory (the script's EXPIRE is not): the script this once, nothing dropped.
    (SET_IFEQ, OOM, "auto", VALKEY9, Refusal(RESEND, VALKEY9, None, SCRIPT)),
    (SET_NX_GET, OOM, "auto", VALKEY9, Refusal(RESEND, VALKEY9, None, SCRIPT)),
    # An answer, not a refusal: what the script would answer too.
    (SET_NX_GET, WRONGTYPE, "auto", VALKEY9, Refusal(ANSWER, VALKEY9, None, COMMAND)),
    (DEL_KEYS, WRONGTYPE, "auto", VALKEY9, Refusal(ANSWER, VALKEY9, None, COMMAND)),
]


@pytest.mark.parametrize(("sent", "exc", "mode", "available", "expected"), TABLE)
def test_each_refusal_of_each_command_leads_to_one_action(
    sent: str, exc: BaseException, mode: str, available: frozenset[str] | None, expected: Refusal
) -> None:
    """after_refusal's table: the action, what the server is known to have next, the notice and the path."""
    decided = after_refusal(sent, exc, isinstance(exc, NoScriptError), mode, available)  # type: ignore[arg-type]
    assert decided == expected


def test_a_refusal_the_script_would_not_take_is_never_sent_again() -> None:
    """Only RESEND and RELOAD send anything again: an answer and a give-up leave what the server has alone."""
    for sent, exc, mode, available, expected in TABLE:
        decided = after_refusal(sent, exc, isinstance(exc, NoScriptError), mode, available)  # type: ignore[arg-type]
        if decided.action in (ANSWER, GIVE_UP):
            assert decided.available is available
            assert decided.notice is None
        else:
            assert decided.path == SCRIPT, (sent, exc, expected)


def test_paths_are_named_by_what_was_sent() -> None:
    """The path an event reports: the script, the module, or the server's own command for every owner check."""
    assert path_of_sent(SCRIPT) == "script"
    assert path_of_sent(NATIVE) == "native"
    assert [path_of_sent(name) for name in (SET_NX_GET, SET_IFEQ, DELIFEQ, DELEX, DEL_KEYS)] == [COMMAND] * 5
