"""What ``acquire()`` and ``wait()`` return: frozen values, one per situation.

``Outcome`` is a discriminated union (on ``kind``), so ``match`` statements and
type checkers narrow it::

    match claim.acquire():
        case Claimed():
            ...  # do the work, then claim.complete(result)
        case Completed(value=value):
            ...  # already done: reply with value
        case InFlight():
            ...  # someone else is working on it: retry later, or claim.wait()
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Claimed", "Completed", "InFlight", "Outcome"]

_FROZEN = ConfigDict(frozen=True, strict=True, extra="forbid")


class Claimed(BaseModel):
    """This caller now owns the work: do it, then ``complete()`` the claim.

    Attributes:
        key: The handle's key.
        token: The token stored in the claim key.
        lease: Seconds the claim stays held unless completed, extended or released.
        fence: With ``fencing=True``, a number that strictly increases with every
            owner of this key: pass it to downstream stores so they refuse a stale
            owner's late writes. ``None`` without fencing.
        checkpoint: With ``checkpoints=True``, the progress an earlier owner of this
            key saved (``checkpoint()``) before its lease lapsed: resume from there.
            ``None`` when there is none (and without checkpoints); ``str`` when the
            client decodes responses, else ``bytes``.
    """

    model_config = _FROZEN
    __match_args__: ClassVar[tuple[str, ...]] = ("key", "token", "lease", "fence", "checkpoint")

    kind: Literal["claimed"] = "claimed"
    key: str
    token: str
    lease: int
    fence: Union[int, None] = None  # noqa: UP007 -- pydantic evaluates this at run time on 3.10 too
    checkpoint: Union[str, bytes, None] = None  # noqa: UP007


class Completed(BaseModel):
    """The work was already done; ``value`` is what its owner stored.

    Attributes:
        key: The handle's key.
        value: ``str`` when the client decodes responses, else ``bytes``.
    """

    model_config = _FROZEN
    __match_args__: ClassVar[tuple[str, ...]] = ("key", "value")

    kind: Literal["completed"] = "completed"
    key: str
    value: Union[str, bytes]  # noqa: UP007 -- pydantic evaluates this at run time on 3.10 too


class InFlight(BaseModel):
    """Another caller holds the claim and has not stored a result yet.

    Attributes:
        key: The handle's key.
        retry_after: Seconds the holder's lease had left when the server answered (its
            PTTL): when a crashed owner's claim lapses and a retry can take it over. A
            live owner renewing its lease pushes this out; ``None`` when unknown (the
            claim freed meanwhile, or a raw writer's claim without an expiry).
        holder: The token that holds the claim (its owner's identity, when the owner
            gave its handle one: ``Claim(..., token="worker-7")``), without the
            fingerprint ``@idempotent`` and the HTTP doors add to theirs; ``None``
            when unknown.
    """

    model_config = _FROZEN
    __match_args__: ClassVar[tuple[str, ...]] = ("key", "retry_after", "holder")

    kind: Literal["in_flight"] = "in_flight"
    key: str
    retry_after: Union[float, None] = None  # noqa: UP007 -- pydantic evaluates this at run time on 3.10 too
    holder: Union[str, None] = None  # noqa: UP007

    # retry_after and holder are readings of the moment the server answered, not part
    # of the situation: two in-flight answers for one key are the same outcome.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, InFlight):
            return self.key == other.key
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.kind, self.key))


Outcome = Annotated[Union[Claimed, Completed, InFlight], Field(discriminator="kind")]  # noqa: UP007
"""Any of the three outcomes, discriminated on ``kind``."""
