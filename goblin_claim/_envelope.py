"""What ``@idempotent`` stores: a small versioned JSON envelope, and call fingerprints.

A stored outcome looks like::

    {"goblin":1,"kind":"result","fp":"5e0c...","value":{"txn":"txn_551"}}
    {"goblin":1,"kind":"error","fp":"5e0c...","error":{"type":"shop.CardDeclined","message":"...","fields":{}}}
    {"goblin":1,"kind":"unstorable","fp":"5e0c...","reason":"..."}

``goblin`` is the format version, so a later format can be told apart; ``fp`` is
the fingerprint of the first call's arguments, so a duplicate with different
arguments is caught after completion without another round trip. A function
returning ``None`` stores ``"value":null``, which is not the nil of in-flight work.
Values go through pydantic, typed by the function's return annotation, and only a
value that comes back equal and of the same type is stored: otherwise the first
call's outcome is kept as ``unstorable`` (fail closed: the function ran, so it is
not run again). ``bytes`` travel as base64. Nothing is ever pickled. No redis import here.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import hashlib
import inspect
import json
import typing
from typing import Annotated, Any, Final, Generic, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PydanticUserError,
    Secret,
    SecretBytes,
    SecretStr,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._core import describe
from ._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ReplayedError,
    ResultNotSerializableError,
    UnreadableResultError,
)

__all__ = [
    "Codec",
    "ErrorEnvelope",
    "FingerprintParameters",
    "ResultEnvelope",
    "StoredError",
    "UnstorableEnvelope",
    "fingerprint_of",
    "fingerprint_parameters",
]

T = TypeVar("T")
VERSION: Literal[1] = 1

# Redis refuses a value above its proto-max-bulk-len, 512 MiB by default.
MAX_RESULT_BYTES = 512 * 1024 * 1024 - 4096
_BASE64_BYTES = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

# Return annotations whose values cannot come back as what ran: an iterator is
# consumed by the first caller, and nothing can be returned from NoReturn.
_UNREPLAYABLE_ORIGINS = (
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.Generator,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
    collections.abc.Awaitable,
    collections.abc.Coroutine,
)


class StoredError(BaseModel):
    """An exception kept as data: its class name, message and JSON-able attributes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str
    fields: dict[str, JsonValue] = Field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> StoredError:
        """Describe ``exc``; attributes that are not JSON-serializable are left out."""
        fields: dict[str, JsonValue] = {}
        for name, value in vars(exc).items():
            if name.startswith("_"):
                continue
            try:
                fields[name] = to_jsonable_python(value)
            except (PydanticSerializationError, TypeError, ValueError):
                continue
        kind = type(exc)
        return cls(type=f"{kind.__module__}.{kind.__qualname__}", message=str(exc), fields=fields)


class ResultEnvelope(BaseModel, Generic[T]):
    """A stored result."""

    model_config = ConfigDict(frozen=True, extra="forbid", **_BASE64_BYTES)

    goblin: Literal[1]
    kind: Literal["result"]
    fp: Union[str, None] = None  # noqa: UP007 -- evaluated by pydantic at run time on 3.10
    value: T


class ErrorEnvelope(BaseModel):
    """A stored terminal error (``replay_errors=``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    goblin: Literal[1]
    kind: Literal["error"]
    fp: Union[str, None] = None  # noqa: UP007
    error: StoredError


class UnstorableEnvelope(BaseModel):
    """The first call returned, but its result could not be stored: duplicates are told so."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    goblin: Literal[1]
    kind: Literal["unstorable"]
    fp: Union[str, None] = None  # noqa: UP007
    reason: str


Envelope = Union[ResultEnvelope[Any], ErrorEnvelope, UnstorableEnvelope]  # noqa: UP007 -- a run-time alias


