"""Honest late completion: complete() after a lapsed lease succeeds only when truly uncontested.

Once claim_key is empty (the lease lapsed, or the claim was released or
forgotten), nothing on the server shows whether another owner claimed and gave
the key up meanwhile: GOBLIN.CLAIM writes only the claim key, and a release or a
lapse leaves no trace. So an unfenced late ``complete()`` is refused, writing
nothing; a fenced one is accepted only while the fence counter still equals its
fence. Every test counts executions, on every backend (scripts and native
GOBLIN.CLAIM / GOBLIN.CAD) and both drivers.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from goblin_claim import Claim, Claimed, ClaimLostError, Completed
from tests.conftest import ALL_BACKENDS, Driver, stored, unique

BACKENDS = ALL_BACKENDS


class Ledger:
    """A fenced store, as examples/fencing.py keeps one: a write with an older fence is refused."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE TABLE ledger (key TEXT PRIMARY KEY, value TEXT, fence INTEGER)")

    def write(self, key: str, value: str, fence: int) -> bool:
        """Store ``value`` unless a write with a fence at least as high is already there."""
        with self.db:
            cursor = self.db.execute(
                "INSERT INTO ledger VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE "
                "SET value = excluded.value, fence = excluded.fence WHERE ledger.fence < excluded.fence",
                (key, value, fence),
            )
        return cursor.rowcount == 1

    def read(self, key: str) -> str | None:
        """The value kept for ``key``."""
        row = self.db.execute("SELECT value FROM ledger WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    """A ``Ledger``, closed after the test: ``with db`` only commits, and 3.13 warns of a connection left open."""
    opened = Ledger()
    try:
        yield opened
    finally:
        opened.db.close()


def _lapse(driver: Driver, handle: Any) -> None:
    """End ``handle``'s lease now, as the server would when it runs out."""
    driver.raw.pexpire(handle.claim_key, 1)
    time.sleep(0.05)
    assert driver.raw.exists(handle.claim_key) == 0


@pytest.mark.parametrize("fencing", [False, True], ids=["unfenced", "fenced"])
@pytest.mark.parametrize("then", ["released", "lapsed"])
def test_the_issues_story_a_stale_owners_late_answer_never_wins(
    driver: Driver, ledger: Ledger, fencing: bool, then: str
) -> None:
    """Worker 1 lapses, worker 2 claims, writes the ledger and releases (or lapses): worker 1's complete() is refused.

    Nothing is stored, so no duplicate ever replays the answer the fenced
    ledger refused; the next caller runs the work again.
    """
    key, runs = unique(), []
    worker1 = driver.claim(key, token="worker-1", fencing=fencing, lease=30)
    first = worker1.acquire()
    assert isinstance(first, Claimed)
    runs.append("worker-1")
    _lapse(driver, worker1)
    worker2 = driver.claim(key, token="worker-2", fencing=fencing, lease=30)
    second = worker2.acquire()
    assert isinstance(second, Claimed)
    runs.append("worker-2")
    if fencing:
        assert second.fence > first.fence
        assert ledger.write(key, "worker-2's answer", second.fence)
        assert not ledger.write(key, "worker-1's answer", first.fence)  # the fenced store refuses worker 1
    if then == "released":
        assert worker2.release() is True  # its next step raised, as the README says to do
    else:
        _lapse(driver, worker2)
    with pytest.raises(ClaimLostError):
        worker1.complete(b"worker-1's answer")
    assert driver.raw.exists(worker1.claim_key, worker1.result_key) == 0  # nothing written
    duplicate = driver.claim(key)
    assert isinstance(duplicate.acquire(), Claimed)  # a retry runs the work; no stale answer replays
    runs.append("duplicate")
    duplicate.complete(b"the duplicate's answer")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"the duplicate's answer")
    assert runs == ["worker-1", "worker-2", "duplicate"]


def test_an_unfenced_late_complete_is_refused_even_when_uncontested(driver: Driver) -> None:
    """Without fencing nothing proves that nobody claimed since: the lapsed owner's complete() writes nothing."""
    key = unique()
    owner = driver.claim(key, lease=1, ttl=600)
    assert isinstance(owner.acquire(), Claimed)
    time.sleep(1.1)  # a real lapse, on the server's clock
    with pytest.raises(ClaimLostError, match="fencing=True"):
        owner.complete(b"late")
    assert driver.raw.exists(owner.claim_key, owner.result_key) == 0
    assert isinstance(driver.claim(key).acquire(), Claimed)


