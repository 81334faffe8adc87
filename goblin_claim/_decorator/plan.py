"""The plan of a decorated call: its key, fingerprint and settings, and every decision of its flow, with no I/O."""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import sys
import types
import typing
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple, ParamSpec, Protocol, TypeVar, cast

from .._clients.kinds import LazyClient, check_client
from .._errors import (
    ClaimLostError,
    ConnectionFailedError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PayloadMismatchError,
    ResultNotSerializableError,
    StillInFlightError,
)
from .._handle import HandleT
from .._protocol.checks import (
    NativeMode,
    check_flags,
    check_namespace,
    check_native,
    check_replicas,
    check_seconds,
    check_timeout,
    describe,
)
from .._protocol.record import fingerprinted_token, holder_fp, new_token
from .codec import OTHER, Codec, ErrorEnvelope, UnstorableEnvelope, replayed
from .fingerprint import FINGERPRINT_CHARS, FingerprintParameters, fingerprint_of, fingerprint_parameters

P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)


class IdempotentFunction(Protocol[P, R_co]):
    """A ``def`` decorated with ``@idempotent``: called as before, plus ``forget``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def forget(self, *args: P.args, **kwargs: P.kwargs) -> bool:
        """Reopen the key these arguments map to (``Claim.forget()``); ``True`` if there was anything."""
        ...


class AsyncIdempotentFunction(Protocol[P, R_co]):
    """An ``async def`` decorated with ``@idempotent``: awaited as before, plus an awaitable ``forget``."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]: ...

    def forget(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, bool]:
        """Reopen the key these arguments map to (``AsyncClaim.forget()``); ``True`` if there was anything."""
        ...


class _DefaultFingerprint:
    """Marker for the default fingerprint: every argument but a method's self or cls, and those at their default."""

    def __repr__(self) -> str:
        return "<all arguments>"


ALL_ARGUMENTS: Any = _DefaultFingerprint()


class _Call(NamedTuple):
    """One invocation: its key, fingerprint and the token that carries the fingerprint."""

    key: str
    fp: str | None
    token: str | None