class Codec(Generic[T]):
    """Encodes one function's outcomes and decodes them back, typed by its return annotation.

    Args:
        return_type: The function's return annotation (``Any`` when it has none).
    """

    def __init__(self, return_type: Any) -> None:
        _refuse_unreplayable(return_type)
        try:
            try:
                # bytes as base64, so any bytes come back exactly (not only UTF-8).
                self._value: TypeAdapter[T] = TypeAdapter(return_type, config=_BASE64_BYTES)
            except PydanticUserError:  # models, dataclasses, TypedDicts bring their own config
                self._value = TypeAdapter(return_type)
            envelope = Annotated[
                Union[ResultEnvelope[return_type], ErrorEnvelope, UnstorableEnvelope],  # noqa: UP007
                Field(discriminator="kind"),
            ]
            self._envelope: TypeAdapter[ResultEnvelope[T] | ErrorEnvelope | UnstorableEnvelope] = TypeAdapter(envelope)
        except PydanticUserError as exc:  # schema errors too: a type pydantic cannot store
            raise InvalidArgumentTypeError(f"cannot store results of type {return_type!r}: {exc}") from exc
        # Serializer warnings say a value does not match its annotation. Where the
        # annotation is Any all the way down, the serializer infers every value and
        # has nothing to warn about that the round trip below would not catch, so
        # the costly "error" mode is spared.
        self._warnings: Literal["error"] | bool = False if _infers_everything(return_type) else "error"

    def encode_result(self, value: T, fp: str | None, key: str) -> bytes:
        """The envelope of a result.

        Raises:
            ResultNotSerializableError: ``value`` does not serialize as the annotation says.
        """
        try:
            # warnings="error": a value that does not match the annotation would
            # not come back equal, so it is refused instead of stored.
            # The adapter's own serializer and validator: its dump_json/validate_json
            # wrappers cost more than the work on a small result.
            body = self._value.serializer.to_json(value, warnings=self._warnings)
            back = self._value.validator.validate_json(body)
        except (PydanticSerializationError, TypeError, ValueError) as exc:  # ValidationError too
            raise ResultNotSerializableError(
                f"the result for {key!r} cannot be stored as JSON ({type(value).__name__}): {exc}; "
                "annotate the function's return type with something pydantic can serialize",
                key=key,
            ) from exc
        if not _same(back, value):
            raise ResultNotSerializableError(
                f"the result for {key!r} would come back as {type(back).__name__} {describe(back)}, not as the "
                f"{type(value).__name__} {describe(value)} that was returned; annotate the return type "
                "exactly (a datetime, a tuple, a dataclass...) so duplicates get what ran",
                key=key,
            )
        if len(body) > MAX_RESULT_BYTES:
            raise ResultNotSerializableError(
                f"the result for {key!r} is {len(body)} bytes as JSON, more than Redis stores in one value",
                key=key,
            )
        return b"".join((_RESULT_HEAD, _json_fp(fp), b',"value":', body, b"}"))

    def encode_error(self, exc: BaseException, fp: str | None) -> bytes:
        """The envelope of a terminal error."""
        envelope = ErrorEnvelope(goblin=VERSION, kind="error", fp=fp, error=StoredError.of(exc))
        return envelope.model_dump_json().encode()

    def encode_unstorable(self, error: ResultNotSerializableError, fp: str | None) -> bytes:
        """The envelope saying the first call's result could not be stored (why, without the value)."""
        reason = str(error).encode("utf-8", "replace").decode("utf-8")[:500]
        return UnstorableEnvelope(goblin=VERSION, kind="unstorable", fp=fp, reason=reason).model_dump_json().encode()

    def decode(self, raw: bytes | str, key: str) -> ResultEnvelope[T] | ErrorEnvelope | UnstorableEnvelope:
        """Read a stored envelope.

        Raises:
            UnreadableResultError: ``raw`` is not an envelope of this format and type.
        """
        try:
            return self._envelope.validate_json(raw)
        except ValidationError as exc:
            preview = raw[:80] if isinstance(raw, str) else raw[:80].decode("utf-8", "replace")
            raise UnreadableResultError(
                f"the stored result for {key!r} is not a goblin-claim envelope for this function's return type "
                f"(another writer, or a changed annotation): {preview!r}",
                key=key,
            ) from exc


_RESULT_HEAD: Final = f'{{"goblin":{VERSION},"kind":"result","fp":'.encode()


def _json_fp(fp: str | None) -> bytes:
    """A fingerprint as JSON: hex digits need no escaping (anything else goes through json)."""
    if fp is None:
        return b"null"
    if fp.isascii() and fp.isalnum():
        return b'"%s"' % fp.encode()
    return json.dumps(fp).encode()


def _infers_everything(return_type: Any) -> bool:
    """Whether ``return_type`` is ``Any``, or a dict or list of ``Any`` (keys Any or str)."""
    if return_type is Any or return_type in (dict, list):
        return True
    origin, args = typing.get_origin(return_type), typing.get_args(return_type)
    if origin is dict:
        return args in ((str, Any), (Any, Any))
    return origin is list and args == (Any,)


