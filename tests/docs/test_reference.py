"""The reference pages' generated parts cover what the package has: every public name, command and event."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from goblin_claim import _events
from goblin_claim._cli.main import _parser

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PUBLIC_MODULES = [
    "goblin_claim",
    "goblin_claim.testing",
    "goblin_claim.otel",
    "goblin_claim.asgi",
    "goblin_claim.wsgi",
    "goblin_claim.django",
    "goblin_claim.flask",
    "goblin_claim.aiohttp",
    "goblin_claim.celery",
    "goblin_claim.rq",
    "goblin_claim.dramatiq",
    "goblin_claim.arq",
    "goblin_claim.faststream",
    "goblin_claim.taskiq",
    "goblin_claim.huey",
]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rendered(page: str) -> str:
    return str(_hook().render((REFERENCE / page).read_text("utf-8")))


def test_every_public_module_has_its_names_on_a_reference_page() -> None:
    """Each public module (the package and every door) is on a reference page, one entry per name of its __all__."""
    rendered = "\n".join(_rendered(page) for page in ("api.md", "http-api.md", "jobs-api.md"))
    door_modules = [path.stem for path in (ROOT / "goblin_claim").glob("[a-z]*.py")]
    assert {f"goblin_claim.{name}" for name in door_modules} <= set(PUBLIC_MODULES)
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            assert f"::: {module}.{name}\n" in rendered + "\n", f"{module}.{name}"


def test_the_cli_page_shows_every_commands_help_as_the_parser_prints_it() -> None:
    """The CLI page holds one help text per command of the parser, the one that command prints."""
    hook = _hook()
    rendered = _rendered("cli.md")
    commands = hook.commands(_parser())
    assert list(commands) == ["doctor", "inspect", "forget", "scan", "stats", "namespaces"]
    for command in commands:
        assert hook.help_text(command).rstrip() in rendered, command
    assert hook.help_text(None).rstrip() in rendered
    assert "<!--" not in rendered


def test_the_events_page_lists_every_field_operation_outcome_and_notice() -> None:
    """The events page names each field of an event and each value the package reports."""
    rendered = _rendered("events.md")
    for name in [*_events.Event._fields, *_events.OPERATIONS, *_events.OUTCOMES, *_events.NOTICES]:
        assert f"`{name}`" in rendered, name
    for outcomes in _events.NOTICES.values():
        for outcome in outcomes:
            assert f"`{outcome}`" in rendered, outcome


def test_the_observability_page_names_the_operations_and_outcomes_the_package_reports() -> None:
    """The prose of the observability page names every operation and outcome (it is written by hand)."""
    page = (ROOT / "docs" / "operations" / "observability.md").read_text("utf-8")
    events = page[page.index("## Events") : page.index("## Logs")]
    named = set(re.findall(r"[a-z_]+", events))
    assert set(_events.OPERATIONS) <= named
    assert set(_events.OUTCOMES) <= named
