"""The command's stdout and stderr as two pipes read by one pump (`agent/output.py`): one export in
the order the lines came, stderr's lines ERROR in Cloud Logging, secrets masked and checkpoint lines
seen in each stream, and an unfinished line never glued to the other stream's bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent_stubs import SETTINGS, WORKER_EVENTS, FakeMetadata, GoogleStub, a_job, chunk_prefix, run_script
from test_agent_cloud_logging import RecordingApi, sink
from test_error_classes_agent import FAST

from tpujobs.agent.containers import docker_failure
from tpujobs.agent.last_output import LastOutput
from tpujobs.agent.masking import SecretMask
from tpujobs.agent.output import LogShipper, OutputPump, Tee
from tpujobs.agent.rest import GoogleApi, Storage
from tpujobs.engine.startup_script import render_startup_script
from tpujobs.local.testing import wait_for

FOREVER = 3600.0  # an unfinished line is never let go for its age in these tests


class MemoryStorage(Storage):
    """Cloud Storage as a dict of uploaded objects."""

    def __init__(self) -> None:
        super().__init__(GoogleApi("http://storage.invalid", None))
        self.objects: dict[str, bytes] = {}

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, *args: object, **kw: object) -> None:
        self.objects[name] = data

    def output(self) -> bytes:
        return b"".join(data for name, data in sorted(self.objects.items()) if name.endswith(".log"))


class CountingTee(Tee):
    """A Tee that counts what the pump gave it, so the test knows a write was read."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.seen = {"stdout": 0, "stderr": 0}

    def write(self, data: bytes, stream: str = "stdout") -> None:
        super().write(data, stream)
        self.seen[stream] += len(data)


class Child:
    """A command's two pipes, written by the test: each write is read by the pump before the next
    is made, so the pump sees them in the order written, however loaded the machine is."""

    def __init__(self, secrets: dict[str, str] | None = None, hold_seconds: float = FOREVER) -> None:
        self.storage = MemoryStorage()
        self.api = RecordingApi()
        self.shipper = LogShipper(self.storage, "b", "p/", FOREVER, mirror=sink(self.api))
        self.last = LastOutput()
        self.tee = CountingTee(self.shipper, self.last, secrets)
        self.checkpoints: list[tuple[int, str]] = []
        out_read, self.out = os.pipe()
        err_read, self.err = os.pipe()
        self.written = {"stdout": 0, "stderr": 0}
        self.pump = OutputPump(
            {"stdout": out_read, "stderr": err_read},
            self.tee,
            lambda step, detail: self.checkpoints.append((step, detail)),
            hold_seconds=hold_seconds,
        )
        self.pump.start()

    def write(self, stream: str, data: bytes) -> None:
        os.write(self.out if stream == "stdout" else self.err, data)
        self.written[stream] += len(data)
        wait_for(lambda: self.tee.seen[stream] >= self.written[stream], timeout=30, what=f"the pump to read {data!r}")

    def end(self) -> None:
        """The command exits: both pipes close, the pump ends, the shipper flushes."""
        os.close(self.out)
        os.close(self.err)
        self.pump.join(30)
        assert not self.pump.is_alive()
        self.shipper.close(0)

    def entries(self) -> list[tuple[str, str, str]]:
        return entries(self.api)


def entries(api: RecordingApi) -> list[tuple[str, str, str]]:
    """(text, severity, stream label) of each Cloud Logging entry, in the order sent."""
    return [
        (str(e["textPayload"]), str(e["severity"]), e["labels"]["tpujobs_stream"])  # type: ignore[index]
        for e in api.entries()
    ]


def test_interleaved_lines_keep_their_order_and_stderr_lines_are_errors() -> None:
    """Lines of both streams reach Cloud Storage and the last output in the order written; in
    Cloud Logging stdout's are INFO and stderr's ERROR, labelled with their stream."""
    child = Child()
    for stream, line in [
        ("stdout", b"step 1\n"),
        ("stderr", b"warning: slow input\n"),
        ("stdout", b"step 2\n"),
        ("stderr", b"Traceback (most recent call last):\n"),
        ("stdout", b"done\n"),
    ]:
        child.write(stream, line)
    child.end()
    printed = b"step 1\nwarning: slow input\nstep 2\nTraceback (most recent call last):\ndone\n"
    assert child.storage.output() == printed
    assert child.last.snapshot() == printed
    assert child.entries() == [
        ("step 1", "INFO", "stdout"),
        ("warning: slow input", "ERROR", "stderr"),
        ("step 2", "INFO", "stdout"),
        ("Traceback (most recent call last):", "ERROR", "stderr"),
        ("done", "INFO", "stdout"),
    ]


def test_the_other_streams_lines_go_before_an_unfinished_line_never_inside_it() -> None:
    """stdout's line cut by its buffer waits for its end; stderr's line written meanwhile comes first."""
    child = Child()
    child.write("stdout", b"loss=0.5 ep")
    child.write("stderr", b"warning: slow input\n")
    child.write("stdout", b"och=1\n")
    child.end()
    assert child.storage.output() == b"warning: slow input\nloss=0.5 epoch=1\n"
    assert child.entries() == [("warning: slow input", "ERROR", "stderr"), ("loss=0.5 epoch=1", "INFO", "stdout")]


