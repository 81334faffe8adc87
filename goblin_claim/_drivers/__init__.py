"""The drivers: ``Claim`` and ``AsyncClaim``, push wake-ups and keep-alives, over the client layer."""
