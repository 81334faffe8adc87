"""``goblin-claim``'s parser and entry point: arguments in, one command group run, an exit status out."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, TextIO, TypeAlias

from .._clients.families import (
    CONNECTION_ERRORS,
    RESPONSE_ERRORS,
)
from .._drivers.sync import Claim
from .._errors import GoblinClaimError
from .._protocol.checks import check_namespace
from .._protocol.record import build_keys
from .connect import (
    _CONNECT_ERRORS,
    DEFAULT_URL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_PROBLEM,
    EXIT_USAGE,
    Client,
    _primaries,
    _short,
    connect,
    redacted,
)
from .doctor import doctor
from .findings import _print_findings
from .keys import _operator_key, inspect_key
from .scan import DEFAULT_BATCH, DEFAULT_SAMPLE, EXACT_UP_TO, STATES, NodeTally, _shown_ttl, estimate, namespaces, walk

# --------------------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    """The whole command line: the shared options, then each command group's parser."""
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
        "exit status: 0 when all is well; 1 on a problem (doctor's findings, a key inspect finds odd or interrupted, "
        "a key scan or "
        "stats finds that acquire() raises on, no server); 2 on bad usage; 141 when the reader closes the pipe "
        "(| head), as SIGPIPE ends `yes | head`; 130 on Ctrl-C.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    url = _url_options()
    _add_doctor(commands, url)
    _add_keys(commands, _key_options(), url)
    walked = _walk_options()
    _add_scan(commands, walked, url)
    _add_stats(commands, walked, url)
    _add_namespaces(commands, url)
    return parser


if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]  # what add_subparsers() returns


def _url_options() -> argparse.ArgumentParser:
    """``--url``, which every command takes."""
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL", DEFAULT_URL),
        help="the server (a cluster node is enough): redis://[user:password@]host:port/db "
        "(rediss:// for TLS; valkey:// or valkeys:// connect with valkey-py); "
        f"default $REDIS_URL, else {DEFAULT_URL}",
    )
    return url


def _key_options() -> argparse.ArgumentParser:
    """A key as the operator knows it: ``inspect`` and ``forget``."""
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
    return keyed


def _walk_options() -> argparse.ArgumentParser:
    """A namespace walked with SCAN: ``scan`` and ``stats``."""
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
    return walked


def _add_doctor(commands: Commands, url: argparse.ArgumentParser) -> None:
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


def _add_keys(commands: Commands, keyed: argparse.ArgumentParser, url: argparse.ArgumentParser) -> None:
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


def _add_scan(commands: Commands, walked: argparse.ArgumentParser, url: argparse.ArgumentParser) -> None:
    lister = commands.add_parser(
        "scan",
        parents=[walked, url],
        help="list a namespace's keys with their state, holder and TTL",
        description="List every key of a namespace: in-flight (the holder and the lease left), interrupted (an "
        "at-most-once attempt whose lease ended without a result: the holder, when it claimed, the retention left), "
        "done (the holder "
        "and the retention left) and odd (keys of another type, names goblin-claim does not write, an older "
        "release's two-key layout, which this release does not read). Walks every primary of a cluster with SCAN "
        "MATCH in batches of --count, never KEYS; read-only. The holder is the token's owner part: the call "
        "fingerprint @idempotent appends to it is never shown, nor are results (inspect KEY shows them). "
        "Exits 1 when it finds a key acquire() raises on (a key of another type, a done marker without its value, "
        "an interrupted key), "
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


def _add_stats(commands: Commands, walked: argparse.ArgumentParser, url: argparse.ArgumentParser) -> None:
    counter = commands.add_parser(
        "stats",
        parents=[walked, url],
        help="count a namespace's keys by state (an estimate on large keyspaces)",
        description="Count a namespace's keys by state: in-flight, interrupted, done, odd. Walks every primary with "
        f"SCAN MATCH, unless the keyspace holds more than --exact-up-to keys (DBSIZE over the primaries; default "
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


def _add_namespaces(commands: Commands, url: argparse.ArgumentParser) -> None:
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
        if report.todo:
            print(f"        -> {report.todo}", file=out)
        if not report.exists and not report.legacy:
            print(
                "        (nothing under this name: `goblin-claim namespaces` lists the namespaces in use; an HTTP "
                "door's key takes --http METHOD PATH [--owner OWNER])",
                file=out,
            )
        return EXIT_PROBLEM if report.problem else EXIT_OK
    try:
        deleted = Claim(client, args.key, namespace=args.namespace).forget()
        if report.marker is not None:  # as the door's own forget() does: let the next enqueue through
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
        if report.checkpoint is not None:
            print(f"  deleted {report.checkpoint} too: the progress an owner saved, so it starts afresh", file=out)
        print("  the next acquire() claims it and runs the work again", file=out)
    if report.marker is not None:
        print(
            f"  deleted {report.marker}: enqueue_once's marker, so the next delay() or enqueue_once() enqueues again",
            file=out,
        )
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
        f"{count} key{'s' if count != 1 else ''} that acquire() raises on (WrongTypeError, ResultLostError, "
        "InterruptedWorkError): "
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
        print(f"{'STATE':<12}{'TTL LEFT':>12}  {'HOLDER':<32} KEY", file=out)
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
        print(f"{entry.state:<12}{_shown_ttl(entry.ttl_ms):>12}  {entry.holder or '-':<32} {entry.key}{note}", file=out)
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
        print(f"  {state:<12}{mark + f'{round(totals[state]):,}':>14}", file=out)
    print(f"  {'total':<12}{mark + f'{round(sum(totals.values())):,}':>14}", file=out)
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
