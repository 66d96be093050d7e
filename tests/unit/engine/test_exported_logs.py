"""The pure parts of log export: names, bytes, when an attempt ends, and following output."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation, decide
from tpujobs.engine.export_requests import LogExportRequest
from tpujobs.engine.jobs.journal import ended_attempt
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.output_export import (
    Chunk,
    LogReader,
    WorkerOutput,
    attempt_has_ended,
    combined_log,
    cut_off_line,
    prefixed_lines,
    worker_log_parts,
    worker_number,
)

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def a_job(**changes) -> Job:
    spec = parse_spec(
        {
            "job_id": "train-1",
            "name": "train",
            "owner": "ada@example.com",
            "accelerator_type": "v4-16",
            "command": "python train.py",
            "max_restarts": 3,
            **changes,
        }
    )
    job, _ = new_job(spec, "us-central2-b", NOW)
    return job


def walk(job: Job, *observations: Observation) -> Decision:
    """Commit each observation in turn, as the store would; the last decision."""
    decision = None
    for seen in observations:
        decision = decide(job, seen, NOW)
        assert isinstance(decision, Decision), decision
        job = decision.job
    assert decision is not None
    return decision


ADMITTED = Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED")
STARTED = Observation(EventKind.WORKERS_STARTED, 1, "agent", worker="0-0")
LOST = Observation(EventKind.CAPACITY_LOST, 1, "agent", reason="Preempted")
CANCEL = Observation(EventKind.CANCEL_REQUESTED, None, "user")


def test_prefixed_lines_prefix_every_line_and_end_the_last_one():
    """Each line gets `[worker K] `, an empty line too; a last line without newline gets one."""
    assert prefixed_lines(3, b"a\n\nb") == b"[worker 3] a\n[worker 3] \n[worker 3] b\n"
    assert prefixed_lines(0, b"") == b""


def worker_log(*pieces_then_cut_off_and_worker) -> bytes:
    """A worker's exported log, whole, from the stream `worker_log_parts` makes of `pieces`."""
    *pieces, cut_off, worker = pieces_then_cut_off_and_worker
    return b"".join(worker_log_parts(pieces, cut_off, worker))


def test_a_cut_off_worker_log_ends_with_the_cut_off_line_on_a_line_of_its_own():
    """The cut-off line follows the output after a newline, whether or not the output ended one."""
    line = cut_off_line(1)
    assert line.startswith(b"[tpujobs] output cut off: worker 1 stopped")
    assert worker_log(b"half a li", True, 1) == b"half a li\n" + line
    assert worker_log(b"whole\n", True, 1) == b"whole\n" + line
    assert worker_log(b"", True, 1) == line
    assert worker_log(b"no marker needed", False, 1) == b"no marker needed"
    assert worker_log(b"half a", b" li", b"", True, 1) == b"half a li\n" + line  # pieces, an empty last one


def test_the_combined_log_keeps_each_workers_lines_together_worker_0_first():
    """Workers in number order, each one's lines in its own order."""
    assert combined_log({1: b"x\ny\n", 0: b"a\n"}) == b"[worker 0] a\n[worker 1] x\n[worker 1] y\n"


def test_worker_numbers_are_slice_major():
    """K = slice * hosts_per_slice + worker."""
    assert [worker_number(s, w, 2) for s in (0, 1) for w in (0, 1)] == [0, 1, 2, 3]


def test_a_worker_is_complete_only_with_complete_json_and_every_chunk_it_counted():
    """complete.json with chunks=2 and chunks 0 and 1: complete; a missing chunk: not."""
    chunks = [Chunk(1, "b", NOW), Chunk(0, "a", NOW)]
    assert WorkerOutput(0, 0, chunks, "c", {"exit_code": 0, "chunks": 2}).is_complete
    assert not WorkerOutput(0, 0, chunks[:1], "c", {"exit_code": 0, "chunks": 2}).is_complete
    assert not WorkerOutput(0, 0, chunks).is_complete


def test_an_incomplete_worker_is_settled_once_quiet_for_the_settle_time():
    """No complete.json: settled when the newest object is older than the settle time."""
    output = WorkerOutput(0, 0, [Chunk(0, "a", NOW)], newest=NOW)
    assert not output.settled(NOW + timedelta(seconds=9), 10)
    assert output.settled(NOW + timedelta(seconds=10), 10)


@pytest.mark.parametrize(
    ("observations", "expected"),
    [
        ((ADMITTED, STARTED, LOST), 1),  # RUNNING -> RECOVERING
        ((ADMITTED, LOST), 1),  # PROVISIONING -> RECOVERING
        ((ADMITTED, STARTED, CANCEL), 1),  # a started job cancelled
        ((ADMITTED, CANCEL), None),  # cancelled before anything started
        ((CANCEL,), None),  # QUEUED -> CANCELLED
        ((ADMITTED, STARTED, LOST, CANCEL), None),  # RECOVERING -> CANCELLED: attempt 1 was already over
        ((ADMITTED, STARTED), None),  # RUNNING: nothing ended
    ],
)
def test_the_attempt_a_change_ended_is_the_one_to_export(observations, expected):
    """Moves from PROVISIONING or RUNNING to an end request an export; others do not."""
    assert ended_attempt(walk(a_job(on_preemption="resume"), *observations)) == expected