def test_a_fenced_late_complete_with_nobody_claiming_since_is_stored(driver: Driver) -> None:
    """Fenced, the lease lapsed, nobody claimed: the counter still holds this fence, so the result is stored once."""
    key, runs = unique(), []
    owner = driver.claim(key, fencing=True, lease=1, ttl=600)
    assert isinstance(owner.acquire(), Claimed)
    runs.append(owner.token)
    time.sleep(1.1)
    assert driver.raw.exists(owner.claim_key) == 0
    owner.complete(b"late but uncontested")
    owner.complete(b"late but uncontested")  # a re-sent complete is still a success
    for _ in range(3):
        outcome = driver.claim(key, fencing=True).acquire()
        assert outcome == Completed(key=key, value=b"late but uncontested")
    assert 590 < driver.raw.ttl(owner.claim_key) <= 600
    assert runs == [owner.token]


def test_a_fenced_complete_is_refused_when_a_same_token_owner_took_over(driver: Driver) -> None:
    """Fenced, one token: the claim holds the token again, but the counter numbered a later owner: refused."""
    key = unique()
    first = driver.claim(key, token="worker-3", fencing=True)
    assert isinstance(first.acquire(), Claimed)
    _lapse(driver, first)
    second = driver.claim(key, token="worker-3", fencing=True)
    assert isinstance(second.acquire(), Claimed)
    with pytest.raises(ClaimLostError):
        first.complete(b"stale")
    assert stored(driver.raw, first) is None
    assert driver.raw.get(first.claim_key) == b"worker-3"  # the second owner's claim, untouched
    second.complete(b"fresh")
    assert driver.claim(key).acquire() == Completed(key=key, value=b"fresh")


def test_a_stale_fenced_owner_is_refused_after_the_next_record_was_forgotten(driver: Driver) -> None:
    """Fenced: A lapses, B completes (the counter goes with it), the record is forgotten: A's late complete is refused.

    Refused again once a newer owner is numbered by the clock; nothing A sends is ever stored.
    """
    key = unique()
    stale = driver.claim(key, fencing=True, lease=30)
    assert isinstance(stale.acquire(), Claimed)
    _lapse(driver, stale)
    fresh = driver.claim(key, fencing=True)
    assert isinstance(fresh.acquire(), Claimed)
    fresh.complete(b"fresh")
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert stored(driver.raw, stale) == b"fresh"
    assert driver.claim(key).forget() is True
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert driver.raw.exists(stale.claim_key) == 0
    newer = driver.claim(key, fencing=True)
    assert isinstance(newer.acquire(), Claimed)
    with pytest.raises(ClaimLostError):
        stale.complete(b"stale")
    assert driver.raw.get(stale.claim_key) == newer.token.encode()


@pytest.mark.parametrize("fencing", [False, True], ids=["unfenced", "fenced"])
def test_complete_after_forget(driver: Driver, fencing: bool) -> None:
    """An operator forgets a live claim: unfenced, its owner's complete() is refused; fenced, uncontested, stored."""
    key = unique()
    owner = driver.claim(key, fencing=fencing)
    assert isinstance(owner.acquire(), Claimed)
    assert driver.claim(key).forget() is True
    if fencing:
        owner.complete(b"v")
        assert driver.claim(key).acquire() == Completed(key=key, value=b"v")
    else:
        with pytest.raises(ClaimLostError):
            owner.complete(b"v")
        assert driver.raw.exists(owner.claim_key, owner.result_key) == 0


def _race_once(driver: Driver) -> None:
    key = unique()
    stale = Claim(driver.raw, key, fencing=True, lease=30)
    assert isinstance(stale.acquire(), Claimed)
    _lapse(driver, stale)
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def late() -> None:
        barrier.wait()
        try:
            stale.complete(b"stale")
            results["late"] = "stored"
        except ClaimLostError:
            results["late"] = "refused"

    def other() -> None:
        handle = Claim(driver.raw, key, fencing=True, lease=30)
        barrier.wait()
        outcome = handle.acquire()
        if isinstance(outcome, Claimed):
            handle.complete(b"fresh")
        results["other"] = outcome

    threads = [threading.Thread(target=late), threading.Thread(target=other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    kept = stored(driver.raw, stale)
    if results["late"] == "stored":
        assert isinstance(results["other"], Completed), results  # it ran nothing
        assert kept == b"stale"
    else:
        assert isinstance(results["other"], Claimed), results
        assert kept == b"fresh"


@pytest.mark.parametrize("driver", ["sync"], indirect=True)
def test_a_stale_owner_and_a_taker_over_race_and_only_one_answer_is_kept(driver: Driver) -> None:
    """Threads: a fenced stale owner completes while another claims; the stored answer is the one whose work counted.

    Fifteen rounds. Either the late complete() wins (the other caller then sees
    Completed and runs nothing) or the other caller claims (the late one is
    refused); never both.
    """
    for _ in range(15):
        _race_once(driver)
