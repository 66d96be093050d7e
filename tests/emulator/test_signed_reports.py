"""Signed worker reports on the Firestore emulator and the TPU simulator: forgeries change nothing.

A running job (submitted, then a signed `started`) is sent what another job's code could
publish with the VM account's token: unsigned reports, reports signed with another job's or
another attempt's key, hosts the job does not have, times outside the attempt, and replays.
Each must leave the job as it was and be recorded in `rejections` with a sentence saying why,
while the reports its own hosts sign still move it. Rejections never keep an attempt key.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_store import REJECTIONS
from tpujobs.domain import signing
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.job_service import JobService
from tpujobs.local.testing import inbound, signed

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
EVENTS = "tpujobs-worker-events"
PREEMPTION = "tpujobs-preemption"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def service(job_service) -> JobService:
    return job_service(stuck_after_seconds=0.0)


def submit(service: JobService, job_id: str, **changes: Any) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",  # two worker hosts per slice
        "command": "python train.py",
        "on_preemption": "resume",
        "on_error": "fail",
        "max_restarts": 3,
        **changes,
    }
    assert service.submit(inbound("tpujobs-submit", spec)).kind == "provisioning"
    return job_id


def exited(job_id: str = "train-1", attempt: int = 1, worker: int = 0, code: int = 0, **changes: Any) -> dict:
    return {
        "kind": "exited",
        "job_id": job_id,
        "attempt": attempt,
        "slice_id": 0,
        "worker_id": worker,
        "exit_code": code,
        **changes,
    }


def notice(job_id: str = "train-1", attempt: int = 1, worker: int = 0) -> dict:
    return {
        "job_id": job_id,
        "attempt": attempt,
        "slice_id": 0,
        "worker_id": worker,
        "reason": "SIGTERM",
    }


def signed_with(key: bytes, topic: str, payload: dict) -> InboundMessage:
    """A message whose bytes are `payload` (with a time and a nonce), signed with `key`, whoever's it is."""
    body = {"at": utc_now().isoformat(), "nonce": secrets.token_hex(16), **payload}
    data = json.dumps(body).encode()
    return InboundMessage(
        str(secrets.randbelow(10**15)),
        topic,
        data,
        {signing.SIGNATURE_ATTRIBUTE: signing.sign(key, data)},
    )


def key_of(service: JobService, job_id: str, attempt: int) -> bytes:
    """The attempt key of a stored job, as its hosts hold it."""
    job = service.store.get(job_id)
    assert job is not None and job.created_at is not None
    return signing.attempt_key(service.settings.report_key, job_id, job.created_at, attempt)


def running(service: JobService, job_id: str = "train-1", **changes: Any) -> str:
    """A job submitted and RUNNING: its worker 0 said `started`, signed."""
    submit(service, job_id, **changes)
    service.on_worker_report(
        signed(
            service,
            EVENTS,
            {"kind": "started", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0},
        )
    )
    assert service.store.get(job_id).state is JobState.RUNNING
    return job_id


def snapshot(service: JobService, job_id: str = "train-1") -> tuple:
    """What a forgery must not change: state, attempt, restarts, exit code, workers done, events."""
    job = service.store.get(job_id)
    return (
        job.state,
        job.attempt,
        job.restarts,
        job.exit_code,
        service.store.attempt_workers_succeeded(job_id, job.attempt),  # the workers done
        len(service.store.events(job_id)),
    )


def rejection_of(service: JobService, message: InboundMessage):
    """The rejection recorded for `message`, or None."""
    return next((r for r in service.store.rejections() if r.message_id == message.message_id), None)


def handle(service: JobService, message: InboundMessage):
    return service.on_preemption(message) if message.topic == PREEMPTION else service.on_worker_report(message)


# Each forgery: how to build it from the service (the RUNNING train-1 and a RUNNING train-2 exist),
# and what its rejection's reason must say.
Forgery = Callable[[JobService], InboundMessage]