def test_an_attempt_has_ended_once_the_job_recovers_from_it_ends_or_moved_past_it():
    """RUNNING at attempt 2: attempt 1 ended, 2 not; RECOVERING or terminal: the current one ended."""
    job = a_job()
    assert not attempt_has_ended(job.evolve(state=JobState.RUNNING, attempt=2), 2)
    assert attempt_has_ended(job.evolve(state=JobState.RUNNING, attempt=2), 1)
    assert not attempt_has_ended(job.evolve(state=JobState.RUNNING, attempt=2), 3)
    assert attempt_has_ended(job.evolve(state=JobState.RECOVERING, attempt=2), 2)
    assert attempt_has_ended(job.evolve(state=JobState.SUCCEEDED, attempt=2), 2)


def test_an_export_request_is_a_job_id_and_an_attempt():
    """{"job_id", "attempt"} decodes; a missing attempt or a bad id is a ReportError."""
    request = decode_report(LogExportRequest, b'{"job_id": "train-1", "attempt": 2}')
    assert (request.job_id, request.attempt) == ("train-1", 2)
    for bad in (b'{"job_id": "train-1"}', b'{"job_id": "Bad Id", "attempt": 1}', b'{"job_id": "t", "attempt": "1"}'):
        with pytest.raises(ReportError):
            decode_report(LogExportRequest, bad)


# --- following, on fakes of the two edges --------------------------------------------


class FakeObjects:
    """Chunks that appear poll by poll: `timeline[i]` is what the i-th listing sees."""

    def __init__(self, timeline: list[dict[tuple[int, int], list[bytes]]], complete_from: int) -> None:
        self.timeline = timeline
        self.complete_from = complete_from
        self.polls = 0
        self.data: dict[str, bytes] = {}

    def worker_outputs(
        self, job_id: str, attempt: int, account: str | None = None
    ) -> dict[tuple[int, int], WorkerOutput]:
        seen = self.timeline[min(self.polls, len(self.timeline) - 1)]
        complete = self.polls >= self.complete_from
        self.polls += 1
        outputs = {}
        for (s, w), pieces in seen.items():
            chunks = []
            for seq, piece in enumerate(pieces):
                name = f"{s}-{w}/{seq}"
                self.data[name] = piece
                chunks.append(Chunk(seq, name, NOW))
            marker = {"exit_code": 0, "chunks": len(pieces)} if complete else None
            outputs[(s, w)] = WorkerOutput(s, w, chunks, "c" if complete else None, marker)
        return outputs

    def chunks_text(self, chunks: list[Chunk]) -> bytes:
        return b"".join(self.data[c.name] for c in chunks)


class FakeStore:
    def __init__(self, job: Job, running_polls: int) -> None:
        self.job = job
        self.running_polls = running_polls
        self.gets = 0

    def get(self, job_id: str) -> Job:
        self.gets += 1
        state = JobState.RUNNING if self.gets <= self.running_polls else JobState.SUCCEEDED
        return self.job.evolve(state=state)


def test_following_prints_whole_lines_as_they_arrive_and_stops_when_the_attempt_ended():
    """Lines split across chunks come out whole, prefixed, each once; the follow returns after the end."""
    timeline = [
        {},
        {(0, 0): [b"one\ntw"]},
        {(0, 0): [b"one\ntw", b"o\n"], (0, 1): [b"x\n"]},
        {(0, 0): [b"one\ntw", b"o\n", b"three"], (0, 1): [b"x\n"]},
    ]
    objects = FakeObjects(timeline, complete_from=3)
    written: list[bytes] = []
    reader = LogReader(objects, FakeStore(a_job(), running_polls=3), sleep=lambda s: None)  # type: ignore[arg-type]
    reader.follow(a_job(), 1, written.append)
    assert b"".join(written) == b"[worker 0] one\n[worker 0] two\n[worker 1] x\n[worker 0] three\n"


def test_following_one_worker_prints_its_bytes_as_they_are():
    """--worker K: that worker's output unprefixed, nothing of the others."""
    timeline = [{(0, 0): [b"a"], (0, 1): [b"b\n"]}, {(0, 0): [b"a", b"c\n"], (0, 1): [b"b\n"]}]
    objects = FakeObjects(timeline, complete_from=1)
    written: list[bytes] = []
    reader = LogReader(objects, FakeStore(a_job(), running_polls=1), sleep=lambda s: None)  # type: ignore[arg-type]
    reader.follow(a_job(), 1, written.append, worker=0)
    assert b"".join(written) == b"ac\n"