class _Spec:
    """Everything ``@idempotent`` decides for one function, checked at decoration time."""

    def __init__(
        self,
        func: Callable[..., Any],
        client: Any,
        key: Callable[..., str] | str,
        lease: int,
        ttl: int,
        wait: float,
        namespace: str | None,
        fingerprint: Callable[..., str] | tuple[str, ...] | None,
        replay_errors: tuple[type[BaseException], ...],
        keep_alive: bool,
        native: NativeMode,
        replicas: int,
        replica_timeout_ms: int,
        fail_open: bool,
        at_most_once: bool,
        checkpoints: bool,
    ) -> None:
        if not callable(func):
            raise InvalidArgumentTypeError(f"@idempotent decorates a function, not {describe(func)}")
        self.func = func
        self.name = _name_of(func)
        target = _target(func)
        _refuse_generators(target, self.name)
        self.is_async = inspect.iscoroutinefunction(target)
        # A factory is resolved on the first call: the client may not exist yet when
        # the module is imported (an application's start-up, a test's fixture).
        self._client = LazyClient(client, functools.partial(_check_client, self.name, self.is_async))
        self._read_signature(func)
        self.key = self._checked_key(key)
        self.lease = check_seconds("lease", lease)
        self.ttl = check_seconds("ttl", ttl)
        self.wait = check_timeout("wait", wait)
        # An integration's bound on the wait, from ``wait``, the holder's lease left and
        # the lease: the job queues never wait past the lease left (goblin_claim._jobs).
        self.wait_bound: Callable[[float, float | None, int], float] | None = None
        self.namespace = check_namespace(self._namespace_of(func, namespace))
        self._choose_fingerprint(fingerprint)
        self.replay_errors = _checked_replay_errors(replay_errors)
        if type(keep_alive) is not bool:
            raise InvalidArgumentTypeError(f"keep_alive must be True or False, not {describe(keep_alive)}")
        self.keep_alive = keep_alive
        self.native = check_native(native)
        self.replicas, self.replica_timeout_ms = check_replicas(replicas, replica_timeout_ms)
        check_flags(fail_open=fail_open, at_most_once=at_most_once, checkpoints=checkpoints)
        # Read only where the claim's round trip failed to reach the server: no success path tests it.
        self.fail_open = fail_open
        self.at_most_once = at_most_once
        self.checkpoints = checkpoints
        self.codec: Codec[Any] = Codec(_return_type(target, self.name))

    def _read_signature(self, func: Callable[..., Any]) -> None:
        """The signature, and what ``bind`` needs for its fast path (plain parameters, their defaults)."""
        try:
            self.signature = inspect.signature(func)
            plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values())
            self._plain_names = tuple(self.signature.parameters) if plain else None
            self._plain_set = frozenset(self.signature.parameters)
            self._plain_defaults = tuple(
                (p.name, p.default) for p in self.signature.parameters.values() if p.default is not p.empty
            )
        except (TypeError, ValueError) as exc:  # a builtin without a signature, say
            raise InvalidArgumentTypeError(f"cannot read the signature of {self.name}: {exc}") from exc

    def _checked_key(self, key: object) -> Callable[..., str] | str:
        """``key``: one parameter's name (not ``*args`` or ``**kwargs``) or a function of the arguments."""
        if isinstance(key, str):
            param = self.signature.parameters.get(key)
            if param is None:
                raise InvalidArgumentTypeError(f"key={describe(key)} is not a parameter of {self.name}{self.signature}")
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise InvalidArgumentError(f"key={key!r} names *{key} or **{key}, which holds no single key")
            return key
        if not callable(key):
            raise InvalidArgumentTypeError(
                f"key must be a parameter name or a function of the arguments, not {describe(key)}"
            )
        return cast("Callable[..., str]", key)

    def _namespace_of(self, func: Callable[..., Any], namespace: str | None) -> str:
        """The namespace given, or the function's default one (an empty one is refused later, like Claim's)."""
        if namespace is not None:
            return namespace
        default = default_namespace(func)
        if default is None:
            raise InvalidArgumentError(
                f"cannot name a default namespace for {self.name} (no module and qualified name, or defined "
                "where there is no file: a REPL, python -c): pass namespace="
            )
        return default

    def _choose_fingerprint(self, fingerprint: Callable[..., str] | tuple[str, ...] | None) -> None:
        """The parameters the fingerprint counts, once: all but a method's self/cls by default, or the tuple's."""
        self.counted: FingerprintParameters | None = None
        if fingerprint is ALL_ARGUMENTS or isinstance(fingerprint, tuple):
            names = None if fingerprint is ALL_ARGUMENTS else fingerprint
            self.counted = fingerprint_parameters(self.signature, names, self.name)
        elif fingerprint is not None and not callable(fingerprint):
            hint = f" (one parameter: fingerprint=({describe(fingerprint)},))" if isinstance(fingerprint, str) else ""
            raise InvalidArgumentTypeError(
                f"fingerprint must be a function, a tuple of parameter names, None or left out, "
                f"not {describe(fingerprint)}{hint}"
            )
        self.fingerprint = fingerprint

    @property
    def client(self) -> Any:
        """The client, made by the factory on first use when a factory was given."""
        client = self._client.made  # read inline: every call asks, and after the first the client is there
        return client if client is not None else self._client.get()

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by parameter name, defaults applied, as ``Signature.bind`` gives them."""
        names = self._plain_names
        if names is not None and not kwargs and len(args) == len(names):
            return dict(zip(names, args, strict=True))  # every parameter given by position: the common call
        if names is not None and len(args) <= len(names):
            # Plain parameters only: zip and fill in, a few times faster than bind().
            arguments = dict(zip(names, args, strict=False))  # names outnumber args when defaults fill in
            if not kwargs or (kwargs.keys() <= self._plain_set and not kwargs.keys() & arguments.keys()):
                arguments.update(kwargs)
                if len(arguments) < len(names):
                    for name, default in self._plain_defaults:
                        arguments.setdefault(name, default)
                if len(arguments) == len(names):
                    return arguments
        try:  # anything else, or a call that is wrong: bind() says how
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:  # what calling the function itself would raise
            raise InvalidArgumentTypeError(f"{self.name}(): {exc}") from exc
        bound.apply_defaults()
        return bound.arguments

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """The key, fingerprint and token of one call (no I/O)."""
        arguments = self.bind(args, kwargs)
        key = arguments[self.key] if isinstance(self.key, str) else self.key(*args, **kwargs)
        if type(key) is not str:
            key = _key_text(key)
        if not key:
            raise InvalidArgumentError("the idempotency key must be a non-empty str, got ''")
        if not key.isascii() and not _is_utf8(key):
            raise InvalidArgumentError(
                f"the idempotency key is not encodable as UTF-8 (a lone surrogate?): {describe(key)}"
            )
        fp: str | None = None
        if self.counted is not None:  # all arguments, or the tuple's
            try:
                fp = fingerprint_of(arguments, self.counted, key)
            except RecursionError as exc:  # arguments that contain themselves, or nest past the stack
                raise InvalidArgumentTypeError(
                    f"cannot fingerprint the arguments for {key!r}: they nest too deeply (or contain themselves); "
                    "pass fingerprint= a function of the arguments that returns a str, or fingerprint=None",
                    key=key,
                ) from exc
        elif callable(self.fingerprint):
            custom = self.fingerprint(*args, **kwargs)
            if type(custom) is not str:
                raise InvalidArgumentTypeError(
                    f"fingerprint must return a str, got {type(custom).__name__} {describe(custom)}", key=key
                )
            if not custom.isascii() and not _is_utf8(custom):
                raise InvalidArgumentError(
                    f"fingerprint returned a str not encodable as UTF-8 (a lone surrogate?): {describe(custom)}",
                    key=key,
                )
            fp = hashlib.sha256(custom.encode()).hexdigest()[:FINGERPRINT_CHARS]
        # The fingerprint rides in the token, which the claim key stores: an
        # in-flight duplicate can compare it with one GET.
        return _Call(key, fp, fingerprinted_token(fp) if fp else None)

    def handle(self, kind: type[HandleT], call: _Call) -> HandleT:
        """The ``Claim`` or ``AsyncClaim`` of one call, from settings checked at decoration."""
        return kind.__new__(kind)._settle(
            self.client, call.key, self.namespace, call.token or new_token(), True, self.lease, self.ttl,
            self.native, False, self.replicas, self.replica_timeout_ms, self.at_most_once, self.checkpoints,
        )  # fmt: skip

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The idempotency key the arguments map to (no I/O)."""
        return self.prepare(args, kwargs).key

    def check_holder(self, holder: object, call: _Call) -> None:
        """Raise ``PayloadMismatchError`` if the claim's holder ran with other arguments."""
        if call.fp is None or holder is None:
            return
        held = holder_fp(holder)
        if held is not None and held != call.fp:
            raise self.mismatch(call)

    def settle(self, stored: bytes | str, call: _Call) -> Any:
        """What a duplicate gets for a stored envelope: the value, or a raised error."""
        value = self.codec.plain_value(stored)  # the shape a result is written in: no model to build
        if value is not OTHER:
            return value
        envelope = self.codec.decode(stored, call.key)
        # The previous format kept 32 hex digits in "fp"; a fingerprint now is their first 16.
        if call.fp is not None and envelope.fp is not None and not envelope.fp.startswith(call.fp):
            raise self.mismatch(call)
        if isinstance(envelope, ErrorEnvelope):
            raise replayed(envelope.error, call.key)
        if isinstance(envelope, UnstorableEnvelope):
            raise ResultNotSerializableError(
                f"the first call for {call.key!r} ran, but its result could not be kept ({envelope.reason}); "
                "it is not run again until the ttl ends or the key is forgotten",
                key=call.key,
            )
        return envelope.value

    def mismatch(self, call: _Call) -> PayloadMismatchError:
        """The error for a key reused with different arguments."""
        return PayloadMismatchError(
            f"{call.key!r} was first called with different arguments (fingerprints differ); "
            "use a new key for a new request",
            key=call.key,
        )

    def wait_for(self, retry_after: float | None) -> float:
        """Seconds an in-flight duplicate waits, given the holder's lease left: ``wait``, or the bound's."""
        if self.wait_bound is None:
            return self.wait
        return self.wait_bound(self.wait, retry_after, self.lease)

    def in_flight(self, call: _Call, retry_after: float | None = None) -> StillInFlightError:
        """The error for ``wait=0`` on in-flight work, carrying the holder's lease left."""
        return StillInFlightError(f"{call.key!r} is in flight (wait=0)", key=call.key, retry_after=retry_after)

    def unstored(self, call: _Call, result: Any, cause: ConnectionFailedError) -> ConnectionFailedError:
        """The error for a result that could not be written before the lease ran out; it carries the result."""
        return ConnectionFailedError(
            f"{call.key!r} ran, but its result could not be stored while the lease lasted ({self.lease}s): "
            f"{cause}; the claim frees itself when its lease lapses",
            key=call.key,
            result=result,
        )

    def lost(self, call: _Call, result: Any, cause: ClaimLostError) -> ClaimLostError:
        """The error for work that finished after its claim was lost; it carries the result."""
        return ClaimLostError(
            f"{call.key!r} finished after its claim was lost; the result was not stored: {cause}",
            key=call.key,
            result=result,
        )


