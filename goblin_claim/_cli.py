"""``goblin-claim``: the command operators reach for first.

- ``goblin-claim doctor --url URL``: is this server ready for goblin-claim? Native
  commands, scripts, cluster, eviction policy, what the connected ACL user may run;
  each finding with what to do. Exits 1 when there is a problem.
- ``goblin-claim inspect KEY [--namespace NS | --http METHOD PATH [--owner OWNER]]``:
  what a key's record holds; an HTTP door's key by its request, a decorated
  function's or a job's by its name (``--function``, ``--task``).
- ``goblin-claim forget KEY [...]``: reopen a key (``Claim.forget()``), saying what was deleted.
- ``goblin-claim scan --namespace NS [--state STATE]``: every key of a namespace with
  its state, holder and TTL, walked with SCAN on every primary (never KEYS).
- ``goblin-claim stats --namespace NS``: the same walk, counted by state; sampled and
  scaled by DBSIZE (and labelled an estimate) on large keyspaces.
- ``goblin-claim namespaces``: the namespaces in use, with their keys counted.

Every subcommand takes ``--url`` (default: ``$REDIS_URL``, else
``redis://localhost:6379/0``; ``valkey://`` and ``valkeys://`` URLs connect with
valkey-py) and talks to a cluster when the server is one. The
standard library's argparse only: no run-time dependency beyond the package's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import secrets
import sys
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO

import redis
import redis.cluster

from . import _http
from ._clients import (
    CLUSTER_ERRORS,
    CLUSTERS,
    CONNECTION_ERRORS,
    ERRORS,
    NO_PERMISSION,
    RESPONSE_ERRORS,
    make_node_client,
)
from ._core import (
    BUILTIN_COMMANDS,
    DONE_PREFIX,
    FENCE_SUFFIX,
    NATIVE_COMMANDS,
    SCRIPTS,
    build_keys,
    check_namespace,
)
from ._envelope import FINGERPRINT_CHARS, Codec, ErrorEnvelope, ResultEnvelope, UnstorableEnvelope
from ._errors import GoblinClaimError, InvalidArgumentError
from ._outcomes import Claimed, Completed
from ._sync import Claim

__all__ = ["Entry", "Finding", "KeyReport", "NodeTally", "doctor", "estimate", "inspect_key", "main", "walk"]

DEFAULT_URL = "redis://localhost:6379/0"
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
# Stopped by the reader (`| head`) or by Ctrl-C: what a shell shows for SIGPIPE and SIGINT.
EXIT_PIPE, EXIT_INTERRUPTED = 128 + 13, 128 + 2
# "warning": worth changing, but nothing goblin-claim promises is at risk (exit status 0).
Level = Literal["ok", "note", "warning", "problem"]
Client = Any  # a standalone or cluster client of redis-py or valkey-py: both type them loosely

_MODULE_HINT = (
    "build the reference module (make native) and load it on every node: "
    "redis-server --loadmodule /path/to/goblin.so, or `loadmodule /path/to/goblin.so` in redis.conf"
)


@dataclass(frozen=True)
class Finding:
    """One thing ``doctor`` found: how it stands, what it is, and what to do about it."""

    level: Level
    what: str
    todo: str = ""


# --------------------------------------------------------------------------- connecting


# URL schemes that valkey-py's clients take; every other goes to redis-py's.
_VALKEY_SCHEMES = ("valkey://", "valkeys://")
# What connecting can raise: the client's errors, or a URL it cannot take.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*ERRORS, ValueError)


def _client_classes(url: str) -> tuple[Any, Any]:
    """The standalone and cluster client classes for ``url``: valkey-py's for ``valkey://``.

    Raises:
        ValueError: A ``valkey://`` or ``valkeys://`` URL without valkey-py installed.
    """
    if not url.lower().startswith(_VALKEY_SCHEMES):
        return redis.Redis, redis.cluster.RedisCluster
    try:
        import valkey
        import valkey.cluster
    except ImportError:
        raise ValueError(
            f"{url.split('://', 1)[0]}:// URLs need valkey-py: pip install 'goblin-claim[valkey]' "
            "(or give a redis:// URL: a Valkey server takes those too)"
        ) from None
    return valkey.Valkey, valkey.cluster.ValkeyCluster


def connect(url: str) -> tuple[Client, bool]:
    """A client for ``url``, and whether the server is a cluster node (then a cluster client).

    ``redis://``, ``rediss://`` and ``unix://`` URLs get redis-py's clients;
    ``valkey://`` and ``valkeys://`` get valkey-py's.

    Raises:
        redis.RedisError: The server cannot be reached or refuses the connection
            (``valkey.ValkeyError`` with valkey-py's clients).
        ValueError: A URL the client cannot parse, or a ``valkey://`` one without valkey-py.
    """
    standalone, cluster_class = _client_classes(url)
    client = standalone.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
        try:
            cluster = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
        except RESPONSE_ERRORS:  # INFO refused by the ACL: try the cluster command itself
            try:
                client.execute_command("CLUSTER MYID")  # type: ignore[no-untyped-call, unused-ignore]
                cluster = True
            except RESPONSE_ERRORS:
                cluster = False
    except BaseException:
        client.close()
        raise
    if not cluster:
        return client, False
    client.close()
    return cluster_class.from_url(url, socket_timeout=5, socket_connect_timeout=5), True


def _primaries(client: Client, cluster: bool) -> list[tuple[str, Any]]:
    """(name, plain client) for every primary: the one server, or each cluster primary."""
    if not cluster:
        kwargs = client.connection_pool.connection_kwargs
        return [(f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}", client)]
    return [(node.name, make_node_client(client, node)) for node in client.get_primaries()]


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # not a URL urllib can take apart: show its scheme only
        return url.split("://", 1)[0] + "://..." if "://" in url else "..."
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


# --------------------------------------------------------------------------- doctor


def native_finding(per_node: dict[str, bool | None]) -> Finding:
    """What the nodes' answers to ``COMMAND INFO goblin.claim goblin.cad`` mean (``None``: refused)."""
    present = [node for node, has in per_node.items() if has]
    unknown = [node for node, has in per_node.items() if has is None]
    if unknown:
        return Finding(
            "note",
            f"cannot tell whether GOBLIN.CLAIM is loaded: this user may not run COMMAND INFO on {', '.join(unknown)}; "
            "the SDK then uses its Lua scripts",
            "grant +command|info (or +command) to let the SDK detect the native commands",
        )
    if len(present) == len(per_node):
        return Finding("ok", 'GOBLIN.CLAIM and GOBLIN.CAD are loaded: the SDK uses them (native="auto")')
    if present:
        missing = [node for node in per_node if node not in present]
        return Finding(
            "problem",
            f"GOBLIN.CLAIM is loaded on {', '.join(present)} but not on {', '.join(missing)}: a cluster with the "
            "module on some nodes only is not supported",
            f"load the module on every node, or on none; {_MODULE_HINT}",
        )
    return Finding(
        "note",
        "GOBLIN.CLAIM / GOBLIN.CAD are not loaded: the SDK runs its Lua scripts (same replies, more server CPU)",
        f"optional: {_MODULE_HINT}",
    )


def owner_check_finding(per_node: dict[str, frozenset[str]]) -> Finding | None:
    """What the nodes' built-in owner checks (DELIFEQ, DELEX) mean; ``None`` where no node has one."""
    if not per_node or not any(per_node.values()):
        return None
    names = sorted(set().union(*per_node.values()))
    if all(per_node.values()):
        return Finding(
            "ok",
            f"the server has its own owner checks ({' / '.join(names)}, SET ... IFEQ): release() and extend() "
            "use them, with no module or scripting",
        )
    lacking = [node for node, found in per_node.items() if not found]
    return Finding(
        "note",
        f"{', '.join(lacking)} lack(s) the owner checks ({' / '.join(names)}) the other nodes have: release() and "
        "extend() run as scripts there",
        "run one server version on every node",
    )


def eviction_finding(node: str, policy: str, maxmemory: int) -> Finding:
    """Whether ``maxmemory-policy`` can evict what goblin-claim stores."""
    if policy == "noeviction":
        return Finding("ok", f"{node}: maxmemory-policy noeviction: claims and completed records are never evicted")
    # Every key goblin-claim writes has a TTL, so volatile-* policies pick them as readily as allkeys-*.
    risk = (
        f"maxmemory-policy {policy} can evict claims and completed records (every key goblin-claim writes has a "
        "TTL, so volatile-* policies evict them too): an evicted record reopens its key, so the next caller runs "
        "the work again, beside a live owner or after it completed"
    )
    todo = "CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or a separate Redis for claims"
    if maxmemory == 0:
        return Finding("note", f"{node}: no maxmemory is set, so nothing is evicted now; once one is, {risk}", todo)
    return Finding("problem", f"{node}: {risk}", todo)


def pubsub_metrics_finding(config: object | None, available: bool = True) -> Finding:
    """Whether redis-py's OpenTelemetry pub/sub metrics would record channel names.

    goblin-claim's wake-up channels are named after claim keys, so a metric attribute per
    channel puts every idempotency key a process waited on into the metrics backend (and
    grows its cardinality with every key). redis-py 8 records the channel of each message
    received when its ``OTelConfig`` enables ``MetricGroup.PUBSUB`` without
    ``hide_pubsub_channel_names=True``.

    Args:
        config: The ``redis.observability.OTelConfig`` in force, or ``None`` when observability
            was not initialised in this process.
        available: Whether this redis-py has ``redis.observability`` at all.
    """
    where = "redis-py's OpenTelemetry metrics"
    todo = (
        "pass OTelConfig(..., hide_pubsub_channel_names=True) to get_observability_instance().init(...), "
        "or leave MetricGroup.PUBSUB out of metric_groups"
    )
    if not available:
        return Finding("ok", f"redis-py {redis.__version__} has no pub/sub metrics: channel names are not recorded")
    if config is None:
        return Finding(
            "note",
            f"{where} are not initialised in this process, so what your application records is unknown here: with "
            "MetricGroup.PUBSUB they record every channel name, and goblin-claim's channels are named after claim keys",
            f"doctor --import <the module that sets up redis-py's observability> checks it; {todo}",
        )
    groups = getattr(config, "metric_groups", None)
    enabled = bool(getattr(config, "enabled_telemetry", 0))
    pubsub = _pubsub_group()
    if not enabled or groups is None or pubsub is None or not groups & pubsub:
        return Finding("ok", f"{where} record no pub/sub messages (MetricGroup.PUBSUB is off): no channel names")
    hidden = getattr(config, "hide_pubsub_channel_names", None)
    if hidden is True:
        return Finding("ok", f"{where} record pub/sub messages with channel names hidden (hide_pubsub_channel_names)")
    if hidden is None:
        return Finding(
            "note",
            f"{where} record pub/sub messages, and this redis-py has no hide_pubsub_channel_names: they may record "
            "channel names, which goblin-claim names after claim keys",
            "leave MetricGroup.PUBSUB out of metric_groups",
        )
    return Finding(
        "warning",
        f"{where} record the channel name of every pub/sub message (MetricGroup.PUBSUB without "
        "hide_pubsub_channel_names): goblin-claim's wake-up channels are named after claim keys, so every key a "
        "waiter listened on becomes a metric attribute, in your metrics backend and growing its cardinality",
        todo,
    )


def _pubsub_group() -> Any:
    try:
        from redis.observability.config import MetricGroup
    except ImportError:  # redis-py before observability
        return None
    return getattr(MetricGroup, "PUBSUB", None)


def _observability_config() -> tuple[object | None, bool]:
    """The OTelConfig redis-py's observability runs with in this process (None: not set up), and whether it exists."""
    try:
        from redis.observability.providers import get_observability_instance
    except ImportError:
        return None, False
    manager = get_observability_instance().get_provider_manager()
    return (manager.config if manager is not None else None), True


def _server_findings(nodes: list[tuple[str, Any]], cluster: bool) -> list[Finding]:
    findings: list[Finding] = []
    name, first = nodes[0]
    try:
        server = first.info("server")
        version = server.get("valkey_version") or server.get("redis_version", "?")
        product = "Valkey" if "valkey_version" in server else "Redis"
        shape = f"a cluster of {len(nodes)} primaries" if cluster else "standalone"
        findings.append(Finding("ok", f"connected to {product} {version} at {name}, {shape}"))
    except RESPONSE_ERRORS as exc:
        findings.append(Finding("note", f"connected to {name}; INFO is refused ({_short(exc)})"))
    for node, conn in nodes:
        try:
            role = conn.info("replication").get("role")
        except RESPONSE_ERRORS:
            continue
        if role not in (None, "master"):
            findings.append(
                Finding(
                    "problem",
                    f"{node} is a replica ({role}): it refuses claims, and a claim read here may be stale",
                    "point the SDK at the primary",
                )
            )
    return findings


def _native_per_node(nodes: list[tuple[str, Any]]) -> dict[str, bool | None]:
    per_node: dict[str, bool | None] = {}
    for node, conn in nodes:
        try:
            reply = conn.execute_command("COMMAND INFO", *(name.lower() for name in NATIVE_COMMANDS))
        except RESPONSE_ERRORS:  # NOPERM
            per_node[node] = None
            continue
        per_node[node] = isinstance(reply, list) and all(bool(entry) for entry in reply)
    return per_node


def _owner_checks_per_node(nodes: list[tuple[str, Any]]) -> dict[str, frozenset[str]]:
    per_node: dict[str, frozenset[str]] = {}
    for node, conn in nodes:
        try:
            reply = conn.execute_command("COMMAND INFO", *(name.lower() for name in BUILTIN_COMMANDS))
        except RESPONSE_ERRORS:  # NOPERM: native_finding has said so already
            continue
        if isinstance(reply, list):
            per_node[node] = frozenset(name for name, entry in zip(BUILTIN_COMMANDS, reply, strict=False) if entry)
    return per_node


def _script_findings(client: Client, cluster: bool) -> list[Finding]:
    try:
        loaded = [client.script_load(script.source) for script in SCRIPTS]
    except NO_PERMISSION as exc:
        return [
            Finding(
                "note",
                f"this user may not SCRIPT LOAD ({_short(exc)}): the SDK loads its scripts with EVAL on first use "
                "instead (one extra round trip per script and connection cache miss)",
                "grant +script|load",
            )
        ]
    except RESPONSE_ERRORS as exc:
        return [Finding("problem", f"the scripts do not load: {_short(exc)}", "enable Lua scripting on this server")]
    if cluster:  # RedisCluster loads on every primary and answers with one node's SHA
        loaded = [next(iter(sha.values())) if isinstance(sha, dict) else sha for sha in loaded]
    mismatched = [s.name for s, sha in zip(SCRIPTS, loaded, strict=True) if _text(sha) != s.sha]
    if mismatched:
        return [Finding("problem", f"scripts hash differently on the server: {', '.join(mismatched)}")]
    where = " on every primary" if cluster else ""
    return [Finding("ok", f"the {len(SCRIPTS)} Lua scripts load{where} (SCRIPT LOAD)")]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _eviction_findings(nodes: list[tuple[str, Any]]) -> list[Finding]:
    findings = []
    for node, conn in nodes:
        try:
            memory = conn.info("memory")
        except RESPONSE_ERRORS as exc:
            findings.append(
                Finding("note", f"{node}: cannot read maxmemory-policy ({_short(exc)})", "check it by hand: noeviction")
            )
            continue
        findings.append(
            eviction_finding(node, str(memory.get("maxmemory_policy", "?")), int(memory.get("maxmemory", 0)))
        )
    return findings


def persistence_finding(node: str, appendonly: str, appendfsync: str, save: str) -> Finding:
    """What a restart of ``node`` does to claims and results, from its persistence settings."""
    if appendonly == "yes":
        if appendfsync == "always":
            return Finding("ok", f"{node}: AOF with appendfsync always: a restart or a crash keeps every write")
        if appendfsync == "everysec":
            return Finding(
                "note",
                f"{node}: AOF with appendfsync everysec: a restart or a redis-server crash keeps every write, but a "
                "machine crash or power loss can lose the last second: completed work done then runs again",
                "CONFIG SET appendfsync always where even that second matters (it costs write throughput)",
            )
        return Finding(
            "warning",
            f"{node}: AOF with appendfsync {appendfsync}: the OS flushes when it likes, so a machine crash can lose "
            "many seconds of completed work, which then runs again",
            "CONFIG SET appendfsync everysec (or always), and set it in redis.conf",
        )
    todo = "CONFIG SET appendonly yes and appendfsync everysec (or always), and set them in redis.conf"
    if save.strip():
        return Finding(
            "problem",
            f"{node}: RDB snapshots only (save {save}), no AOF: a restart or crash loses every write since the last "
            "snapshot, so work completed since runs again and live claims vanish (for claims that must survive "
            "restarts)",
            todo,
        )
    return Finding(
        "problem",
        f"{node}: persistence is off (no AOF, no RDB): a restart forgets every claim and result, so all completed "
        "work runs again (for claims that must survive restarts)",
        todo,
    )


def min_replicas_finding(node: str, replicas: int, min_replicas: int, max_lag: int) -> Finding:
    """Whether a primary with replicas refuses writes once cut off from them (``min-replicas-to-write``)."""
    if min_replicas >= 1:
        return Finding(
            "ok",
            f"{node}: {replicas} replica(s), min-replicas-to-write {min_replicas} (max lag {max_lag} s): cut off from "
            "its replicas, this primary refuses writes instead of accepting claims a failover would lose",
        )
    return Finding(
        "warning",
        f"{node}: {replicas} replica(s) but min-replicas-to-write 0: a primary cut off from its replicas (frozen, "
        "partitioned) keeps accepting claims and results until it is demoted, and the failover loses them: callers "
        "get different answers and work runs twice",
        "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 2 on every data node, and use replicas=1",
    )


def _config(conn: Any, name: str) -> str | None:
    try:
        reply = conn.config_get(name)
    except RESPONSE_ERRORS:  # CONFIG refused by the ACL (or a managed service)
        return None
    return None if name not in reply else _text(reply[name])


def _durability_findings(nodes: list[tuple[str, Any]], durable: bool) -> list[Finding]:
    findings = []
    for node, conn in nodes:
        appendonly, appendfsync, save = (_config(conn, name) for name in ("appendonly", "appendfsync", "save"))
        if appendonly is None or appendfsync is None or save is None:
            findings.append(
                Finding(
                    "note",
                    f"{node}: cannot read its persistence settings (CONFIG GET is refused)",
                    "check by hand: appendonly yes, appendfsync everysec or always",
                )
            )
        else:
            found = persistence_finding(node, appendonly, appendfsync, save)
            if found.level == "problem" and not durable:  # --ephemeral: forgetting on restart is accepted
                found = Finding("note", found.what, found.todo)
            findings.append(found)
        try:
            replicas = int(conn.info("replication").get("connected_slaves", 0))
        except RESPONSE_ERRORS:
            continue
        if replicas:
            wanted, lag = _config(conn, "min-replicas-to-write"), _config(conn, "min-replicas-max-lag")
            if wanted is None or lag is None:
                findings.append(
                    Finding(
                        "note",
                        f"{node}: {replicas} replica(s); cannot read min-replicas-to-write (CONFIG GET is refused)",
                        "check by hand: min-replicas-to-write 1",
                    )
                )
            else:
                findings.append(min_replicas_finding(node, replicas, int(wanted), int(lag)))
    return findings


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


def _expect(outcome: object, kind: type) -> None:
    if not isinstance(outcome, kind):
        raise GoblinClaimError(f"expected {kind.__name__}, got {outcome!r}")


def doctor(
    client: Client, cluster: bool, namespace: str = "goblin", write: bool = True, durable: bool = True
) -> list[Finding]:
    """Everything ``goblin-claim doctor`` checks, as findings.

    Args:
        client: A connected client (a cluster client on a cluster).
        cluster: Whether ``client`` is a cluster client.
        namespace: The namespace whose keys the ACL check writes under (one scratch claim, 10 s TTL).
        write: Whether to run that check (it writes and deletes a scratch record).
        durable: Whether claims must survive a restart; ``False`` makes persistence off a note.
    """
    nodes = _primaries(client, cluster)
    findings = _server_findings(nodes, cluster)
    native = native_finding(_native_per_node(nodes))
    findings.append(native)
    owner_checks = owner_check_finding(_owner_checks_per_node(nodes))
    if owner_checks is not None:
        findings.append(owner_checks)
    findings += _script_findings(client, cluster)
    findings += _eviction_findings(nodes)
    findings += _durability_findings(nodes, durable)
    if write:
        findings += _acl_findings(client, namespace, native.level == "ok")
        findings += _acl_operation_findings(client, namespace, native.level == "ok", cluster)
    else:
        findings.append(Finding("note", "ACL not checked (--no-write)", "run doctor without --no-write to check it"))
    findings.append(pubsub_metrics_finding(*_observability_config()))
    return findings


def _print_findings(findings: Sequence[Finding], out: TextIO) -> None:
    labels = {"ok": "ok", "note": "note", "warning": "WARNING", "problem": "PROBLEM"}
    for finding in findings:
        print(f"  {labels[finding.level]:<8} {finding.what}", file=out)
        if finding.todo and finding.level != "ok":
            print(f"  {'':<8} -> {finding.todo}", file=out)
    problems = sum(finding.level == "problem" for finding in findings)
    warnings = sum(finding.level == "warning" for finding in findings)
    summary = f"{problems} problem{'s' if problems != 1 else ''}" if problems else "no problems"
    if warnings:
        summary += f", {warnings} warning{'s' if warnings != 1 else ''}"
    print(summary, file=out)


# --------------------------------------------------------------------------- inspect and forget


@dataclass
class KeyReport:
    """What a key's record holds, in words, and whether that is a problem."""

    state: str
    lines: list[str] = field(default_factory=list)
    problem: bool = False
    exists: bool = False  # the record, as forget() would delete it
    legacy: list[str] = field(default_factory=list)  # an older release's keys of the same key, still there
    marker: str | None = None  # Celery's enqueue_once marker beside the record, when there is one


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


def split_record(value: bytes) -> tuple[bytes, bytes] | None:
    """``(token, value)`` of a completed record ``done <token> <value>``; ``None`` for anything else."""
    if not value.startswith(_DONE):
        return None
    cut = value.find(b" ", len(_DONE))
    if cut < 0:
        return None
    return value[len(_DONE) : cut], value[cut + 1 :]


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
    fence, marker = record + FENCE_SUFFIX, record + _TASK.decode()
    legacy = _legacy_names(namespace, key)
    pipe = client.pipeline(transaction=False)
    for name in (record, fence, *legacy, marker):
        pipe.type(name)
        pipe.pttl(name)
    replies = pipe.execute()
    kind, pttl = _text(replies[0]), int(replies[1])
    fence_type = _text(replies[2])
    value = client.get(record) if kind == "string" else None
    counter = client.get(fence) if fence_type == "string" else None
    first = client.get(marker) if _text(replies[-2]) == "string" else None
    report = KeyReport("", exists=kind != "none")
    lines = report.lines
    lines.append(f"key {key!r} in namespace {namespace!r}")
    if kind == "none" or (kind == "string" and value is None):  # expired between the reads
        lines.append(f"record  {record}: none")
        report.state = "free: the next acquire() claims it"
    elif kind != "string":
        lines.append(f"record  {record}: a {kind}, not written by goblin-claim")
        report.state = f"odd: a {kind} where the record belongs; acquire() raises WrongTypeError"
        report.problem = True
    else:
        assert isinstance(value, bytes)
        parts = split_record(value)
        if parts is not None:
            token, stored = parts
            owner = _FINGERPRINT.sub(b"", token)
            fingerprint = token[len(owner) + 1 :].decode() or None
            lines.append(f"record  {record}: done by {_shown(owner)}, {len(stored)} bytes of value, {_ttl(pttl)}")
            lines += _describe_value(stored, fingerprint)
            kept = "for good" if pttl == -1 else f"{pttl / 1000:.0f} s more"
            report.state = f"done by {_shown(owner)}, kept {kept}: duplicates get the result"
        elif value.startswith(_DONE):
            lines.append(f"record  {record}: {_shown(value)}, {_ttl(pttl)}")
            report.state = (
                "odd: a done marker without a value, not written by this release's complete(): acquire() raises "
                f"ResultLostError; `goblin-claim forget {key}` reopens the key"
            )
            report.problem = True
        else:
            lines.append(f"record  {record}: {_shown(value)}, {_ttl(pttl)}")
            if pttl == -1:
                report.state = f"held by {_shown(value)}, with no lease end: in flight until the record is deleted"
            else:
                report.state = f"held by {_shown(value)}, lease ends in {pttl / 1000:.1f} s: in flight"
    if counter is not None:
        lines.append(f"fence   {fence}: {_shown(counter)} (the fence of the latest claim)")
    if first is not None:
        report.marker = marker
        lines.append(f"task    {marker}: {_shown(first)}, {_ttl(int(replies[-1]))} (Celery's enqueue_once marker)")
    for index, name in enumerate(legacy):
        legacy_type, legacy_pttl = _text(replies[4 + 2 * index]), int(replies[5 + 2 * index])
        if legacy_type == "none":
            continue
        report.legacy.append(name)
        lines.append(
            f"legacy  {name}: a {legacy_type}, {_ttl(legacy_pttl)}: written by an older release (two keys per key); "
            "this release neither reads nor deletes it, and callers of the two releases do not see each other's "
            "claims: run one release everywhere, then let it expire (or DEL it)"
        )
        report.problem = True
    return report


# --------------------------------------------------------------------------- scan and stats

State = Literal["in-flight", "done", "odd"]
STATES: tuple[State, ...] = ("in-flight", "done", "odd")
DEFAULT_BATCH = 500
# Above this many keys (DBSIZE, summed over the primaries), stats samples unless --exact.
EXACT_UP_TO = 1_000_000
DEFAULT_SAMPLE = 100
# A record whose head reads differently before and after its TTL is read again,
# this many times in all; past that it is reported as changing.
_READS = 3
# How much of a record a walk reads: its marker and token, never a large value whole.
_HEAD = 1024

# The decorator and the HTTP middleware end their tokens with ".<hex digits>", the call's
# fingerprint: a hash of the arguments, which a low-entropy argument lets anyone guess
# back. Listings show the part before it: who holds the claim.
_FINGERPRINT = re.compile(rb"\.[0-9a-f]{%d}(?:[0-9a-f]{%d})?\Z" % (FINGERPRINT_CHARS, FINGERPRINT_CHARS))
_ESCAPED = re.compile(r"%(25|7B|7D)")
_UNESCAPED = {"25": "%", "7B": "{", "7D": "}"}
_GLOB = re.compile(r"([*?\[\]\\])")
_DONE = DONE_PREFIX.encode()
_FENCE = FENCE_SUFFIX.encode()
# The Celery door's enqueue_once keeps the first message's task id beside the record.
_TASK = b":task"
# An older release laid each key out on two keys, <ns>:{<key>}:claim and <ns>:{<key>}:result.
_LEGACY_SUFFIXES = (b":claim", b":result")
_SUFFIXES = (b"", _FENCE, _TASK, *_LEGACY_SUFFIXES)


@dataclass(frozen=True)
class Entry:
    """One key of a namespace as ``scan`` lists it.

    Attributes:
        state: ``in-flight``, ``done`` or ``odd``.
        key: The idempotency key, as ``inspect`` and ``forget`` take it; for a name that is not
            laid out as this release lays out keys (an older release's two keys among them),
            the Redis key itself.
        ttl_ms: What is left of the lease (in flight) or of the retention (done); ``-1`` for no
            TTL, ``None`` when none applies.
        holder: The holder token's owner part (never the call fingerprint after it), or ``None``.
        note: What is wrong, for odd keys.
        raises: What ``acquire()`` raises on this key (``WrongTypeError``, ``ResultLostError``),
            ``None`` when it serves the key: such a key makes ``scan`` and ``stats`` exit 1.
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
    """Who holds a claim: its token without the call fingerprint the decorator appends."""
    return printable(_FINGERPRINT.sub(b"", token))


def scan_pattern(namespace: str) -> str:
    """The SCAN MATCH pattern of every key goblin-claim writes under ``namespace``."""
    return _GLOB.sub(r"\\\1", namespace) + ":{*"


def parse_name(name: bytes, prefix: bytes) -> tuple[bytes, bytes] | None:
    """(hash tag, suffix) of a name under ``prefix`` (``<ns>:{``), else ``None``.

    The suffix is ``b""`` for a record ``<ns>:{<tag>}``, ``b":fence"`` for its fence
    counter, ``b":task"`` for Celery's enqueue_once marker, and ``b":claim"`` or
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


def classify(key: str, kind: str, pttl: int, head: bytes | None) -> Entry | None:
    """The state of one record from its type, TTL and head, read together; ``None`` when it is gone.

    Args:
        key: The idempotency key, as shown.
        kind: TYPE of the record's key (``none``, ``string``, ``hash``...).
        pttl: PTTL of the record's key (-2 absent, -1 no TTL).
        head: The record's first bytes (up to 1024; enough for its marker and token), when it is a string.
    """
    if kind == "none":
        return None  # expired or forgotten since SCAN named it
    if kind != "string" or head is None:
        note = f"a {kind}, not written by goblin-claim: acquire() raises WrongTypeError"
        return Entry("odd", key, _left(pttl), None, note, "WrongTypeError")
    if head.startswith(_DONE):
        cut = head.find(b" ", len(_DONE))
        if cut < 0 and len(head) < _HEAD:
            return Entry(
                "odd",
                key,
                _left(pttl),
                owner_part(head[len(_DONE) :]),
                "a done marker without a value, not written by this release's complete(): acquire() raises "
                "ResultLostError until the TTL ends or `goblin-claim forget` reopens the key",
                "ResultLostError",
            )
        token = head[len(_DONE) : cut] if cut >= 0 else head[len(_DONE) :]
        return Entry("done", key, _left(pttl), owner_part(token), _NO_TTL if pttl == -1 else "")
    return Entry(
        "in-flight", key, _left(pttl), owner_part(head), _NO_TTL + ", so it never frees itself" if pttl == -1 else ""
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


def _read_records(conn: Any, prefix: bytes, tags: Sequence[bytes]) -> list[tuple[str, int, bytes | None] | None]:
    """TYPE, PTTL and head (GETRANGE) of each tag's record: one round trip for the batch.

    Pipelined without MULTI (a node's keys span many slots, and a cluster refuses
    cross-slot transactions), so the head is read again after the TTL: a reading is
    kept only when both heads agree, which rules out a complete(), forget(), expiry
    or new claim landing between them (a record names its token, and a token is
    unique to its owner). ``None`` for a record that changed on every read.
    """
    readings: dict[bytes, tuple[str, int, bytes | None] | None] = dict.fromkeys(tags)
    pending = list(tags)
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
        replies = pipe.execute(raise_on_error=False)
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
    return [readings[tag] for tag in tags]


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
        if suffix in (_FENCE, _TASK):
            continue  # a fence counter or Celery's marker: beside the record by design, which speaks for them
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
    for tag, reading in zip(tags, _read_records(conn, prefix, list(tags)), strict=True):
        key = key_of(tag)
        if reading is None:
            yield Entry("odd", key, note="it changed on every read (busy): look again with inspect")
            continue
        entry = classify(key, *reading)
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
    not a fence counter or Celery's marker), so a namespace whose records are gone but
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
                    found[space] = found.get(space, 0) + (parsed[1] not in (_FENCE, _TASK))
            if int(cursor) == 0:
                break
    return dict(sorted(found.items()))


def _shown_ttl(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms == -1:
        return "no TTL"
    return f"{ms / 1000:.1f} s"


# --------------------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL", DEFAULT_URL),
        help="the server (a cluster node is enough): redis://[user:password@]host:port/db "
        "(rediss:// for TLS; valkey:// or valkeys:// connect with valkey-py); "
        f"default $REDIS_URL, else {DEFAULT_URL}",
    )
    keyed = argparse.ArgumentParser(add_help=False)
    keyed.add_argument(
        "key",
        help="the idempotency key: as passed to Claim(...), as key= gives it to @idempotent or a job door, or an "
        "HTTP request's Idempotency-Key header value (with --http; a bare token or an sf-string)",
    )
    keyed.add_argument(
        "--namespace",
        "--function",
        "--task",
        dest="namespace",
        metavar="NS",
        help="the namespace the key lives in: Claim's namespace= (default: goblin); a decorated function's "
        "<module>.<qualified name> (e.g. shop.payments.charge), which is an RQ or arq job's too; a Celery task's or "
        "Dramatiq actor's name; with --http, the door's namespace= (default: goblin-http)",
    )
    keyed.add_argument(
        "--http",
        nargs=2,
        metavar=("METHOD", "PATH"),
        help="KEY is the Idempotency-Key of this HTTP request to an ASGI, WSGI, Django or Flask door: its method "
        "and path (or URL; the query string is not part of the key)",
    )
    keyed.add_argument(
        "--owner",
        help="with --http: what the door's scope= function returned for the request (default: none, a door "
        "without scope= or with shared_scope=True)",
    )
    keyed.add_argument(
        "--owner-type",
        choices=("str", "int", "uuid"),
        default="str",
        help="the type scope= returned (default: str; the int 7 and the str '7' are two owners)",
    )
    walked = argparse.ArgumentParser(add_help=False)
    walked.add_argument(
        "--namespace",
        default="goblin",
        help="the namespace to walk (default: goblin, Claim's default; @idempotent's default is the function's "
        "<module>.<qualified name>, e.g. shop.payments.charge)",
    )
    walked.add_argument(
        "--count",
        type=_positive,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"SCAN's COUNT: names per round trip; each batch's records are read in one more "
        f"(default: {DEFAULT_BATCH})",
    )
    parser = argparse.ArgumentParser(
        prog="goblin-claim",
        description="Operate goblin-claim: check a server, look at a key, reopen a key, find what is stuck.",
        epilog="examples:\n"
        "  goblin-claim doctor --url redis://localhost:6379/0\n"
        "  goblin-claim inspect evt88\n"
        "  goblin-claim inspect order-42 --function shop.payments.charge\n"
        "  goblin-claim inspect order-42 --http POST /payments --owner alice\n"
        "  goblin-claim forget evt88\n"
        "  goblin-claim namespaces\n"
        "  goblin-claim scan --namespace shop.payments.charge --state in-flight\n"
        "  goblin-claim stats --namespace shop.payments.charge\n"
        "exit status: 0 when all is well; 1 on a problem (doctor's findings, a key inspect finds odd, a key scan or "
        "stats finds that acquire() raises on, no server); 2 on bad usage; 141 when the reader closes the pipe "
        "(| head), as SIGPIPE ends `yes | head`; 130 on Ctrl-C.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "doctor",
        parents=[url],
        help="check that a server is ready for goblin-claim",
        description="Check a server: native GOBLIN.CLAIM / GOBLIN.CAD, the Lua scripts, cluster or not, whether "
        "maxmemory-policy can evict results, and what the connected ACL user may run (by claiming, completing and "
        "forgetting one scratch key under the namespace, with a 10 s TTL), whether a restart keeps completed work "
        "(AOF, appendfsync, RDB) and whether a primary with replicas refuses writes once cut off from them "
        "(min-replicas-to-write). Each finding says what to do. "
        "Exits 1 when there is a problem.",
    )
    check.add_argument(
        "--namespace", default="goblin", help="where the ACL check writes its scratch key (default: goblin)"
    )
    check.add_argument("--no-write", action="store_true", help="skip the ACL check, which writes a scratch key")
    check.add_argument(
        "--ephemeral",
        action="store_true",
        help="claims need not survive a restart: persistence off is a note, not a problem",
    )
    check.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (repeatable): the application module that sets up redis-py's OpenTelemetry "
        "observability, so doctor checks whether its pub/sub metrics record channel names (claim keys)",
    )
    commands.add_parser(
        "inspect",
        parents=[keyed, url],
        help="show what a key's record holds",
        description="Show what a key's record holds: free, held by a token (with the lease left), or done (by "
        "which token, with the retention left), and the stored result, the @idempotent JSON envelope decoded; "
        "also the fence counter, and keys an older release's two-key layout left for the key. Exits 1 on a "
        "record goblin-claim did not write or an older release's keys.",
    )
    commands.add_parser(
        "forget",
        parents=[keyed, url],
        help="reopen a key: delete its record",
        description="Delete a key's record, whoever holds it (Claim.forget()): the next caller runs the work "
        "again. Says what was deleted. An owner still working on it completes the key only if nobody claimed it "
        "since.",
    )
    lister = commands.add_parser(
        "scan",
        parents=[walked, url],
        help="list a namespace's keys with their state, holder and TTL",
        description="List every key of a namespace: in-flight (the holder and the lease left), done (the holder "
        "and the retention left) and odd (keys of another type, names goblin-claim does not write, an older "
        "release's two-key layout, which this release does not read). Walks every primary of a cluster with SCAN "
        "MATCH in batches of --count, never KEYS; read-only. The holder is the token's owner part: the call "
        "fingerprint @idempotent appends to it is never shown, nor are results (inspect KEY shows them). "
        "Exits 1 when it finds a key acquire() raises on (a key of another type, a done marker without its value), "
        "listed or not.",
    )
    lister.add_argument(
        "--state",
        action="append",
        choices=STATES,
        help="list only keys in this state (repeatable; default: all); the summary still counts every state",
    )
    lister.add_argument("--limit", type=_positive, metavar="N", help="stop after listing N keys")
    lister.add_argument(
        "--json",
        action="store_true",
        help="JSON Lines: one object per key and line (state, key, ttl_ms, holder, note, raises), no header or "
        "summary; no line at all when no key is listed",
    )
    counter = commands.add_parser(
        "stats",
        parents=[walked, url],
        help="count a namespace's keys by state (an estimate on large keyspaces)",
        description="Count a namespace's keys by state: in-flight, done, odd. Walks every primary with SCAN "
        f"MATCH, unless the keyspace holds more than --exact-up-to keys (DBSIZE over the primaries; default "
        f"{EXACT_UP_TO:,}) or --sample is given: then it reads --sample SCAN batches of --count names per "
        f"primary (default {DEFAULT_SAMPLE}) and scales what it found by DBSIZE, and says the counts are an "
        "estimate. Read-only. Exits 1 when it finds a key acquire() raises on.",
    )
    counter.add_argument(
        "--json",
        action="store_true",
        help="one JSON document: namespace, exact, counts (by state), total, raising (keys acquire() raises on), "
        "primaries, examined, dbsize",
    )
    how = counter.add_mutually_exclusive_group()
    how.add_argument(
        "--sample", type=_positive, metavar="N", help="estimate from N SCAN batches per primary, scaled by DBSIZE"
    )
    how.add_argument("--exact", action="store_true", help="walk everything, however large the keyspace")
    counter.add_argument(
        "--exact-up-to",
        type=_positive,
        default=EXACT_UP_TO,
        metavar="KEYS",
        help=f"walk everything when DBSIZE is at most this, else sample (default: {EXACT_UP_TO})",
    )
    spaces = commands.add_parser(
        "namespaces",
        parents=[url],
        help="list the namespaces in use, with their keys counted",
        description="List every namespace holding keys laid out as goblin-claim lays them out (<ns>:{<key>}), "
        "with how many keys scan would list in it, over every primary of a cluster: one SCAN MATCH walk, never "
        "KEYS, names only, read-only. Another application's keys of that shape are counted too.",
    )
    spaces.add_argument("--count", type=_positive, default=DEFAULT_BATCH, metavar="N", help="SCAN's COUNT")
    spaces.add_argument(
        "--json", action="store_true", help='JSON Lines: {"namespace": ..., "keys": N} per line; none when empty'
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``goblin-claim`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    A reader that closes the pipe (``| head``) ends the command quietly with 141, the
    status a shell shows for ``yes | head`` (not 0: a walk cut short vouches for nothing
    it did not reach); Ctrl-C ends it with 130, without a traceback.
    """
    out = out or sys.stdout
    try:
        try:
            return _main(argv, out)
        finally:
            out.flush()  # here, where a closed pipe is caught, rather than at the interpreter's exit
    except BrokenPipeError:
        if out is sys.stdout:  # the interpreter flushes stdout again as it exits: into nothing
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return EXIT_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, out: TextIO) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command in ("inspect", "forget"):
            args.namespace, args.key, args.said = _operator_key(args)
        if getattr(args, "namespace", None) is not None:
            check_namespace(args.namespace)
    except GoblinClaimError as exc:
        print(f"goblin-claim {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for module in getattr(args, "imports", ()):
        if not _import(module):
            return EXIT_USAGE
    try:
        client, cluster = connect(args.url)
    except _CONNECT_ERRORS as exc:
        print(f"goblin-claim {args.command}: cannot connect to {redacted(args.url)}: {_short(exc)}", file=out)
        print("  -> check --url (redis://user:password@host:port/db), that the server runs, and AUTH", file=out)
        return EXIT_PROBLEM
    try:
        return _run(args, client, cluster, out)
    except CONNECTION_ERRORS as exc:
        print(f"goblin-claim {args.command}: lost the connection: {_short(exc)}", file=out)
        return EXIT_PROBLEM
    finally:
        client.close()


def _import(module: str) -> bool:
    """Import an application module for doctor, from the working directory too (as ``python -m`` would)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except Exception as exc:  # whatever the application's import raises, say so and stop
        print(f"goblin-claim doctor: cannot import {module}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    return True


def _run(args: argparse.Namespace, client: Client, cluster: bool, out: TextIO) -> int:
    if args.command == "doctor":
        print(f"goblin-claim doctor: {redacted(args.url)}", file=out)
        findings = doctor(client, cluster, args.namespace, write=not args.no_write, durable=not args.ephemeral)
        _print_findings(findings, out)
        return EXIT_PROBLEM if any(f.level == "problem" for f in findings) else EXIT_OK
    if args.command in ("scan", "stats", "namespaces"):
        try:
            return {"scan": _scan, "stats": _stats, "namespaces": _namespaces}[args.command](args, client, cluster, out)
        except RESPONSE_ERRORS as exc:  # NOPERM on SCAN or a read, a cluster mid-resharding...
            print(f"goblin-claim {args.command}: the server refused: {_short(exc)}", file=out)
            return EXIT_PROBLEM
    try:
        report = inspect_key(client, args.namespace, args.key)
    except RESPONSE_ERRORS as exc:
        print(f"goblin-claim {args.command}: the server refused: {_short(exc)}", file=out)
        return EXIT_PROBLEM
    if args.command == "inspect":
        if args.http:
            print(f"HTTP    {args.said}", file=out)
        for line in report.lines:
            print(line, file=out)
        print(f"state   {report.state}", file=out)
        if not report.exists and not report.legacy:
            print(
                "        (nothing under this name: `goblin-claim namespaces` lists the namespaces in use; an HTTP "
                "door's key takes --http METHOD PATH [--owner OWNER])",
                file=out,
            )
        return EXIT_PROBLEM if report.problem else EXIT_OK
    try:
        deleted = Claim(client, args.key, namespace=args.namespace).forget()
        if report.marker is not None:  # as the Celery task's own forget() does: let the next delay() through
            client.delete(report.marker)
    except GoblinClaimError as exc:
        print(f"goblin-claim forget: {exc}", file=out)
        return EXIT_PROBLEM
    record = build_keys(args.namespace, args.key)[0]
    if not deleted:
        print(f"nothing to forget: {record} does not exist", file=out)
    else:
        print(f"forgot {args.said}: deleted {record}", file=out)
        print(f"  it was: {report.state}", file=out)
        print("  the next acquire() claims it and runs the work again", file=out)
    if report.marker is not None:
        print(f"  deleted {report.marker}: Celery's enqueue_once marker, so delay() sends the task again", file=out)
    for name in report.legacy:
        print(f"  left {name}: an older release's key, which this release neither reads nor deletes", file=out)
    return EXIT_OK


def _where(args: argparse.Namespace, client: Client, cluster: bool) -> str:
    shape = f"a cluster of {len(client.get_primaries())} primaries" if cluster else "standalone"
    space = f"namespace {args.namespace!r} at " if getattr(args, "namespace", None) else ""
    return f"{space}{redacted(args.url)}, {shape}"


def _raising(count: int, args: argparse.Namespace, out: TextIO) -> int:
    """Say how many keys ``acquire()`` raises on, if any; the exit status that calls for."""
    if not count:
        return EXIT_OK
    print(
        f"{count} key{'s' if count != 1 else ''} that acquire() raises on (WrongTypeError, ResultLostError): "
        f"`goblin-claim inspect KEY --namespace {args.namespace}` says what each holds, `forget` reopens it",
        file=out,
    )
    return EXIT_PROBLEM


def _scan(args: argparse.Namespace, client: Client, cluster: bool, out: TextIO) -> int:
    wanted = set(args.state or STATES)
    counts = dict.fromkeys(STATES, 0)
    listed = raising = 0
    limited = False
    if not args.json:
        print(f"goblin-claim scan: {_where(args, client, cluster)}", file=out)
        print(f"{'STATE':<10}{'TTL LEFT':>12}  {'HOLDER':<32} KEY", file=out)
    for entry in walk(client, cluster, args.namespace, args.count):
        counts[entry.state] += 1
        raising += entry.raises is not None
        if entry.state not in wanted:
            continue
        if args.limit is not None and listed >= args.limit:
            limited = True
            break
        listed += 1
        if args.json:
            print(json.dumps(asdict(entry)), file=out)
            continue
        note = f"  ({entry.note})" if entry.note else ""
        print(f"{entry.state:<10}{_shown_ttl(entry.ttl_ms):>12}  {entry.holder or '-':<32} {entry.key}{note}", file=out)
    if not args.json:
        seen = sum(counts.values())
        summary = ", ".join(f"{counts[state]} {state}" for state in STATES)
        if limited:
            print(f"stopped after {listed} keys (--limit); so far: {summary}", file=out)
        else:
            shown = "" if wanted == set(STATES) else f", {listed} listed (--state {' '.join(sorted(wanted))})"
            print(f"{seen} key{'s' if seen != 1 else ''}: {summary}{shown}", file=out)
            if not seen:
                print("(`goblin-claim namespaces` lists the namespaces in use)", file=out)
        return _raising(raising, args, out)
    return EXIT_PROBLEM if raising else EXIT_OK


def _stats(args: argparse.Namespace, client: Client, cluster: bool, out: TextIO) -> int:
    sample = args.sample
    why = f"--sample {sample}"
    if sample is None and not args.exact:
        size = sum(int(conn.dbsize()) for _, conn in _primaries(client, cluster))
        if size > args.exact_up_to:
            sample, why = DEFAULT_SAMPLE, f"DBSIZE {size:,} is over --exact-up-to {args.exact_up_to:,}"
    tallies: list[NodeTally] = []
    for _ in walk(client, cluster, args.namespace, args.count, sample=sample, tallies=tallies):
        pass
    totals, exact = estimate(tallies)
    raising = sum(tally.raising for tally in tallies)
    examined, size = sum(tally.examined for tally in tallies), sum(tally.dbsize for tally in tallies)
    if args.json:
        counts = {state: round(totals[state]) for state in STATES}
        document = {"namespace": args.namespace, "exact": exact, "counts": counts, "total": sum(counts.values())}
        document |= {"raising": raising, "primaries": len(tallies), "examined": examined, "dbsize": size}
        print(json.dumps(document), file=out)
        return EXIT_PROBLEM if raising else EXIT_OK
    mark = "" if exact else "~"
    print(f"goblin-claim stats: {_where(args, client, cluster)}", file=out)
    for state in STATES:
        print(f"  {state:<10}{mark + f'{round(totals[state]):,}':>14}", file=out)
    print(f"  {'total':<10}{mark + f'{round(sum(totals.values())):,}':>14}", file=out)
    nodes = f"{len(tallies)} primar{'ies' if len(tallies) != 1 else 'y'}"
    if exact:
        print(f"exact: every key of the namespace, walked with SCAN on {nodes}", file=out)
    else:
        share = f" ({examined / size:.1%})" if size else ""
        print(
            f"estimate ({why}): {sample} SCAN batches of {args.count} per primary read {examined:,} of {size:,} keys"
            f"{share} on {nodes}, scaled by DBSIZE; --exact walks everything",
            file=out,
        )
    odd = sum(tally.counts["odd"] for tally in tallies)
    if odd:
        found = "found" if exact else "found in the sample"
        print(
            f"odd keys {found}: {odd}; list them, with what each is, with `goblin-claim scan --namespace "
            f"{args.namespace} --state odd`",
            file=out,
        )
    return _raising(raising, args, out)


def _namespaces(args: argparse.Namespace, client: Client, cluster: bool, out: TextIO) -> int:
    found = namespaces(client, cluster, args.count)
    if args.json:
        for space, keys in found.items():
            print(json.dumps({"namespace": space, "keys": keys}), file=out)
        return EXIT_OK
    print(f"goblin-claim namespaces: {_where(args, client, cluster)}", file=out)
    print(f"{'KEYS':>10}  NAMESPACE", file=out)
    for space, keys in found.items():
        print(f"{keys:>10,}  {space}", file=out)
    total = sum(found.values())
    print(
        f"{len(found)} namespace{'s' if len(found) != 1 else ''}, {total:,} key{'s' if total != 1 else ''}"
        + ("; `goblin-claim stats --namespace NS` counts one's keys by state" if found else ""),
        file=out,
    )
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - python -m goblin_claim._cli
    sys.exit(main())
