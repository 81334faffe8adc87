"""``@idempotent``: plan, flows, the stored envelope, replay, fingerprints. Imports the drivers and below."""
