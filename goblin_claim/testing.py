"""In-process Redis for testing code that uses goblin-claim, on both paths.

``fake_redis(native=False)`` is a fakeredis client that answers as a stock Redis 7:
claims take its own ``SET ... NX GET``, the rest runs the Lua scripts
(``fake_redis(native=False, version=(6, 2))`` runs the scripts alone, as Redis 6.2
would); ``fake_redis(native=True)`` also answers GOBLIN.CLAIM and GOBLIN.CAD with
the protocol's semantics, so code under test takes the native path where the server
has no command of its own for it. Needs the ``testing`` extra (``pip install
goblin-claim[testing]``: fakeredis with Lua).

Example::

    from goblin_claim import Claim, Claimed
    from goblin_claim.testing import fake_redis

    def test_first_call_claims():
        assert isinstance(Claim(fake_redis(native=True), "evt88").acquire(), Claimed)

Not guaranteed: the native commands are added through fakeredis internals, so
this module supports the fakeredis versions this package pins; a plain
``fakeredis.FakeRedis`` keeps answering "unknown command" for them.
"""

from __future__ import annotations

from typing import Any

from ._protocol.record import CLAIMED

try:
    import fakeredis
    from fakeredis import _msgs
    from fakeredis._clients._async import FakeAsyncRedisConnection
    from fakeredis._clients._sync import FakeRedisConnection
    from fakeredis._command_args_parsing import Int
    from fakeredis._commands import Key, Signature
    from fakeredis._core import CommandItem
    from fakeredis._helpers import SimpleError
    from fakeredis._socket import AsyncFakeSocket, FakeSocket
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("goblin_claim.testing needs fakeredis with Lua: pip install 'goblin-claim[testing]'") from exc

try:  # valkey-py is optional: fake_valkey and fake_async_valkey need it
    from fakeredis._clients._valkey import FakeAsyncValkeyConnection, FakeValkeyConnection
except ImportError:  # pragma: no cover - depends on the environment
    _VALKEY = False
else:
    _VALKEY = True

__all__ = ["fake_async_redis", "fake_async_valkey", "fake_redis", "fake_valkey"]

_CLAIMED = CLAIMED.encode()
# Largest expiry Redis accepts for SET ... EX at the current time is bounded by
# its millisecond clock; this mirrors the server's overflow check.
_MAX_MS = 2**63


# The signatures live here, not in fakeredis' global command table, so only the
# clients this module makes know the commands.
# (fakeredis annotates its argument specs as types, but passes Key() instances itself.)
_SIGNATURES = {
    "goblin.claim": Signature("goblin.claim", "goblin_claim", (Key(), Key(), bytes, Int)),  # type: ignore[arg-type]
    "goblin.cad": Signature("goblin.cad", "goblin_cad", (Key(), bytes)),  # type: ignore[arg-type]
}
_COMMAND_INFO = {
    b"goblin.claim": [b"goblin.claim", 5, [b"write", b"denyoom"], 1, 2, 1, [b"@write"], [], [], []],
    b"goblin.cad": [b"goblin.cad", 3, [b"write", b"fast"], 1, 1, 1, [b"@write"], [], [], []],
}


# fakeredis's command table lists commands it does not run (DELEX, in 2.41): these
# clients' COMMAND INFO answers nil for them, as a server without them does, so the
# SDK's probe never picks an owner check the fake would refuse. It also lists Redis 7's
# commands whatever version it plays: these clients leave them out below 7, as Redis
# 6.2 would, so the probe infers no SET ... NX GET there (which the fake refuses then).
_NOT_RUN = frozenset({b"delex", b"delifeq"})
_SINCE_7 = frozenset({b"expiretime", b"pexpiretime"})


class _TruthfulCommandInfo:
    """COMMAND INFO that lists only what the fake runs, at the version it plays."""

    version: Any

    def command_info(self, *commands: bytes) -> list[Any]:
        plain: list[Any] = super().command_info(*commands)  # type: ignore[misc]
        lacking = _NOT_RUN | _SINCE_7 if self.version < (7,) else _NOT_RUN
        return [None if name.lower() in lacking else entry for name, entry in zip(commands, plain, strict=True)]


class _GoblinCommands(_TruthfulCommandInfo):
    """GOBLIN.CLAIM and GOBLIN.CAD for a fakeredis socket, with the seed's semantics."""

    _db: Any

    def _name_to_func(self, cmd_name: str) -> tuple[Any, Signature]:
        sig = _SIGNATURES.get(cmd_name)
        if sig is not None:
            return getattr(self, sig.func_name), sig
        return super()._name_to_func(cmd_name)  # type: ignore[misc, no-any-return]

    def command_info(self, *commands: bytes) -> list[Any]:
        # COMMAND INFO lists the plug-in commands too, so native detection finds them.
        plain = super().command_info(*commands)
        return [_COMMAND_INFO.get(name.lower(), entry) for name, entry in zip(commands, plain, strict=True)]

    def goblin_claim(self, claim_key: CommandItem, result_key: CommandItem, token: bytes, seconds: int) -> Any:
        # SET checks the expiry before NX, so a bad one fails even when the claim is held.
        if seconds <= 0 or (self._db.time + seconds) * 1000 >= _MAX_MS:
            raise SimpleError("ERR invalid expire time in 'goblin.claim' command")
        if not claim_key:
            claim_key.value = token
            claim_key.expireat = self._db.time + seconds
            return _CLAIMED
        value = result_key.value
        if value is not None and type(value) is not bytes:
            raise SimpleError(_msgs.WRONGTYPE_MSG)
        return value

    def goblin_cad(self, key: CommandItem, value: bytes) -> int:
        current = key.value
        if current is not None and type(current) is not bytes:
            raise SimpleError(_msgs.WRONGTYPE_MSG)
        if current is None or current != value:
            return 0
        key.value = None
        return 1


