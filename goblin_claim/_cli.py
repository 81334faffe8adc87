"""``goblin-claim``: the command operators reach for first.

- ``goblin-claim doctor --url URL``: is this server ready for goblin-claim? Native
  commands, scripts, cluster, eviction policy, what the connected ACL user may run;
  each finding with what to do. Exits 1 when there is a problem.
- ``goblin-claim inspect KEY [--namespace NS]``: what a key's claim and result hold.
- ``goblin-claim forget KEY [--namespace NS]``: reopen a key (``Claim.forget()``),
  saying what was deleted.

Every subcommand takes ``--url`` (default: ``$REDIS_URL``, else
``redis://localhost:6379/0``) and talks to a cluster when the server is one. The
standard library's argparse only: no run-time dependency beyond the package's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import redis
import redis.cluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core import DONE_PREFIX, NATIVE_COMMANDS, SCRIPTS, build_keys, check_namespace
from ._envelope import Codec, ErrorEnvelope, ResultEnvelope, UnstorableEnvelope
from ._errors import GoblinClaimError
from ._outcomes import Claimed, Completed
from ._sync import Claim

__all__ = ["Finding", "KeyReport", "doctor", "inspect_key", "main"]

DEFAULT_URL = "redis://localhost:6379/0"
EXIT_OK, EXIT_PROBLEM = 0, 1
Level = Literal["ok", "note", "problem"]
Client = Any  # redis.Redis or redis.cluster.RedisCluster: redis-py types them loosely

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


def connect(url: str) -> tuple[Client, bool]:
    """A client for ``url``, and whether the server is a cluster node (then a cluster client).

    Raises:
        redis.RedisError: The server cannot be reached or refuses the connection.
    """
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
        try:
            cluster = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
        except ResponseError:  # INFO refused by the ACL: try the cluster command itself
            try:
                client.execute_command("CLUSTER MYID")  # type: ignore[no-untyped-call, unused-ignore]
                cluster = True
            except ResponseError:
                cluster = False
    except BaseException:
        client.close()
        raise
    if not cluster:
        return client, False
    client.close()
    return redis.cluster.RedisCluster.from_url(url, socket_timeout=5, socket_connect_timeout=5), True


def _primaries(client: Client, cluster: bool) -> list[tuple[str, Any]]:
    """(name, plain client) for every primary: the one server, or each cluster primary."""
    if not cluster:
        kwargs = client.connection_pool.connection_kwargs
        return [(f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}", client)]
    return [(node.name, client.get_redis_connection(node)) for node in client.get_primaries()]


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


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


def eviction_finding(node: str, policy: str, maxmemory: int) -> Finding:
    """Whether ``maxmemory-policy`` can evict what goblin-claim stores."""
    if policy == "noeviction":
        return Finding("ok", f"{node}: maxmemory-policy noeviction: results and claims are never evicted")
    # Every key goblin-claim writes has a TTL, so volatile-* policies pick them as readily as allkeys-*.
    risk = (
        f"maxmemory-policy {policy} can evict results and claims (every key goblin-claim writes has a TTL, so "
        "volatile-* policies evict them too): an evicted result turns its key into ResultLostError until an "
        "operator runs `goblin-claim forget`, an evicted claim lets the work run again"
    )
    todo = "CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or a separate Redis for claims"
    if maxmemory == 0:
        return Finding("note", f"{node}: no maxmemory is set, so nothing is evicted now; once one is, {risk}", todo)
    return Finding("problem", f"{node}: {risk}", todo)


def _server_findings(nodes: list[tuple[str, Any]], cluster: bool) -> list[Finding]:
    findings: list[Finding] = []
    name, first = nodes[0]
    try:
        server = first.info("server")
        version = server.get("valkey_version") or server.get("redis_version", "?")
        product = "Valkey" if "valkey_version" in server else "Redis"
        shape = f"a cluster of {len(nodes)} primaries" if cluster else "standalone"
        findings.append(Finding("ok", f"connected to {product} {version} at {name}, {shape}"))
    except ResponseError as exc:
        findings.append(Finding("note", f"connected to {name}; INFO is refused ({_short(exc)})"))
    for node, conn in nodes:
        try:
            role = conn.info("replication").get("role")
        except ResponseError:
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
        except ResponseError:  # NOPERM
            per_node[node] = None
            continue
        per_node[node] = isinstance(reply, list) and all(bool(entry) for entry in reply)
    return per_node


def _script_findings(client: Client, cluster: bool) -> list[Finding]:
    try:
        loaded = [client.script_load(script.source) for script in SCRIPTS]
    except NoPermissionError as exc:
        return [
            Finding(
                "note",
                f"this user may not SCRIPT LOAD ({_short(exc)}): the SDK loads its scripts with EVAL on first use "
                "instead (one extra round trip per script and connection cache miss)",
                "grant +script|load",
            )
        ]
    except ResponseError as exc:
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
        except ResponseError as exc:
            findings.append(
                Finding("note", f"{node}: cannot read maxmemory-policy ({_short(exc)})", "check it by hand: noeviction")
            )
            continue
        findings.append(
            eviction_finding(node, str(memory.get("maxmemory_policy", "?")), int(memory.get("maxmemory", 0)))
        )
    return findings


def _user(client: Client) -> str:
    try:
        return _text(client.execute_command("ACL WHOAMI"))
    except (ResponseError, RedisClusterException):
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


def _expect(outcome: object, kind: type) -> None:
    if not isinstance(outcome, kind):
        raise GoblinClaimError(f"expected {kind.__name__}, got {outcome!r}")


def doctor(client: Client, cluster: bool, namespace: str = "goblin", write: bool = True) -> list[Finding]:
    """Everything ``goblin-claim doctor`` checks, as findings.

    Args:
        client: A connected client (a cluster client on a cluster).
        cluster: Whether ``client`` is a cluster client.
        namespace: The namespace whose keys the ACL check writes under (one scratch claim, 10 s TTL).
        write: Whether to run that check (it writes and deletes a scratch key pair).
    """
    nodes = _primaries(client, cluster)
    findings = _server_findings(nodes, cluster)
    native = native_finding(_native_per_node(nodes))
    findings.append(native)
    findings += _script_findings(client, cluster)
    findings += _eviction_findings(nodes)
    if write:
        findings += _acl_findings(client, namespace, native.level == "ok")
    else:
        findings.append(Finding("note", "ACL not checked (--no-write)", "run doctor without --no-write to check it"))
    return findings


def _print_findings(findings: Sequence[Finding], out: TextIO) -> None:
    labels = {"ok": "ok", "note": "note", "problem": "PROBLEM"}
    for finding in findings:
        print(f"  {labels[finding.level]:<8} {finding.what}", file=out)
        if finding.todo and finding.level != "ok":
            print(f"  {'':<8} -> {finding.todo}", file=out)
    problems = sum(finding.level == "problem" for finding in findings)
    print(f"{problems} problem{'s' if problems != 1 else ''}" if problems else "no problems", file=out)


# --------------------------------------------------------------------------- inspect and forget


@dataclass
class KeyReport:
    """What a key's claim and result hold, in words, and whether that is a problem."""

    state: str
    lines: list[str] = field(default_factory=list)
    problem: bool = False
    exists: tuple[bool, bool] = (False, False)


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