def test_an_unfinished_line_let_go_for_its_age_is_ended_before_the_other_stream() -> None:
    """Held past hold_seconds (0 here) a progress bar ships as it is; stderr's next line starts a line
    of its own in the export, and Cloud Logging still gets stdout's line whole."""
    child = Child(hold_seconds=0.0)
    child.write("stdout", b"50%|#####")
    wait_for(lambda: b"50%" in child.shipper._pending, timeout=30, what="the unfinished line to ship")
    child.write("stderr", b"warning: slow input\n")
    child.write("stdout", b" 100%\n")
    child.end()
    assert child.storage.output() == b"50%|#####\nwarning: slow input\n 100%\n"
    assert child.entries() == [("warning: slow input", "ERROR", "stderr"), ("50%|##### 100%", "INFO", "stdout")]


def test_a_secret_split_across_two_reads_of_stderr_is_masked_while_stdout_flows() -> None:
    """stderr's first half of a token waits in its own mask; stdout's line goes out meanwhile, and
    the whole token is cut out of every copy."""
    child = Child({"TOKEN": "hunter2-very-secret"})
    child.write("stderr", b"token=hunter2-ve")
    child.write("stdout", b"step 1\n")
    assert child.shipper._pending == b"step 1\n"  # not held behind stderr's unfinished token
    child.write("stderr", b"ry-secret\n")
    child.end()
    assert child.storage.output() == b"step 1\ntoken=[secret TOKEN]\n"
    assert child.last.snapshot() == child.storage.output()
    assert "hunter2" not in json.dumps(child.api.bodies)
    assert child.entries() == [("step 1", "INFO", "stdout"), ("token=[secret TOKEN]", "ERROR", "stderr")]


def test_checkpoint_lines_on_stderr_are_seen_even_when_cut_by_a_read() -> None:
    """A checkpoint line on stderr counts, also one whose two halves have a stdout line between them."""
    child = Child()
    child.write("stderr", b"TPUJOBS_CHECKPOINT step=7 saved\n")
    child.write("stderr", b"TPUJOBS_CHECK")
    child.write("stdout", b"step 8\n")
    child.write("stderr", b"POINT step=8\n")
    child.end()
    assert child.checkpoints == [(7, "saved"), (8, "")]


def test_dockers_last_words_on_stderr_are_in_the_tail() -> None:
    """The docker CLI says why it could not run a container on stderr: the pump's tail has it."""
    child = Child()
    child.write("stdout", b"pulling\n")
    child.write("stderr", b"docker: Error response from daemon: unable to apply caps.\n")
    child.end()
    assert (docker_failure(child.pump.tail) or "").startswith("docker: Error response from daemon")


def test_an_agent_line_after_an_unfinished_one_starts_a_line_of_its_own() -> None:
    """The export ends stdout's unfinished line before the agent's note (and says so); Cloud
    Logging keeps stdout's line whole and the note a WARNING."""
    storage, api = MemoryStorage(), RecordingApi()
    shipper = LogShipper(storage, "b", "p/", FOREVER, mirror=sink(api))
    assert shipper.write(b"epoch 1", "stdout") == b""
    assert shipper.write(b"[tpujobs-agent] withdrawn\n") == b"\n"
    assert shipper.write(b" done\n", "stdout") == b""
    shipper.close(0)
    assert storage.output() == b"epoch 1\n[tpujobs-agent] withdrawn\n done\n"
    assert entries(api) == [("[tpujobs-agent] withdrawn", "WARNING", "agent"), ("epoch 1 done", "INFO", "stdout")]


def test_the_mask_lets_a_lines_end_out_at_once() -> None:
    """Only a tail that may begin a secret waits, so a stream's finished line is never held back
    (where the other stream's later lines would overtake it)."""
    mask = SecretMask({"TOKEN": "hunter2-very-secret"})
    assert mask.feed(b"step 1\n") == b"step 1\n"
    assert mask.feed(b"token=hun") == b"token="
    assert mask.feed(b"gry\n") == b"hungry\n"
    assert mask.feed(b"hunter2-very-secret!") == b"[secret TOKEN]!"


def test_the_agent_runs_the_command_with_stdout_and_stderr_apart(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Through the whole agent, stderr's line never lands inside stdout's unfinished one (as one
    shared pipe would have it: `halferr`), in the export and in the failed `exited`'s last lines."""
    command = "printf half; echo err >&2; echo ' rest'; exit 3"
    code, _, stderr = run_script(
        render_startup_script(a_job(command=command), SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
    assert code == 3, stderr
    # The outcomes, by when the pump read what: `half` waited for its end, before or after `err`
    # (both pipes ready at once: which came first cannot be known), or (a machine stalled for
    # HOLD_SECONDS between two shell builtins) it was let go, and ended before `err`.
    assert google.output(chunk_prefix()) in (b"err\nhalf rest\n", b"half rest\nerr\n", b"half\nerr\n rest\n")
    exited, _ = google.messages(WORKER_EVENTS)[-1]
    assert exited["last_lines"] in (["err", "half rest"], ["half rest", "err"], ["half", "err", " rest"])
