"""What the drill's e2e tests share: a spot job file of an example's code, and `tpujobs drill` run as a user runs it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def job_file(
    tmp_path: Path, name: str, code: Path, command: str, accelerator: str, env: Mapping[str, str] | None = None
) -> Path:
    """A spot job of the code in `code` that resumes on preemption and fails on an error."""
    spec = tmp_path / f"{name}.yaml"
    lines = [
        f"name: {name}",
        "owner: ada@example.com",
        f"accelerator_type: {accelerator}",
        "capacity: spot",
        f"code_dir: {code}",
        f"command: {command}",
        "on_preemption: resume",
        "on_error: fail",
        "max_restarts: 4",
    ]
    if env:
        lines += ["env:", *(f"  {key}: {json.dumps(value)}" for key, value in env.items())]
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return spec


def drill(*args: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """`tpujobs drill ARGS -o json`: its exit code and its JSON answer."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["drill", *args, "-o", "json", "--timeout", f"{timeout:g}"])
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}: {result.output}") from None
