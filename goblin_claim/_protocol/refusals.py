"""The one rule for a refused command: what a server's refusal says about what it lacks, and what to send instead.

``after_refusal`` decides; the drivers, their batches and the keep-alives perform
what it returns (send the script, its text, or give up), sync and asyncio alike,
and emit the notice it names, so every path reacts to a refusal the same way.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from .checks import NativeMode
from .scripts import DEL_KEYS, PEXPIRETIME, SET_IFEQ, SET_NX_GET, with_owner_checks

# What was sent, beside the owner checks' own names (``scripts.SET_NX_GET``, ``SET_IFEQ``...).
# They are the paths events report too (``Event.path``), with ``COMMAND`` for the owner checks.
SCRIPT: Final = "script"  # EVALSHA (or EVAL) of a Lua script
NATIVE: Final = "native"  # a module command: GOBLIN.CLAIM, GOBLIN.CAD
COMMAND: Final = "command"  # the server's own command: an owner check, SET ... NX GET, DEL
# What follows a refusal (``Refusal.action``).
RESEND: Final = "resend"  # the script instead, by its SHA: the refused command ran nothing
RELOAD: Final = "reload"  # the script's text (EVAL): the server lost its script cache
GIVE_UP: Final = "give_up"  # this user may not run scripts: the handle's error saying what to grant
ANSWER: Final = "answer"  # not a refusal: the error is the server's answer, as the script's would be

_RELOADED: Final = ("script_reload", "reloaded")
_MODULE_GONE: Final = ("native_fallback", "fell_back")
_CHECK_GONE: Final = ("native_fallback", "owner_check")


class Refusal(NamedTuple):
    """What follows one refused command.

    Attributes:
        action: ``RESEND``, ``RELOAD``, ``GIVE_UP`` or ``ANSWER``.
        available: What the server is known to have from now on (the client's
            ``state.native``), less what the refusal showed it lacks.
        notice: The event it is reported as (operation, outcome), if any.
        path: How the call goes from here: ``"script"`` once sent again, else as sent.
    """

    action: str
    available: frozenset[str] | None
    notice: tuple[str, str] | None
    path: str


def after_refusal(
    sent: str, exc: BaseException, no_script: bool, mode: NativeMode, available: frozenset[str] | None
) -> Refusal:
    """What follows the refusal ``exc`` of a command: sent again as the script, as its text, or an answer.

    Args:
        sent: What was sent: ``SCRIPT``, ``NATIVE``, or the owner check's name
            (``SET NX GET``, ``SET IFEQ``, ``DELIFEQ``, ``DELEX``, ``DEL``).
        exc: The error reply (raised, or a pipeline's value).
        no_script: ``exc`` is the client's NOSCRIPT error (its text alone does not say so).
        mode: The handle's ``native`` setting.
        available: What the server is known to have (the client's ``state.native``).

    A refused command ran nothing, so sending the script instead is safe. The table,
    first row that matches:

    - anything, refused by an ACL that denies EVALSHA / EVAL: ``GIVE_UP``, no notice
      (the handle's error says what to grant);
    - the script, NOSCRIPT: ``RELOAD``, notice ``script_reload`` / ``reloaded``;
    - a module command, unknown (``mode`` not ``"always"``): ``RESEND``, notice
      ``native_fallback`` / ``fell_back``;
    - an owner check, unusable (``owner_check_unusable``): ``RESEND``, notice
      ``native_fallback`` / ``owner_check``;
    - an owner check, OOM (SET under maxmemory): ``RESEND``, no notice, nothing dropped;
    - anything else: ``ANSWER``, no notice.

    A module command refused drops every native command (``available`` empty); an
    owner check refused as unusable drops what ``without_owner_check`` says.

    Example::

        decision = after_refusal(SCRIPT, exc, isinstance(exc, NoScriptError), "auto", state.native)
        if decision.action == RELOAD:
            reply = send(script_command(script, args, source=True))
    """
    if gives_up(exc):
        return Refusal(GIVE_UP, available, None, path_of_sent(sent))
    if sent == SCRIPT:
        if no_script:
            return Refusal(RELOAD, available, _RELOADED, SCRIPT)
        return Refusal(ANSWER, available, None, SCRIPT)
    if sent == NATIVE:
        if mode != "always" and is_unknown_command(exc):
            return Refusal(RESEND, frozenset(), _MODULE_GONE, SCRIPT)  # this node lacks the module after all
        return Refusal(ANSWER, available, None, NATIVE)
    if available is not None and owner_check_unusable(exc):
        return Refusal(RESEND, without_owner_check(available, sent, exc), _CHECK_GONE, SCRIPT)
    if is_out_of_memory(exc):  # SET refused under maxmemory, EXPIRE not: the script, this once
        return Refusal(RESEND, available, None, SCRIPT)
    return Refusal(ANSWER, available, None, COMMAND)  # WRONGTYPE, a failover...: what the script would answer too


def gives_up(exc: BaseException) -> bool:
    """Whether the refusal ``exc`` ends in ``GIVE_UP`` whatever was sent: ``after_refusal``'s first row.

    A driver whose call failed anywhere (the command, the script, its reload) asks
    only this: a user denied scripts gets the handle's error saying what to grant.
    """
    return is_scripting_refused(exc)


def path_of_sent(sent: str) -> str:
    """The path an event reports for what was sent: ``SCRIPT``, ``NATIVE``, or ``COMMAND`` for an owner check."""
    return sent if sent in (SCRIPT, NATIVE) else COMMAND


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
