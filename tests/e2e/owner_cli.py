"""What the end-to-end tests of job controls share: the CLI as the jobs' owner, a submitted
one-host spot job, its timeline, and a wait for its end."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.local.testing import wait_for

OWNER = "ada@example.com"


def tpujobs(*args: str) -> str:
    """`tpujobs ARGS` as the jobs' owner; its output, the command checked to have succeeded."""
    result = CliRunner().invoke(app, list(args), env={"TPUJOBS_OWNER": OWNER}, terminal_width=200)
    assert result.exit_code == 0, f"tpujobs {' '.join(args)}: {result.output}"
    return result.output


def submitted(tmp_path: Path, prefix: str, **spec: Any) -> str:
    """`tpujobs submit` of a one-host spot job with `spec`'s fields; the job's id."""
    job_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    path = tmp_path / f"{job_id}.json"
    base = {"job_id": job_id, "name": prefix, "owner": OWNER, "capacity": "spot", "accelerator_type": "v4-8"}
    path.write_text(json.dumps({**base, **spec}))
    assert job_id in tpujobs("submit", str(path))
    return job_id


def events(job_id: str) -> list[dict[str, Any]]:
    """The job's timeline, as `tpujobs describe JOB -o json` shows it."""
    return list(json.loads(tpujobs("describe", job_id, "-o", "json"))["events"])


def ended(env, job_id: str, timeout: float = 120.0):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} ended"
    return wait_for(probe, timeout=timeout)
