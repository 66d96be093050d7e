"""`tpujobs demo` on the running local stack: the story happens and the command says so."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_the_demo_preempts_recovers_and_finishes(local_stack):
    """The demo exits 0 only after a preemption, a resume from a checkpoint and a success."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["demo"], terminal_width=160)
    assert result.exit_code == 0, result.output[-3000:]
    for line in ("preempted midway", "resumed from its checkpoint at step", "finished SUCCEEDED"):
        assert line in result.output
    assert "✗" not in result.output


def test_the_demo_on_compute_engine_preempts_a_v7x_mig_recovers_and_finishes(local_stack):
    """--platform compute: a v7x-16 job's MIG is preempted, and it resumes from its checkpoint and succeeds."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["demo", "--platform", "compute"], terminal_width=160)
    assert result.exit_code == 0, result.output[-3000:]
    assert "1 x v7x-16 spot on Compute Engine" in result.output
    for line in ("preempted midway", "resumed from its checkpoint at step", "finished SUCCEEDED"):
        assert line in result.output
    assert "✗" not in result.output
