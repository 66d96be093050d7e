"""Log export on the storage and Firestore emulators: chunk objects written as the agent
writes them, jobs moved by the real store, then `OutputExporter` and `tpujobs logs` read them."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.output_bucket import GcsOutputBucket
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine.errors import TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.output_export import LogReader, OutputExporter, OutputObjects, cut_off_line
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import local_settings, reconciler_for, signed

pytestmark = pytest.mark.emulator

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def store(firestore_client) -> FirestoreJobStore:
    return FirestoreJobStore(firestore_client)


@pytest.fixture
def objects(bucket) -> OutputObjects:
    return OutputObjects(GcsOutputBucket(bucket.client, bucket.name))


def exporter(objects: OutputObjects, store: FirestoreJobStore, **timing: float) -> OutputExporter:
    """An exporter that treats chunks as settled at once unless the test says otherwise."""
    timing = {"settle_seconds": 0.0, **timing}
    return OutputExporter(objects, store, utc_now, sleep=lambda seconds: None, **timing)


def a_job(store: FirestoreJobStore, job_id: str = "train-1", **spec) -> str:
    """A job in the store, QUEUED."""
    data = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",  # two worker hosts
        "command": "python train.py",
        "on_preemption": "resume",
        "max_restarts": 3,
        **spec,
    }
    job, event = new_job(parse_spec(data), "us-central2-b", NOW, f"gs://logs/logs/jobs/{job_id}/")
    assert store.create(job, event)
    return job_id


def move(store: FirestoreJobStore, job_id: str, *steps: tuple[EventKind, int, dict]) -> None:
    """Commit observations as the handlers would."""
    for kind, attempt, extra in steps:
        outcome = store.apply(job_id, Observation(kind, attempt, "agent", **extra), utc_now)
        assert isinstance(outcome, Decision), outcome


def run(attempt: int) -> list[tuple[EventKind, int, dict]]:
    return [
        (EventKind.ADMITTED, attempt, {"capacity_state": "ACCEPTED"})
        if attempt == 1
        else (EventKind.NEXT_ATTEMPT_REQUESTED, attempt - 1, {"capacity_state": "ACCEPTED"}),
        (EventKind.WORKERS_STARTED, attempt, {"worker": "0-0"}),
    ]


def succeed(attempt: int, workers: int = 2) -> list[tuple[EventKind, int, dict]]:
    return [(EventKind.WORKER_SUCCEEDED, attempt, {"worker": f"0-{w}", "exit_code": 0}) for w in range(workers)]


PREEMPTED = (EventKind.CAPACITY_LOST, 1, {"reason": "Preempted"})


def write_chunks(bucket, job_id: str, attempt: int, worker: str, pieces: list[bytes], complete: bool) -> None:
    """What the agent's LogShipper leaves: numbered chunks, and complete.json on a clean end."""
    slice_id, worker_id = worker.split("-")
    prefix = f"logs/jobs/{job_id}/attempt-{attempt}/chunks/slice-{slice_id}-worker-{worker_id}/"
    for seq, piece in enumerate(pieces):
        bucket.blob(f"{prefix}{seq:06d}.log").upload_from_string(piece, content_type="text/plain; charset=utf-8")
    if complete:
        marker = json.dumps({"exit_code": 0, "chunks": len(pieces)}).encode()
        bucket.blob(prefix + "complete.json").upload_from_string(marker, content_type="text/plain; charset=utf-8")


def text(bucket, name: str) -> bytes:
    return bucket.blob(name).download_as_bytes()


def two_workers_succeeded(store, bucket, job_id: str = "train-1") -> None:
    a_job(store, job_id)
    move(store, job_id, *run(1), *succeed(1))
    write_chunks(bucket, job_id, 1, "0-0", [b"step 1\nstep ", b"2\n"], complete=True)
    write_chunks(bucket, job_id, 1, "0-1", [b"hello from 1\n"], complete=True)


