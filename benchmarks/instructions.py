"""What a call costs the client's CPU, counted in instructions: goblin-claim beside raw EVALSHA and Powertools.

Wall-clock ratios on a shared two-core machine move by more than the few percent
a keep-alive or a decoded envelope costs, so this counts instead: each contender
runs in a child process under ``valgrind --tool=callgrind``, once with a warm-up
only and once with ``--calls`` more calls, and the difference divided by
``--calls`` is its user-space instructions per call (the Python interpreter, the
client library and goblin-claim, not the server, which runs in another process).
The counts repeat from run to run within a fraction of a percent whatever else the
machine does.

Rows: ``@idempotent``'s first call with and without its keep-alive, the two raw
round trips a first call needs (``EVALSHA`` claim, ``SET`` result; and the two plain
commands, ``SET ... NX GET`` and ``SET``), the same with the SDK's own store script
(owner-checked and announced to waiters), Powertools' first call (when the ``peers``
group is installed: ``make bench-peers``), a duplicate through ``@idempotent`` against a
raw ``EVALSHA`` of the claim script (and a raw ``SET ... NX GET``) that reads the same
completed record, and a first
call and a duplicate through the handle (``Claim.acquire()``, ``complete()``). Beside
each, the server's time running the commands the calls sent (``INFO commandstats``),
which a wall clock adds to the client's on a machine that runs both.

Needs valgrind. Uses REDIS_URL, else starts a redis-server on a free port.

    python benchmarks/instructions.py [--calls 2000] [--only CONTENDER ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import server_url  # noqa: E402

from goblin_claim import Claim, idempotent  # noqa: E402
from goblin_claim._protocol.scripts import CLAIM, COMPLETE  # noqa: E402

WARM_UP = 200
CONTENDERS = (
    "keep-alive", "no-keep-alive", "raw-first", "raw-scripts", "raw-commands", "powertools", "duplicate",
    "raw-duplicate", "raw-set-duplicate", "raw-get", "handle-first", "handle-duplicate",
)  # fmt: skip


def charge(order_id: str) -> dict[str, object]:
    return {"order_id": order_id, "amount": 5, "status": "charged"}


def child(url: str, contender: str, calls: int) -> None:
    """Run ``WARM_UP + calls`` calls of ``contender`` (in the process callgrind watches)."""
    client = redis.Redis.from_url(url)
    ids = itertools.count()
    run = time.time_ns()
    total = WARM_UP + calls
    if contender in ("keep-alive", "no-keep-alive"):
        first = idempotent(client, key="order_id", namespace=f"ins-{contender}", keep_alive=contender == "keep-alive")(
            charge
        )
        for _ in range(total):
            first(f"o-{run}-{next(ids)}")
    elif contender == "raw-first":
        sha = client.script_load(CLAIM.source)
        for _ in range(total):
            key = f"ins-raw:{{o-{run}-{next(ids)}}}"
            client.evalsha(sha, 2, key, key, "t", 30)
            client.set(key, b'{"status":"charged"}', ex=30)
    elif contender == "raw-commands":  # the two plain commands a first call's job takes, sent raw
        for _ in range(total):
            key = f"ins-rawc:{{o-{run}-{next(ids)}}}"
            client.set(key, "t", nx=True, get=True, ex=30)
            client.set(key, b'{"status":"charged"}', ex=86400)
    elif contender == "handle-first":  # a first call through the handle: acquire(), complete()
        for _ in range(total):
            handle = Claim(client, f"o-{run}-{next(ids)}", namespace="ins-handle")
            handle.acquire()
            handle.complete(b'{"status":"charged"}')
    elif contender == "handle-duplicate":  # a duplicate through the handle, of a completed record
        done = Claim(client, "o-1", namespace=f"ins-hdup-{run}")
        done.acquire()
        done.complete(b'{"status":"charged"}')
        for _ in range(total):
            Claim(client, "o-1", namespace=f"ins-hdup-{run}").acquire()
    elif contender == "raw-scripts":  # the SDK's own two scripts: the store owner-checked and announced
        claim, complete = client.script_load(CLAIM.source), client.script_load(COMPLETE.source)
        for _ in range(total):
            key = f"ins-raws:{{o-{run}-{next(ids)}}}"
            client.evalsha(claim, 2, key, key, "t", 30)
            client.evalsha(complete, 2, key, key, "t", b'{"status":"charged"}', 86400, "done t", "publish")
    elif contender == "powertools":
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer

        logging.getLogger("aws_lambda_powertools").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")
        persistence = RedisCachePersistenceLayer(client=client)

        @idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=IdempotencyConfig())
        def pt_charge(order: dict[str, object]) -> dict[str, object]:
            return charge(str(order["order_id"]))

        for _ in range(total):
            pt_charge(order={"order_id": f"o-{run}-{next(ids)}"})
    else:
        duplicate = idempotent(client, key="order_id", namespace=f"ins-dup-{run}")(charge)
        duplicate("o-1")  # completed: every later call reads the record
        if contender == "duplicate":
            for _ in range(total):
                duplicate("o-1")
        elif contender == "raw-set-duplicate":  # the server's own claim of the same record, sent raw
            record = f"ins-dup-{run}:{{o-1}}"
            for _ in range(total):
                client.set(record, "t", nx=True, get=True, ex=30)
        elif contender == "raw-get":  # the floor of a read in one round trip: GET of the record
            record = f"ins-dup-{run}:{{o-1}}"
            for _ in range(total):
                client.get(record)
        else:
            sha = client.script_load(CLAIM.source)
            record = f"ins-dup-{run}:{{o-1}}"
            for _ in range(total):
                client.evalsha(sha, 2, record, record, "t", 30)


def server_time(url: str) -> float:
    """Microseconds the server has spent running commands (INFO commandstats), INFO's own left out."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return float(sum(stat["usec"] for name, stat in stats.items() if name != "cmdstat_info"))


