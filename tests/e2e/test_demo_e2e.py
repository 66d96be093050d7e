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
