"""Which routes take a key: the ``idempotency_key()`` mark, ``routes=`` and ``required=``, and the key under them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar, cast

from .._errors import InvalidArgumentTypeError
from .answers import Answer, problem
from .failures import misconfigured
from .options import KEY_RULES, KeyRule, Options, check_rule
from .request import parse_key

MARK: Final = "_goblin_claim_key"  # on an endpoint or view marked by idempotency_key(): its rule
OPT_KEY: Final = "idempotency_key"  # a Litestar handler's opt entry (``@post(..., idempotency_key="ignore")``)
Endpoint = TypeVar("Endpoint")
_marked = False  # set once any endpoint is marked: only then do the ASGI doors look a request's route up


def idempotency_key(rule: KeyRule) -> Callable[[Endpoint], Endpoint]:
    """A route's own rule for the ``Idempotency-Key`` header, over the door's ``routes`` and ``required``.

    Marks the endpoint (a function, or the class of a class-based view) and returns
    it unchanged, so it may sit above or below the framework's route decorator.
    Every door reads it: Starlette and FastAPI endpoints, Litestar handlers (or
    their ``opt``: ``@post("/hook", idempotency_key="ignore")``), Django and Flask views.

    Args:
        rule: ``"require"`` (no key: 400, the endpoint does not run), ``"accept"``
            (a key is honoured, no key passes through), or ``"ignore"`` (never
            claimed, key or not: a webhook its sender signs, a health check).

    Returns:
        The decorator.

    Raises:
        InvalidArgumentError: ``rule`` is none of the three.

    Example::

        @app.post("/webhook")
        @idempotency_key("ignore")
        async def webhook(request: Request) -> Response: ...
    """
    checked = check_rule("idempotency_key()", rule)

    def mark(endpoint: Endpoint) -> Endpoint:
        global _marked
        try:
            setattr(endpoint, MARK, checked)
        except AttributeError:
            raise InvalidArgumentTypeError(
                f"idempotency_key() marks a function or a class, not {type(endpoint).__qualname__}"
            ) from None
        _marked = True
        return endpoint

    return mark


def any_marked() -> bool:
    """Whether any endpoint was marked by ``idempotency_key()`` in this process."""
    return _marked


def marked_rule(endpoint: object) -> KeyRule | None:
    """The rule ``idempotency_key()`` put on an endpoint or view (or on a class-based view's class), if any."""
    rule = getattr(endpoint, MARK, None)
    if rule is None:
        rule = getattr(getattr(endpoint, "view_class", None), MARK, None)  # Django's and Flask's as_view()
    return cast(KeyRule, rule) if type(rule) is str and rule in KEY_RULES else None


def key_rule(
    options: Options, request: object, path: str, marked: KeyRule | None, door: str = "http"
) -> KeyRule | Answer:
    """What this request's route does with the key: its own mark, else ``routes``, else ``required``.

    Args:
        options: The door's options.
        request: What a ``routes`` function receives (ASGI scope, WSGI environ, Django or Flask request).
        path: The path a pattern of ``routes`` is matched against (the one in the claim's key).
        marked: The rule found on the request's route (``idempotency_key()``, a Litestar ``opt``), if any.
        door: The door asking (its logger and its advice, should the ``routes`` function fail).

    Returns:
        The rule, or the 500 answering a ``routes`` function that raised or
        returned something else (``routes-failed``, logged once).
    """
    if marked is not None:
        return marked
    routes = options.routes
    if callable(routes):
        try:
            chosen = routes(request)
        except Exception as exc:
            return misconfigured(door, "routes", routes, error=exc)
        if chosen is not None:
            if type(chosen) is not str or chosen not in KEY_RULES:
                return misconfigured(door, "routes", routes, value=chosen)
            return cast(KeyRule, chosen)
    else:
        for pattern, rule in routes:
            if pattern.match(path):
                return rule
    return "require" if options.required else "accept"


def key_of(options: Options, rule: KeyRule, values: list[bytes]) -> str | Answer | None:
    """The request's key under ``rule``: the key, the answer refusing the request, or ``None`` to pass it through."""
    if rule == "ignore":
        return None
    if not values:
        if rule == "require":
            detail = f"this request needs an {options.header} header: a unique key per operation"
            return problem(400, detail, code="key-missing")
        return None
    return parse_key(options.header, values)
