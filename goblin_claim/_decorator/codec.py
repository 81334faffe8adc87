"""What ``@idempotent`` stores: a small versioned JSON envelope, and call fingerprints.

A stored outcome looks like::

    {"goblin":1,"value":{"txn":"txn_551"}}
    {"goblin":1,"kind":"error","error":{"type":"shop.CardDeclined","message":"...","fields":{}}}
    {"goblin":1,"kind":"unstorable","reason":"..."}

``goblin`` is the format version, so a later format can be told apart; an
envelope naming no ``kind`` is a result (``"kind":"result"`` is read too). The
decorator's record (``done <token> <envelope>``, one key) carries the fingerprint
of the first call's arguments in its token, so a duplicate with different
arguments is caught after completion without another round trip; an envelope may
also carry it itself, as ``"fp"`` (the encoders write it when given one). A function
returning ``None`` stores ``"value":null``, which is not the nil of in-flight work.
Values go through pydantic, typed by the function's return annotation, and only a
value that would replay as it ran is stored: read back from its own JSON, it must
have the same types and values all the way down (``_difference``), not only compare
equal, since ``1 == 1.0 == True``. Otherwise the first call's outcome is kept as
``unstorable`` (fail closed: the function ran, so it is not run again). ``bytes``
travel as base64. Nothing is ever pickled. No redis import here.
"""

from __future__ import annotations

import collections
import collections.abc
import enum
import json
import typing
from typing import Annotated, Any, Final, Generic, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    PydanticUserError,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .._errors import (
    InvalidArgumentTypeError,
    ReplayedError,
    ResultNotSerializableError,
    UnreadableResultError,
)
from .replay import _difference

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
    kind: Literal["result"] = "result"  # left out as stored: an envelope without a kind is a result
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
                Union[  # noqa: UP007
                    Annotated[ResultEnvelope[return_type], Tag("result")],
                    Annotated[ErrorEnvelope, Tag("error")],
                    Annotated[UnstorableEnvelope, Tag("unstorable")],
                ],
                Discriminator(_kind_of),
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
        difference = _difference(back, value)
        if difference is not None:
            raise ResultNotSerializableError(
                f"the result for {key!r} would not replay as it ran: {difference}; annotate the return type "
                "exactly (a float, a datetime, a tuple, a dataclass...) so duplicates get what ran",
                key=key,
            )
        if len(body) > MAX_RESULT_BYTES:
            raise ResultNotSerializableError(
                f"the result for {key!r} is {len(body)} bytes as JSON, more than Redis stores in one value",
                key=key,
            )
        if fp is None:
            return b"".join((_RESULT_HEAD, b'"value":', body, b"}"))
        return b"".join((_RESULT_HEAD, b'"fp":', _json_fp(fp), b',"value":', body, b"}"))

    def encode_error(self, exc: BaseException, fp: str | None) -> bytes:
        """The envelope of a terminal error."""
        envelope = ErrorEnvelope(goblin=VERSION, kind="error", fp=fp, error=StoredError.of(exc))
        return envelope.model_dump_json(exclude=_NO_FP if fp is None else None).encode()

    def encode_unstorable(self, error: ResultNotSerializableError, fp: str | None) -> bytes:
        """The envelope saying the first call's result could not be stored (why, without the value)."""
        reason = str(error).encode("utf-8", "replace").decode("utf-8")[:500]
        envelope = UnstorableEnvelope(goblin=VERSION, kind="unstorable", fp=fp, reason=reason)
        return envelope.model_dump_json(exclude=_NO_FP if fp is None else None).encode()

    def plain_value(self, raw: bytes | str) -> T | _Other:
        """The value of a plain result envelope, read without the envelope's model; else ``OTHER``.

        Plain: as ``encode_result`` writes it without a fingerprint,
        ``{"goblin":1,"value":...}``. The same value ``decode`` reads: what lies
        between that head and the closing brace is valid JSON only when it is
        exactly the member's value. Anything else (an error envelope, the previous
        format, bytes of another writer) answers ``OTHER``, for ``decode`` to read
        or refuse.
        """
        if type(raw) is bytes:
            if not (raw.startswith(_VALUE_HEAD) and raw.endswith(b"}")):
                return OTHER
        elif not (isinstance(raw, str) and raw.startswith(_VALUE_HEAD_TEXT) and raw.endswith("}")):
            return OTHER
        try:
            return self._value.validator.validate_json(raw[_VALUE_AT:-1])  # type: ignore[no-any-return]
        except ValidationError:
            return OTHER

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


_RESULT_HEAD: Final = f'{{"goblin":{VERSION},'.encode()  # no kind: a result is what has none
_VALUE_HEAD: Final = _RESULT_HEAD + b'"value":'
_VALUE_HEAD_TEXT: Final = _VALUE_HEAD.decode()
_VALUE_AT: Final = len(_VALUE_HEAD)


class _Other(enum.Enum):
    OTHER = "other"


OTHER: Final = _Other.OTHER
"""What ``Codec.plain_value`` answers for anything but a plain result envelope."""


def _kind_of(envelope: Any) -> str:
    """The kind of a stored envelope, as its discriminator: "result" when it names none."""
    if isinstance(envelope, dict):
        kind = envelope.get("kind", "result")
        return kind if isinstance(kind, str) else ""
    return getattr(envelope, "kind", "")


# Without a fingerprint (the decorator's record carries it in its token) the field is left out.
_NO_FP: Final = {"fp"}


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
