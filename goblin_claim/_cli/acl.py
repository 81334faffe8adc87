"""``doctor``'s ACL checks: what each operation sends, and whether the connected user may send it."""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Callable
from typing import Any

from .._clients.families import (
    CLUSTER_ERRORS,
    CLUSTERS,
    ERRORS,
    NO_PERMISSION,
    RESPONSE_ERRORS,
    make_node_client,
)
from .._drivers.sync import Claim
from .._errors import GoblinClaimError
from .._outcomes import Claimed, Completed
from .._protocol.record import build_keys
from .._protocol.scripts import SCRIPTS
from .connect import Client, _short
from .findings import Finding, _expect, _text


def _user(client: Client) -> str:
    try:
        return _text(client.execute_command("ACL WHOAMI"))
    except (*RESPONSE_ERRORS, *CLUSTER_ERRORS):
        return "?"


def _acl_findings(client: Client, namespace: str, native: bool) -> list[Finding]:
    """Run each operation the SDK needs on a scratch key under ``namespace``; report what the user may run."""
    user = _user(client)
    scratch = f"goblin-doctor-{secrets.token_hex(6)}"
    allowed: list[str] = []
    refused: list[str] = []

    def attempt(operation: str, run: Callable[[], object]) -> None:
        try:
            run()
        except GoblinClaimError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            refused.append(f"{operation}: {_short(cause)}")
        else:
            allowed.append(operation)

    script = Claim(client, scratch, namespace=namespace, lease=10, ttl=10, native="never")
    attempt("claim (script)", lambda: _expect(script.acquire(), Claimed))
    attempt("complete", lambda: script.complete(b"doctor"))
    reader = Claim(client, scratch, namespace=namespace, native="never")
    attempt("read a result", lambda: _expect(reader.acquire(), Completed))
    attempt("forget", script.forget)
    if native:
        owner = Claim(client, scratch + "-native", namespace=namespace, lease=10, ttl=10, native="always")
        attempt("claim (GOBLIN.CLAIM)", lambda: _expect(owner.acquire(), Claimed))
        attempt("release (GOBLIN.CAD)", owner.release)
        attempt("forget", owner.forget)
    keys = f"{namespace}:*"
    if refused:
        return [
            Finding(
                "problem",
                f"ACL user {user!r} may not run everything goblin-claim sends on {keys} keys: " + "; ".join(refused),
                f"grant it at least: ~{keys} +evalsha +eval +script|load +command|info"
                + (" +goblin.claim +goblin.cad" if native else "")
                + " (and +wait for replicas=)",
            )
        ]
    return [Finding("ok", f"ACL user {user!r} may run on {keys} keys: {', '.join(dict.fromkeys(allowed))}")]


# What each operation sends, by path. The script path needs EVALSHA and EVAL (EVAL for a cold
# script cache and a batch's recoveries) and every command its scripts call; the native path
# needs the module's command, and a claim that finds the key held reads it with peek.lua.
# Publishing and subscribing only wake waiters, who poll without them: never a problem.
_WAKE = frozenset({"publish", "spublish", "subscribe", "ssubscribe"})
_SHARDED = frozenset({"spublish", "ssubscribe"})  # what a cluster client sends instead
_OPERATIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    # (operation, its scripts, its native commands (scripts then only for peek), its wake-up commands)
    ("claim", ("claim",), ("goblin.claim", "@peek"), ()),
    ("complete", ("complete",), (), ("publish",)),
    ("wait and its wake-up", ("claim",), ("goblin.claim", "@peek"), ("subscribe",)),
    ("extend (and keep-alive)", ("extend",), (), ()),
    ("checkpoint", ("checkpoint",), (), ()),
    ("release", ("release",), ("goblin.cad",), ("publish",)),
    ("forget", ("forget",), (), ("publish",)),
    ("batch (acquire_many)", ("claim",), ("goblin.claim", "@peek"), ()),
)


def script_commands(name: str) -> frozenset[str]:
    """The commands the named script calls (read from its source), lower case."""
    source = next(script.source for script in SCRIPTS if script.name == name)
    called = {match.lower() for match in re.findall(r"redis\.p?call\(\s*[\"'](\w+)[\"']", source)}
    if re.search(r"[\"']s?publish[\"']", source):  # the wake-up, called by a name the caller passes
        called |= {"publish", "spublish"}
    return frozenset(called)


def operation_needs(native: bool, sharded: bool = False) -> list[tuple[str, frozenset[str], frozenset[str]]]:
    """(operation, the commands it needs, its wake-up commands) on the script or native path."""
    rows = []
    for operation, scripts, native_commands, wake in _OPERATIONS:
        needs: set[str] = set()
        if native and native_commands:
            needs.update(command for command in native_commands if not command.startswith("@"))
            if "@peek" in native_commands:
                needs.update({"evalsha", "eval"} | script_commands("peek"))
        else:
            needs.update({"evalsha", "eval"})
            for script in scripts:
                needs.update(script_commands(script))
        woken = {("s" + command if sharded else command) for command in wake}
        woken.update(needs & _WAKE)  # a script that announces: still only a wake-up
        woken = {command for command in woken if (command in _SHARDED) == sharded}
        rows.append((operation, frozenset(needs - _WAKE), frozenset(woken)))
    return rows


