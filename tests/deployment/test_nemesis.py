"""The nemesis (``tests/support/nemesis.py``), short: random faults over a Redis Cluster of 3 primaries and 3 replicas.

About 30 s of faults drawn from a seed (SIGKILL, SIGSTOP and manual failover of primaries,
CLIENT KILL storms, live slot migration, SCRIPT FLUSH, DEBUG SLEEP) while a small workload
asks for ids through every path (sync and asyncio ``RedisCluster``; ``Claim``, fenced
``Claim``, ``@idempotent``, ``acquire_many``), on redis-server and on valkey-server. The
seed is printed (``NEMESIS_SEED=... to replay``) and taken from the environment when set;
``make chaos`` runs long schedules by hand.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support import nemesis

SERVERS = ("redis", "valkey")


@pytest.mark.slow
@pytest.mark.alone  # hundreds of callers and a cluster's failovers: the machine to itself, as other tests time leases
@pytest.mark.timeout(420)
def test_random_faults_keep_every_id_once(redis_server_binary: str, figures: Callable[[str], None]) -> None:
    """30 s of seeded faults: no foreign exception, no unexplained double run, no stuck id, no late caller."""
    report = nemesis.run(nemesis.Settings(binary=redis_server_binary, seconds=30, rate=1.0, deadline=30))
    figures("nemesis: " + report.figures())
    for line in report.broken:  # also in the figures, which the run's summary prints last
        figures(f"nemesis BROKEN ({report.replay}): {line}")
    assert not report.broken, (
        f"replay: {report.replay}\n"
        + "\n".join(report.broken)
        + "\n"
        + "\n".join(line for line in report.details if not line.startswith("explained"))
        + "".join(f"\n--- {name}:\n{trace}" for name, trace in report.samples.items())
    )
