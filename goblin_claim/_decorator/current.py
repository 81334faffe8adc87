"""``current_claim()``: the handle of the ``@idempotent`` call whose function runs in this context."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Union

from .._errors import NoCurrentClaimError

if TYPE_CHECKING:
    from .._drivers.aio import AsyncClaim
    from .._drivers.sync import Claim

    Handle = Union[Claim, AsyncClaim]  # noqa: UP007 -- a run-time alias on 3.10

__all__ = ["CURRENT", "current_claim"]

# Set by the decorator's flow around the function's run only: a duplicate never touches it.
# A task copies it when made, so tasks the function starts see it too.
CURRENT: ContextVar[Handle] = ContextVar("goblin_claim_current_claim")


def current_claim() -> Claim | AsyncClaim:
    """The ``Claim`` (or ``AsyncClaim``) of the innermost ``@idempotent`` call whose function runs here.

    For the function's own code, and what it calls in the same thread or task (or
    in tasks it starts), while it runs; the decorated function's duplicates never
    run it. A sync function asks it before an irreversible step, with no round trip::

        @idempotent(client, key="order_id")
        def ship(order_id: str) -> str:
            parcel = pack(order_id)
            goblin_claim.current_claim().ensure_held()  # ClaimLostError once the lease is lost
            return courier.send(parcel)

    Raises:
        NoCurrentClaimError: Called outside such a function (it is a ``LookupError``
            too, as a context variable without a value raises).
    """
    try:
        return CURRENT.get()
    except LookupError:
        raise NoCurrentClaimError(
            "current_claim() is called outside the function of an @idempotent call: there is no claim here"
        ) from None
