"""Every check `make test` runs before pytest fails on the fault it exists for.

A check is only as good as the fault it has been seen to catch: `mkdocs build --strict --quiet`
passed broken anchors for months, because --quiet drops the warnings strict mode counts. Each test
here takes the check's command line from the Makefile as it stands, runs the real tool with the
project's own configuration (pyproject.toml, mkdocs.yml) on a small planted copy, and sees it fail
with the tool's own message; the same copy without the fault passes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
# The project's configuration files, whichever of them exist: each tool finds its own in the
# directory it runs in, as it does at the root of the repository.
CONFIGS = ("pyproject.toml", ".importlinter", "setup.cfg", "mypy.ini", ".mypy.ini", "ruff.toml", ".ruff.toml")


def recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, in order."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def make_command(target: str, tool: str) -> tuple[dict[str, str], list[str]]:
    """The environment and arguments of the line of `target` that runs `tool` (e.g. "ruff format"),
    with `$(BIN)` this interpreter's bin directory and the repository paths it checks left off."""
    for line in recipe(target):
        words = shlex.split(line.replace("$(BIN)", str(BIN)))
        env = {}
        while words and "=" in words[0] and not words[0].startswith("-"):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        program, *args = words
        subcommands = tool.split()[1:]
        if [Path(program).name, *args[: len(subcommands)]] == tool.split():
            rest = args[len(subcommands) :]
            return env, [program, *subcommands, *(arg for arg in rest if not (ROOT / arg).is_dir())]
    raise AssertionError(f"`make {target}` has no line that runs {tool}")


def run_check(target: str, tool: str, where: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env, argv = make_command(target, tool)
    environment = {**os.environ, **env, "PYTHONPATH": str(where / "shared"), "NO_COLOR": "1"}
    return subprocess.run(
        [*argv, *extra], cwd=where, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding the project's configuration files and nothing else."""
    for name in CONFIGS:
        if (ROOT / name).is_file():
            shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_make_test_runs_the_lint_and_docs_checks() -> None:
    """The checks below are the ones `make test` runs before pytest: if the targets part, this says so."""
    prerequisites = (ROOT / "Makefile").read_text(encoding="utf-8").split("\ntest:", 1)[1].split("\n", 1)[0].split()
    assert {"lint", "docs"} <= set(prerequisites)


def test_make_docs_fails_on_a_link_to_an_anchor_that_does_not_exist(tmp_path: Path) -> None:
    """`make docs` on a two-page site with the project's mkdocs.yml (INHERIT): a link to a heading
    that is not there fails the build, and shows which; the right anchor builds."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nsite_dir: site\nnav:\n  - index.md\n  - other.md\n",
        encoding="utf-8",
    )
    (docs / "other.md").write_text("# Other\n\n## A section\n\nText.\n", encoding="utf-8")

    (docs / "index.md").write_text("# Home\n\nSee [a section](other.md#a-section).\n", encoding="utf-8")
    clean = run_check("docs", "mkdocs build", tmp_path)
    assert clean.returncode == 0, output(clean)

    (docs / "index.md").write_text("# Home\n\nSee [a section](other.md#no-such-section).\n", encoding="utf-8")
    broken = run_check("docs", "mkdocs build", tmp_path)
    assert broken.returncode != 0
    assert "does not contain an anchor '#no-such-section'" in output(broken)


def test_lint_imports_fails_on_a_layer_violation(project: Path) -> None:
    """import-linter with the project's contracts on a copy of the package: the copy keeps them,
    and one domain module importing the CLI breaks the layers contract."""
    shutil.copytree(
        ROOT / "shared" / "tpujobs", project / "shared" / "tpujobs", ignore=shutil.ignore_patterns("__pycache__")
    )
    clean = run_check("lint", "lint-imports", project)
    assert clean.returncode == 0, output(clean)

    (project / "shared" / "tpujobs" / "domain" / "planted.py").write_text("from tpujobs.cli import app\n")
    broken = run_check("lint", "lint-imports", project)
    assert broken.returncode != 0
    assert "BROKEN" in output(broken)
    assert "tpujobs.domain.planted -> tpujobs.cli" in output(broken)


def test_mypy_fails_on_a_type_error_in_the_domain(project: Path) -> None:
    """mypy with the project's settings on a planted domain module: a wrong return type fails, and so
    does an unannotated function (the domain is strict); the typed module passes."""
    domain = project / "shared" / "tpujobs" / "domain"
    domain.mkdir(parents=True)
    (domain.parent / "__init__.py").write_text("")
    (domain / "__init__.py").write_text("")
    planted = domain / "planted.py"

    planted.write_text("def label(count: int) -> str:\n    return str(count)\n")
    clean = run_check("lint", "mypy", project, "shared/tpujobs/domain/planted.py")
    assert clean.returncode == 0, output(clean)

    planted.write_text("def label(count: int) -> str:\n    return count\n\n\ndef untyped(value):\n    return value\n")
    broken = run_check("lint", "mypy", project, "shared/tpujobs/domain/planted.py")
    assert broken.returncode != 0
    assert 'Incompatible return value type (got "int", expected "str")  [return-value]' in output(broken)
    assert "[no-untyped-def]" in output(broken)


# Inside the project's line length (120), past ruff's default (88): the clean file passes only under
# the project's own settings.
LONG_CALL = (
    'print("a call wider than ruff\'s default line length of 88 columns", "and narrower than the project\'s 120")\n'
)


def test_ruff_format_check_fails_on_unformatted_code(project: Path) -> None:
    """`ruff format --check` with the project's settings: code it would change fails, naming the file."""
    assert 88 < len(LONG_CALL.rstrip()) <= 120
    planted = project / "planted.py"
    planted.write_text(LONG_CALL)
    clean = run_check("lint", "ruff format", project, "planted.py")
    assert clean.returncode == 0, output(clean)

    planted.write_text("values = {  'a':1 }\n")
    broken = run_check("lint", "ruff format", project, "planted.py")
    assert broken.returncode != 0
    assert "planted.py" in output(broken)
    assert "would be reformatted" in output(broken) or "Would reformat" in output(broken)  # ruff's words vary


def test_ruff_check_fails_on_a_lint_error(project: Path) -> None:
    """`ruff check` with the project's rules: an unused import (F401) and unsorted imports (I001,
    a rule the project selects beyond ruff's defaults) fail; the clean file passes."""
    planted = project / "planted.py"
    planted.write_text(f"import os\n\n{LONG_CALL}print(os.sep)\n")
    clean = run_check("lint", "ruff check", project, "planted.py")
    assert clean.returncode == 0, output(clean)

    planted.write_text("import sys\nimport os\n\nprint(sys.argv)\n")
    broken = run_check("lint", "ruff check", project, "planted.py")
    assert broken.returncode != 0
    assert "F401" in output(broken)
    assert "I001" in output(broken)
