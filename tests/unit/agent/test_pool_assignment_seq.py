"""A pool agent keeps the highest assignment seq it acted on across reboots: a stale assignment
that a gcloud read-modify-write brought back into the node's metadata never runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from agent_stubs import FakeMetadata, GoogleStub, a_job
from test_pool_agent import ASSIGNMENT, BASH, UnitHost, assign, kinds_of

from tpujobs.agent.assignment_seq import HighestSeq
from tpujobs.engine.startup_script import idle_assignment_text
from tpujobs.local.testing import wait_for


def test_the_kept_seq_is_minus_one_until_kept_and_survives_a_new_reader(tmp_path: Path) -> None:
    """Nothing kept (or unreadable) reads -1; a kept seq is what another instance reads, replaced."""
    kept = HighestSeq.beside(str(tmp_path / "pool"), 1, 2)
    assert kept.read() == -1
    kept.keep(4)
    kept.keep(9)
    assert HighestSeq.beside(str(tmp_path / "pool"), 1, 2).read() == 9
    assert HighestSeq.beside(str(tmp_path / "pool"), 0, 2).read() == -1  # another host's
    Path(kept.path).write_text("nine\n")
    assert kept.read() == -1


@pytest.mark.skipif(BASH is None or not os.path.exists("/proc/self/stat"), reason="needs bash and /proc")
def test_after_a_reboot_an_older_assignment_brought_back_never_runs(tmp_path: Path) -> None:
    """Seq 5 runs; the VM reboots while the metadata says seq 3 again (gcloud wrote back what it
    read): the agent started again refuses it, and seq 6 then runs."""
    runs = tmp_path / "runs"
    jobs = {name: a_job(job_id=f"{name}-1", command=f"echo {name} >> {runs}") for name in ("a", "b", "c")}
    with GoogleStub() as google, FakeMetadata(**{ASSIGNMENT: idle_assignment_text(0)}) as metadata:
        metadata.key_server = google
        host = UnitHost(tmp_path, metadata, google)
        try:
            first = host.start()
            assign(metadata, 5, jobs["a"])
            wait_for(lambda: host.said("job a-1 attempt 1: ended"))
            os.kill(first.pid, signal.SIGTERM)
            assert first.wait(timeout=30) == 0

            assign(metadata, 3, jobs["b"])
            host.start()
            wait_for(lambda: host.said("assignment seq 3 ignored: seq 5 was seen already"))
            assign(metadata, 6, jobs["c"])
            wait_for(lambda: host.said("job c-1 attempt 1: ended"))
        finally:
            host.stop()
        assert runs.read_text() == "a\nc\n"
        assert kinds_of(google, jobs["b"]) == []