def test_two_workers_output_becomes_one_log_per_worker_and_a_prefixed_combined_log(store, bucket, objects):
    """worker-0.log and worker-1.log are their chunks in order; attempt.log prefixes every line."""
    two_workers_succeeded(store, bucket)
    result = exporter(objects, store).export("train-1", 1)
    base = f"gs://{bucket.name}/logs/jobs/train-1/attempt-1/"
    assert result.log_uri == base + "attempt.log"
    assert dict(result.worker_logs) == {0: base + "worker-0.log", 1: base + "worker-1.log"}
    assert result.cut_off_workers == ()
    assert text(bucket, "logs/jobs/train-1/attempt-1/worker-0.log") == b"step 1\nstep 2\n"
    assert text(bucket, "logs/jobs/train-1/attempt-1/worker-1.log") == b"hello from 1\n"
    assert text(bucket, "logs/jobs/train-1/attempt-1/attempt.log") == (
        b"[worker 0] step 1\n[worker 0] step 2\n[worker 1] hello from 1\n"
    )


def test_the_export_is_recorded_on_the_attempt_document_and_the_jobs_log_uri(store, bucket, objects, firestore_client):
    """jobs/{id}/attempts/1 holds the URIs and exported_at; the job's log_uri is attempt.log."""
    two_workers_succeeded(store, bucket)
    result = exporter(objects, store).export("train-1", 1)
    document = firestore_client.collection("jobs").document("train-1").collection("attempts").document("1").get()
    fields = document.to_dict()
    assert fields["attempt"] == 1 and fields["log_uri"] == result.log_uri
    assert fields["worker_logs"] == {"0": result.worker_logs[0], "1": result.worker_logs[1]}
    assert fields["cut_off_workers"] == [] and fields["exported_at"] is not None
    assert store.get("train-1").log_uri == result.log_uri
    assert store.attempt_logs("train-1", 1).worker_logs == result.worker_logs


def test_exporting_twice_rewrites_nothing(store, bucket, objects):
    """The second export uploads nothing: same bytes, same generations."""
    two_workers_succeeded(store, bucket)
    first = exporter(objects, store).export("train-1", 1)
    generations = {
        b.name: b.generation
        for b in bucket.list_blobs(prefix="logs/jobs/train-1/attempt-1/")
        if "/chunks/" not in b.name
    }
    contents = {name: text(bucket, name) for name in generations}
    second = exporter(objects, store).export("train-1", 1)
    assert len(first.written) == 3 and second.written == ()
    assert (second.log_uri, dict(second.worker_logs)) == (first.log_uri, dict(first.worker_logs))
    after = {
        b.name: b.generation
        for b in bucket.list_blobs(prefix="logs/jobs/train-1/attempt-1/")
        if "/chunks/" not in b.name
    }
    assert after == generations
    assert {name: text(bucket, name) for name in after} == contents


def test_a_worker_without_complete_json_gets_the_cut_off_line(store, bucket, objects):
    """A preempted worker's half line is ended and followed by the cut-off line, in both logs."""
    a_job(store)
    move(store, "train-1", *run(1), PREEMPTED)
    write_chunks(bucket, "train-1", 1, "0-0", [b"done\n"], complete=True)
    write_chunks(bucket, "train-1", 1, "0-1", [b"step 1\nstep 2 hal"], complete=False)
    result = exporter(objects, store).export("train-1", 1)
    assert result.cut_off_workers == (1,)
    assert text(bucket, "logs/jobs/train-1/attempt-1/worker-1.log") == b"step 1\nstep 2 hal\n" + cut_off_line(1)
    assert text(bucket, "logs/jobs/train-1/attempt-1/attempt.log").endswith(
        b"[worker 1] step 2 hal\n[worker 1] " + cut_off_line(1)
    )
    assert store.attempt_logs("train-1", 1).cut_off_workers == (1,)


def test_a_worker_still_writing_makes_the_export_wait_then_retry(store, bucket, objects):
    """A fresh chunk and no complete.json: the exporter waits, then TransientError for a redelivery."""
    a_job(store)
    move(store, "train-1", *run(1), PREEMPTED)
    write_chunks(bucket, "train-1", 1, "0-0", [b"still going\n"], complete=False)
    slept: list[float] = []
    waiting = OutputExporter(objects, store, utc_now, sleep=slept.append, wait_in_call_seconds=0.0)
    with pytest.raises(TransientError, match="still writing"):
        waiting.export("train-1", 1)
    assert bucket.get_blob("logs/jobs/train-1/attempt-1/attempt.log") is None


