"""No module reaches into another's private names: what crosses a module boundary is public.

Every Python file of the package, the functions, the tests, the benchmarks and the tools is
parsed, not imported, so the check holds for code paths no other test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted(
    path
    for folder in ("shared/tpujobs", "functions", "tests", "bench", "tools")
    for path in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in path.parts
)


def private_imports(tree: ast.AST) -> list[str]:
    """`from tpujobs... import _name` of `tree`, as `line: module._name` (dunders are public)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tpujobs":
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.endswith("__"):
                    found.append(f"{node.lineno}: {node.module}.{alias.name}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_file_imports_a_private_name_of_tpujobs(path: Path):
    """A `_name` of another module is its own business: make it public, or do not use it."""
    assert private_imports(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_check_sees_a_private_import():
    """The scan is not vacuous: it reports `from tpujobs.cli import _settings`, not `__version__`."""
    tree = ast.parse("from tpujobs.cli import _settings\nfrom tpujobs import __version__\n")
    assert private_imports(tree) == ["1: tpujobs.cli._settings"]