def _same(back: Any, value: Any) -> bool:
    try:
        return type(back) is type(value) and bool(back == value)
    except Exception:  # an __eq__ that raises cannot vouch for the round trip
        return False


def _refuse_unreplayable(return_type: Any) -> None:
    origin = typing.get_origin(return_type) or return_type
    if return_type in (typing.NoReturn, getattr(typing, "Never", typing.NoReturn)) or (
        isinstance(origin, type) and origin in _UNREPLAYABLE_ORIGINS
    ):
        raise InvalidArgumentTypeError(
            f"results of type {return_type!r} cannot be replayed to duplicates (an iterator is used up by the "
            "first caller); return a list, or a value, instead"
        )


def replayed(stored: StoredError, key: str) -> ReplayedError:
    """The error a duplicate raises for a stored terminal error."""
    return ReplayedError(
        f"the first call for {key!r} failed with {stored.type}: {stored.message}",
        key=key,
        type_name=stored.type,
        error_message=stored.message,
        fields=dict(stored.fields),
    )


# --------------------------------------------------------------------------- fingerprints
#
# "The same call" is the counted arguments as JSON sees them, made canonical here
# rather than by pydantic's serializer, which masks every secret as "**********"
# (so two card numbers would look equal) and refuses bytes that are not UTF-8.
# Everything here is stable across processes: no hash(), no id(), no repr.

# Types JSON writes as they are (subclasses of str, int and float too, by value).
_PLAIN: Final = frozenset({str, int, float, bool, type(None)})
_SECRETS: Final = (SecretStr, SecretBytes, Secret)
_BINARY: Final = (bytes, bytearray, memoryview)
# The first parameter of a method is what it runs on, not an argument of the call.
_RECEIVERS: Final = ("self", "cls")
_NO_DEFAULT: Final[Any] = inspect.Parameter.empty
_MISSING: Final[Any] = object()
_ENCODER: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # made once: json.dumps(**options) is not

# The same encoder's C core, made once rather than on every encode() (what
# JSONEncoder.iterencode does); circular data is caught as a RecursionError.
_C_ENCODER: Final = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]  # None where the C accelerator is missing
        None, _ENCODER.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


def _json_text(data: Any) -> str:
    """``data`` as ``_ENCODER`` writes it."""
    if _C_ENCODER is None:
        return _ENCODER.encode(data)
    return "".join(_C_ENCODER(data, 0))


FingerprintParameters = tuple[tuple[str, Any], ...]
"""The parameters a fingerprint counts, each with the default that leaves it out."""


def fingerprint_parameters(signature: inspect.Signature, names: object, where: str) -> FingerprintParameters:
    """The parameters a fingerprint counts, checked once, when decorating.

    Args:
        signature: The decorated function's signature.
        names: ``None`` for every parameter but a method's leading ``self`` or
            ``cls``; else ``fingerprint=``'s tuple of parameter names.
        where: The function's name, for errors.

    Raises:
        InvalidArgumentTypeError: ``names`` is not a tuple of str naming parameters.
        InvalidArgumentError: ``names`` is empty or names a parameter twice.
    """
    params = signature.parameters
    if names is None:
        chosen = list(params)
        first = next(iter(params.values()), None)
        if (
            first is not None
            and first.name in _RECEIVERS
            and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
        ):
            chosen.remove(first.name)
    else:
        if type(names) is not tuple:
            raise InvalidArgumentTypeError(
                f"fingerprint must be a function, a tuple of parameter names, None or left out, not {describe(names)}"
            )
        if not names:
            raise InvalidArgumentError("fingerprint=() counts nothing: name parameters, or pass fingerprint=None")
        for name in names:
            if type(name) is not str:
                raise InvalidArgumentTypeError(f"fingerprint= names parameters by str, not {describe(name)}")
            if name not in params:
                raise InvalidArgumentTypeError(
                    f"fingerprint= names {name!r}, which is not a parameter of {where}{signature}"
                )
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"fingerprint= names a parameter twice: {describe(names)}")
        chosen = list(names)
    return tuple((name, _default_of(params[name])) for name in chosen)