def unsigned_exit(service: JobService) -> InboundMessage:
    body = {"at": utc_now().isoformat(), "nonce": secrets.token_hex(16), **exited()}
    return inbound(EVENTS, body)


def exit_signed_with_another_jobs_key(service: JobService) -> InboundMessage:
    return signed_with(key_of(service, "train-2", 1), EVENTS, exited())


def exit_signed_for_another_job_then_retargeted(service: JobService) -> InboundMessage:
    genuine = signed(service, EVENTS, exited(job_id="train-2"))
    body = json.loads(genuine.data)
    body["job_id"] = "train-1"
    return InboundMessage(genuine.message_id, EVENTS, json.dumps(body).encode(), dict(genuine.attributes))


def notice_signed_with_another_attempts_key(service: JobService) -> InboundMessage:
    return signed_with(key_of(service, "train-1", 2), PREEMPTION, notice())


def notice_signed_with_another_jobs_key(service: JobService) -> InboundMessage:
    return signed_with(key_of(service, "train-2", 1), PREEMPTION, notice())


def exit_from_worker_2(service: JobService) -> InboundMessage:
    return signed(service, EVENTS, exited(worker=2))


def exit_from_slice_1(service: JobService) -> InboundMessage:
    return signed(service, EVENTS, {**exited(), "slice_id": 1})


def notice_from_slice_1(service: JobService) -> InboundMessage:
    return signed(service, PREEMPTION, {**notice(), "slice_id": 1})


def exit_before_the_attempt_began(service: JobService) -> InboundMessage:
    job = service.store.get("train-1")
    return signed(service, EVENTS, exited(at=(job.created_at - timedelta(hours=1)).isoformat()))


def exit_an_hour_in_the_future(service: JobService) -> InboundMessage:
    return signed(service, EVENTS, exited(at=(utc_now() + timedelta(hours=1)).isoformat()))


def notice_an_hour_in_the_future(service: JobService) -> InboundMessage:
    return signed(service, PREEMPTION, {**notice(), "at": (utc_now() + timedelta(hours=1)).isoformat()})


def exit_of_an_attempt_the_job_has_not_reached(service: JobService) -> InboundMessage:
    return signed(service, EVENTS, exited(attempt=2))


FORGERIES: list[tuple[Forgery, str]] = [
    (unsigned_exit, "the report is unsigned (no tpujobs-signature attribute)"),
    (
        exit_signed_with_another_jobs_key,
        "the signature does not match the key of the attempt the report names",
    ),
    (
        exit_signed_for_another_job_then_retargeted,
        "the signature does not match the key of the attempt the report names",
    ),
    (
        notice_signed_with_another_attempts_key,
        "the signature does not match the key of the attempt the report names",
    ),
    (
        notice_signed_with_another_jobs_key,
        "the signature does not match the key of the attempt the report names",
    ),
    (exit_from_worker_2, "worker 2 is out of range: each slice has 2 host(s)"),
    (exit_from_slice_1, "slice 1 is out of range: the job has 1 slice(s)"),
    (notice_from_slice_1, "slice 1 is out of range: the job has 1 slice(s)"),
    (exit_before_the_attempt_began, "is before attempt 1 began"),
    (exit_an_hour_in_the_future, "is in the future"),
    (notice_an_hour_in_the_future, "is in the future"),
    (exit_of_an_attempt_the_job_has_not_reached, "it names attempt 2, but the job is at attempt 1"),
]


