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
from .._protocol.scripts import DEL_KEYS, DELEX, DELIFEQ, SCRIPTS, SET_IFEQ, SET_NX_GET
from .connect import Client, _short
from .findings import Finding, _expect, _text


def _user(client: Client) -> str:
    try:
        return _text(client.execute_command("ACL WHOAMI"))
    except (*RESPONSE_ERRORS, *CLUSTER_ERRORS):
        return "?"


def _acl_findings(
    client: Client, namespace: str, native: bool, builtins: frozenset[str] = frozenset()
) -> list[Finding]:
    """Run each operation the SDK needs on a scratch key under ``namespace``; report what the user may run.

    Three runs: the scripts (``native="never"``), the module's commands where it is
    loaded (``native="always"``), and the server's own commands where it has them
    (``builtins``: a default handle). A script refused where the server's own commands
    serve every operation is a note: only handles with options that need scripts fail.
    """
    user = _user(client)
    scratch = f"goblin-doctor-{secrets.token_hex(6)}"
    allowed: list[str] = []
    refused: list[str] = []
    scripted: list[str] = []

    def attempt(operation: str, run: Callable[[], object], into: list[str] | None = None) -> None:
        try:
            run()
        except GoblinClaimError as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            (refused if into is None else into).append(f"{operation}: {_short(cause)}")
        else:
            allowed.append(operation)

    own = bool(builtins & {SET_NX_GET, SET_IFEQ, DELIFEQ, DELEX}) and _may_probe(client)
    if own:
        served = _served(builtins)
        owner = Claim(client, scratch + "-own", namespace=namespace, lease=10, ttl=10)
        attempt(f"claim ({_NAMES[SET_NX_GET]})", lambda: _expect(owner.acquire(), Claimed))
        if SET_IFEQ in builtins:
            attempt(f"complete ({_NAMES[SET_IFEQ]})", lambda: owner.complete(b"doctor"))
        release = served.get("release")
        if release is not None:
            other = Claim(client, scratch + "-own-release", namespace=namespace, lease=10, ttl=10)

            def claim_and_release() -> None:
                _expect(other.acquire(), Claimed)
                _expect_true(other.release())

            attempt(f"release ({release})", claim_and_release)
        attempt("forget (DEL)", owner.forget)
    # Where the server's own commands serve every operation, the scripts serve only options.
    only_options = own and all(operation in _served(builtins) for operation in _DEFAULT_OPERATIONS)
    into = scripted if only_options else None
    script = Claim(client, scratch, namespace=namespace, lease=10, ttl=10, native="never")
    attempt("claim (script)", lambda: _expect(script.acquire(), Claimed), into)
    attempt("complete (script)" if own else "complete", lambda: script.complete(b"doctor"), into)
    reader = Claim(client, scratch, namespace=namespace, native="never")
    attempt("read a result", lambda: _expect(reader.acquire(), Completed), into)
    attempt("forget (script)" if own else "forget", script.forget, into)
    if native:
        owner = Claim(client, scratch + "-native", namespace=namespace, lease=10, ttl=10, native="always")
        attempt("claim (GOBLIN.CLAIM)", lambda: _expect(owner.acquire(), Claimed))
        attempt("release (GOBLIN.CAD)", owner.release)
        attempt("forget", owner.forget)
    keys = f"{namespace}:*"
    findings = []
    if refused:
        findings.append(
            Finding(
                "problem",
                f"ACL user {user!r} may not run everything goblin-claim sends on {keys} keys: " + "; ".join(refused),
                f"grant it at least: ~{keys} +evalsha +eval +script|load +command|info"
                + (" +goblin.claim +goblin.cad" if native else "")
                + " (and +wait for replicas=)",
            )
        )
    else:
        findings.append(Finding("ok", f"ACL user {user!r} may run on {keys} keys: {', '.join(dict.fromkeys(allowed))}"))
    if scripted:
        findings.append(
            Finding(
                "note",
                f"ACL user {user!r} may not run goblin-claim's scripts on {keys} keys ("
                + "; ".join(scripted)
                + "): the server's own commands serve every operation of a default handle, but handles with "
                'at_most_once, checkpoints, fencing, replicas=, two keys (from_keys) or native="never" raise an '
                "error naming the permission",
                "grant +evalsha +eval (or +@scripting) for those options",
            )
        )
    return findings


