"""An object is its class and every class of the package it inherits from: splitting a big object
into base classes keeps each class short and the object as big as before. None may pass 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "shared" / "tpujobs"
LIMIT = 400

ClassKey = tuple[str, str]  # (module, class name)


def _classes() -> dict[ClassKey, tuple[int, list[ClassKey]]]:
    """Every class of the package: its lines and the package classes it names as bases."""
    found: dict[ClassKey, tuple[int, list[ClassKey]]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("tpujobs", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported = {
            alias.asname or alias.name: (_absolute(node, package), alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                bases = [base.value if isinstance(base, ast.Subscript) else base for base in node.bases]
                named = [imported.get(b.id, (module, b.id)) for b in bases if isinstance(b, ast.Name)]
                found[(module, node.name)] = (node.end_lineno - node.lineno + 1, named)
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, a relative one (the agent's) resolved."""
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def object_lines(key: ClassKey, classes: dict[ClassKey, tuple[int, list[ClassKey]]]) -> int:
    """The class's lines plus those of every package class it inherits from, each counted once."""
    seen: set[ClassKey] = set()
    pending = [key]
    total = 0
    while pending:
        current = pending.pop()
        if current in seen or current not in classes:
            continue  # a base from outside the package (or counted already)
        seen.add(current)
        lines, bases = classes[current]
        total += lines
        pending.extend(bases)
    return total


def _sizes() -> dict[str, int]:
    classes = _classes()
    return {f"{module}.{name}": object_lines((module, name), classes) for module, name in classes}


def test_no_object_with_its_bases_is_over_400_lines() -> None:
    """Every class together with the package's classes it inherits from fits 400 lines."""
    too_big = sorted(f"{name}: {lines}" for name, lines in _sizes().items() if lines > LIMIT)
    assert too_big == []


def test_bases_in_the_package_are_counted() -> None:
    """A class's object counts the lines of its package bases, theirs included (the check is not vacuous)."""
    classes = {("m", "Base"): (300, []), ("m", "Middle"): (90, [("m", "Base")]), ("m", "Top"): (20, [("m", "Middle")])}
    assert object_lines(("m", "Top"), classes) == 410
    assert object_lines(("m", "Base"), classes) == 300