def _probe(client: Client, command: str, key: str) -> str | None:
    """Run a harmless form of ``command`` on ``key`` as this user: ``None`` if allowed, else why not."""
    forms: dict[str, Callable[[], object]] = {
        "get": lambda: client.get(key),
        "set": lambda: client.set(key, "doctor", ex=10),
        "pttl": lambda: client.pttl(key),
        "expire": lambda: client.expire(key, 10),
        "del": lambda: client.delete(key),
        "strlen": lambda: client.strlen(key),
        "time": lambda: client.execute_command("TIME"),
        "exists": lambda: client.exists(key),
        "eval": lambda: client.eval("return 1", 1, key),
        "evalsha": lambda: client.evalsha(next(s.sha for s in SCRIPTS if s.name == "peek"), 2, key, key),
        "wait": lambda: client.execute_command("WAIT", 0, 1),
        "publish": lambda: client.publish(key, "doctor"),
        "spublish": lambda: client.spublish(key, "doctor"),
        "goblin.cad": lambda: client.execute_command("GOBLIN.CAD", key, "doctor"),
        "goblin.claim": lambda: client.execute_command("GOBLIN.CLAIM", key, key, "doctor", 10),
        "subscribe": lambda: _probe_subscribe(client, key, sharded=False),
        "ssubscribe": lambda: _probe_subscribe(client, key, sharded=True),
    }

    def fallback() -> object:
        return client.execute_command(command.upper(), key)

    run = forms.get(command, fallback)
    try:
        run()
    except NO_PERMISSION as exc:
        return _short(exc)
    except RESPONSE_ERRORS as exc:
        text = str(exc)
        if "NOPERM" in text or "no permissions" in text.lower() or "can't run this command" in text:
            return _short(exc)
        return None  # refused for another reason (NOSCRIPT, a wrong type): the permission is there
    except ERRORS:  # not an ACL answer (routing, a dropped connection)
        return None
    finally:
        with contextlib.suppress(*ERRORS):
            if command in ("set", "goblin.claim"):
                client.delete(key)
    return None


def _probe_subscribe(client: Client, channel: str, sharded: bool) -> None:
    if isinstance(client, CLUSTERS):  # the node that owns the channel's slot, plainly
        cluster: Any = client  # redis-py leaves get_node_from_key untyped
        client = make_node_client(cluster, cluster.get_node_from_key(channel))
    pubsub = client.pubsub()
    try:
        (pubsub.ssubscribe if sharded else pubsub.subscribe)(channel)
        deadline = 20
        while deadline:  # the confirmation (or the refusal) comes back as a message
            message = pubsub.get_message(timeout=0.1)
            if message is not None:
                return
            deadline -= 1
    finally:
        pubsub.close()


def acl_operation_findings(
    lacking: dict[str, str], user: str, keys: str, native: bool, sharded: bool = False
) -> list[Finding]:
    """Per operation, what the user lacks (``lacking``: command -> the refusal), on the script and native paths."""
    findings: list[Finding] = []
    paths = [(False, "scripts")] + ([(True, "native")] if native else [])
    wake_missing: dict[str, set[str]] = {}
    for use_native, label in paths:
        problems = []
        for operation, needs, wake in operation_needs(use_native, sharded):
            missing = sorted(needs & lacking.keys())
            if missing:
                problems.append(f"{operation} lacks {' '.join(missing)}")
            for command in wake & lacking.keys():
                wake_missing.setdefault(command, set()).add(operation)
        if problems:
            grant = sorted({command for row in operation_needs(use_native, sharded) for command in row[1]})
            findings.append(
                Finding(
                    "problem",
                    f"ACL user {user!r} on the {label} path: " + "; ".join(problems),
                    f"grant ~{keys} " + " ".join(f"+{command}" for command in grant),
                )
            )
    for command, operations in sorted(wake_missing.items()):
        findings.append(
            Finding(
                "note",
                f"ACL user {user!r} may not {command.upper()} ({lacking[command]}): waiters are not woken early "
                f"({', '.join(sorted(operations))}); they poll instead, nothing fails",
                f"optional: grant +{command} and &{keys} to wake waiters at once",
            )
        )
    if "wait" in lacking:
        findings.append(
            Finding(
                "note",
                f"ACL user {user!r} may not WAIT ({lacking['wait']}): claims with replicas= fail",
                "grant +wait if you use replicas=",
            )
        )
    if not findings:
        findings.append(Finding("ok", f"ACL user {user!r} may send every command each operation needs"))
    return findings


def _acl_operation_findings(client: Client, namespace: str, native: bool, cluster: bool) -> list[Finding]:
    user = _user(client)
    key = build_keys(namespace, f"goblin-doctor-{secrets.token_hex(6)}")[0]
    commands = {"wait"} | {command for _op, needs, wake in operation_needs(False, cluster) for command in needs | wake}
    if native:
        commands |= {command for _op, needs, _wake in operation_needs(True, cluster) for command in needs}
    lacking = {command: why for command in sorted(commands) if (why := _probe(client, command, key)) is not None}
    return acl_operation_findings(lacking, user, f"{namespace}:*", native, sharded=cluster)