def _expect_true(released: bool) -> None:
    if not released:
        raise GoblinClaimError("the claim just taken was not released")


def _may_probe(client: Client) -> bool:
    """Whether this user may ask the server which commands it has (the SDK's probe: COMMAND INFO).

    A cluster client reads the command table when it starts (COMMAND): it has it.
    """
    if isinstance(client, CLUSTERS):
        return True
    try:
        client.execute_command("COMMAND INFO", "get")
    except (*RESPONSE_ERRORS, *CLUSTER_ERRORS):
        return False
    return True


# The operations of a default handle, and the server's own commands that may serve them.
_DEFAULT_OPERATIONS = (
    "claim", "complete", "wait and its wake-up", "extend (and keep-alive)", "release", "forget", "batch (acquire_many)",
)  # fmt: skip
_NAMES = {SET_NX_GET: "SET ... NX GET", SET_IFEQ: "SET ... IFEQ", DELIFEQ: "DELIFEQ", DELEX: "DELEX", DEL_KEYS: "DEL"}
# operation -> (the server's own command that serves it, the commands it sends, its wake-up commands)
_OWN: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # A held record is read with GET, PTTL and PEXPIRETIME (the lease left, and the server's clock).
    "claim": ((SET_NX_GET,), ("set", "get", "pttl", "pexpiretime"), ()),
    "complete": ((SET_IFEQ,), ("set", "get"), ("publish",)),  # GET tells a refusal apart
    "wait and its wake-up": ((SET_NX_GET,), ("set", "get", "pttl", "pexpiretime"), ("subscribe",)),
    "extend (and keep-alive)": ((SET_IFEQ,), ("set",), ()),
    "release": ((DELIFEQ, DELEX), (), ("publish",)),  # the delete command itself, below
    "forget": ((DEL_KEYS,), ("del",), ("publish",)),
    "batch (acquire_many)": ((SET_NX_GET,), ("set", "get", "pttl", "pexpiretime"), ()),
}


def _served(builtins: frozenset[str]) -> dict[str, str]:
    """The operations of a default handle the server's own commands serve, with the command (as named)."""
    served = {}
    for operation, (names, _needs, _wake) in _OWN.items():
        found = next((name for name in names if name in builtins), None)
        if found is not None:
            served[operation] = _NAMES[found]
    return served


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


def operation_needs(
    native: bool, sharded: bool = False, builtins: frozenset[str] | None = None
) -> list[tuple[str, frozenset[str], frozenset[str]]]:
    """(operation, the commands it needs, its wake-up commands) on the script or native path.

    With ``builtins`` (the server's own commands: ``SET NX GET``, ``SET IFEQ``, ``DELIFEQ``,
    ``DELEX``, ``DEL``), the path of the server's own commands instead: a row for each
    operation they serve.
    """
    rows = []
    if builtins is not None:
        for operation, (names, sends, wake) in _OWN.items():
            found = next((name for name in names if name in builtins), None)
            if found is None:
                continue
            sent = set(sends) | ({found.lower()} if operation == "release" else set())
            woken = {("s" + command if sharded else command) for command in wake}
            rows.append((operation, frozenset(sent), frozenset(woken)))
        return rows
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