def _default_of(param: inspect.Parameter) -> Any:
    if param.kind is param.VAR_POSITIONAL:
        return ()
    if param.kind is param.VAR_KEYWORD:
        return {}
    return param.default


def fingerprint_of(arguments: collections.abc.Mapping[str, Any], counted: FingerprintParameters, key: str) -> str:
    """A short hash of the counted arguments: 32 hex digits, the same in every process.

    A parameter left at its default is left out (so adding an optional parameter
    keeps the fingerprints of earlier calls); secrets count by a hash of their
    value; ``bytes`` by a hash of their content; sets in sorted order.

    Args:
        arguments: The bound arguments, defaults applied.
        counted: What ``fingerprint_parameters`` chose.
        key: The idempotency key, for errors.

    Raises:
        InvalidArgumentTypeError: an argument has no JSON form.
    """
    data: dict[str, Any] = {}
    try:
        for name, default in counted:
            value = arguments[name]
            if default is _NO_DEFAULT or not _is_default(value, default):
                data[name] = _canonical(value)
        text = _json_text(data)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentTypeError(
            f"cannot fingerprint the arguments for {key!r}: {exc}; pass fingerprint= a function of the "
            "arguments that returns a str, a tuple of the parameters that count, or None",
            key=key,
        ) from exc
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _is_default(value: Any, default: Any) -> bool:
    # Same type and equal: 0 is not a default False, and an __eq__ that raises,
    # or answers with something other than True (an array), never hides a value.
    if value is default:
        return True
    if type(value) is not type(default):
        return False
    try:
        return (value == default) is True
    except Exception:
        return False


def _canonical(value: Any) -> Any:
    """``value`` as JSON-ready data: dicts with str keys, lists, str, numbers, bool, None."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list or kind is tuple:
        return [_canonical(item) for item in value]
    if kind is dict:
        return _canonical_mapping(value)
    if isinstance(value, _SECRETS):
        return {"$secret": hashlib.sha256(_secret_bytes(value)).hexdigest()}
    if isinstance(value, _BINARY):
        return {"$bytes": hashlib.sha256(value.tobytes() if isinstance(value, memoryview) else value).hexdigest()}
    if isinstance(value, BaseModel):
        return _canonical_model(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _canonical(item)
            for field in dataclasses.fields(value)
            if (item := getattr(value, field.name, _MISSING)) is not _MISSING and not _is_default(item, field.default)
        }
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if isinstance(value, (str, int, float)):  # subclasses: JSON writes their plain value
        return value
    if isinstance(value, collections.abc.Mapping):
        return _canonical_mapping(value)
    if isinstance(value, (collections.abc.Set, frozenset)):
        # No order, and str hashing differs per process: sorted by their JSON.
        return sorted((_canonical(item) for item in value), key=_json_text)
    if isinstance(value, collections.abc.Sequence):
        return [_canonical(item) for item in value]
    return to_jsonable_python(value)  # datetime, Decimal, UUID, Path...; unknown objects raise


def _canonical_mapping(value: collections.abc.Mapping[Any, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, item in value.items():
        if type(name) is not str:
            # As JSON writes keys: 1 and "1" are the same key.
            text = _canonical(name)
            name = text if isinstance(text, str) else _json_text(text)
        if name.startswith("$"):
            name = "$" + name  # a caller's {"$bytes": ...} never reads as a tag
        data[name] = _canonical(item)
    return data


def _canonical_model(value: BaseModel) -> dict[str, Any]:
    # Field by field: model_dump would mask secrets. Fields at their default are
    # left out, as parameters are, so adding an optional field keeps fingerprints.
    data: dict[str, Any] = {}
    for name, info in type(value).model_fields.items():
        item = getattr(value, name, _MISSING)  # model_construct() may leave a field unset
        if item is _MISSING or (info.default_factory is None and _is_default(item, info.default)):
            continue
        data[name] = _canonical(item)
    extra = value.__pydantic_extra__
    if extra:
        data.update(_canonical_mapping(extra))
    return data


def _secret_bytes(value: SecretStr | SecretBytes | Secret[Any]) -> bytes:
    secret = value.get_secret_value()
    if isinstance(secret, str):
        return secret.encode("utf-8", "surrogatepass")
    if isinstance(secret, bytes):
        return secret
    return _json_text(_canonical(secret)).encode()  # Secret[int], Secret[date]...