def test_once_the_wait_is_over_a_worker_still_writing_is_exported_cut_off(store, bucket, objects):
    """max_wait_seconds after the attempt's end, what there is is exported, with the cut-off line."""
    a_job(store)
    move(store, "train-1", *run(1), PREEMPTED)
    write_chunks(bucket, "train-1", 1, "0-0", [b"still going\n"], complete=False)
    patient = OutputExporter(objects, store, utc_now, sleep=lambda s: None, max_wait_seconds=0.0)
    result = patient.export("train-1", 1)
    assert result.cut_off_workers == (0,)
    assert text(bucket, "logs/jobs/train-1/attempt-1/worker-0.log") == b"still going\n" + cut_off_line(0)


def test_a_preempted_jobs_first_attempt_keeps_its_logs_beside_the_second(store, bucket, objects):
    """Attempt 1 (cut off) and attempt 2 (complete) each keep their logs; the job names attempt 2's,
    even when attempt 1's export finishes last."""
    a_job(store)
    move(store, "train-1", *run(1), PREEMPTED, *run(2), *succeed(2))
    for worker in ("0-0", "0-1"):
        write_chunks(bucket, "train-1", 1, worker, [f"a1 {worker}\n".encode()], complete=False)
        write_chunks(bucket, "train-1", 2, worker, [f"a2 {worker}\n".encode()], complete=True)
    second = exporter(objects, store).export("train-1", 2)
    first = exporter(objects, store).export("train-1", 1)
    assert first.cut_off_workers == (0, 1) and second.cut_off_workers == ()
    assert text(bucket, "logs/jobs/train-1/attempt-1/worker-1.log") == b"a1 0-1\n" + cut_off_line(1)
    assert text(bucket, "logs/jobs/train-1/attempt-2/worker-1.log") == b"a2 0-1\n"
    assert store.get("train-1").log_uri == second.log_uri
    assert store.attempt_logs("train-1", 1).log_uri == first.log_uri


def test_workers_of_a_multislice_job_are_numbered_slice_major(store, bucket, objects):
    """slices=2 of v4-16: slice 1 worker 0 is worker 2."""
    a_job(store, slices=2)
    move(store, "train-1", *run(1), PREEMPTED)
    write_chunks(bucket, "train-1", 1, "1-0", [b"from slice 1\n"], complete=True)
    result = exporter(objects, store).export("train-1", 1)
    assert list(result.worker_logs) == [2]
    assert text(bucket, "logs/jobs/train-1/attempt-1/attempt.log") == b"[worker 2] from slice 1\n"


def test_nothing_is_exported_for_a_missing_job_a_running_attempt_or_one_without_output(store, bucket, objects):
    """No job, an attempt still running, or no chunks: no objects, no error, and the reason."""
    export = exporter(objects, store)
    assert export.export("nope-1", 1).reason == "no job 'nope-1'"
    a_job(store)
    move(store, "train-1", *run(1))
    write_chunks(bucket, "train-1", 1, "0-0", [b"running\n"], complete=False)
    assert export.export("train-1", 1).reason == "attempt 1 has not ended"
    a_job(store, "quiet-1")
    move(store, "quiet-1", *run(1), PREEMPTED)
    assert export.export("quiet-1", 1).reason == "attempt 1 has no output"
    assert not [b.name for b in bucket.list_blobs() if not b.name.split("/")[-1][0].isdigit()]


def test_a_malformed_export_request_is_recorded_as_a_rejection(store, objects):
    """Bad input is acknowledged (None) and kept in `rejections`."""
    message = InboundMessage("77", "tpujobs-log-export", b'{"job_id": "train-1"}')
    assert exporter(objects, store).handle(message) is None
    [rejection] = store.rejections()
    assert rejection.message_id == "77" and "attempt" in rejection.reason


def test_a_request_on_the_topic_exports(store, bucket, objects):
    """The message {"job_id", "attempt"} as export_logs gets it."""
    two_workers_succeeded(store, bucket)
    message = InboundMessage("78", "tpujobs-log-export", b'{"job_id": "train-1", "attempt": 1}')
    assert exporter(objects, store).handle(message).log_uri.endswith("/attempt-1/attempt.log")


