"""Every default of the public API, read from one place."""

from __future__ import annotations

from typing import Final

DEFAULT_NAMESPACE: Final = "goblin"

# How long a claim is held before another caller may take it over, in seconds.
LEASE: Final = 30
# How long a completed record (and its answer) is kept for duplicates, in seconds.
TTL: Final = 86400
# replicas=: how many replicas must acknowledge a claim and a result (WAIT), and for how long it waits.
REPLICAS: Final = 0
REPLICA_TIMEOUT_MS: Final = 500
# checkpoints=True: the largest progress checkpoint() stores, in bytes (encoded).
CHECKPOINT_MAX_BYTES: Final = 64 * 1024
