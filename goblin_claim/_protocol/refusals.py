"""The one rule for a refused command: what a server's refusal says about what it lacks, and what to send instead."""

from __future__ import annotations

from .scripts import DEL_KEYS, PEXPIRETIME, SET_IFEQ, SET_NX_GET, with_owner_checks


def owner_check_unusable(exc: BaseException) -> bool:
    """Whether a built-in owner check's error says this server or user cannot take it at all.

    An unknown command, a syntax error (a server that has the command but not the
    option), or an ACL that does not grant it (a user whose commands are listed one
    by one): the script does the same with what the user has, from now on.
    """
    text = str(exc).lower()
    return is_unknown_command(exc) or "syntax error" in text or "no permissions to run" in text


def without_owner_check(available: frozenset[str], check: str, exc: BaseException) -> frozenset[str]:
    """``available`` once owner check ``check`` was refused with ``exc`` as unusable (see ``owner_check_unusable``).

    A delete command the server turned out to lack ("unknown command": a command
    table that lists more than the server runs) also takes away the SET IFEQ
    inferred from it, unless the other delete command still vouches for it. A
    refused SET NX GET takes PEXPIRETIME with it, which no longer vouches for it.
    """
    if check == SET_NX_GET:
        return available - {SET_NX_GET, PEXPIRETIME, DEL_KEYS}
    left = available - {check}
    if check != SET_IFEQ and is_unknown_command(exc):
        left = with_owner_checks(left - {SET_IFEQ})
    return left


def is_scripting_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is an ACL's refusal of EVALSHA or EVAL: this user may not run Lua scripts."""
    text = str(exc).lower()
    return "no permissions to run the 'evalsha' command" in text or "no permissions to run the 'eval' command" in text


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the server's refusal of a write that may grow memory (maxmemory, noeviction).

    ``SET`` is refused then, while extend.lua is not (its ``EXPIRE`` never grows
    memory): a renewal then goes as the script, that once.
    """
    text = str(exc)
    return text.startswith("OOM") or "used memory > 'maxmemory'" in text


def is_unknown_command(exc: BaseException) -> bool:
    """Whether ``exc`` says the server (or a cluster client's table) lacks the command."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text
