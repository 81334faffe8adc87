"""Call fingerprints: a digest of a call's arguments, so a duplicate with other arguments is refused."""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import enum
import hashlib
import inspect
import json
from typing import Any, Final

from pydantic import (
    BaseModel,
    Secret,
    SecretBytes,
    SecretStr,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from .._protocol.checks import describe

_MISSING: Final[Any] = object()


# A fingerprint's hex digits: 64 bits, against keys reused by mistake (not an adversary).
FINGERPRINT_CHARS: Final = 16
_FINGERPRINT_BYTES: Final = FINGERPRINT_CHARS // 2


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
    """A short hash of the counted arguments: ``FINGERPRINT_CHARS`` hex digits, the same in every process.

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
                data[name] = value if type(value) in _PLAIN else _canonical(value)
        text = _json_text(data)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentTypeError(
            f"cannot fingerprint the arguments for {key!r}: {exc}; pass fingerprint= a function of the "
            "arguments that returns a str, a tuple of the parameters that count, or None",
            key=key,
        ) from exc
    return _sha256(text.encode()).digest()[:_FINGERPRINT_BYTES].hex()


_sha256 = hashlib.sha256


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
        data[name] = item if type(item) in _PLAIN else _canonical(item)
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
