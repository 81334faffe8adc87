"""``Claim``, ``AsyncClaim``, wake-ups, keep-alives, the HTTP claim paths: over the handle, clients and ``_http``."""