class _NativeSocket(_GoblinCommands, FakeSocket):
    pass


class _NativeAsyncSocket(_GoblinCommands, AsyncFakeSocket):
    pass


class _StockSocket(_TruthfulCommandInfo, FakeSocket):
    pass


class _StockAsyncSocket(_TruthfulCommandInfo, AsyncFakeSocket):
    pass


class _SwapSocket:
    """A fake connection whose socket is of ``_socket_class`` (the native or the stock commands)."""

    _socket_class: type[FakeSocket]

    def _connect(self) -> Any:
        sock = super()._connect()  # type: ignore[misc]
        # The parent built the socket with every argument it needs; only its class changes.
        sock.__class__ = self._socket_class
        return sock


class _AsyncSwapSocket:
    """``_SwapSocket`` for an asyncio fake connection."""

    _socket_class: type[AsyncFakeSocket]
    _sock: Any

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[misc]
        assert self._sock is not None
        self._sock.__class__ = self._socket_class


# fakeredis's connections mix its fake bases into the client library's, which mypy
# finds at odds once a class has more than one base; those definitions are fakeredis's.
class _NativeConnection(_SwapSocket, FakeRedisConnection):  # type: ignore[misc]
    _socket_class = _NativeSocket


class _StockConnection(_SwapSocket, FakeRedisConnection):  # type: ignore[misc]
    _socket_class = _StockSocket


class _NativeAsyncConnection(_AsyncSwapSocket, FakeAsyncRedisConnection):  # type: ignore[misc]
    _socket_class = _NativeAsyncSocket


class _StockAsyncConnection(_AsyncSwapSocket, FakeAsyncRedisConnection):  # type: ignore[misc]
    _socket_class = _StockAsyncSocket


if _VALKEY:

    class _NativeValkeyConnection(_SwapSocket, FakeValkeyConnection):  # type: ignore[misc]
        _socket_class = _NativeSocket

    class _StockValkeyConnection(_SwapSocket, FakeValkeyConnection):  # type: ignore[misc]
        _socket_class = _StockSocket

    class _NativeAsyncValkeyConnection(_AsyncSwapSocket, FakeAsyncValkeyConnection):  # type: ignore[misc]
        _socket_class = _NativeAsyncSocket

    class _StockAsyncValkeyConnection(_AsyncSwapSocket, FakeAsyncValkeyConnection):  # type: ignore[misc]
        _socket_class = _StockAsyncSocket


def fake_redis(native: bool, **kwargs: Any) -> fakeredis.FakeRedis:
    """A sync fakeredis client; with ``native=True`` it answers GOBLIN.CLAIM / GOBLIN.CAD.

    Args:
        native: Whether the fake server has the native commands.
        **kwargs: Passed to ``fakeredis.FakeRedis`` (``decode_responses``,
            ``protocol``, ``server`` to share data between clients, ...).
    """
    if native:
        kwargs["connection_class"] = _NativeConnection
    else:
        kwargs.setdefault("connection_class", _StockConnection)
    return fakeredis.FakeRedis(**kwargs)


def fake_async_redis(native: bool, **kwargs: Any) -> fakeredis.FakeAsyncRedis:
    """An asyncio fakeredis client; with ``native=True`` it answers GOBLIN.CLAIM / GOBLIN.CAD.

    Args:
        native: Whether the fake server has the native commands.
        **kwargs: Passed to ``fakeredis.FakeAsyncRedis``.
    """
    if native:
        kwargs["connection_class"] = _NativeAsyncConnection
    else:
        kwargs.setdefault("connection_class", _StockAsyncConnection)
    return fakeredis.FakeAsyncRedis(**kwargs)


def _valkey_fakes() -> Any:
    if not _VALKEY:
        raise ImportError("fake_valkey needs valkey-py: pip install 'goblin-claim[testing,valkey]'")
    return fakeredis


def fake_valkey(native: bool, **kwargs: Any) -> Any:
    """``fake_redis`` for code that uses valkey-py: a ``fakeredis.FakeValkey`` (a ``valkey.Valkey``).

    Args:
        native: Whether the fake server has the native commands.
        **kwargs: Passed to ``fakeredis.FakeValkey``.
    """
    fakes = _valkey_fakes()
    if native:
        kwargs["connection_class"] = _NativeValkeyConnection
    else:
        kwargs.setdefault("connection_class", _StockValkeyConnection)
    return fakes.FakeValkey(**kwargs)


def fake_async_valkey(native: bool, **kwargs: Any) -> Any:
    """``fake_async_redis`` for code that uses valkey-py: a ``fakeredis.FakeAsyncValkey``.

    Args:
        native: Whether the fake server has the native commands.
        **kwargs: Passed to ``fakeredis.FakeAsyncValkey``.
    """
    fakes = _valkey_fakes()
    if native:
        kwargs["connection_class"] = _NativeAsyncValkeyConnection
    else:
        kwargs.setdefault("connection_class", _StockAsyncValkeyConnection)
    return fakes.FakeAsyncValkey(**kwargs)