@pytest.mark.parametrize(("forge", "why"), FORGERIES, ids=[forge.__name__ for forge, _ in FORGERIES])
def test_a_forged_report_changes_nothing_and_is_rejected_with_a_sentence(service, forge, why):
    """The forgery leaves state, attempt, restarts, exit code and events as they were, and its rejection says why."""
    running(service, "train-1")
    running(service, "train-2")
    before, other_before = snapshot(service, "train-1"), snapshot(service, "train-2")
    forged = forge(service)
    assert handle(service, forged) is None
    assert snapshot(service, "train-1") == before
    assert snapshot(service, "train-2") == other_before
    rejection = rejection_of(service, forged)
    assert rejection is not None, f"no rejection for {forge.__name__}"
    assert rejection.topic == forged.topic
    assert rejection.reason.startswith("Report for train-1 attempt ") and rejection.reason.endswith(".")
    assert why in rejection.reason


def test_a_notice_from_a_leftover_host_of_the_previous_attempt_cannot_stop_the_next(service):
    """At attempt 2, a notice naming attempt 2 but signed with attempt 1's key (which that job's old code holds) is
    refused."""
    running(service, "train-1")
    service.on_preemption(signed(service, PREEMPTION, notice()))
    service.on_worker_report(
        signed(
            service,
            EVENTS,
            {"kind": "started", "job_id": "train-1", "attempt": 2, "slice_id": 0, "worker_id": 0},
        )
    )
    assert (service.store.get("train-1").state, service.store.get("train-1").attempt) == (
        JobState.RUNNING,
        2,
    )
    before = snapshot(service)
    forged = signed_with(key_of(service, "train-1", 1), PREEMPTION, notice(attempt=2))
    assert service.on_preemption(forged) is None
    assert snapshot(service) == before
    assert (
        "the signature does not match the key of the attempt the report names" in rejection_of(service, forged).reason
    )


def test_a_replay_under_a_new_message_id_is_rejected_naming_the_first(service):
    """The same signed bytes and attributes under a new id, after the original was believed, are a replay."""
    running(service, "train-1")
    original = signed(service, EVENTS, exited(worker=0))
    service.on_worker_report(original)
    assert service.store.attempt_workers_succeeded("train-1", 1) == 1
    before = snapshot(service)
    replay = InboundMessage("9" + original.message_id, EVENTS, original.data, dict(original.attributes))
    assert service.on_worker_report(replay) is None
    assert snapshot(service) == before
    reason = rejection_of(service, replay).reason
    assert f"it is a replay: the same signed report arrived before as message {original.message_id}" in reason
    assert rejection_of(service, original) is None


def test_a_replayed_preemption_notice_is_rejected_naming_the_first(service):
    """A believed notice replayed under a new id is refused as a replay, after the job moved on to attempt 2."""
    running(service, "train-1")
    original = signed(service, PREEMPTION, notice())
    service.on_preemption(original)
    before = snapshot(service)
    assert before[1:3] == (2, 1)
    replay = InboundMessage("9" + original.message_id, PREEMPTION, original.data, dict(original.attributes))
    assert service.on_preemption(replay) is None
    assert snapshot(service) == before
    assert f"arrived before as message {original.message_id}" in rejection_of(service, replay).reason


def test_a_redelivery_under_the_same_message_id_is_handled_not_rejected(service):
    """Pub/Sub redelivering a believed report keeps its id: it is handled again, idempotently, and never rejected."""
    running(service, "train-1")
    original = signed(service, EVENTS, exited(worker=0))
    service.on_worker_report(original)
    before = snapshot(service)
    again = InboundMessage(original.message_id, EVENTS, original.data, dict(original.attributes))
    assert service.on_worker_report(again) is not None
    assert snapshot(service) == before
    assert rejection_of(service, original) is None
    last = signed(service, EVENTS, exited(worker=1))
    service.on_worker_report(last)
    service.on_worker_report(InboundMessage(last.message_id, EVENTS, last.data, dict(last.attributes)))
    assert service.store.get("train-1").state is JobState.SUCCEEDED
    assert service.store.rejections() == []


