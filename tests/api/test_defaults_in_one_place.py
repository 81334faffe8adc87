"""Every default of an option lives in ``goblin_claim/_defaults.py``: no option elsewhere defaults to a number.

A default written beside a signature drifts from its twin (``Claim.wait``'s, the decorator's and the
job doors' ``wait`` were three literals once): the package's signatures and option classes name the
constant instead. ``_clients`` is left out: its adapters mirror redis-py's own signatures.
"""

from __future__ import annotations

import ast
import pathlib

import goblin_claim

PACKAGE = pathlib.Path(goblin_claim.__file__).parent
# The public options that take a number (the handle's, the decorator's, the doors').
OPTIONS = frozenset({
    "lease", "ttl", "wait", "timeout", "replicas", "replica_timeout_ms", "max_body_bytes", "max_response_bytes",
})  # fmt: skip


def _is_number(node: ast.expr) -> bool:
    """A literal number, or arithmetic of them (``1024 * 1024``, ``-1``); a bool is not one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return isinstance(node, ast.UnaryOp) and _is_number(node.operand)


def _literal_defaults(tree: ast.Module) -> list[tuple[int, str, str]]:
    """Each ``(line, option, default)`` of ``tree`` whose option defaults to a number in place."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            pairs = list(zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is not None]
            found += [(d.lineno, a.arg, ast.unparse(d)) for a, d in pairs if a.arg in OPTIONS and _is_number(d)]
        elif isinstance(node, ast.ClassDef):
            for field in node.body:
                if (
                    isinstance(field, ast.AnnAssign)
                    and isinstance(field.target, ast.Name)
                    and field.target.id in OPTIONS
                    and field.value is not None
                    and _is_number(field.value)
                ):
                    found.append((field.lineno, field.target.id, ast.unparse(field.value)))
    return found


def test_no_option_defaults_to_a_number_outside_the_defaults_module() -> None:
    """Signatures and option classes name ``_defaults``' constants; the scan itself finds a planted literal."""
    planted = ast.parse("def f(lease=30, *, wait: float = 10.0, ok=True): ...\nclass O:\n    ttl: int = 60 * 60\n")
    assert [option for _, option, _ in _literal_defaults(planted)] == ["lease", "wait", "ttl"]

    literals = [
        f"{path.relative_to(PACKAGE)}:{line}: {option}={default}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_defaults.py" and "_clients" not in path.parts
        for line, option, default in _literal_defaults(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert literals == []