def taken_paths(native: bool, builtins: frozenset[str], probed: bool = True) -> dict[str, str]:
    """The path each operation of a default handle takes: "commands", "native" or "scripts".

    The server's own commands first, where the user may probe for them; then the
    module's, where it is loaded (a claim finding the record held reads it with a
    script); else the scripts.
    """
    own = _served(builtins) if probed else {}
    natives = {operation for operation, _scripts, commands, _wake in _OPERATIONS if commands}
    return {
        operation: "commands" if operation in own else "native" if native and operation in natives else "scripts"
        for operation in _DEFAULT_OPERATIONS
    }


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
        "delifeq": lambda: client.execute_command("DELIFEQ", key, "doctor"),
        "delex": lambda: client.execute_command("DELEX", key, "IFEQ", "doctor"),
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
    lacking: dict[str, str],
    user: str,
    keys: str,
    native: bool,
    sharded: bool = False,
    builtins: frozenset[str] = frozenset(),
    probed: bool = True,
) -> list[Finding]:
    """Per operation, what the user lacks (``lacking``: command -> the refusal), on each path.

    A path's lack is a problem for the operations a default handle sends that way
    (``taken_paths``), and a note for the others: a path no default operation takes
    serves only options (the scripts: at_most_once, checkpoints, fencing, replicas=,
    two keys, native="never"). The paths taken are said once, as a finding of their own.
    """
    findings: list[Finding] = []
    taken = taken_paths(native, builtins, probed)
    own = bool(_served(builtins)) and probed
    paths: list[tuple[str, list[tuple[str, frozenset[str], frozenset[str]]]]] = [
        ("scripts", operation_needs(False, sharded))
    ]
    if native:
        paths.append(("native", operation_needs(True, sharded)))
    if own:
        paths.append(("commands", operation_needs(False, sharded, builtins)))
    labels = {"scripts": "scripts", "native": "native", "commands": "server's own commands"}
    wake_missing: dict[str, set[str]] = {}
    for path, rows in paths:
        problems, untaken, options_only = [], [], []
        for operation, needs, wake in rows:
            missing = sorted(needs & lacking.keys())
            if taken.get(operation) == path:
                if missing:
                    problems.append(f"{operation} lacks {' '.join(missing)}")
                for command in wake & lacking.keys():
                    wake_missing.setdefault(command, set()).add(operation)
            elif missing:
                untaken.extend(missing)
                options_only.append(f"{operation} lacks {' '.join(missing)}")
        grant = sorted({command for row in rows for command in row[1]})
        if problems:
            findings.append(
                Finding(
                    "problem",
                    f"ACL user {user!r} on the {labels[path]} path: " + "; ".join(problems),
                    f"grant ~{keys} " + " ".join(f"+{command}" for command in grant),
                )
            )
        if untaken and path == "scripts":
            # What only options send (checkpoint(), at-most-once records, fences): a note, beside any problem.
            if problems:
                what = "; ".join(options_only) + ", for"
            else:
                what = f"lacks {' '.join(sorted(set(untaken)))}: no operation of a default handle takes it here, but"
            findings.append(
                Finding(
                    "note",
                    f"ACL user {user!r} on the scripts path {what} handles with at_most_once, checkpoints, fencing, "
                    'replicas=, two keys (from_keys) or native="never", which raise an error naming the permission',
                    f"grant ~{keys} " + " ".join(f"+{command}" for command in grant) + " for those options",
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
    if builtins and not probed:
        findings.append(
            Finding(
                "note",
                f"ACL user {user!r} may not run COMMAND INFO, so the SDK cannot find the server's own commands "
                f"({', '.join(sorted(_NAMES[name] for name in builtins if name in _NAMES))}): it runs the scripts",
                "grant +command|info to let claims and stores go without scripts",
            )
        )
    if not findings:
        findings.append(Finding("ok", f"ACL user {user!r} may send every command each operation needs"))
    findings.append(Finding("ok", f"ACL user {user!r}, default handles here: {_paths_line(taken, builtins)}"))
    return findings


def _paths_line(taken: dict[str, str], builtins: frozenset[str]) -> str:
    """Which path each operation takes, as one line."""
    served = _served(builtins)
    by_path: dict[str, list[str]] = {}
    for operation, path in taken.items():
        named = f"{operation} ({served[operation]})" if path == "commands" else operation
        by_path.setdefault(path, []).append(named)
    words = {
        "commands": "the server's own commands for", "native": "the module's commands for", "scripts": "the scripts for"
    }  # fmt: skip
    return "; ".join(f"{words[path]} {', '.join(operations)}" for path, operations in by_path.items())


def _acl_operation_findings(
    client: Client, namespace: str, native: bool, cluster: bool, builtins: frozenset[str] = frozenset()
) -> list[Finding]:
    user = _user(client)
    key = build_keys(namespace, f"goblin-doctor-{secrets.token_hex(6)}")[0]
    commands = {"wait"} | {command for _op, needs, wake in operation_needs(False, cluster) for command in needs | wake}
    if native:
        commands |= {command for _op, needs, _wake in operation_needs(True, cluster) for command in needs}
    probed = _may_probe(client)
    for _op, needs, wake in operation_needs(False, cluster, builtins) if builtins else ():
        commands |= needs | wake
    lacking = {command: why for command in sorted(commands) if (why := _probe(client, command, key)) is not None}
    return acl_operation_findings(lacking, user, f"{namespace}:*", native, cluster, builtins, probed)
