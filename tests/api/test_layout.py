"""The package's layout holds: the layers contract is kept, ARCHITECTURE.md draws it, and no import closes a circle.

The layers themselves are ``pyproject.toml``'s ``[tool.importlinter]`` contracts, which
``lint-imports`` checks (``make lint``) and the first test here runs too. The circle check
reads the source with ``ast``, so what is checked is every import written down: those at
module level, inside ``try`` and ``if TYPE_CHECKING:`` blocks and inside functions alike.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import goblin_claim

PACKAGE = Path(goblin_claim.__file__).parent
# What a door may take from another door (its own framework's adapter of the same rules): none.
PACKAGES = ("_protocol", "_clients", "_drivers", "_decorator", "_http", "_cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute: anywhere in the file, inside functions too."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - (child.level - 1)]
                    module = ".".join([*base, child.module] if child.module else base)
                else:
                    module = child.module or ""
                found.add(module)
                # "from . import x": x may be a module
                found.update(f"{module}.{alias.name}" for alias in child.names if _is_module(f"{module}.{alias.name}"))
            visit(child)

    visit(ast.parse(path.read_text("utf-8")))
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _ours(imported: set[str]) -> set[str]:
    return {name.removeprefix("goblin_claim.") for name in imported if name.startswith("goblin_claim.")}


def test_every_package_says_what_lives_there_and_what_it_may_import() -> None:
    """Each package's docstring is one line: what lives there (and, for the layers, what it may import)."""
    for package in PACKAGES:
        doc = importlib.import_module(f"goblin_claim.{package}").__doc__
        assert doc, package
        assert "\n" not in doc.strip(), package


ROOT = PACKAGE.parent


def _contract_layers() -> list[list[str]]:
    """The layers contract's layers, top to bottom, each a list of its modules."""
    # Read as text (tomllib is 3.11's): the one "layers = [...]" list of the file.
    (block,) = re.findall(r"^layers = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text("utf-8"), re.M | re.S)
    return [[name.strip() for name in layer.split("|")] for layer in re.findall(r'"([^"]+)"', block)]


def test_the_import_contracts_are_kept() -> None:
    """``lint-imports``: every import written down keeps the layers, and the frameworks stay in their doors.

    In a process of its own: import-linter configures logging as it starts, which
    disables every logger already made in the process that runs it (the package's too).
    """
    command = [
        sys.executable,
        "-c",
        "import sys, importlinter.cli; sys.exit(importlinter.cli.lint_imports(no_cache=True, no_logo=True))",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_module_of_the_package_has_its_layer() -> None:
    """A new top-level module or package fails the suite until the contract (and the page) places it."""
    placed = {name for layer in _contract_layers() for name in layer}
    top_level = {path.stem if path.suffix else path.name for path in PACKAGE.iterdir()}
    top_level = {
        name for name in top_level
        if (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()
    } - {"__init__"}  # fmt: skip
    assert top_level == placed


def test_architecture_md_draws_the_contract() -> None:
    """The page's table has the contract's layers, in its order, with the same modules in each."""
    page = (ROOT / "ARCHITECTURE.md").read_text("utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    drawn = [re.findall(r"`([^`]+)`", row.split("|")[2]) for row in rows]
    assert drawn == _contract_layers()


def test_no_import_closes_a_circle() -> None:
    """The import graph of the package, ``TYPE_CHECKING`` blocks and imports inside functions included, has no cycle."""
    graph = {
        name.removeprefix("goblin_claim."): {m for m in _ours(_imports(path)) if m != name}
        for name, path in MODULES.items()
    }
    graph = {name: {m for m in deps if m in graph and m != name} for name, deps in graph.items()}
    visiting: list[str] = []
    done: set[str] = set()
    cycles: list[list[str]] = []

    def walk(node: str) -> None:
        visiting.append(node)
        for dep in sorted(graph[node]):
            if dep in visiting:
                cycles.append([*visiting[visiting.index(dep) :], dep])
            elif dep not in done:
                walk(dep)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            walk(node)
    assert not cycles, [" -> ".join(cycle) for cycle in cycles]
