"""@idempotent: results and their replay, keys, fingerprints and what counts as the same call."""
