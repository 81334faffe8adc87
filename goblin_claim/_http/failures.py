"""A ``scope`` or ``routes`` function that fails: the 500 naming its cause and fix, logged once per process."""

from __future__ import annotations

import logging
import re
import threading
import traceback
from typing import Final

from .answers import Answer, problem

# Where each door's scope function must sit to see the caller: what ran before it is all it sees.
_PLACEMENT: Final = {
    "asgi": (
        "in Starlette and FastAPI, add the authentication middleware after this one (the last added runs first); "
        "in Litestar, list it before this one"
    ),
    "wsgi": "wrap this middleware inside the authentication middleware: auth(IdempotencyMiddleware(app, ...))",
    "django": "list goblin_claim.django.IdempotencyMiddleware after the authentication middleware in MIDDLEWARE",
    "flask": "register the authentication's before_request before Idempotency(app) or init_app(app)",
    "aiohttp": "list the authentication middleware before this one in web.Application(middlewares=[...])",
}
_logged: set[tuple[str, ...]] = set()
_logged_lock = threading.Lock()
_MAX_LOGGED: Final = 256  # causes remembered per process; past it, new causes are answered but not logged


def misconfigured(
    door: str, option: str, function: object, *, error: Exception | None = None, value: object = None
) -> Answer:
    """The 500 answering a request whose ``scope`` or ``routes`` function raised ``error`` or returned ``value``.

    Nothing ran and nothing was stored. The answer names the cause (the
    exception's type, and for a ``KeyError`` or ``AttributeError`` the missing
    name; or the type returned) and the fix. The server log has one line at
    ERROR with the exception's message and where it was raised, once per
    process for each function and cause, so a misconfigured service does not
    write a line per request.
    """
    name = f"{getattr(function, '__module__', None) or '?'}.{getattr(function, '__qualname__', repr(function))}"
    if error is not None:
        cause, kind = f"raised {_cause(error)}", type(error).__name__
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        told = f"raised {type(error).__name__}: {error}{where}"
    else:
        cause = kind = told = f"returned {type(value).__name__}"
    fix = _fix(door, option, error)
    code = f"{option}-failed"
    with _logged_lock:
        first = (door, option, name, kind) not in _logged and len(_logged) < _MAX_LOGGED
        if first:
            _logged.add((door, option, name, kind))
    if first:
        logging.getLogger(f"goblin_claim.{door}").error(
            "the %s function %s %s: every request it fails on is answered 500 (%s) without running the app, and "
            "this is logged once; %s",
            option, name, told, code, fix,
        )  # fmt: skip
    detail = f"the server's idempotency {option} function {cause}, so the request was not run and nothing was stored"
    return problem(500, f"{detail}; {fix}", code=code)


def _cause(error: Exception) -> str:
    """The exception's type, with the name a KeyError or AttributeError missed (never its whole message)."""
    # The message may hold what the client must not see (a database's address...), but a
    # short identifier that was missing is the misconfiguration itself: scope["user"].
    if isinstance(error, KeyError) and len(error.args) == 1 and _IDENTIFIER.fullmatch(str(error.args[0])):
        return f"KeyError({error.args[0]!r})"
    missing = getattr(error, "name", None)
    if isinstance(error, AttributeError) and isinstance(missing, str) and _IDENTIFIER.fullmatch(missing):
        return f"AttributeError (no attribute {missing!r})"
    return type(error).__name__


_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _fix(door: str, option: str, error: Exception | None) -> str:
    """How to fix a failing ``scope`` or ``routes`` function, in the words of ``door``."""
    if option == "routes":
        return "the routes function must return 'require', 'accept', 'ignore' or None (then required= decides)"
    if error is None:
        return (
            "return the caller's id as a str, int or UUID (user.id, not the user object), or None when there is "
            "no caller (answered 403)"
        )
    if door == "asgi" and (
        (isinstance(error, KeyError) and error.args[:1] == ("user",)) or "AuthenticationMiddleware" in str(error)
    ):
        return f"scope['user'] is set by an authentication middleware, which must run first: {_PLACEMENT[door]}"
    if door == "asgi" and isinstance(error, NotImplementedError):
        return (
            "Starlette's SimpleUser and UnauthenticatedUser have no identity: return user.display_name when "
            "user.is_authenticated (else None), or give your user class an identity property"
        )
    placement = _PLACEMENT.get(door, "run it after the authentication")
    return (
        f"the scope function runs before the app and sees only what ran before it ({placement}); it should return "
        "None for a request without a caller (answered 403)"
    )
