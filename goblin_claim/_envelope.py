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
import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import math
import typing
from typing import Annotated, Any, Final, Generic, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    PydanticUserError,
    Secret,
    SecretBytes,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticSerializationError, TzInfo, to_jsonable_python

from ._core import describe
from ._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ReplayedError,
    ResultNotSerializableError,
    UnreadableResultError,
)

__all__ = [
    "FINGERPRINT_CHARS",
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


# A fingerprint's hex digits: 64 bits, against keys reused by mistake (not an adversary).
FINGERPRINT_CHARS: Final = 16
_FINGERPRINT_BYTES: Final = FINGERPRINT_CHARS // 2

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


# --------------------------------------------------------------------------- what replays
#
# Read back from its own JSON, a result must be what ran: the same type (exactly:
# bool, int and float differ, an Enum member is not its str, a subclass is not its
# base) and the same value, all the way down. ``==`` cannot tell (1 == 1.0 == True,
# and containers compare their items with ``==``), so the two are walked together.

# pydantic's JSON stops near 255 levels of nesting: deeper than this, only a value
# that holds itself gets here. The walk is a loop, so depth never costs recursion.
_MAX_DEPTH: Final = 1000
# Leaves whose ``==`` says everything once their exact types match: what most results are made of.
_LEAVES: Final = frozenset({str, int, bool, bytes, type(None)})
# A container of only these is settled in C loops (_flat): from this many items it pays.
_FLAT: Final = _LEAVES | {float}
_FLAT_FROM: Final = 32
# All that JSON keeps of a time zone is its offset; these two tzinfo classes are only that.
_FIXED_OFFSETS: Final = (datetime.timezone, TzInfo)
# How a step from a value to a part of it reads in a message.
_ITEM, _ATTRIBUTE, _KEY, _MEMBER = range(4)

_Path = Union[tuple[Any, int, Any], None]  # noqa: UP007 -- (parent, how, step), built only as the walk goes
_Step = tuple[Any, Any, _Path, int]  # (came back, ran, where, depth)


def _difference(back: Any, value: Any) -> str | None:
    """How ``back``, read from ``value``'s JSON, differs from it; ``None`` when it would replay as it ran.

    Exact types and equal values all the way down, through lists, tuples (named ones
    too), dicts, sets, pydantic models (fields, extra and private attributes),
    dataclasses (fields and any other attributes), enums, datetimes, Decimals (to the
    digit: ``1.0`` is not ``1.00``) and floats (``-0.0`` is not ``0.0``).

    NaN counts as NaN: where the serializer keeps it (a model configured with
    ``ser_json_inf_nan="constants"``) a duplicate gets NaN back, as ran; by default
    JSON writes NaN and infinities as null, which come back as ``None`` and are refused.

    Not compared: the order of a plain dict's keys (a TypedDict comes back in its
    fields' order), a model's ``model_fields_set``, and the name of a fixed-offset
    zone (``timezone(timedelta(hours=1))`` comes back as the same offset). A zone with
    rules (``ZoneInfo("Europe/Paris")``) comes back as a fixed offset, so it differs.
    """
    try:
        return _walk(back, value)
    except Exception as exc:  # an __eq__, __hash__ or property that raises cannot vouch for the replay
        return f"comparing it with what would come back raised {describe(exc)}"


def _walk(back: Any, value: Any) -> str | None:
    stack: list[_Step] = [(back, value, None, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        b, v, path, depth = pop()
        kind = type(v)
        if type(b) is not kind:
            return _came_back(path, b, v)
        if kind in _LEAVES:
            if b != v:
                return _came_back(path, b, v)
            continue
        if depth >= _MAX_DEPTH:
            return f"{_where(path)} is nested more than {_MAX_DEPTH} levels deep, or holds itself"
        depth += 1
        reason: str | None = None
        if kind is list or kind is tuple:
            reason = _sequence(b, v, path, depth, push)
        elif kind is dict:
            reason = _mapping(b, v, path, depth, push)
        elif kind is float:
            reason = None if _same_float(b, v) else _came_back(path, b, v)
        elif isinstance(v, BaseModel):
            reason = _model(b, v, path, depth, push)
        elif isinstance(v, enum.Enum):  # before str and int: a member is not walked as its value
            reason = None if b is v or b == v else _came_back(path, b, v)
        elif isinstance(v, (datetime.datetime, datetime.time)):
            reason = _moment(b, v, path)
        elif isinstance(v, decimal.Decimal):
            reason = None if b.compare_total(v) == 0 else _came_back(path, b, v)
        elif isinstance(v, float):
            reason = None if _same_float(b, v) else _came_back(path, b, v)
        elif isinstance(v, (str, bytes, bytearray, memoryview, int)):  # before Sequence: not walked per item
            reason = None if b == v else _came_back(path, b, v)
        elif isinstance(v, collections.abc.Mapping):
            reason = _mapping(b, v, path, depth, push)
        elif isinstance(v, collections.abc.Set):
            reason = _members(b, v, path, depth, push)
        elif isinstance(v, collections.abc.Sequence):
            reason = _sequence(b, v, path, depth, push)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            reason = _attributes(b, v, path, depth, push)
        else:  # dates, UUIDs, timedeltas, paths...: their == compares what they hold
            reason = None if bool(b == v) else _came_back(path, b, v)
        if reason is not None:
            return reason
    return None


def _parts(
    parts: collections.abc.Iterable[tuple[Any, Any, Any]],
    path: _Path,
    how: int,
    depth: int,
    push: collections.abc.Callable[[_Step], None],
) -> None:
    """Queue ``(step, came back, ran)`` parts for the walk, settling equal leaves (and nonzero floats) at once."""
    for step, b, v in parts:
        kind = type(v)
        if kind in _FLAT and type(b) is kind and b == v and (kind is not float or v != 0.0):
            continue
        push((b, v, (path, how, step), depth))


def _sequence(b: Any, v: Any, path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]) -> str | None:
    if len(b) != len(v):
        return _came_back(path, b, v)
    if isinstance(v, collections.deque) and b.maxlen != v.maxlen:
        return f"{_where(path)} would come back with maxlen {b.maxlen}, not {v.maxlen}"
    if len(v) < _FLAT_FROM or not _flat(b, v):
        _parts(zip(range(len(v)), b, v, strict=True), path, _ITEM, depth, push)
    return None


def _flat(b: collections.abc.Sequence[Any], v: collections.abc.Sequence[Any]) -> bool:
    """Whether ``b`` and ``v`` hold the same leaves in the same places: settled in C loops, not item by item."""
    kinds = list(map(type, v))
    if kinds != list(map(type, b)):
        return False
    found = {kinds[0]} if kinds and kinds.count(kinds[0]) == len(kinds) else set(kinds)  # mostly one kind
    if not found <= _FLAT or b != v:
        return False
    return float not in found or 0.0 not in v  # -0.0 == 0.0: zeros go the long way, which compares signs


def _mapping(b: Any, v: Any, path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]) -> str | None:
    if len(b) != len(v):
        return _came_back(path, b, v)
    if isinstance(v, collections.defaultdict) and b.default_factory is not v.default_factory:
        return f"{_where(path)} would come back with the default {describe(b.default_factory)}"
    # JSON keeps the order, so the keys usually pair up as they stand.
    if len(v) >= _FLAT_FROM and _flat(list(b), list(v)) and _flat(list(b.values()), list(v.values())):
        return None
    for (key_b, item_b), (key_v, item_v) in zip(b.items(), v.items(), strict=True):
        # _pair, inline: this loop is most of what a small result costs.
        kind = type(key_v)
        if kind not in _LEAVES or type(key_b) is not kind or key_b != key_v:
            if key_b is not key_v and key_b != key_v:
                break
            push((key_b, key_v, (path, _KEY, key_v), depth))
        kind = type(item_v)
        if kind not in _FLAT or type(item_b) is not kind or item_b != item_v or (kind is float and item_v == 0.0):
            push((item_b, item_v, (path, _ITEM, key_v), depth))
    else:
        return None
    # Another order: a TypedDict comes back in its fields' order, whatever order ran.
    index = {key: key for key in b}
    for key_v, item_v in v.items():
        key_b = index.get(key_v, _MISSING)
        if key_b is _MISSING:
            return f"{_where(path)} would come back without the key {describe(key_v)}"
        _pair(key_b, key_v, b[key_b], item_v, path, depth, push)
    if isinstance(v, collections.OrderedDict):  # whose == compares the order
        return f"{_where(path)} would come back in another order"
    return None


def _pair(
    key_b: Any,
    key_v: Any,
    item_b: Any,
    item_v: Any,
    path: _Path,
    depth: int,
    push: collections.abc.Callable[[_Step], None],
) -> None:
    """Queue an item whose key came back equal, and the key itself (1 and True are one key, of two types)."""
    kind = type(key_v)
    if kind not in _LEAVES or type(key_b) is not kind:
        push((key_b, key_v, (path, _KEY, key_v), depth))
    kind = type(item_v)
    if kind not in _LEAVES or type(item_b) is not kind or item_b != item_v:
        push((item_b, item_v, (path, _ITEM, key_v), depth))


def _members(b: Any, v: Any, path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]) -> str | None:
    if len(b) != len(v):
        return _came_back(path, b, v)
    index = {item: item for item in b}  # the member that came back for each equal one that ran
    for item in v:
        got = index.get(item, _MISSING)
        if got is _MISSING:
            return f"{_where(path)} would come back without {describe(item)}"
        _parts(((item, got, item),), path, _MEMBER, depth, push)
    return None


