"""The HTTP doors: the ASGI middleware, the WSGI middleware, Django and Flask, and their shared rules."""
