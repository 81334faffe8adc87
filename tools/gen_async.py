"""Generate the asyncio twins of the sync modules: ``_drivers/aio.py`` and ``_decorator/aio.py``.

The ``Claim`` driver (``_drivers/sync.py``) and the ``@idempotent`` flow
(``_decorator/sync.py``) each have an asyncio mirror, name for name; writing
those by hand invites drift, so each is derived from its sync source by the
exact replacements below. Run ``python tools/gen_async.py`` after editing a
source; ``--check`` fails when a committed twin is stale (``make typecheck``
runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "goblin_claim"

# (sync text, async text): each must occur in _drivers/sync.py, or the script fails.
DRIVER: list[tuple[str, str]] = [
    (
        '"""``Claim``: the claim protocol over a sync redis-py client.\n\nThe mirror of ``_drivers/aio.py``',
        '"""``AsyncClaim``: the claim protocol over an asyncio redis-py client.\n\nThe mirror of ``_drivers/sync.py``',
    ),
    ("import contextlib\n", "import asyncio\nimport contextlib\n"),
    ("from redis.cluster import RedisCluster\n", "from redis.asyncio.cluster import RedisCluster\n"),
    (
        "from .._clients.families import CLUSTER_ERRORS, CLUSTERS, ERRORS, NO_SCRIPT, RESPONSE_ERRORS, adapt\n",
        "from .._clients.families import ASYNC_CLUSTERS, CLUSTER_ERRORS, ERRORS, NO_SCRIPT, RESPONSE_ERRORS, adapt\n",
    ),
    (
        "from .._clients.cluster import is_redirect, node_round\n",
        "from .._clients.cluster import is_redirect, node_round_async\n",
    ),
    ("= node_round(client,", "= await node_round_async(client,"),
    ("from collections.abc import Callable,", "from collections.abc import Awaitable, Callable,"),
    (
        "    def _persisting(self, attempt: Callable[[bool], T]",
        "    async def _persisting(self, attempt: Callable[[bool], Awaitable[T]]",
    ),
    ("                return attempt(first)", "                return await attempt(first)"),
    ("            _sleep(None, delay)", "            await _sleep(None, delay)"),
    ("return self._persisting(", "return await self._persisting("),
    ("    def _call_once(", "    async def _call_once("),
    ("    def _call_and_wait_once(", "    async def _call_and_wait_once("),
    ("    def _extend(", "    async def _extend("),
    ("        self._extend(lease)", "        await self._extend(lease)"),
    ("    def _acquire_alone(", "    async def _acquire_alone("),
    ("handles[i]._acquire_alone()", "await handles[i]._acquire_alone()"),
    ("replies[i] = handles[i].release()", "replies[i] = await handles[i].release()"),
    ("def _waited(", "async def _waited("),
    ("= _waited(client,", "= await _waited(client,"),
    ("def _node_rounds(", "async def _node_rounds("),
    ("return _node_rounds(client,", "return await _node_rounds(client,"),
    ("isinstance(client, CLUSTERS)", "isinstance(client, ASYNC_CLUSTERS)"),
    ("    from redis import Redis\n", "    from redis.asyncio import Redis\n"),
    ("SyncClient", "AsyncClient"),
    ("KeepAlive", "AsyncKeepAlive"),
    ("            with claim.keep_alive():", "            async with claim.keep_alive():"),
    ("result = long_work()", "result = await long_work()"),
    ("            claim.complete(result)\n", "            await claim.complete(result)\n"),
    ("    def _peek(", "    async def _peek("),
    ('__all__ = ["Claim"]', '__all__ = ["AsyncClaim"]'),
    ("class Claim(ClaimBase[", "class AsyncClaim(ClaimBase["),
    ("over a sync redis-py client.", "over an asyncio redis-py client."),
    (
        "client: A ``redis.Redis`` or ``redis.cluster.RedisCluster`` (or valkey-py's\n"
        "            ``valkey.Valkey`` / ``valkey.cluster.ValkeyCluster``)",
        "client: A ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster`` (or\n"
        "            valkey-py's ``valkey.asyncio.Valkey`` / ``valkey.asyncio.cluster.ValkeyCluster``)",
    ),
    ('claim = Claim(redis.Redis(), "evt88"', 'claim = AsyncClaim(redis.asyncio.Redis(), "evt88"'),
    ("match claim.acquire():", "match await claim.acquire():"),
    ("claim.complete(charge_card())", "await claim.complete(await charge_card())"),
    ("reply(claim.wait(timeout=10).value)", "reply((await claim.wait(timeout=10)).value)"),
    (") -> Claim:", ") -> AsyncClaim:"),
    ("    def acquire(", "    async def acquire("),
    ("    def complete(", "    async def complete("),
    ("    def extend(", "    async def extend("),
    ("    def release(", "    async def release("),
    ("    def wait(", "    async def wait("),
    ("    def _call(", "    async def _call("),
    ("def _prepare(", "async def _prepare("),
    ("def _send(", "async def _send("),
    ("return _send(client,", "return await _send(client,"),
    (
        "    return send_direct(pool, command, meanwhile, sends)",
        "    return await send_direct_async(pool, command, meanwhile, sends)",
    ),
    ("    def _acquire(", "    async def _acquire("),
    ("    def _complete(", "    async def _complete("),
    ("return self._acquire(None)", "return await self._acquire(None)"),
    ("        self._complete(value, None)", "        await self._complete(value, None)"),
    ("    send_direct,\n", "    send_direct_async,\n"),
    ("    send_direct_many,\n", "    send_direct_many_async,\n"),
    ("return send_direct_many(pool, commands, sends)", "return await send_direct_many_async(pool, commands, sends)"),
    (
        "from .._clients.errors import failed, is_reshaping, raised_by_client, translate\n",
        "from .._clients.errors import failed_async, is_reshaping, raised_by_client, translate\n",
    ),
    ("raise failed(client,", "raise await failed_async(client,"),
    ("error = failed(client,", "error = await failed_async(client,"),
    ("    to_the_end,\n", "    to_the_end_async,\n"),
    ("    def _give_back(", "    async def _give_back("),
    ("            to_the_end(self.release())", "            await to_the_end_async(self.release())"),
    ("            self._give_back()", "            await self._give_back()"),
    ("                handle._give_back()", "                await handle._give_back()"),
    ("self._call(", "await self._call("),
    ("outcome = self._acquire(None)", "outcome = await self._acquire(None)"),
    ("_prepare(client, state)\n", "await _prepare(client, state)\n"),
    ("return client.", "return await client."),
    ("with state.sync_lock:", "async with state.async_lock:"),
    (
        "            state.native = native_from_command_table(",
        "            await client.initialize()  # loads the command table on first use\n"
        "            state.native = native_from_command_table(",
    ),
    (" client.script_load(script.source)\n", " await client.script_load(script.source)\n"),
    ("replies = pipe.execute(", "replies = await pipe.execute("),
    ("replies: list[object] = pipe.execute(", "replies: list[object] = await pipe.execute("),
    ("def _announcing(", "async def _announcing("),
    ("return _announcing(client,", "return await _announcing(client,"),
    ("import threading\n", ""),
    ("from .wakeup import wake_kind, wakeups\n", "from .wakeup import async_wakeups, wake_kind\n"),
    ("subscriber = wakeups(self._client)", "subscriber = async_wakeups(self._client)"),
    ("subscriber.unwatch(self.claim_key, woken)", "await subscriber.unwatch(self.claim_key, woken)"),
    ("                _sleep(woken, delay)\n", "                await _sleep(woken, delay)\n"),
    (
        "def _sleep(woken: threading.Event | None, delay: float) -> None:\n"
        '    """Sleep ``delay`` seconds, or until ``woken`` is set."""\n'
        "    if woken is None:\n"
        "        time.sleep(delay)\n"
        "    else:\n"
        "        woken.wait(delay)\n",
        "async def _sleep(woken: asyncio.Event | None, delay: float) -> None:\n"
        '    """Sleep ``delay`` seconds, or until ``woken`` is set.\n'
        "\n"
        "    ``asyncio.wait``, not ``wait_for``: before Python 3.12 a ``wait_for`` whose inner\n"
        "    wait finishes just as the caller is cancelled returns, and the cancellation is lost.\n"
        '    """\n'
        "    if woken is None:\n"
        "        await asyncio.sleep(delay)\n"
        "    else:\n"
        "        waiter = asyncio.ensure_future(woken.wait())\n"
        "        try:\n"
        "            await asyncio.wait((waiter,), timeout=delay)\n"
        "        finally:\n"
        "            waiter.cancel()\n",
    ),
    ("    def acquire_many(", "    async def acquire_many("),
    ("def _pipelined(", "async def _pipelined("),
    ("def _round(", "async def _round("),
    ("= _round(client,", "= await _round(client,"),
    ("= _pipelined(client,", "= await _pipelined(client,"),
    ("in zip(nils, _pipelined(client,", "in zip(nils, await _pipelined(client,"),
    ("list[tuple[Claim, Claimed", "list[tuple[AsyncClaim, Claimed"),
    ("    handle: Claim, reply: object,", "    handle: AsyncClaim, reply: object,"),
    (
        "            for claim, outcome in Claim.acquire_many(client,",
        "            for claim, outcome in await AsyncClaim.acquire_many(client,",
    ),
    (
        "                    claim.complete(handle(claim.key))",
        "                    await claim.complete(await handle(claim.key))",
    ),
    ("    def release_many(", "    async def release_many("),
    ("handles: Iterable[Claim]) -> list[bool]:", "handles: Iterable[AsyncClaim]) -> list[bool]:"),
    ("    def forget(", "    async def forget("),
    ("    def _call_and_wait(", "    async def _call_and_wait("),
    ("reply = self._peek()", "reply = await self._peek()"),
    ("self._call_and_wait(", "await self._call_and_wait("),
]


