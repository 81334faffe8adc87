"""The service's side effects, one row each, in a sqlite file (``TRIAL_LEDGER``) without a UNIQUE constraint.

A transfer booked, an event applied, a receipt sent: each writes ``(kind, id)``. Nothing
refuses a second row for an id, so work that ran twice shows as two rows.
"""

from __future__ import annotations

import os
import sqlite3
import time


def create(path: str) -> None:
    """Make the ledger's file and table (WAL: the service's processes write at once)."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE ledger (kind TEXT NOT NULL, id TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL)")
        db.commit()
    finally:
        db.close()


def record(kind: str, key: str) -> int:
    """Write one row; its row id (a run's own number: a replayed answer carries the first run's)."""
    db = sqlite3.connect(os.environ["TRIAL_LEDGER"], timeout=30, isolation_level=None)
    try:
        row = db.execute("INSERT INTO ledger VALUES (?, ?, ?, ?)", (kind, key, os.getpid(), time.time())).lastrowid
        assert row is not None
        return row
    finally:
        db.close()


def rows(path: str) -> list[tuple[int, str, str]]:
    """Every row: ``(row id, kind, id)``."""
    db = sqlite3.connect(path, timeout=30)
    try:
        return [(int(r), str(k), str(i)) for r, k, i in db.execute("SELECT rowid, kind, id FROM ledger")]
    finally:
        db.close()
