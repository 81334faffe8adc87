"""What ``@idempotent`` stores: a small versioned JSON envelope, and call fingerprints.

A stored outcome looks like::

    {"goblin":1,"kind":"result","fp":"5e0c...","value":{"txn":"txn_551"}}
    {"goblin":1,"kind":"error","fp":"5e0c...","error":{"type":"shop.CardDeclined","message":"...","fields":{}}}

``goblin`` is the format version, so a later format can be told apart; ``fp`` is
the fingerprint of the first call's arguments, so a duplicate with different
arguments is caught after completion without another round trip. A function
returning ``None`` stores ``"value":null``, which is not the nil of in-flight work.
Values go through pydantic, typed by the function's return annotation; nothing is
ever pickled. No redis import here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._errors import InvalidArgumentTypeError, ReplayedError, ResultNotSerializableError, UnreadableResultError

__all__ = ["Codec", "ErrorEnvelope", "ResultEnvelope", "StoredError", "fingerprint_of"]

T = TypeVar("T")
VERSION: Literal[1] = 1


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

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class Codec(Generic[T]):
    """Encodes one function's outcomes and decodes them back, typed by its return annotation.

    Args:
        return_type: The function's return annotation (``Any`` when it has none).
    """

    def __init__(self, return_type: Any) -> None:
        try:
            self._value: TypeAdapter[T] = TypeAdapter(return_type)
            envelope = Annotated[
                Union[ResultEnvelope[return_type], ErrorEnvelope],  # noqa: UP007
                Field(discriminator="kind"),
            ]
            self._envelope: TypeAdapter[ResultEnvelope[T] | ErrorEnvelope] = TypeAdapter(envelope)
        except PydanticUserError as exc:  # schema errors too: a type pydantic cannot store
            raise InvalidArgumentTypeError(f"cannot store results of type {return_type!r}: {exc}") from exc

    def encode_result(self, value: T, fp: str | None, key: str) -> bytes:
        """The envelope of a result.

        Raises:
            ResultNotSerializableError: ``value`` does not serialize as the annotation says.
        """
        try:
            # warnings="error": a value that does not match the annotation would
            # not come back equal, so it is refused instead of stored.
            body = self._value.dump_json(value, warnings="error")
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise ResultNotSerializableError(
                f"the result for {key!r} cannot be stored as JSON ({type(value).__name__}): {exc}; "
                "annotate the function's return type with something pydantic can serialize",
                key=key,
            ) from exc
        head = f'{{"goblin":{VERSION},"kind":"result","fp":{json.dumps(fp)},"value":'
        return head.encode() + body + b"}"

    def encode_error(self, exc: BaseException, fp: str | None) -> bytes:
        """The envelope of a terminal error."""
        envelope = ErrorEnvelope(goblin=VERSION, kind="error", fp=fp, error=StoredError.of(exc))
        return envelope.model_dump_json().encode()

    def decode(self, raw: bytes | str, key: str) -> ResultEnvelope[T] | ErrorEnvelope:
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


def replayed(stored: StoredError, key: str) -> ReplayedError:
    """The error a duplicate raises for a stored terminal error."""
    return ReplayedError(
        f"the first call for {key!r} failed with {stored.type}: {stored.message}",
        key=key,
        type_name=stored.type,
        error_message=stored.message,
        fields=dict(stored.fields),
    )


def _canonical(value: Any) -> Any:
    # Sets have no order (and str hashing differs per process): sort them so
    # equal arguments give equal fingerprints everywhere.
    if isinstance(value, (set, frozenset)):
        items = [_canonical(item) for item in value]
        return sorted(items, key=lambda item: json.dumps(to_jsonable_python(item), sort_keys=True))
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value


def fingerprint_of(arguments: Any, key: str) -> str:
    """A short hash of ``arguments`` (JSON through pydantic, dict keys sorted).

    Raises:
        InvalidArgumentTypeError: an argument cannot be turned into JSON.
    """
    try:
        data = json.dumps(to_jsonable_python(_canonical(arguments)), sort_keys=True, separators=(",", ":"))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentTypeError(
            f"cannot fingerprint the arguments for {key!r}: {exc}; pass fingerprint= a function of the "
            "arguments that returns a str, or fingerprint=None",
            key=key,
        ) from exc
    return hashlib.sha256(data.encode()).hexdigest()[:32]