def instructions(url: str, contender: str, calls: int, out: Path) -> tuple[int, float]:
    """Callgrind's total for one child run, and the server's command time meanwhile."""
    before = server_time(url)
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
         "--child", contender, "--url", url, "--calls", str(calls)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total for {contender}:\n{done.stderr[-2000:]}")
    return int(found.group(1)), server_time(url) - before


def per_call(url: str, contender: str, calls: int, scratch: Path) -> tuple[float, float]:
    """Client instructions and server command microseconds per call: a run of ``calls`` less a warm-up-only run."""
    base, base_usec = instructions(url, contender, 0, scratch / f"{contender}.0")
    loaded, loaded_usec = instructions(url, contender, calls, scratch / f"{contender}.{calls}")
    return (loaded - base) / calls, (loaded_usec - base_usec) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", choices=CONTENDERS)
    parser.add_argument("--url")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, help="run these contenders alone")
    args = parser.parse_args()
    if args.child:
        child(args.url, args.child, args.calls)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (Debian: apt-get install valgrind)")
    contenders = [c for c in CONTENDERS if c != "powertools" or importlib.util.find_spec("aws_lambda_powertools")]
    if args.only:
        contenders = [c for c in contenders if c in args.only]
    with server_url() as url, tempfile.TemporaryDirectory() as scratch:
        measured = {c: per_call(url, c, args.calls, Path(scratch)) for c in contenders}
    counts = {c: count for c, (count, _) in measured.items()}
    print(f"per call ({args.calls} calls after {WARM_UP} of warm-up): the client's user-space instructions")
    print("(callgrind) and the server's time running its commands (INFO commandstats)")
    for contender, (count, usec) in measured.items():
        print(f"  {contender:<14} {count / 1000:8.1f}k   server {usec:5.1f} us")
    server = {c: usec for c, (_, usec) in measured.items()}

    def ratio(label: str, a: str, b: str) -> None:
        if a in counts and b in counts:
            print(f"{label}: {counts[a] / counts[b]:.2f}x the instructions")

    if "keep-alive" in counts and "no-keep-alive" in counts:
        ka, nk = counts["keep-alive"], counts["no-keep-alive"]
        print(f"a keep-alive adds {ka - nk:,.0f} instructions to a first call: {(ka - nk) / ka:.1%} of it")
    ratio("first call against two raw round trips (EVALSHA, SET)", "keep-alive", "raw-first")
    ratio("first call against the two plain commands (SET NX GET, SET)", "keep-alive", "raw-commands")
    ratio("a handle's first call (acquire, complete) against the two plain commands", "handle-first", "raw-commands")
    if {"keep-alive", "raw-scripts", "raw-first"} <= server.keys():
        print(
            f"the server's time for a first call: {server['keep-alive']:.1f} us, for the SDK's two scripts sent raw "
            f"{server['raw-scripts']:.1f} us, for EVALSHA + SET {server['raw-first']:.1f} us"
            + (f", for SET NX GET + SET {server['raw-commands']:.1f} us" if "raw-commands" in server else "")
            + (f", for Powertools' {server['powertools']:.1f} us" if "powertools" in server else "")
        )
    ratio("Powertools' first call against @idempotent's", "powertools", "keep-alive")
    ratio("a duplicate against raw EVALSHA", "duplicate", "raw-duplicate")
    ratio("a duplicate against a raw SET NX GET", "duplicate", "raw-set-duplicate")
    ratio("a handle's duplicate against a raw SET NX GET", "handle-duplicate", "raw-set-duplicate")
    ratio("a duplicate against a raw GET", "duplicate", "raw-get")
    ratio("a handle's duplicate against raw EVALSHA", "handle-duplicate", "raw-duplicate")


if __name__ == "__main__":
    main()
