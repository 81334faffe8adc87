"""The response's side: whether it can be kept, and the pass-through of a streamed one that is not."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Final

from .options import Options


def streamed_reason(options: Options, headers: Iterable[tuple[bytes, bytes]], trailers: bool = False) -> str | None:
    """Why a response cannot be kept, known from its start alone; ``None`` when it may be."""
    if trailers:
        return "it has trailers"
    limit = options.max_response_bytes
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-length" and value.isdigit() and int(value) > limit:
            return f"its Content-Length {int(value)} is larger than max_response_bytes={limit}"
        if lowered == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            if kind in options.stream_types:
                return "it is an event stream" if kind == b"text/event-stream" else f"it is a {kind.decode()} stream"
    return None


CUT_STREAM: Final = "the streamed response was not sent whole (the client left)"


def passed_through(
    chunks: Iterable[bytes | str], keep: AbstractContextManager[object], ended: Callable[[], None],
    cut: Callable[[], None],
) -> Iterator[bytes]:  # fmt: skip
    """A streamed response that is not kept, passed on as the app makes it, its lease kept alive until it ends.

    ``keep`` (the claim's keep-alive, entered) is exited once the last chunk went
    out, or once the stream was cut short (the client left, the app failed
    mid-stream); then ``ended()`` (the key is marked unstored) or ``cut()`` (it is
    kept closed as abandoned) runs. The sync doors' one pass-through (Django
    under WSGI, Flask); ``apassed_through`` is Django's under ASGI.
    """
    whole = False
    try:
        for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else chunk.encode()
        whole = True
    finally:
        keep.__exit__(None, None, None)
        (ended if whole else cut)()


async def apassed_through(
    chunks: AsyncIterable[bytes | str], keep: AbstractAsyncContextManager[object],
    ended: Callable[[], Awaitable[None]], cut: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:  # fmt: skip
    """``passed_through`` for an asyncio door: the lease is renewed until the stream ended or was cut."""
    whole = False
    try:
        async for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else chunk.encode()
        whole = True
    finally:
        await keep.__aexit__(None, None, None)
        await (ended if whole else cut)()
