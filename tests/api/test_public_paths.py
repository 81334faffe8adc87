"""Guards of the public paths: what users import, the console script, the logger names.

The package's inside may be laid out again; these are what code outside it calls, so
each is pinned here. A change to any of them is a change users see: it goes in the
CHANGELOG, and this file changes with it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import typing
from importlib import metadata
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "goblin_claim"

# Every public module and its __all__, as released.
PUBLIC: dict[str, tuple[str, ...]] = {
    "goblin_claim": (
        "AsyncClaim", "Claim", "ClaimLostError", "Claimed", "Completed", "ConnectionFailedError",
        "GoblinClaimError", "InFlight", "InterruptedWorkError", "InvalidArgumentError", "InvalidArgumentTypeError",
        "NativeUnavailableError", "NoCurrentClaimError", "NotReplicatedError", "Outcome", "PayloadMismatchError",
        "ReplayedError", "ResultLostError", "ResultNotSerializableError", "ServerError", "ServerUnavailableError",
        "StillInFlightError", "UnreadableResultError", "WrongTypeError", "add_listener", "current_claim",
        "idempotent", "remove_listener",
    ),
    "goblin_claim.asgi": (
        "DEFAULT_NEVER_REPLAYED", "DEFAULT_RELEASE_STATUSES", "DEFAULT_REPLAY_HEADERS", "DEFAULT_STREAM_TYPES",
        "ASGIApp", "AbandonedRequest", "IdempotencyMiddleware", "KeyRule", "Message", "Receive", "Scope", "Send",
        "StoredResponse", "UnstoredResponse", "idempotency_key",
    ),
    "goblin_claim.wsgi": (
        "DEFAULT_RELEASE_STATUSES", "DEFAULT_REPLAY_HEADERS", "IdempotencyMiddleware", "StartResponse", "WSGIApp",
    ),
    "goblin_claim.django": (
        "CLIENT_SETTING", "SETTING", "GoblinClaimConfig", "IdempotencyMiddleware", "async_client",
        "check_middleware_order", "client", "idempotency_key", "idempotent_view", "problem_response",
    ),
    "goblin_claim.flask": ("Idempotency", "idempotency_key"),
    "goblin_claim.aiohttp": ("IdempotencyMiddleware", "idempotency_key"),
    "goblin_claim.celery": ("IdempotentTask",),
    "goblin_claim.rq": ("enqueue_once", "idempotent_job"),
    "goblin_claim.dramatiq": ("Idempotency",),
    "goblin_claim.arq": ("idempotent_job",),
    "goblin_claim.faststream": ("idempotent_handler",),
    "goblin_claim.taskiq": ("idempotent_task",),
    "goblin_claim.huey": ("idempotent_task",),
    "goblin_claim.otel": ("instrument", "uninstrument"),
    "goblin_claim.testing": ("fake_async_redis", "fake_async_valkey", "fake_redis", "fake_valkey"),
}  # fmt: skip

# The loggers users configure, by name (one per concern; the HTTP doors' by door).
LOGGERS = {
    "goblin_claim.arq",
    "goblin_claim.asgi",
    "goblin_claim.celery",
    "goblin_claim.claim",
    "goblin_claim.dramatiq",
    "goblin_claim.events",
    "goblin_claim.faststream",
    "goblin_claim.huey",
    "goblin_claim.idempotent",
    "goblin_claim.keepalive",
    "goblin_claim.rq",
    "goblin_claim.server",
    "goblin_claim.taskiq",
    "goblin_claim.wakeup",
    "goblin_claim.wsgi",
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_path_keeps_its_names(module: str) -> None:
    """Each public module imports, its ``__all__`` is what was released, and every name in it resolves."""
    imported = importlib.import_module(module)
    assert tuple(imported.__all__) == PUBLIC[module]
    for name in imported.__all__:
        assert getattr(imported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_classes_are_named_where_users_import_them(module: str) -> None:
    """A public class's ``__module__`` and ``repr`` show the path users import, not a private module.

    Names a door re-exports from the shared HTTP rules (``idempotency_key`` and the response
    models) are shown under the first door that exports them, ``goblin_claim.asgi``.
    """
    imported = importlib.import_module(module)
    for name in imported.__all__:
        public = getattr(imported, name)
        if not inspect.isclass(public) or typing.get_origin(public) is not None:
            # A constant or a type alias (Scope, KeyRule, Outcome) has no module of its own. A
            # subscripted alias is told by its origin: before 3.11 it passes for a class, naming
            # its origin's module (ASGIApp, a Callable[...], says collections.abc).
            continue
        home = next(m for m in PUBLIC if getattr(importlib.import_module(m), name, None) is public)
        assert public.__module__ == home, f"{module}.{name} says {public.__module__}"
        assert repr(public) == f"<class '{home}.{name}'>"


def test_public_functions_of_the_root_are_named_after_it() -> None:
    """``help(goblin_claim.idempotent)`` and tracebacks name ``goblin_claim``, not its private module."""
    import goblin_claim

    for name in ("idempotent", "add_listener", "remove_listener"):
        assert getattr(goblin_claim, name).__module__ == "goblin_claim"


def test_the_console_script_runs() -> None:
    """``goblin-claim`` is installed as a console script pointing at the CLI, and answers ``--help``."""
    (script,) = (ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "goblin-claim")
    assert callable(script.load())
    runs = f"import sys; from {script.module} import {script.attr}; sys.exit({script.attr}())"
    done = subprocess.run(
        [sys.executable, "-c", runs, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "doctor" in done.stdout
    assert "scan" in done.stdout


def test_the_logger_names_are_the_released_ones() -> None:
    """Every ``logging.getLogger`` name in the package is one of the released names (or a door's by name)."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger" and node.args:
                (arg,) = node.args
                if isinstance(arg, ast.Constant):
                    found.add(arg.value)
                else:  # the HTTP doors' shared rules log under the door's own logger
                    assert isinstance(arg, ast.JoinedStr), path
                    assert ast.unparse(arg) == "f'goblin_claim.{door}'", path
    assert found == LOGGERS