def _describe_value(raw: bytes) -> list[str]:
    """A stored result, the decorator's JSON envelope decoded where it is one."""
    try:
        envelope = Codec[Any](Any).decode(raw, "")
    except GoblinClaimError:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return [f"  raw bytes: {raw[:200]!r}{' ...' if len(raw) > 200 else ''}"]
        return [f"  raw text: {text[:500]!r}{' ...' if len(text) > 500 else ''}"]
    fingerprint = f", call fingerprint {envelope.fp}" if envelope.fp else ""
    if isinstance(envelope, ResultEnvelope):
        value = json.dumps(envelope.value, indent=2, default=str)
        return [f"  @idempotent result{fingerprint}:", *(f"    {line}" for line in value.splitlines())]
    if isinstance(envelope, ErrorEnvelope):
        error = envelope.error
        return [f"  @idempotent stored error{fingerprint}: {error.type}: {error.message}"]
    assert isinstance(envelope, UnstorableEnvelope)
    return [
        f"  @idempotent unstorable result{fingerprint} (duplicates get ResultNotSerializableError): {envelope.reason}"
    ]


def inspect_key(client: Client, namespace: str, key: str) -> KeyReport:
    """What the claim and result of ``key`` hold, in words."""
    claim_key, result_key = build_keys(namespace, key)
    pipe = client.pipeline(transaction=False)
    for name in (claim_key, result_key):
        pipe.type(name)
        pipe.pttl(name)
    replies = pipe.execute()
    claim_type, claim_ttl, result_type, result_ttl = (
        _text(replies[0]),
        int(replies[1]),
        _text(replies[2]),
        int(replies[3]),
    )
    holder = client.get(claim_key) if claim_type == "string" else None
    result = client.get(result_key) if result_type == "string" else None
    report = KeyReport("", exists=(claim_type != "none", result_type != "none"))
    lines = report.lines
    lines.append(f"key {key!r} in namespace {namespace!r}")
    if claim_type == "none":
        lines.append(f"claim   {claim_key}: none")
    elif claim_type != "string":
        lines.append(
            f"claim   {claim_key}: a {claim_type}, not written by goblin-claim; claims fall through to the result"
        )
        report.problem = True
    else:
        lines.append(f"claim   {claim_key}: {_shown(holder)}, {_ttl(claim_ttl)}")
    if result_type == "none":
        lines.append(f"result  {result_key}: none")
    elif result_type != "string":
        lines.append(f"result  {result_key}: a {result_type}: acquire() raises WrongTypeError")
        report.problem = True
    else:
        assert isinstance(result, bytes)
        lines.append(f"result  {result_key}: {len(result)} bytes, {_ttl(result_ttl)}")
        lines += _describe_value(result)
    text = _text(holder) if holder is not None else ""
    done = text.startswith(DONE_PREFIX)
    if claim_type == "none":
        if result_type == "none":
            report.state = "free: the next acquire() claims it"
        else:
            report.state = (
                "free, with a result stored but no claim (the claim was evicted or deleted, or a raw writer): "
                "the next acquire() claims it and the work runs again"
            )
            report.problem = True
    elif claim_type != "string":
        report.state = "held by a non-string claim key: in flight to every caller"
    elif done and result_type == "none":
        report.state = (
            f"done by {text.removeprefix(DONE_PREFIX)!r}, but the result is lost (evicted or deleted): acquire() "
            f"raises ResultLostError; `goblin-claim forget {key}` reopens the key"
        )
        report.problem = True
    elif done:
        report.state = (
            f"done by {text.removeprefix(DONE_PREFIX)!r}, kept {claim_ttl / 1000:.0f} s more: duplicates get the result"
        )
    elif result_type != "none":
        report.state = f"held by {text!r}, with a result stored by a raw-protocol writer: duplicates get it"
    else:
        report.state = f"held by {text!r}, lease ends in {claim_ttl / 1000:.1f} s: in flight"
    return report


