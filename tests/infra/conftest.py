"""Fixtures of the infra tests: infra/ parsed once, the function bundle built once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from terraform_config import ROOT, Terraform


@pytest.fixture(scope="session")
def tf() -> Terraform:
    return Terraform.load()


@pytest.fixture(scope="session")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/function/ as `make bundle` builds it, in a scratch folder."""
    out = tmp_path_factory.mktemp("bundle")
    subprocess.run([sys.executable, str(ROOT / "tools" / "bundle.py"), "--out", str(out)], check=True)
    return out


@pytest.fixture(scope="session")
def deployed_entry_points(bundle_dir: Path) -> dict[str, Any]:
    """What Cloud Functions will load: `main` imported from the bundle alone, in a fresh
    interpreter, with where `main` and `tpujobs` came from and each target's signature type."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import main, tpujobs; "
        "from functions_framework import _function_registry as r; "
        "print(json.dumps({'main': main.__file__, 'tpujobs': tpujobs.__file__, "
        "'registry': dict(r.REGISTRY_MAP)}))"
    )
    answer = subprocess.run(
        [sys.executable, "-c", script, str(bundle_dir / "function")],
        check=True,
        capture_output=True,
        text=True,
        cwd=bundle_dir,
    )
    return json.loads(answer.stdout.strip().splitlines()[-1])
