"""The startup script a TPU VM runs at boot: every job value is quoted, nothing is executed.

Spec validation forbids most hostile values, so the hostile jobs here are built with
`Job.evolve` directly: the script must be safe even if validation were bypassed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpujobs.agent.startup import render_startup_script
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)

HOSTILE_JOB_IDS = {
    "quote_break": "x'; touch pwned; '",
    "quote_break_absolute": "x'; touch {tmp}/pwned-abs; '",
    "command_substitution": "$(touch pwned)",
    "backticks": "`touch pwned`",
    "variable_expansion": "${HOME:+$(touch pwned)}",
    "double_quotes": '"; touch pwned; "',
    "newline": "x\ntouch pwned",
    "semicolon": "x; touch pwned",
    "ampersand": "x & touch pwned &",
    "pipe": "x | touch pwned",
    "redirect": "x > pwned",
    "backslash": "x\\'; touch pwned; \\'",
    "glob": "*",
    "dash_option": "-n -e",
    "empty": "",
}


def valid_job(**spec_changes: str) -> Job:
    """A QUEUED job made by new_job from a valid spec."""
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), "us-central2-b", NOW)
    return job


def run_script(script: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run the script with bash in `workdir`, PATH intact, and return what happened."""
    path = workdir / "startup.sh"
    path.write_text(script)
    return subprocess.run(
        [BASH or "bash", str(path)],
        cwd=workdir,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(workdir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_script_of_a_valid_job_passes_bash_syntax_check(tmp_path: Path) -> None:
    """`bash -n` accepts the script."""
    path = tmp_path / "startup.sh"
    path.write_text(render_startup_script(valid_job()))
    result = subprocess.run(
        [BASH or "bash", "-n", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_script_of_a_valid_job_announces_its_job_and_attempt(tmp_path: Path) -> None:
    """Run as is, the script prints the job id and attempt and exits 0."""
    job = valid_job().evolve(attempt=3, queued_resource="train-1-a3")
    result = run_script(render_startup_script(job), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "tpujobs: job train-1 attempt 3 booted\n"


def test_the_script_starts_with_a_bash_shebang_and_strict_mode() -> None:
    """A VM runs it with bash, failing on the first error or unset variable."""
    script = render_startup_script(valid_job())
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script


@pytest.mark.parametrize(("resume", "flag"), [(True, "1"), (False, "0")])
def test_the_script_exports_the_resume_flag(resume: bool, flag: str) -> None:
    """TPUJOBS_RESUME is 1 when the attempt continues from its checkpoint, else 0."""
    script = render_startup_script(valid_job().evolve(resume_next=resume))
    assert f"export TPUJOBS_RESUME={flag}\n" in script


@pytest.mark.parametrize("job_id", HOSTILE_JOB_IDS.values(), ids=HOSTILE_JOB_IDS.keys())
def test_a_hostile_job_id_is_quoted_so_the_script_runs_nothing_and_prints_it_literally(
    tmp_path: Path, job_id: str
) -> None:
    """Quotes, $(), backticks, newlines and ; in a job id create no file and are echoed as written."""
    job_id = job_id.replace("{tmp}", str(tmp_path))
    job = valid_job().evolve(job_id=job_id)
    script = render_startup_script(job)

    syntax = subprocess.run(
        [BASH or "bash", "-n"], input=script, capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr

    result = run_script(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["startup.sh"]
    assert result.stdout == f"tpujobs: job {job_id} attempt 1 booted\n"


def test_the_literal_hostile_value_from_the_brief_touches_nothing_in_tmp(tmp_path: Path) -> None:
    """x'; touch /tmp/pwned; ' leaves /tmp/pwned as it was and is printed whole."""
    job_id = "x'; touch /tmp/pwned; '"
    marker = Path("/tmp/pwned")
    existed_before = marker.exists()
    result = run_script(render_startup_script(valid_job().evolve(job_id=job_id)), tmp_path)
    assert result.returncode == 0, result.stderr
    assert job_id in result.stdout
    if not existed_before:
        assert not marker.exists()