def test_a_correctly_signed_exit_zero_from_every_worker_makes_the_job_succeed(service):
    """Both hosts of the v4-16 sign `exited 0` with their attempt's key: SUCCEEDED, exit code 0, no rejection."""
    running(service, "train-1")
    service.on_worker_report(signed(service, EVENTS, exited(worker=0)))
    assert service.store.get("train-1").state is JobState.RUNNING
    service.on_worker_report(signed(service, EVENTS, exited(worker=1)))
    job = service.store.get("train-1")
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert service.store.attempt_workers_succeeded("train-1", 1) == 2
    assert service.store.rejections() == []


def test_the_last_host_of_a_two_slice_job_is_believed(service):
    """Slice 1, worker 1 of a 2-slice v4-16 is a host the job has: its signed `exited 0` counts."""
    running(service, "train-1", slices=2)
    for slice_id in (0, 1):
        for worker in (0, 1):
            service.on_worker_report(signed(service, EVENTS, {**exited(worker=worker), "slice_id": slice_id}))
    assert service.store.get("train-1").state is JobState.SUCCEEDED
    assert service.store.rejections() == []


def test_a_report_for_a_job_that_does_not_exist_is_rejected(service):
    """A signed-looking report naming no stored job is refused, naming the job id."""
    forged = signed(service, EVENTS, exited(job_id="ghost"))
    assert service.on_worker_report(forged) is None
    assert "job_id 'ghost': no such job" in rejection_of(service, forged).reason


def test_a_rejected_message_that_carries_an_attempt_key_is_stored_scrubbed(service, firestore_client):
    """A qr-state message holding an audit-log-like entry with a key: the rejection document read back lacks the key."""
    running(service, "train-1")
    text = signing.key_text(key_of(service, "train-1", 1))
    entry = {
        "protoPayload": {
            "serviceName": "compute.googleapis.com",  # not the TPU API: no audit-log target, a bad qr-state
            "request": {"metadata": {signing.KEY_ATTRIBUTE: text, "startup-script": "#!/bin/bash"}},
        }
    }
    message = inbound("tpujobs-qr-state", entry)
    assert service.on_qr_state(message) is None
    stored = firestore_client.collection(REJECTIONS).document(message.message_id).get().to_dict()
    assert stored is not None
    body = text[len(signing.KEY_PREFIX) :]
    assert body not in json.dumps(stored, default=str)
    assert "tpujobs-key-v1:<redacted>" in stored["payload"]
    assert signing.KEY_ATTRIBUTE in stored["payload"]  # the rest of the payload is kept


def test_a_forged_report_that_carries_an_attempt_key_is_stored_scrubbed(service, firestore_client):
    """An unsigned report whose detail holds the job's key text: rejected, and the key is not in the document."""
    running(service, "train-1")
    text = signing.key_text(key_of(service, "train-1", 1))
    body = {
        "at": utc_now().isoformat(),
        "nonce": secrets.token_hex(16),
        **exited(),
        "kind": "aborted",
        "detail": text,
    }
    message = inbound(EVENTS, body)
    assert service.on_worker_report(message) is None
    stored = firestore_client.collection(REJECTIONS).document(message.message_id).get().to_dict()
    assert "unsigned" in stored["reason"]
    assert text[len(signing.KEY_PREFIX) :] not in json.dumps(stored, default=str)


def test_a_rejected_submission_whose_bad_field_is_an_attempt_key_keeps_no_key(service, firestore_client):
    """A spec refused for a field holding a key text: neither the payload nor the reason of its rejection
    keeps the key."""
    running(service, "train-1")
    text = signing.key_text(key_of(service, "train-1", 1))
    spec = {
        "job_id": "leak-1",
        "name": text,
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    message = inbound("tpujobs-submit", spec)
    assert service.submit(message).kind == "rejected"
    stored = firestore_client.collection(REJECTIONS).document(message.message_id).get().to_dict()
    assert "name" in stored["reason"]
    assert text[len(signing.KEY_PREFIX) :] not in json.dumps(stored, default=str)
