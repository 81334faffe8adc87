"""goblin-claim: do this work exactly once, over the Redis you already run.

An atomic claim (``SET claim_key token NX EX lease``, or the native
``GOBLIN.CLAIM`` where the server has it) decides who runs the work; everyone
else gets the first run's stored result in the same round trip.
"""

from ._decorator.current import current_claim
from ._decorator.idempotent import idempotent
from ._drivers.aio import AsyncClaim
from ._drivers.sync import Claim
from ._errors import (
    ClaimLostError,
    ConnectionFailedError,
    GoblinClaimError,
    InterruptedWorkError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NativeUnavailableError,
    NoCurrentClaimError,
    NotReplicatedError,
    PayloadMismatchError,
    ReplayedError,
    ResultLostError,
    ResultNotSerializableError,
    ServerError,
    ServerUnavailableError,
    StillInFlightError,
    UnreadableResultError,
    WrongTypeError,
)
from ._events import add_listener, remove_listener
from ._outcomes import Claimed, Completed, InFlight, Outcome

__all__ = [
    "AsyncClaim",
    "Claim",
    "ClaimLostError",
    "Claimed",
    "Completed",
    "ConnectionFailedError",
    "GoblinClaimError",
    "InFlight",
    "InterruptedWorkError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "NativeUnavailableError",
    "NoCurrentClaimError",
    "NotReplicatedError",
    "Outcome",
    "PayloadMismatchError",
    "ReplayedError",
    "ResultLostError",
    "ResultNotSerializableError",
    "ServerError",
    "ServerUnavailableError",
    "StillInFlightError",
    "UnreadableResultError",
    "WrongTypeError",
    "add_listener",
    "current_claim",
    "idempotent",
    "remove_listener",
]


def _say_where_users_import_them() -> None:
    """Name the public classes and functions after this package, not the private modules defining them.

    ``repr()``, ``help()``, tracebacks, and the error types in logs and telemetry then show
    ``goblin_claim.Claim``, the path users import, however the package is laid out inside.
    """
    for name in __all__:
        public = globals()[name]
        if isinstance(public, type) or (callable(public) and hasattr(public, "__code__")):
            public.__module__ = __name__


_say_where_users_import_them()