def test_the_reader_shows_chunks_before_the_export_and_the_exported_log_after(store, bucket, objects):
    """Before the export: the chunks, prefixed; after: attempt.log and worker-K.log as written."""
    two_workers_succeeded(store, bucket)
    reader = LogReader(objects, store)
    job = store.get("train-1")
    before, exported = reader.show(job, 1)
    assert not exported and before == b"[worker 0] step 1\n[worker 0] step 2\n[worker 1] hello from 1\n"
    exporter(objects, store).export("train-1", 1)
    assert reader.show(job, 1) == (before, True)
    assert reader.show(job, 1, worker=1) == (b"hello from 1\n", True)


class RecordedExports:
    def __init__(self) -> None:
        self.requests: list[tuple[str, int]] = []

    def request_export(self, job_id: str, attempt: int) -> None:
        self.requests.append((job_id, attempt))


class BrokenExports(RecordedExports):
    """Pub/Sub is down until `broken` is set false; then the requests are recorded."""

    broken = True

    def request_export(self, job_id: str, attempt: int) -> None:
        if self.broken:
            raise TransientError("Pub/Sub is down")
        super().request_export(job_id, attempt)


def service_with(exports, firestore_client, tpu_client, project_id, simulator_url, clock=utc_now) -> Engine:
    settings = local_settings(project=project_id, tpu_endpoint=simulator_url, logs_bucket="logs")
    return Engine(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        clock,
        lambda seconds: None,
        exports=exports,
    )


def test_the_service_requests_an_export_when_an_attempt_ends(firestore_client, tpu_client, project_id, simulator_url):
    """A preemption asks for attempt 1's export, success for attempt 2's; nothing else does."""
    exports = RecordedExports()
    service = service_with(exports, firestore_client, tpu_client, project_id, simulator_url)
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    assert service.submission.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    identity = {"job_id": "train-1", "slice_id": 0, "worker_id": 0}
    service.worker_events.on_worker_report(
        signed(service, "tpujobs-worker-events", {**identity, "kind": "started", "attempt": 1})
    )
    assert exports.requests == []
    service.capacity_events.on_preemption(signed(service, "tpujobs-preemption", {**identity, "attempt": 1}))
    assert service.store.get("train-1").attempt == 2
    service.worker_events.on_worker_report(
        signed(service, "tpujobs-worker-events", {**identity, "kind": "exited", "attempt": 2, "exit_code": 0})
    )
    assert service.store.get("train-1").state is JobState.SUCCEEDED
    assert exports.requests == [("train-1", 1), ("train-1", 2)]


def test_a_failed_export_request_does_not_fail_the_handler(firestore_client, tpu_client, project_id, simulator_url):
    """The job is CANCELLED and the handler returns, though the request could not be sent."""
    service = service_with(BrokenExports(), firestore_client, tpu_client, project_id, simulator_url)
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    service.submission.submit(message("tpujobs-submit", spec))
    identity = {"job_id": "train-1", "slice_id": 0, "worker_id": 0, "attempt": 1}
    service.worker_events.on_worker_report(signed(service, "tpujobs-worker-events", {**identity, "kind": "started"}))
    service.controls.on_control(
        message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": "ada@example.com"})
    )
    assert service.store.get("train-1").state is JobState.CANCELLED


def test_the_reconciler_asks_again_for_an_export_whose_request_was_lost(
    firestore_client, tpu_client, project_id, simulator_url
):
    """The handler's request failed; a tick a minute later asks again, for the ended attempt
    only, until the export is recorded; a job without output is not asked for forever."""
    from datetime import timedelta

    from tpujobs.engine.reconciler import EXPORT_GRACE_S, EXPORT_WINDOW_S

    now = [utc_now()]
    exports = BrokenExports()
    service = service_with(exports, firestore_client, tpu_client, project_id, simulator_url, lambda: now[0])
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    service.submission.submit(message("tpujobs-submit", spec))
    identity = {"job_id": "train-1", "slice_id": 0, "worker_id": 0}
    service.worker_events.on_worker_report(
        signed(service, "tpujobs-worker-events", {**identity, "kind": "started", "attempt": 1})
    )
    service.worker_events.on_worker_report(
        signed(service, "tpujobs-worker-events", {**identity, "kind": "exited", "attempt": 1, "exit_code": 0})
    )
    assert service.store.get("train-1").state is JobState.SUCCEEDED

    exports.broken = False
    reconciler_for(service).tick()
    assert exports.requests == []  # too early: the handler's own request may still be on its way

    now[0] += timedelta(seconds=EXPORT_GRACE_S + 1)
    reconciler_for(service).tick()
    assert exports.requests == [("train-1", 1)]

    now[0] += timedelta(seconds=EXPORT_WINDOW_S)
    reconciler_for(service).tick()
    assert exports.requests == [("train-1", 1)]  # past the window: left alone