def _model(b: Any, v: BaseModel, path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]) -> str | None:
    # Fields, then extra and private attributes (mostly None): a duplicate reads all three.
    reason = _named(b.__dict__, v.__dict__, path, depth, push)
    for came, ran in ((b.__pydantic_extra__, v.__pydantic_extra__), (b.__pydantic_private__, v.__pydantic_private__)):
        if reason is None and (came or ran):
            reason = _named(came or {}, ran or {}, path, depth, push)
    return reason


def _attributes(b: Any, v: Any, path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]) -> str | None:
    names = [field.name for field in dataclasses.fields(v)]
    parts = ((name, getattr(b, name, _MISSING), getattr(v, name, _MISSING)) for name in names)
    _parts(parts, path, _ATTRIBUTE, depth, push)
    # Attributes besides the fields (set after construction) come back only if the constructor sets them.
    came, ran = getattr(b, "__dict__", {}), getattr(v, "__dict__", {})
    if len(came) > len(names) or len(ran) > len(names):
        fields = set(names)
        came = {name: item for name, item in came.items() if name not in fields}
        ran = {name: item for name, item in ran.items() if name not in fields}
        return _named(came, ran, path, depth, push)
    return None


def _named(
    came: dict[str, Any], ran: dict[str, Any], path: _Path, depth: int, push: collections.abc.Callable[[_Step], None]
) -> str | None:
    """Queue the attributes ``ran`` against those that came back, which must be the same names."""
    if came.keys() != ran.keys():
        missing, added = sorted(ran.keys() - came.keys()), sorted(came.keys() - ran.keys())
        changes = ([f"without {describe(missing)}"] if missing else []) + ([f"with {describe(added)}"] if added else [])
        return f"{_where(path)} would come back {' and '.join(changes)} as attributes"
    _parts(((name, came[name], item) for name, item in ran.items()), path, _ATTRIBUTE, depth, push)
    return None