def _check_client(name: str, is_async: bool, client: Any) -> None:
    # Judged by what the client does (an awaitable execute_command or not), so
    # redis-py-compatible clients of the right kind work too.
    if is_async:
        check_client(client, True, f"@idempotent on async def {name}", f"make {name} a plain def")
    else:
        check_client(client, False, f"@idempotent on def {name}", f"make {name} an async def")


def _checked_replay_errors(replay_errors: object) -> tuple[type[BaseException], ...]:
    if not isinstance(replay_errors, tuple) or not all(
        isinstance(kind, type) and issubclass(kind, BaseException) for kind in replay_errors
    ):
        raise InvalidArgumentTypeError(
            f"replay_errors must be a tuple of exception classes, not {describe(replay_errors)}"
        )
    return replay_errors


def _target(func: Callable[..., Any]) -> Callable[..., Any]:
    """What actually runs: the function inside partials, a callable object's ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    if not inspect.isfunction(func) and not inspect.ismethod(func) and not inspect.isbuiltin(func):
        # A callable object: its class's __call__ is a plain function.
        call = next((vars(base)["__call__"] for base in type(func).__mro__ if "__call__" in vars(base)), None)
        if inspect.isfunction(call):
            return types.MethodType(call, func)
    return func


def _refuse_generators(target: Callable[..., Any], name: str) -> None:
    if inspect.isasyncgenfunction(target):
        raise InvalidArgumentTypeError(
            f"@idempotent cannot replay the async generator {name}: the first caller would consume it and "
            "duplicates could not get the same items; make it an async def that returns a list"
        )
    if inspect.isgeneratorfunction(target):
        raise InvalidArgumentTypeError(
            f"@idempotent cannot replay the generator {name}: the first caller would get a used-up iterator "
            "and duplicates a list; make it a def that returns a list"
        )


# What a module is called while Python runs it as the program (and, in a
# multiprocessing child started with "spawn" or "forkserver", its re-import).
_MAIN_MODULES = ("__main__", "__mp_main__")


def default_namespace(func: Callable[..., Any]) -> str | None:
    """``<module>.<qualified name>`` of ``func``, the same however the process was started.

    A function of the program Python runs is in ``__main__`` (``__mp_main__`` in a
    multiprocessing child): its module is named as ``import`` would name it, so
    ``python pkg/mod.py``, ``python -m pkg.mod`` and ``import pkg.mod`` agree when
    ``pkg`` is a package (a directory with ``__init__.py``).

    Returns:
        The namespace, or ``None`` when it cannot be told: ``func`` has no module or
        qualified name, or it was defined where there is no file (a REPL, ``python -c``).
    """
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module in _MAIN_MODULES:
        imported = _imported_name(sys.modules.get(module))
        if imported is None:
            return None
        module = imported
    return f"{module}.{qualname}"


def _imported_name(main: object) -> str | None:
    # python -m pkg.mod keeps the module's import name in its spec; a directory or
    # zip run as a program has the spec name "__main__", and a script no spec.
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and name not in _MAIN_MODULES:
        return name
    # A script: the file the program runs (also the file of every function in it,
    # even one wrapped by a decorator from elsewhere); none in a REPL or python -c.
    path = getattr(main, "__file__", None)
    return module_name_of_path(path) if isinstance(path, str) and path else None


def module_name_of_path(path: str) -> str | None:
    """The dotted name ``import`` gives the module in ``path``: up through each directory with ``__init__.py``.

    Example: ``/srv/app/pkg/mod.py``, with ``/srv/app/pkg/__init__.py``, is ``pkg.mod``.
    """
    directory, filename = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(filename)[0]
    parts = [] if stem == "__init__" else [stem]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        if not package.isidentifier():  # not importable as a package: the module is imported from below it
            break
        parts.insert(0, package)
    return ".".join(parts) or None


def _name_of(func: Callable[..., Any]) -> str:
    name = getattr(func, "__qualname__", None)
    return name if isinstance(name, str) else describe(func)


def _key_text(key: object) -> str:
    # An integer id or a UUID is a fine key, as text (a UUID in its canonical
    # form); a bool is no id, and anything else has no single text form.
    if type(key) is int:
        return _int_key(key)
    if isinstance(key, uuid.UUID):
        return str(key)
    raise InvalidArgumentTypeError(
        f"the idempotency key must be a non-empty str, an int or a UUID, got {type(key).__name__} {describe(key)}"
    )


def _int_key(key: int) -> str:
    try:
        return str(key)
    except ValueError as exc:  # past Python's digit limit for int -> str
        raise InvalidArgumentError(f"an int key must have at most {sys.get_int_max_str_digits()} digits") from exc


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _return_type(func: Callable[..., Any], name: str) -> Any:
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:  # evaluating string annotations can raise anything
        raise InvalidArgumentTypeError(
            f"cannot resolve the return annotation of {name}: {type(exc).__name__}: {exc}; "
            "decorate a def whose return type is defined at module level"
        ) from exc
    return hints.get("return", Any)
