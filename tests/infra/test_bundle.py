"""`make bundle` builds a deployable function source: the right files, exact pins, reproducible."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from terraform_config import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the bundle itself needs none of this

REQUIREMENTS = ROOT / "functions" / "requirements.txt"


def _pins() -> dict[str, Requirement]:
    lines = [line.strip() for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines()]
    requirements = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(r.name): r for r in requirements}


def _runtime_dependencies() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}


def test_requirements_pin_exactly_every_runtime_dependency_within_its_range() -> None:
    """functions/requirements.txt names each pyproject dependency once, `==` a version its range allows."""
    pins, wanted = _pins(), _runtime_dependencies()
    assert set(pins) == set(wanted), (
        f"pin these: {set(wanted) - set(pins)}; not dependencies: {set(pins) - set(wanted)}"
    )
    for name, pin in pins.items():
        (specifier,) = pin.specifier
        assert specifier.operator == "==", f"{name} is not pinned exactly: {pin}"
        assert wanted[name].specifier.contains(specifier.version), f"{pin} is outside pyproject's {wanted[name]}"


def test_the_tests_ran_on_the_pinned_versions() -> None:
    """`make venv` installs with the pins as constraints: what is tested is what deploys."""
    for name, pin in _pins().items():
        (specifier,) = pin.specifier
        assert importlib.metadata.version(name) == specifier.version, f"{name}: run `make venv` again"


def test_the_bundle_holds_main_the_package_and_the_pins(bundle_dir: Path) -> None:
    """main.py at the root as functions/main.py, every module of the deployed layers, requirements.txt;
    no caches, and nothing of the terminal's or the local stack's code."""
    function = bundle_dir / "function"
    assert (function / "main.py").read_bytes() == (ROOT / "functions" / "main.py").read_bytes()
    assert (function / "requirements.txt").read_bytes() == REQUIREMENTS.read_bytes()
    package = ROOT / "shared" / "tpujobs"
    deployed = ("agent", "domain", "engine", "adapters", "runtime")
    wanted = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts and (p.parent == package or p.relative_to(package).parts[0] in deployed)
    }
    bundled = {p.relative_to(function / "tpujobs").as_posix() for p in (function / "tpujobs").rglob("*.py")}
    assert wanted == bundled
    assert (function / "tpujobs" / "py.typed").exists()
    assert not (function / "tpujobs" / "cli").exists() and not (function / "tpujobs" / "local").exists()
    assert not list(function.rglob("__pycache__")) and not list(function.rglob("*.pyc"))


def test_the_zip_is_the_folder_and_reproducible(bundle_dir: Path, tmp_path: Path) -> None:
    """The zip holds the folder's files; built again it has the same bytes (and the same MD5
    Terraform names the upload by)."""
    archive = bundle_dir / "function.zip"
    files = sorted(
        p.relative_to(bundle_dir / "function").as_posix() for p in (bundle_dir / "function").rglob("*") if p.is_file()
    )
    with zipfile.ZipFile(archive) as bundle:
        assert bundle.namelist() == files
        assert bundle.read("main.py") == (ROOT / "functions" / "main.py").read_bytes()
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bundle.py"), "--out", str(tmp_path)], check=True, capture_output=True
    )
    assert (tmp_path / "function.zip").read_bytes() == archive.read_bytes()


def test_main_imports_from_the_bundle_alone(bundle_dir: Path, deployed_entry_points: dict[str, Any]) -> None:
    """Cloud Functions imports main.py and tpujobs from the bundle, not from a checkout."""
    function = (bundle_dir / "function").resolve()
    assert Path(deployed_entry_points["main"]).resolve().parent == function
    assert Path(deployed_entry_points["tpujobs"]).resolve().parent == function / "tpujobs"
