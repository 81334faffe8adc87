"""What every driver does with a refused command: the one rule's decision, kept on the client and reported.

``_protocol.refusals.after_refusal`` decides what follows (send the script, its
text, give up, or take the error as the answer); this keeps what the decision
learned about the server on the client's state and emits the notice it names.
The drivers' single calls, their batches and the keep-alives all call it, then
perform the action themselves.
"""

from __future__ import annotations

from typing import Any

from .. import _events
from .._clients.families import NO_SCRIPT
from .._clients.transport import ClientState
from .._protocol.refusals import Refusal, after_refusal

__all__ = ["refused"]


def refused(
    handle: Any, state: ClientState, sent: str, exc: BaseException, noticed: set[tuple[str, str]] | None = None
) -> Refusal:
    """``after_refusal`` for ``handle``'s command ``sent`` refused with ``exc``, kept and reported.

    What the server turned out to lack is written to ``state.native`` (only when
    the decision changed it, so a concurrent caller's finding is not overwritten
    by a stale read); the notice goes out on ``handle``. A batch passes ``noticed``
    so that each notice goes out once per round, however many keys it concerned.
    """
    available = state.native
    decision = after_refusal(sent, exc, isinstance(exc, NO_SCRIPT), handle._native, available)
    if decision.available is not available:
        state.native = decision.available
    notice = decision.notice
    if notice is not None and (noticed is None or notice not in noticed):
        if noticed is not None:
            noticed.add(notice)
        _events.notice(handle, *notice)
    return decision
