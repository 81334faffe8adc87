"""Claim / AsyncClaim: acquire, complete, extend, release, ownership, renewal, wake-ups, races and cancellation."""
