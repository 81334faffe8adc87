"""What ran is what replays: a value is stored only if read back from its own JSON it has the same types and values."""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import datetime
import decimal
import enum
import math
from typing import Any, Final, Union

from pydantic import (
    BaseModel,
)
from pydantic_core import TzInfo

from .._protocol.checks import describe

_MISSING: Final[Any] = object()


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
