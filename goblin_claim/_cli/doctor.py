"""``goblin-claim doctor``: is this server ready? Native commands, scripts, eviction, persistence, replication."""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster

from .._clients.families import (
    NO_PERMISSION,
    RESPONSE_ERRORS,
)
from .._protocol.scripts import (
    BUILTIN_COMMANDS,
    DELEX,
    DELIFEQ,
    NATIVE_COMMANDS,
    SCRIPTS,
    SET_IFEQ,
    SET_NX_GET,
    with_owner_checks,
)
from .acl import _DEFAULT_OPERATIONS, _acl_findings, _acl_operation_findings, _served
from .connect import Client, _primaries, _short
from .findings import Finding, _text

_MODULE_HINT = (
    "build the reference module (make native) and load it on every node: "
    "redis-server --loadmodule /path/to/goblin.so, or `loadmodule /path/to/goblin.so` in redis.conf"
)


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
    """What the nodes' own commands mean for a default handle; ``None`` where no node has one.

    ``per_node``: what ``COMMAND INFO`` found of DELIFEQ, DELEX and PEXPIRETIME, from
    which SET ... IFEQ and SET ... NX GET (and DEL for forget) are inferred.
    """
    found = {node: with_owner_checks(names) for node, names in per_node.items()}
    served = {node: _served(names) for node, names in found.items()}
    if not served or not any(served.values()):
        return None
    if all(names == served[next(iter(served))] for names in served.values()):
        ops = served[next(iter(served))]
        rest = [operation for operation in _DEFAULT_OPERATIONS if operation not in ops]
        scripted = (
            f"; {', '.join(rest)} run the scripts (the server lacks "
            + " and ".join(_lacking(found[next(iter(found))]))
            + ")"
            if rest
            else ""
        )
        return Finding(
            "ok",
            "the server's own commands serve default handles, with no module or scripting: "
            + ", ".join(f"{operation} ({command})" for operation, command in ops.items())
            + scripted
            + "; at_most_once, checkpoints, fencing, replicas= and two keys always run the scripts",
        )
    common = set.intersection(*(set(ops) for ops in served.values()))
    lacking = [node for node, ops in served.items() if set(ops) != set().union(*(set(o) for o in served.values()))]
    return Finding(
        "note",
        f"{', '.join(lacking)} lack(s) commands of their own the other nodes have: only "
        + (", ".join(sorted(common)) or "nothing")
        + " goes without scripts on every node",
        "run one server version on every node",
    )


def _lacking(found: frozenset[str]) -> list[str]:
    """The server's own commands a default handle would use that ``found`` lacks, as named to users."""
    wanted = [(SET_NX_GET, "SET ... NX GET: Redis 7.0, Valkey"), (SET_IFEQ, "SET ... IFEQ: Valkey 8.1, Redis 8.4")]
    named = [text for name, text in wanted if name not in found]
    if DELIFEQ not in found and DELEX not in found:
        named.append("DELIFEQ or DELEX: Valkey 9, Redis 8.4")
    return named


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
        "partitioned) keeps accepting claims and results until it is demoted, and the failover drops them: results "
        "whose callers were answered are lost, callers of one id get different answers, and work runs twice",
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
    per_node = _owner_checks_per_node(nodes)
    owner_checks = owner_check_finding(per_node)
    if owner_checks is not None:
        findings.append(owner_checks)
    # What every node has (a cluster whose nodes differ: what serves everywhere).
    builtins = frozenset.intersection(*map(with_owner_checks, per_node.values())) if per_node else frozenset()
    findings += _script_findings(client, cluster)
    findings += _eviction_findings(nodes)
    findings += _durability_findings(nodes, durable)
    if write:
        findings += _acl_findings(client, namespace, native.level == "ok", builtins)
        findings += _acl_operation_findings(client, namespace, native.level == "ok", cluster, builtins)
    else:
        findings.append(Finding("note", "ACL not checked (--no-write)", "run doctor without --no-write to check it"))
    findings.append(pubsub_metrics_finding(*_observability_config()))
    return findings
