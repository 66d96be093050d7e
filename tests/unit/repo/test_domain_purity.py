"""The domain is pure: no Google library, no I/O, no clock reads.

Every module under shared/tpujobs/domain is parsed, not imported, so the check holds
even for code paths no other test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tpujobs.domain

DOMAIN = Path(tpujobs.domain.__file__).resolve().parent
MODULES = sorted(DOMAIN.rglob("*.py"))

FORBIDDEN_IMPORTS = frozenset(
    {
        "google",
        "functions_framework",
        "requests",
        "grpc",
        "socket",
        "os",
        "subprocess",
        "time",
        "random",
    }
)
CLOCK_READS = frozenset({"now", "utcnow", "today"})


def module_id(path: Path) -> str:
    return str(path.relative_to(DOMAIN))


def imported_roots(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every import statement, relative imports resolved to tpujobs."""
    roots: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            root = "tpujobs" if node.level else (node.module or "").split(".")[0]
            roots.append((node.lineno, root))
    return roots


def dynamic_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of __import__('x') and importlib.import_module('x') calls."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in {"__import__", "import_module"}:
            first = node.args[0]
            module = first.value if isinstance(first, ast.Constant) else "<dynamic>"
            found.append((node.lineno, str(module)))
    return found


def clock_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of every `X.now()`, `X.utcnow()` and `X.today()`, whatever X is named."""
    return [
        (node.lineno, ast.unparse(node.func))
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_READS
    ]


def test_the_domain_package_has_modules_to_check() -> None:
    """The scan is not vacuous: the modules the design names are all there."""
    names = {path.name for path in MODULES}
    expected = {
        "accelerators.py",
        "spec.py",
        "states.py",
        "job.py",
        "transitions.py",
        "restart_rules.py",
        "naming.py",
    }
    assert expected <= names


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_a_domain_module_imports_nothing_impure(path: Path) -> None:
    """No google.*, functions_framework, requests, grpc, socket, os, subprocess, time or random."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [(line, root) for line, root in imported_roots(tree) if root in FORBIDDEN_IMPORTS]
    assert bad == []


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_a_domain_module_imports_nothing_dynamically(path: Path) -> None:
    """No __import__ or importlib.import_module that would slip past the static check."""
    assert dynamic_imports(ast.parse(path.read_text(), filename=str(path))) == []


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_a_domain_module_reads_no_clock(path: Path) -> None:
    """Time comes in as an argument: no datetime.now, utcnow or today."""
    assert clock_reads(ast.parse(path.read_text(), filename=str(path))) == []


@pytest.mark.parametrize("path", MODULES, ids=module_id)
def test_a_domain_module_imports_only_the_domain_from_tpujobs(path: Path) -> None:
    """The domain depends on nothing else in the package (ports, adapters, service) but the agent's contracts
    (the wire, and the progress protocol jobs print)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    outside = [
        (node.lineno, node.module)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 0
        and (node.module or "").startswith("tpujobs")
        and not (node.module or "").startswith("tpujobs.domain")
        and node.module not in ("tpujobs.agent.wire", "tpujobs.agent.progress")  # contracts: standard library, pure
    ]
    assert outside == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The scanners themselves find an impure import, a dynamic import and a clock read."""
    tree = ast.parse(
        "import os.path\n"
        "from google.cloud import firestore\n"
        "from datetime import datetime as dt\n"
        "x = dt.now()\n"
        "y = __import__('socket')\n"
    )
    assert {root for _, root in imported_roots(tree)} >= {"os", "google"}
    assert clock_reads(tree) == [(4, "dt.now")]
    assert dynamic_imports(tree) == [(5, "socket")]
