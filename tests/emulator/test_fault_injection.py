"""The handlers beside the job service killed at each of their I/O steps in turn, then repaired.

`export_logs` (`OutputExporter.handle`) runs on the storage emulator: redelivery repairs every
crash point, and so does the reconciler, which asks again (through the Pub/Sub emulator) for an
export not recorded a minute after its attempt ended. `record_dead_letter` (`DeadLetters.record`)
writes once to Firestore and only redelivery repairs it: the dead letter is its message's only
record. The job-service handlers and the tick: tests/unit/engine/test_engine_fault_injection.py.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_dead_letters import DEAD_LETTERS
from tpujobs.adapters.firestore_store import REJECTIONS, FirestoreJobStore
from tpujobs.adapters.output_bucket import GcsOutputBucket
from tpujobs.adapters.pubsub import Publisher
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.states import JobState
from tpujobs.engine import dead_letters, topology
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.output_export import OutputExporter, OutputObjects, attempt_log_name, worker_log_name
from tpujobs.engine.reconciler import EXPORT_GRACE_S
from tpujobs.engine.services import Engine
from tpujobs.local import wiring
from tpujobs.local.testing import (
    CrashingStore,
    CrashPlan,
    InjectedCrash,
    When,
    local_settings,
    reconciler_for,
    signed,
    wait_for,
)
from tpujobs.runtime import instances

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
JOB = "train-1"  # every test has its own project and simulator, so one id serves all
OWNER = "ada@example.com"
SPEC: dict[str, Any] = {
    "job_id": JOB,
    "name": "train",
    "owner": OWNER,
    "accelerator_type": "v4-8",  # one worker host: one exit report ends an attempt
    "command": "python train.py",
    "on_preemption": "resume",
    "on_error": "fail",
    "max_restarts": 3,
}


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _report(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "job_id": JOB, "attempt": 1, "slice_id": 0, "worker_id": 0, **fields}


class CrashingPort:
    """Any adapter whose `io` methods are steps of `plan`, named `{label}.{method}`; its other
    attributes (names, URIs) pass through uncounted."""

    def __init__(self, label: str, real: Any, plan: CrashPlan, io: tuple[str, ...]) -> None:
        self._label, self._real, self._plan, self._io = label, real, plan, io

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._real, name)
        if name not in self._io:
            return attribute
        return lambda *args, **kwargs: self._plan.step(f"{self._label}.{name}", lambda: attribute(*args, **kwargs))


def crash_around(plan: CrashPlan, handle: Callable[[], object], steps: tuple[str, ...]) -> None:
    """Run `handle` on ports sharing `plan`, and check it died where planned."""
    with pytest.raises(InjectedCrash):
        handle()
    assert plan.crashed and plan.steps == list(steps[: plan.at]), plan.steps


def _step_points(name: str, steps: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(k, when, id=f"{name}-{k}-{step}-{when}")
        for k, step in enumerate(steps, start=1)
        for when in ("before", "after")
    ]


# export_logs: one ended attempt of one host, its output uploaded as the agent uploads it.
OUTPUT = [b"step 1 loss 2.0\n", b"step 2 loss 1.0\n"]
EXPORT_STEPS = (
    "store.get",  # the job: has the attempt ended?
    "objects.worker_outputs",  # list the chunks, read complete.json
    "objects.write_stream_if_changed",  # worker-0.log, streamed from the one worker's chunks
    "objects.write_stream_if_changed",  # attempt.log, streamed from them again
    "store.record_attempt_logs",  # the commit: attempts/1 and the job's log_uri
)
_OBJECT_IO = ("worker_outputs", "read", "chunks_text", "write_if_changed", "write_stream_if_changed")


@dataclass
class ExportWorld:
    """One job, ended, on the Firestore emulator, with its output in a bucket of the storage emulator."""

    service: Engine
    firestore_client: Any
    project_id: str
    objects: OutputObjects
    emulator_host: str

    def exporter(self, plan: CrashPlan | None = None) -> OutputExporter:
        store, objects = self.service.store, self.objects
        if plan is not None:
            store, objects = CrashingStore(store, plan), CrashingPort("objects", objects, plan, _OBJECT_IO)
        return OutputExporter(objects, store, utc_now, sleep=lambda seconds: None, settle_seconds=0.0)

    def request(self) -> InboundMessage:
        payload = {"job_id": JOB, "attempt": 1}
        return InboundMessage("4343", topology.LOG_EXPORT, json.dumps(payload).encode())

    def rejections(self) -> list[dict[str, Any]]:
        return [doc.to_dict() for doc in self.firestore_client.collection(REJECTIONS).stream()]


@pytest.fixture
def exports(
    firestore_client, tpu_client, project_id, simulator_url, storage_url: str, emulators: dict[str, str]
) -> ExportWorld:
    """The job submitted, started and exited 0 on the engine (Firestore, this test's simulator)."""
    settings = local_settings(project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs")
    service = Engine(
        FirestoreJobStore(firestore_client), CloudTpu(tpu_client, project_id), settings, utc_now, lambda seconds: None
    )
    submitted = service.submission.submit(InboundMessage("setup-submit", topology.SUBMIT, json.dumps(SPEC).encode()))
    assert submitted.kind == "provisioning", submitted
    for kind, fields in (("started", {}), ("exited", {"exit_code": 0})):
        report = signed(service, "tpujobs-worker-events", _report(kind, **fields), message_id=f"setup-{kind}")
        service.worker_events.on_worker_report(report)
    assert service.store.get(JOB).state is JobState.SUCCEEDED
    bucket = wiring.storage_client(storage_url, project_id).create_bucket(f"logs-{uuid.uuid4().hex[:10]}")
    chunks = f"logs/jobs/{JOB}/attempt-1/chunks/slice-0-worker-0/"
    for seq, piece in enumerate(OUTPUT):
        bucket.blob(f"{chunks}{seq:06d}.log").upload_from_string(piece)
    bucket.blob(chunks + "complete.json").upload_from_string(json.dumps({"exit_code": 0, "chunks": 2}))
    objects = OutputObjects(GcsOutputBucket(bucket.client, bucket.name))
    return ExportWorld(service, firestore_client, project_id, objects, emulators["PUBSUB_EMULATOR_HOST"])


def assert_exported(world: ExportWorld, context: str) -> None:
    """Both logs hold the output, the attempt and the job name them, and exporting again
    uploads nothing: the export is whole and written once."""
    objects = world.objects
    assert objects.read(worker_log_name(JOB, 1, 0)) == b"".join(OUTPUT), context
    assert objects.read(attempt_log_name(JOB, 1)) == b"".join(b"[worker 0] " + line for line in OUTPUT), context
    job = world.service.store.get(JOB)
    assert job.log_uri == objects.uri(attempt_log_name(JOB, 1)), context
    (recorded,) = world.service.store.attempt_documents(JOB)
    assert recorded["id"] == "1" and recorded["worker_logs"] == {"0": objects.uri(worker_log_name(JOB, 1, 0))}, context
    again = world.exporter().handle(world.request())
    assert again is not None and again.written == (), f"{context}: exported again, it rewrote {again}"
    assert world.rejections() == [], context


def test_the_export_makes_exactly_its_listed_io_steps_and_exports(exports: ExportWorld) -> None:
    """Uncrashed, export_logs makes the listed port calls and writes both logs."""
    plan = CrashPlan()
    exports.exporter(plan).handle(exports.request())
    assert plan.steps == list(EXPORT_STEPS) and not plan.crashed
    assert_exported(exports, "uncrashed")


@pytest.mark.parametrize(("k", "when"), _step_points("export", EXPORT_STEPS))
def test_redelivery_finishes_an_export_killed_at_any_io_step(exports: ExportWorld, k: int, when: When) -> None:
    """Killed before/after step k, the same request delivered again leaves the whole export."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: exports.exporter(plan).handle(exports.request()), EXPORT_STEPS)
    exports.exporter().handle(exports.request())
    assert_exported(exports, f"export: crash {when} {plan.steps}, then redelivered")


@pytest.mark.parametrize(("k", "when"), _step_points("export", EXPORT_STEPS))
def test_the_reconciler_asks_again_for_an_export_killed_at_any_io_step(
    exports: ExportWorld, k: int, when: When
) -> None:
    """Killed before/after step k and the request lost: a tick a minute later (the handler's
    grace) publishes the request again unless the export was recorded, and that request,
    pulled from the Pub/Sub emulator, finishes it."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: exports.exporter(plan).handle(exports.request()), EXPORT_STEPS)
    context = f"export: crash {when} {plan.steps}, request lost, reconciled"
    h, host = exports, exports.emulator_host
    publisher, subscriber = wiring.publisher_client(host), wiring.subscriber_client(host)
    topic = publisher.create_topic(name=publisher.topic_path(h.project_id, topology.LOG_EXPORT)).name
    watch = subscriber.subscription_path(h.project_id, "log-export-watch")
    subscriber.create_subscription(name=watch, topic=topic)
    later = Engine(
        h.service.store,
        h.service.capacity,
        h.service.settings,
        lambda: utc_now() + timedelta(seconds=EXPORT_GRACE_S + 30),
        sleep=lambda seconds: None,
        exports=Publisher.build(h.project_id, h.service.settings.prefix),
    )
    report = reconciler_for(later).tick()
    asked = f"{JOB}: export of attempt 1 asked again" in report.observed
    assert asked is (k < len(EXPORT_STEPS) or when == "before"), f"{context}: {report}"
    if asked:
        pulled = wait_for(lambda: subscriber.pull(subscription=watch, max_messages=1, timeout=5).received_messages)
        subscriber.acknowledge(subscription=watch, ack_ids=[pulled[0].ack_id])
        request = InboundMessage(pulled[0].message.message_id, topology.LOG_EXPORT, pulled[0].message.data)
        exports.exporter().handle(request)
    assert_exported(exports, context)
    exports.exporter().handle(exports.request())  # the lost request turns up after all
    assert_exported(exports, f"{context}, then redelivered late")


# record_dead_letter: one write of a message only it knows.
DEAD_LETTER_STEPS = ("dead_letters.add",)
SUBMIT_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)
RECORDED_AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def _dead_letter(project_id: str) -> InboundMessage:
    """A submit that failed five deliveries, with the attributes Pub/Sub adds to a dead letter."""
    return InboundMessage(
        "9001",
        topology.DEAD_LETTER,
        json.dumps(SPEC).encode(),
        {
            "origin": "ci",
            dead_letters.DELIVERY_COUNT: "5",
            dead_letters.SOURCE_SUBSCRIPTION: topology.push_subscription_name(SUBMIT_ROUTE, ""),
            dead_letters.SOURCE_PROJECT: project_id,
            dead_letters.SOURCE_PUBLISH_TIME: "2026-03-01T11:59:30.123Z",
        },
    )


def _recorder(project_id: str, plan: CrashPlan | None = None) -> dead_letters.DeadLetters:
    """The recorder `record_dead_letter` builds, on the emulator; its store crashing as planned."""
    recorder = instances.build_dead_letters(local_settings(project=project_id), lambda: RECORDED_AT)
    if plan is not None:
        recorder = copy.copy(recorder)
        recorder.store = CrashingPort(
            "dead_letters", recorder.store, plan, ("add", "get", "list_dead_letters", "mark_replayed")
        )
    return recorder


def assert_recorded(project_id: str, firestore_client: Any, context: str) -> None:
    """One record, exactly what the message says, replayable to tpujobs-submit."""
    message = _dead_letter(project_id)
    assert _recorder(project_id).get(message.message_id) == dead_letters.dead_letter_from_message(
        message, RECORDED_AT
    ), context
    assert len(list(firestore_client.collection(DEAD_LETTERS).stream())) == 1, context


def test_recording_a_dead_letter_makes_exactly_its_listed_io_steps(project_id, firestore_client) -> None:
    """Uncrashed, record_dead_letter makes one write, and the letter names its topic."""
    plan = CrashPlan()
    letter = _recorder(project_id, plan).record(_dead_letter(project_id))
    assert plan.steps == list(DEAD_LETTER_STEPS) and not plan.crashed
    assert letter is not None and letter.topic == topology.SUBMIT
    assert_recorded(project_id, firestore_client, "uncrashed")


@pytest.mark.parametrize(("k", "when"), _step_points("dead-letter", DEAD_LETTER_STEPS))
def test_redelivery_finishes_a_dead_letter_record_killed_at_its_write(
    project_id, firestore_client, k: int, when: When
) -> None:
    """Killed before or after its write, the dead letter delivered again is recorded once, as
    it would have been; the record, when the write happened, is left as it was."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: _recorder(project_id, plan).record(_dead_letter(project_id)), DEAD_LETTER_STEPS)
    written = _recorder(project_id).get("9001") is not None
    assert written is (when == "after"), plan.steps
    _recorder(project_id).record(_dead_letter(project_id))
    assert_recorded(project_id, firestore_client, f"dead letter: crash {when} {plan.steps}, then redelivered")
