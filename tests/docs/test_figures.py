"""The figures the README and the pages show are the benchmarks' output, as stored under docs/figures/.

Each file under docs/figures/ is a benchmark's output as printed (its first line says the
command that regenerates it); the capacity page includes the files whole. The README, which
GitHub shows without includes, quotes rows of them: each quoted row must be a row of one of
the files, so a figure is never typed by hand and never outlives a rerun.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"


def _section(text: str, name: str) -> str:
    start = text.index(f"--8<-- [start:{name}]")
    return text[start : text.index(f"--8<-- [end:{name}]")]


def data_rows(text: str) -> list[str]:
    """The data rows of the Markdown tables in ``text``: not a header (the row above a separator), not a separator."""
    lines = text.splitlines()
    separator = re.compile(r"\|(?:-+\|)+")
    return [
        line
        for i, line in enumerate(lines)
        if line.startswith("| ")
        and not separator.fullmatch(line)
        and not (i + 1 < len(lines) and separator.fullmatch(lines[i + 1]))
    ]


def test_every_figure_the_readme_quotes_is_a_row_of_benchmark_output() -> None:
    """Each table row of the README's figures is a row of a stored benchmark output."""
    quoted = data_rows(_section((ROOT / "README.md").read_text("utf-8"), "figures"))
    stored = set("\n".join(path.read_text("utf-8") for path in FIGURES.glob("*.md")).splitlines())
    assert len(quoted) >= 5
    assert [row for row in quoted if row not in stored] == []


def test_each_stored_output_says_how_to_regenerate_it_and_a_page_includes_it() -> None:
    """Each file of figures names the command that made it (a comment, or its first line); a page includes it."""
    pages = "\n".join(path.read_text("utf-8") for path in (ROOT / "docs").rglob("*.md") if FIGURES not in path.parents)
    for path in [*FIGURES.glob("*.md"), *FIGURES.glob("*.txt")]:
        first = path.read_text("utf-8").splitlines()[0]
        if path.suffix == ".md":
            assert first.startswith("<!-- Output of "), path
            assert "regenerate with: python benchmarks/" in first, path
        else:  # a console transcript: the command, then what it printed
            assert first.startswith("$ python benchmarks/"), path
        assert f'--8<-- "docs/figures/{path.name}"' in pages, path
