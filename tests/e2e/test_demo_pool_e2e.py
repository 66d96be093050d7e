"""`tpujobs demo --pool` on the running local stack: three jobs on a warm pool, each start timed."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e


def test_the_pool_demo_runs_three_jobs_on_held_units_and_releases_them(local_stack):
    """The pool demo exits 0 only after three jobs succeed on the pool's units, with no queued
    resource of their own, each with a start latency, and the pool is deleted and released."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["demo", "--pool"], terminal_width=160)
    assert result.exit_code == 0, result.output[-3000:]
    assert "✗" not in result.output
    for line in ("jobs SUCCEEDED on the pool", "no queued resource was made for any job", "units released"):
        assert line in result.output
    latencies = re.findall(r"job \d/3 \S+: SUCCEEDED, started (\d+\.\d+) s after submit", result.output)
    assert len(latencies) == 3, result.output[-3000:]
