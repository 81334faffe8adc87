"""A stand-in for authentication: ``X-User`` names the caller (``request.user_id``, None when absent)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class HeaderUserMiddleware:
    """Set ``request.user_id`` from the ``X-User`` header, in either world."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        """Name the caller, then go on."""
        request.user_id = request.headers.get("X-User")
        return self.get_response(request)