# (sync text, async text) for the decorator's flow: each must occur in _decorator/sync.py.
FLOW: list[tuple[str, str]] = [
    (
        '"""The I/O flow of ``@idempotent`` on a ``def``, over ``Claim``.\n\n'
        "The source of ``_decorator/aio.py`` (``tools/gen_async.py`` makes it).\n",
        '"""The I/O flow of ``@idempotent`` on an ``async def``, over ``AsyncClaim``.\n\n'
        "The mirror of ``_decorator/sync.py``, which it is generated from.\n",
    ),
    ("import contextlib\n", "import asyncio\nimport contextlib\n"),
    ("from .._drivers.sync import Claim\n", "from .._drivers.aio import AsyncClaim\n"),
    ("KeepAlive", "AsyncKeepAlive"),
    ("claim: Claim", "claim: AsyncClaim"),
    ("spec.handle(Claim, call)", "spec.handle(AsyncClaim, call)"),
    ("def call(", "async def call("),
    ("def _flow(", "async def _flow("),
    ("return _flow(", "return await _flow("),
    ("def _finish(", "async def _finish("),
    ("def store(", "async def store("),
    ("def _keep_error(", "async def _keep_error("),
    ("        claim.complete(spec.codec", "        await claim.complete(spec.codec"),
    ("def _release_quietly(", "async def _release_quietly("),
    ("outcome = claim._acquire(", "outcome = await claim._acquire("),
    ("outcome = claim.wait(", "outcome = await claim.wait("),
    ("_release_quietly(claim)\n", "await _release_quietly(claim)\n"),
    ("result = spec.func(*args, **kwargs)", "result = await spec.func(*args, **kwargs)"),
    ("        store(spec, claim, call,", "        await store(spec, claim, call,"),
    ("    store(spec, claim, call, payload", "    await store(spec, claim, call, payload"),
    ("claim._complete(payload,", "await claim._complete(payload,"),
    ("time.sleep(delay)", "await asyncio.sleep(delay)"),
    ("from .._clients.transport import to_the_end\n", "from .._clients.transport import to_the_end_async\n"),
    ("to_the_end(", "await to_the_end_async("),
]

# (source, target, replacements)
JOBS = [
    ("_drivers/sync.py", "_drivers/aio.py", DRIVER),
    ("_decorator/sync.py", "_decorator/aio.py", FLOW),
]


def generate(source: str, replacements: list[tuple[str, str]]) -> str:
    """The text the twin of ``source`` must have."""
    text = (PACKAGE / source).read_text("utf-8")
    for old, new in replacements:
        if old not in text:
            raise SystemExit(f"gen_async: {old!r} no longer occurs in {source}; update its replacements")
        text = text.replace(old, new)
    return f"# Generated from {source} by tools/gen_async.py: edit {source}, then run that script.\n" + text


def main(argv: list[str]) -> int:
    """Write the asyncio twins, or with ``--check`` report whether they are current."""
    stale = 0
    for source, target, replacements in JOBS:
        text = generate(source, replacements)
        path = PACKAGE / target
        if "--check" in argv:
            if path.read_text("utf-8") != text:
                print(f"{target} is stale: run python tools/gen_async.py", file=sys.stderr)
                stale = 1
        else:
            path.write_text(text, "utf-8")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
