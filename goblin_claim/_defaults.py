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
# How long a duplicate waits for in-flight work to finish, in seconds: Claim.wait(),
# @idempotent(wait=) and the job doors' wait=, whose slot (a thread, a worker) it holds meanwhile.
WAIT: Final = 10.0
# The HTTP doors' wait=: a duplicate request answers 409 at once rather than holding a server worker.
HTTP_WAIT: Final = 0.0
# A client a Django setting's URL makes: its socket_timeout and socket_connect_timeout, in seconds, unless the
# URL's query sets them (without one, a frozen server would hold a worker for good).
URL_CLIENT_TIMEOUT: Final = 2.0
# The HTTP doors' bounds on what they read to fingerprint a request and store to replay it, in bytes.
MAX_BODY_BYTES: Final = 1024 * 1024
MAX_RESPONSE_BYTES: Final = 1024 * 1024
# The HTTP doors' server_errors=: a 5xx (or an exception the app raised) gives the key back, so a retry runs.
HTTP_SERVER_ERRORS: Final = "give back"
# checkpoints=True: the largest progress checkpoint() stores, in bytes (encoded).
CHECKPOINT_MAX_BYTES: Final = 64 * 1024
