"""MkDocs hook: the reference pages' generated parts, made from the code at build time.

A page line is replaced by what the installed package says, so the page never
disagrees with it:

- ``<!-- goblin-claim --help -->`` / ``<!-- goblin-claim COMMAND --help -->``: that
  ``--help`` text, from the CLI's own parser (``goblin_claim._cli.main._parser``), at a
  fixed width;
- ``<!-- api: MODULE -->``: one mkdocstrings entry (``::: MODULE.NAME``) per name of
  ``MODULE.__all__``, in its order;
- ``<!-- events -->``: the event's fields (``goblin_claim._events.Event``) and every
  operation, outcome and notice the package reports.

``tests/docs/test_reference.py`` checks what these make.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Iterable
from typing import Any

HELP = re.compile(r"^<!-- goblin-claim (?:(?P<command>[a-z]+) )?--help -->$", re.MULTILINE)
API = re.compile(r"^<!-- api: (?P<module>[\w.]+) -->$", re.MULTILINE)
EVENTS = re.compile(r"^<!-- events -->$", re.MULTILINE)
WIDTH = "100"


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def help_text(command: str | None) -> str:
    """What ``goblin-claim [COMMAND] --help`` prints, at the page's width."""
    from goblin_claim._cli.main import _parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = _parser()
        return (parser if command is None else commands(parser)[command]).format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def api_entries(module: str) -> str:
    """One mkdocstrings entry per public name of ``module``."""
    names = importlib.import_module(module).__all__
    return "\n\n".join(f"::: {module}.{name}" for name in names)


def events_text() -> str:
    """The event's fields, and the operations, outcomes and notices, as Markdown."""
    from goblin_claim import _events

    doc = _events.Event.__doc__ or ""
    described = dict(re.findall(r"^\s{8}(\w+): (.+)$", doc, flags=re.MULTILINE))
    fields = _events.Event.__annotations__
    rows = [f"| `{field}` | `{fields[field]}` | {described.get(field, '')} |" for field in _events.Event._fields]
    notices = [f"| `{name}` | {codes(outcomes)} |" for name, outcomes in sorted(_events.NOTICES.items())]
    return "\n".join(
        [
            "| field | type | what it holds |",
            "|---|---|---|",
            *rows,
            "",
            f"**Operations** (`event.operation`): {codes(_events.OPERATIONS)}.",
            "",
            f"**Outcomes** (`event.outcome` of an operation): {codes(_events.OUTCOMES)}.",
            "",
            "**Notices** (events about something inside an operation) and their outcomes:",
            "",
            "| notice | outcomes |",
            "|---|---|",
            *notices,
        ]
    )


def codes(names: Iterable[str]) -> str:
    """``names``, sorted, each as code."""
    return ", ".join(f"`{name}`" for name in sorted(names))


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by what it names."""

    def help_block(match: re.Match[str]) -> str:
        command = match.group("command")
        shown = "goblin-claim --help" if command is None else f"goblin-claim {command} --help"
        return f"```console\n$ {shown}\n{help_text(command).rstrip()}\n```"

    markdown = HELP.sub(help_block, markdown)
    markdown = API.sub(lambda m: api_entries(m.group("module")), markdown)
    return EVENTS.sub(lambda m: events_text(), markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill in the generated parts of the pages that ask for them."""
    return render(markdown)
