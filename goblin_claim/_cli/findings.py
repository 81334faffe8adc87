"""What ``doctor`` reports: a finding, its level and what to do, and how findings are printed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from .._errors import GoblinClaimError

# "warning": worth changing, but nothing goblin-claim promises is at risk (exit status 0).
Level = Literal["ok", "note", "warning", "problem"]


@dataclass(frozen=True)
class Finding:
    """One thing ``doctor`` found: how it stands, what it is, and what to do about it."""

    level: Level
    what: str
    todo: str = ""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _expect(outcome: object, kind: type) -> None:
    if not isinstance(outcome, kind):
        raise GoblinClaimError(f"expected {kind.__name__}, got {outcome!r}")


def _print_findings(findings: Sequence[Finding], out: TextIO) -> None:
    labels = {"ok": "ok", "note": "note", "warning": "WARNING", "problem": "PROBLEM"}
    for finding in findings:
        print(f"  {labels[finding.level]:<8} {finding.what}", file=out)
        if finding.todo and finding.level != "ok":
            print(f"  {'':<8} -> {finding.todo}", file=out)
    problems = sum(finding.level == "problem" for finding in findings)
    warnings = sum(finding.level == "warning" for finding in findings)
    summary = f"{problems} problem{'s' if problems != 1 else ''}" if problems else "no problems"
    if warnings:
        summary += f", {warnings} warning{'s' if warnings != 1 else ''}"
    print(summary, file=out)