# --------------------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL", DEFAULT_URL),
        help="the server (a cluster node is enough): redis://[user:password@]host:port/db; "
        f"default $REDIS_URL, else {DEFAULT_URL}",
    )
    keyed = argparse.ArgumentParser(add_help=False)
    keyed.add_argument("key", help="the idempotency key, as passed to Claim(...) or returned by @idempotent's key=")
    keyed.add_argument(
        "--namespace",
        default="goblin",
        help="the namespace the key lives in (default: goblin, Claim's default; @idempotent's default is the "
        "function's <module>.<qualified name>, e.g. shop.payments.charge)",
    )
    parser = argparse.ArgumentParser(
        prog="goblin-claim",
        description="Operate goblin-claim: check a server, look at a key, reopen a key.",
        epilog="examples:\n"
        "  goblin-claim doctor --url redis://localhost:6379/0\n"
        "  goblin-claim inspect evt88\n"
        "  goblin-claim inspect order-42 --namespace shop.payments.charge\n"
        "  goblin-claim forget evt88\n"
        "exit status: 0 when all is well, 1 on a problem (doctor's findings, a lost result, no server), "
        "2 on bad usage.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "doctor",
        parents=[url],
        help="check that a server is ready for goblin-claim",
        description="Check a server: native GOBLIN.CLAIM / GOBLIN.CAD, the Lua scripts, cluster or not, whether "
        "maxmemory-policy can evict results, and what the connected ACL user may run (by claiming, completing and "
        "forgetting one scratch key under the namespace, with a 10 s TTL). Each finding says what to do. "
        "Exits 1 when there is a problem.",
    )
    check.add_argument(
        "--namespace", default="goblin", help="where the ACL check writes its scratch key (default: goblin)"
    )
    check.add_argument("--no-write", action="store_true", help="skip the ACL check, which writes a scratch key")
    commands.add_parser(
        "inspect",
        parents=[keyed, url],
        help="show a key's claim and result",
        description="Show what a key's claim and result hold: free, held by a token (with the lease left), done "
        "(with the retention left), or done but the result lost; and the stored result, the @idempotent JSON "
        "envelope decoded. Exits 1 on a lost result or keys goblin-claim did not write.",
    )
    commands.add_parser(
        "forget",
        parents=[keyed, url],
        help="reopen a key: delete its claim and result",
        description="Delete a key's claim and result, whoever holds them, in one atomic step (Claim.forget()): the "
        "next caller runs the work again. Says what was deleted. An owner still working on it completes the key "
        "only if nobody claimed it since.",
    )
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``goblin-claim`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    if args.namespace is not None:
        try:
            check_namespace(args.namespace)
        except GoblinClaimError as exc:
            print(f"goblin-claim: {exc}", file=sys.stderr)
            return 2
    try:
        client, cluster = connect(args.url)
    except (RedisError, RedisClusterException, ValueError) as exc:
        print(f"goblin-claim {args.command}: cannot connect to {args.url}: {_short(exc)}", file=out)
        print("  -> check --url (redis://user:password@host:port/db), that the server runs, and AUTH", file=out)
        return EXIT_PROBLEM
    try:
        return _run(args, client, cluster, out)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        print(f"goblin-claim {args.command}: lost the connection: {_short(exc)}", file=out)
        return EXIT_PROBLEM
    finally:
        client.close()


def _run(args: argparse.Namespace, client: Client, cluster: bool, out: TextIO) -> int:
    if args.command == "doctor":
        print(f"goblin-claim doctor: {args.url}", file=out)
        findings = doctor(client, cluster, args.namespace, write=not args.no_write)
        _print_findings(findings, out)
        return EXIT_PROBLEM if any(f.level == "problem" for f in findings) else EXIT_OK
    try:
        report = inspect_key(client, args.namespace, args.key)
    except ResponseError as exc:
        print(f"goblin-claim {args.command}: the server refused: {_short(exc)}", file=out)
        return EXIT_PROBLEM
    if args.command == "inspect":
        for line in report.lines:
            print(line, file=out)
        print(f"state   {report.state}", file=out)
        return EXIT_PROBLEM if report.problem else EXIT_OK
    try:
        deleted = Claim(client, args.key, namespace=args.namespace).forget()
    except GoblinClaimError as exc:
        print(f"goblin-claim forget: {exc}", file=out)
        return EXIT_PROBLEM
    claim_key, result_key = build_keys(args.namespace, args.key)
    if not deleted:
        print(f"nothing to forget: neither {claim_key} nor {result_key} exists", file=out)
        return EXIT_OK
    gone = [name for name, existed in zip((claim_key, result_key), report.exists, strict=True) if existed]
    print(f"forgot {args.key!r}: deleted {' and '.join(gone) or 'its keys'}", file=out)
    print(f"  it was: {report.state}", file=out)
    print("  the next acquire() claims it and runs the work again", file=out)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - python -m goblin_claim._cli
    sys.exit(main())
