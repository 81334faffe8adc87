"""The package's layout holds: each layer imports only what is under it, and no import closes a circle.

Read from the source with ``ast``, so what is checked is every import written down:
those at module level, inside ``try`` and ``if TYPE_CHECKING:`` blocks and inside
functions alike.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import goblin_claim

PACKAGE = Path(goblin_claim.__file__).parent
CLIENT_LIBRARIES = frozenset({"redis", "valkey", "glide", "glide_sync"})
DOORS = frozenset({"asgi", "wsgi", "django", "flask", "celery", "rq", "dramatiq", "arq", "otel"})
# What a door may take from another door (its own framework's adapter of the same rules): none.
PACKAGES = ("_protocol", "_clients", "_drivers", "_decorator", "_http", "_cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, lazy: bool = True) -> set[str]:
    """Every module ``path`` imports, absolute.

    ``lazy=False`` leaves out imports inside functions; those under ``if TYPE_CHECKING:``
    always count.
    """
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if (lazy or not inner) and isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif (lazy or not inner) and isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - (child.level - 1)]
                    module = ".".join([*base, child.module] if child.module else base)
                else:
                    module = child.module or ""
                found.add(module)
                # "from . import x": x may be a module
                found.update(f"{module}.{alias.name}" for alias in child.names if _is_module(f"{module}.{alias.name}"))
            visit(child, inner)

    visit(ast.parse(path.read_text("utf-8")), False)
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


@pytest.mark.parametrize("module", [name for name in MODULES if name.startswith("goblin_claim._protocol")])
def test_the_protocol_imports_no_client_library_and_nothing_above_it(module: str) -> None:
    """``_protocol`` is plain values: no redis, valkey or GLIDE, and of ours only the errors and outcomes."""
    imported = _imports(MODULES[module])
    assert not {name for name in imported if name.split(".")[0] in CLIENT_LIBRARIES}
    assert _ours(imported) <= {"_errors", "_outcomes", "_defaults"} | {
        name for name in _ours(imported) if name.startswith("_protocol")
    }


@pytest.mark.parametrize("module", ["goblin_claim._errors", "goblin_claim._outcomes", "goblin_claim._defaults"])
def test_the_values_import_nothing_of_ours_and_no_client(module: str) -> None:
    """The errors, the outcomes and the defaults stand alone."""
    imported = _imports(MODULES[module])
    assert not _ours(imported)
    assert not {name for name in imported if name.split(".")[0] in CLIENT_LIBRARIES}


def test_the_handle_makes_no_client_call_and_the_clients_import_no_driver() -> None:
    """``_handle`` sits on ``_protocol`` and ``_clients``; ``_clients`` imports no driver, decorator, door or CLI."""
    above_clients = ("_drivers", "_decorator", "_http", "_jobs", "_cli", "_handle", *DOORS)
    for name, path in MODULES.items():
        if name.startswith("goblin_claim._clients"):
            assert not {m for m in _ours(_imports(path)) if m.split(".")[0] in above_clients}, name
    handle = _ours(_imports(MODULES["goblin_claim._handle"]))
    assert {m.split(".")[0] for m in handle} <= {"_protocol", "_clients", "_errors", "_outcomes", "_defaults"}


def test_the_drivers_import_no_decorator_door_or_cli() -> None:
    """``Claim``, ``AsyncClaim`` and the HTTP claim paths know nothing of what is built on them."""
    for name, path in MODULES.items():
        if name.startswith("goblin_claim._drivers"):
            above = {m for m in _ours(_imports(path)) if m.split(".")[0] in ("_decorator", "_jobs", "_cli", *DOORS)}
            assert not above, name


@pytest.mark.parametrize("door", sorted(DOORS))
def test_no_door_imports_another_door(door: str) -> None:
    """A door is its framework's adapter of the shared rules (``_http``, ``_jobs``): never of another door."""
    imported = _ours(_imports(MODULES[f"goblin_claim.{door}"]))
    assert not imported & DOORS, imported & DOORS


def test_no_import_closes_a_circle() -> None:
    """The import graph of the package, ``TYPE_CHECKING`` blocks included, has no cycle."""
    graph = {
        name.removeprefix("goblin_claim."): {m for m in _ours(_imports(path, lazy=False)) if m != name}
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


def test_the_keep_alives_import_no_handle_even_for_the_type_checker() -> None:
    """The keep-alives name the handles they renew by what those have (protocols), so no circle needs a pass."""
    assert not {"_drivers.sync", "_drivers.aio"} & _ours(_imports(MODULES["goblin_claim._drivers.keepalive"]))
