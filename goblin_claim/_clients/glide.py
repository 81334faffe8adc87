"""GLIDE clients behind the part of redis-py's client API the drivers use.

``adapter_for(client)`` gives one adapter per GLIDE client (``glide.GlideClient``,
``glide.GlideClusterClient``, ``glide_sync.GlideClient``,
``glide_sync.GlideClusterClient``). It speaks GLIDE's own API: every command goes
through ``custom_command`` (routed by its key on a cluster), a pipeline is a
non-atomic ``Batch`` / ``ClusterBatch`` run with ``raise_on_error=False``, and
``wait()``'s wake-ups come through GLIDE's pub/sub. What GLIDE raises comes back
as the redis-py exception the same server reply gives there (``NoScriptError``,
``ReadOnlyError``, ``ResponseError`` with its code, ``ConnectionError``,
``TimeoutError``), so the drivers' error handling (translation, transient
answers, the NOSCRIPT reload, the native fallback) reads it unchanged.

Where GLIDE differs, and what is done about it:

- GLIDE has no ``decode_responses``: its replies are bytes, and so is ``Completed.value``.
- GLIDE 2.6 cannot parse a RESP3 ``COMMAND INFO`` reply for a command the server
  has; the native probe is sent as ``COMMAND LIST`` (the same ACL permission,
  ``+command``) and its answer reshaped to COMMAND INFO's.
- A pipeline holding a ``WAIT`` (``replicas=``) is given the client's request
  timeout plus WAIT's own, so GLIDE's default 250 ms never cuts a WAIT short; on
  a cluster it goes whole to the primary of its keys' slot, where WAIT counts (a
  batch of claims on several slots with ``replicas=`` is refused, as on redis-py's
  cluster client).
- A cluster adapter is not a redis-py cluster client (the drivers never see
  ``RedisCluster``'s node API): GLIDE follows the cluster's redirections itself,
  scripts are loaded on every primary, and the wake-ups are plain ``PUBLISH``.
- ``wait()``'s subscriber is a second GLIDE client made from the user's client's
  configuration (its own subscriptions and callback left out, RESP3, which GLIDE's
  pub/sub needs); it subscribes and unsubscribes as waiters come and go.

GLIDE is imported here only, and only once a GLIDE client is passed in.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from .glide_aio import AsyncGlideAdapter
from .glide_base import redis_error
from .glide_sync import GlideAdapter

__all__ = ["AsyncGlideAdapter", "GlideAdapter", "adapter_for", "redis_error"]


# The adapter is kept on its client (a cycle the collector frees with both): a map
# holding adapters keyed weakly by client would keep every client alive through
# its adapter, and an adapter kept only by handles would be made again, probe and
# all, for each request's handle.
_ATTRIBUTE = "_goblin_claim_adapter"
_LOCK = threading.Lock()


def adapter_for(client: Any) -> GlideAdapter | AsyncGlideAdapter:
    """The one adapter of a GLIDE client, made on first use."""
    adapter: GlideAdapter | AsyncGlideAdapter | None = getattr(client, _ATTRIBUTE, None)
    if adapter is not None and adapter.glide is client:
        return adapter
    with _LOCK:
        adapter = getattr(client, _ATTRIBUTE, None)
        if adapter is None or adapter.glide is not client:
            cluster = any(kind.__name__ == "GlideClusterClient" for kind in type(client).__mro__)
            asyncio_client = inspect.iscoroutinefunction(getattr(client, "custom_command", None))
            adapter = AsyncGlideAdapter(client, cluster) if asyncio_client else GlideAdapter(client, cluster)
            setattr(client, _ATTRIBUTE, adapter)
    return adapter