def test_a_job_on_its_own_account_exports_under_that_accounts_logs_prefix(store, bucket, objects):
    """service_account: chunks and exported logs under logs/accounts/{email}/jobs/{id}/."""
    email = "team-a@proj.iam.gserviceaccount.com"
    a_job(store, service_account=email)
    move(store, "train-1", *run(1), PREEMPTED)
    prefix = f"logs/accounts/{email}/jobs/train-1/attempt-1/"
    bucket.blob(prefix + "chunks/slice-0-worker-0/000000.log").upload_from_string(b"mine\n")
    result = exporter(objects, store).export("train-1", 1)
    assert result.log_uri == f"gs://{bucket.name}/{prefix}attempt.log"
    assert text(bucket, prefix + "worker-0.log") == b"mine\n" + cut_off_line(0)


def code_tarball(bucket, custom_time: datetime | None = None) -> str:
    """An uploaded code tarball (as the CLI leaves it, custom time and all): its gs:// URI."""
    blob = bucket.blob("code/0123456789abcdef.tar.gz")
    blob.custom_time = custom_time
    blob.upload_from_string(b"tarball", content_type="application/gzip")
    return f"gs://{bucket.name}/{blob.name}"


def test_each_attempts_end_marks_the_jobs_code_as_used_now(store, bucket, objects):
    """The export of an ended attempt moves the code tarball's custom time to the clock's now,
    even for an attempt without output, so the code rule keeps what may still resume."""
    uploaded = datetime(2025, 1, 1, tzinfo=timezone.utc)
    a_job(store, code_uri=code_tarball(bucket, uploaded))
    move(store, "train-1", *run(1), PREEMPTED)
    ended = datetime(2025, 2, 1, tzinfo=timezone.utc)
    result = OutputExporter(objects, store, lambda: ended, sleep=lambda seconds: None, settle_seconds=0).export(
        "train-1", 1
    )
    assert result.reason == "attempt 1 has no output"
    assert bucket.get_blob("code/0123456789abcdef.tar.gz").custom_time == ended


def test_a_running_attempt_leaves_the_code_alone_and_an_earlier_time_never_moves_it_back(store, bucket, objects):
    """Before the attempt ends nothing is marked; a clock behind the custom time changes nothing."""
    later = datetime(2025, 6, 1, tzinfo=timezone.utc)
    a_job(store, code_uri=code_tarball(bucket, later))
    move(store, "train-1", *run(1))
    earlier = OutputExporter(objects, store, lambda: NOW, sleep=lambda seconds: None, settle_seconds=0)
    assert earlier.export("train-1", 1).reason == "attempt 1 has not ended"
    move(store, "train-1", PREEMPTED)
    earlier.export("train-1", 1)
    assert bucket.get_blob("code/0123456789abcdef.tar.gz").custom_time == later


def test_code_outside_the_buckets_code_prefix_is_not_touched_and_missing_code_is_no_error(store, bucket, objects):
    """A code_uri in another bucket or prefix is not ours to keep; a deleted tarball stays deleted."""
    bucket.blob("elsewhere/train.tar.gz").upload_from_string(b"theirs")
    assert not objects.mark_code_used(f"gs://{bucket.name}/elsewhere/train.tar.gz", NOW)
    assert not objects.mark_code_used("gs://other-bucket/code/0123456789abcdef.tar.gz", NOW)
    assert bucket.get_blob("elsewhere/train.tar.gz").custom_time is None
    a_job(store, code_uri=f"gs://{bucket.name}/code/fedcba9876543210.tar.gz")
    move(store, "train-1", *run(1), *succeed(1))
    write_chunks(bucket, "train-1", 1, "0-0", [b"done\n"], complete=True)
    assert exporter(objects, store).export("train-1", 1).log_uri is not None
    assert bucket.get_blob("code/fedcba9876543210.tar.gz") is None