def _moment(b: Any, v: datetime.datetime | datetime.time, path: _Path) -> str | None:
    # == compares instants: 12:00+00:00 is 13:00+01:00, and fold is not compared.
    if not (b == v and b.utcoffset() == v.utcoffset() and b.fold == v.fold):
        return _came_back(path, b, v)
    zone_b, zone_v = b.tzinfo, v.tzinfo
    if (
        zone_b is zone_v
        or (isinstance(zone_b, _FIXED_OFFSETS) and isinstance(zone_v, _FIXED_OFFSETS))
        or (type(zone_b) is type(zone_v) and zone_b == zone_v)
    ):
        return None
    return (
        f"{_where(path)}'s time zone {describe(zone_v)} would come back as {describe(zone_b)}: JSON keeps the "
        "offset, not the zone's rules (return the time in UTC or at a fixed offset)"
    )


def _same_float(b: float, v: float) -> bool:
    if b == v:
        return b != 0.0 or math.copysign(1.0, b) == math.copysign(1.0, v)  # -0.0 == 0.0
    return b != b and v != v  # NaN for NaN


def _came_back(path: _Path, b: Any, v: Any) -> str:
    return (
        f"{_where(path)} would come back as {_shown(b)}, not as the {_shown(v)} that was returned"
        if path is not None
        else f"it would come back as {_shown(b)}, not as the {_shown(v)} that was returned"
    )


def _shown(value: Any) -> str:
    return "nothing" if value is _MISSING else f"{type(value).__name__} {describe(value)}"


def _where(path: _Path) -> str:
    """``path`` as Python would reach it from the result: ``result['items'][0].amount``."""
    steps: list[str] = []
    while path is not None:
        path, how, step = path
        if how == _ITEM:
            steps.append(f"[{describe(step, 40)}]")
        elif how == _ATTRIBUTE:
            steps.append(f".{step}")
        elif how == _KEY:
            steps.append(f" (the key {describe(step, 40)})")
        else:
            steps.append(f" (the member {describe(step, 40)})")
    return "the result" if not steps else "result" + "".join(reversed(steps))


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
