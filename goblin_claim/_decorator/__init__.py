"""``@idempotent``: the decorator, its plan, its sync and asyncio flows, the stored envelope, replay, fingerprints."""
