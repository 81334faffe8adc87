"""The doors' options are declared once (``_http.DoorOptions``): every door takes the same names and defaults."""

from __future__ import annotations

import dataclasses
import inspect

import fakeredis
import pytest

from goblin_claim import InvalidArgumentTypeError
from goblin_claim._defaults import LEASE, TTL
from goblin_claim._http import DEFAULTS, DOOR_OPTIONS, DoorOptions, make_options
from goblin_claim.asgi import IdempotencyMiddleware as AsgiMiddleware
from goblin_claim.wsgi import IdempotencyMiddleware as WsgiMiddleware


def test_the_asgi_signature_is_the_door_options() -> None:
    """The ASGI middleware's keyword arguments are DoorOptions' fields, in order, with the same defaults."""
    parameters = list(inspect.signature(AsgiMiddleware).parameters.values())
    assert [p.name for p in parameters[:2]] == ["app", "client"]
    options = parameters[2:]
    assert tuple(p.name for p in options) == DOOR_OPTIONS
    assert all(p.kind is p.KEYWORD_ONLY for p in options)
    assert [p.default for p in options] == [getattr(DEFAULTS, name) for name in DOOR_OPTIONS]


def test_the_defaults_come_from_the_defaults_module() -> None:
    """Lease and ttl are _defaults' own; the validated defaults are the same from every door."""
    assert (DEFAULTS.lease, DEFAULTS.ttl) == (LEASE, TTL)
    asgi = AsgiMiddleware(lambda scope, receive, send: None, client=fakeredis.FakeAsyncRedis()).options  # type: ignore[arg-type, return-value]
    wsgi = WsgiMiddleware(lambda environ, start_response: [], client=fakeredis.FakeRedis()).options
    assert asgi == wsgi == make_options() == DoorOptions().checked()


def test_an_unknown_option_is_named() -> None:
    """A misspelt option (in WSGI's, Flask's or Django's options) is a TypeError naming it and the known ones."""
    with pytest.raises(InvalidArgumentTypeError, match=r"unknown option 'leese': the HTTP doors' options are required"):
        make_options(leese=5)
    with pytest.raises(TypeError, match="leese"):
        WsgiMiddleware(lambda environ, start_response: [], client=fakeredis.FakeRedis(), leese=5)


def test_over_keeps_what_was_given() -> None:
    """A route's options over the extension's: the extension's given options stay, the route's win."""
    given = DEFAULTS.over({"lease": 5, "namespace": "ns"})
    route = given.over({"ttl": 60})
    assert (route.lease, route.namespace, route.ttl) == (5, "ns", 60)
    assert dataclasses.replace(DEFAULTS, lease=5, namespace="ns", ttl=60) == route
