"""Signed worker reports, on the fakes and the TPU simulator: forgeries change nothing.

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
from engine_harness import Engine

from tpujobs.domain import signing
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.local.testing import inbound, signed

EVENTS = "tpujobs-worker-events"
PREEMPTION = "tpujobs-preemption"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(stuck_after_seconds=0.0)


def submit(jobs: Engine, job_id: str, **changes: Any) -> str:
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
    assert jobs.submit(spec).kind == "provisioning"
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


def signed_with(key: bytes, topic: str, payload: dict, jobs: Engine | None = None) -> InboundMessage:
    """A message whose bytes are `payload` (with a time and a nonce), signed with `key`, whoever's it
    is, naming the current master key and the creation time of the job it names (public facts)."""
    body = {"at": utc_now().isoformat(), "nonce": secrets.token_hex(16), **payload}
    data = json.dumps(body).encode()
    job = None if jobs is None else jobs.store.get(body["job_id"])
    created = "0" if job is None or job.created_at is None else str(signing.created_micros(job.created_at))
    attributes = {
        signing.SIGNATURE_ATTRIBUTE: signing.sign(key, data),
        signing.KEY_VERSION_ATTRIBUTE: "1",
        signing.JOB_CREATED_ATTRIBUTE: created,
    }
    return InboundMessage(str(secrets.randbelow(10**15)), topic, data, attributes)


def key_of(jobs: Engine, job_id: str, attempt: int) -> bytes:
    """The attempt key of a stored job, as its hosts hold it."""
    job = jobs.store.get(job_id)
    assert job is not None and job.created_at is not None
    return signing.attempt_key(jobs.settings.report_key, job_id, job.created_at, attempt)


def running(jobs: Engine, job_id: str = "train-1", **changes: Any) -> str:
    """A job submitted and RUNNING: its worker 0 said `started`, signed."""
    submit(jobs, job_id, **changes)
    jobs.report("started", 1, job_id=job_id)
    assert jobs.store.get(job_id).state is JobState.RUNNING
    return job_id


def snapshot(jobs: Engine, job_id: str = "train-1") -> tuple:
    """What a forgery must not change: state, attempt, restarts, exit code, workers done, events."""
    job = jobs.store.get(job_id)
    return (
        job.state,
        job.attempt,
        job.restarts,
        job.exit_code,
        jobs.store.attempt_workers_succeeded(job_id, job.attempt),  # the workers done
        len(jobs.store.events(job_id)),
    )


def rejection_of(jobs: Engine, message: InboundMessage):
    """The rejection recorded for `message`, or None."""
    return next((r for r in jobs.store.rejections() if r.message_id == message.message_id), None)


def stored_rejection(jobs: Engine, message: InboundMessage) -> dict:
    """The rejection of `message` as the store keeps it."""
    return next(d for d in jobs.store.rejection_documents() if d["message_id"] == message.message_id)


# Each forgery: how to build it from the jobs (the RUNNING train-1 and a RUNNING train-2 exist),
# and what its rejection's reason must say.
Forgery = Callable[[Engine], InboundMessage]


def unsigned_exit(jobs: Engine) -> InboundMessage:
    body = {"at": utc_now().isoformat(), "nonce": secrets.token_hex(16), **exited()}
    return inbound(EVENTS, body)


def exit_signed_with_another_jobs_key(jobs: Engine) -> InboundMessage:
    return signed_with(key_of(jobs, "train-2", 1), EVENTS, exited(), jobs)


def exit_signed_for_another_job_then_retargeted(jobs: Engine) -> InboundMessage:
    genuine = signed(jobs, EVENTS, exited(job_id="train-2"))
    body = json.loads(genuine.data)
    body["job_id"] = "train-1"
    return InboundMessage(genuine.message_id, EVENTS, json.dumps(body).encode(), dict(genuine.attributes))


def notice_signed_with_another_attempts_key(jobs: Engine) -> InboundMessage:
    return signed_with(key_of(jobs, "train-1", 2), PREEMPTION, notice(), jobs)


def notice_signed_with_another_jobs_key(jobs: Engine) -> InboundMessage:
    return signed_with(key_of(jobs, "train-2", 1), PREEMPTION, notice(), jobs)


def exit_from_worker_2(jobs: Engine) -> InboundMessage:
    return signed(jobs, EVENTS, exited(worker=2))


def exit_from_slice_1(jobs: Engine) -> InboundMessage:
    return signed(jobs, EVENTS, {**exited(), "slice_id": 1})


def notice_from_slice_1(jobs: Engine) -> InboundMessage:
    return signed(jobs, PREEMPTION, {**notice(), "slice_id": 1})


def exit_before_the_attempt_began(jobs: Engine) -> InboundMessage:
    job = jobs.store.get("train-1")
    return signed(jobs, EVENTS, exited(at=(job.created_at - timedelta(hours=1)).isoformat()))


def exit_an_hour_in_the_future(jobs: Engine) -> InboundMessage:
    return signed(jobs, EVENTS, exited(at=(utc_now() + timedelta(hours=1)).isoformat()))


def notice_an_hour_in_the_future(jobs: Engine) -> InboundMessage:
    return signed(jobs, PREEMPTION, {**notice(), "at": (utc_now() + timedelta(hours=1)).isoformat()})


def exit_of_an_attempt_the_job_has_not_reached(jobs: Engine) -> InboundMessage:
    return signed(jobs, EVENTS, exited(attempt=2))


FORGERIES: list[tuple[Forgery, str]] = [
    (unsigned_exit, signing.UNSIGNED),
    (
        exit_signed_with_another_jobs_key,
        signing.MISMATCH,
    ),
    (
        exit_signed_for_another_job_then_retargeted,
        signing.MISMATCH,
    ),
    (
        notice_signed_with_another_attempts_key,
        signing.MISMATCH,
    ),
    (
        notice_signed_with_another_jobs_key,
        signing.MISMATCH,
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
def test_a_forged_report_changes_nothing_and_is_rejected_with_a_sentence(jobs, forge, why):
    """The forgery leaves state, attempt, restarts, exit code and events as they were, and its rejection says why."""
    running(jobs, "train-1")
    running(jobs, "train-2")
    before, other_before = snapshot(jobs, "train-1"), snapshot(jobs, "train-2")
    forged = forge(jobs)
    assert jobs.handle(forged) is None
    assert snapshot(jobs, "train-1") == before
    assert snapshot(jobs, "train-2") == other_before
    rejection = rejection_of(jobs, forged)
    assert rejection is not None, f"no rejection for {forge.__name__}"
    assert rejection.topic == forged.topic
    assert rejection.reason.startswith("Report for train-1 attempt ") and rejection.reason.endswith(".")
    assert why in rejection.reason


def test_a_notice_from_a_leftover_host_of_the_previous_attempt_cannot_stop_the_next(jobs):
    """At attempt 2, a notice naming attempt 2 but signed with attempt 1's key (which that job's old code holds) is
    refused."""
    running(jobs, "train-1")
    jobs.handle(signed(jobs, PREEMPTION, notice()))
    jobs.report("started", 2)
    assert (jobs.store.get("train-1").state, jobs.store.get("train-1").attempt) == (
        JobState.RUNNING,
        2,
    )
    before = snapshot(jobs)
    forged = signed_with(key_of(jobs, "train-1", 1), PREEMPTION, notice(attempt=2), jobs)
    assert jobs.handle(forged) is None
    assert snapshot(jobs) == before
    assert signing.MISMATCH in rejection_of(jobs, forged).reason


def test_a_replay_under_a_new_message_id_is_rejected_naming_the_first(jobs):
    """The same signed bytes and attributes under a new id, after the original was believed, are a replay."""
    running(jobs, "train-1")
    original = signed(jobs, EVENTS, exited(worker=0))
    jobs.handle(original)
    assert jobs.store.attempt_workers_succeeded("train-1", 1) == 1
    before = snapshot(jobs)
    replay = InboundMessage("9" + original.message_id, EVENTS, original.data, dict(original.attributes))
    assert jobs.handle(replay) is None
    assert snapshot(jobs) == before
    reason = rejection_of(jobs, replay).reason
    assert f"it is a replay: the same signed report arrived before as message {original.message_id}" in reason
    assert rejection_of(jobs, original) is None


def test_a_replayed_preemption_notice_is_rejected_naming_the_first(jobs):
    """A believed notice replayed under a new id is refused as a replay, after the job moved on to attempt 2."""
    running(jobs, "train-1")
    original = signed(jobs, PREEMPTION, notice())
    jobs.handle(original)
    before = snapshot(jobs)
    assert before[1:3] == (2, 1)
    replay = InboundMessage("9" + original.message_id, PREEMPTION, original.data, dict(original.attributes))
    assert jobs.handle(replay) is None
    assert snapshot(jobs) == before
    assert f"arrived before as message {original.message_id}" in rejection_of(jobs, replay).reason


def test_a_redelivery_under_the_same_message_id_is_handled_not_rejected(jobs):
    """Pub/Sub redelivering a believed report keeps its id: it is handled again, idempotently, and never rejected."""
    running(jobs, "train-1")
    original = signed(jobs, EVENTS, exited(worker=0))
    jobs.handle(original)
    before = snapshot(jobs)
    again = InboundMessage(original.message_id, EVENTS, original.data, dict(original.attributes))
    assert jobs.handle(again) is not None
    assert snapshot(jobs) == before
    assert rejection_of(jobs, original) is None
    last = signed(jobs, EVENTS, exited(worker=1))
    jobs.handle(last)
    jobs.handle(InboundMessage(last.message_id, EVENTS, last.data, dict(last.attributes)))
    assert jobs.store.get("train-1").state is JobState.SUCCEEDED
    assert jobs.store.rejections() == []


def test_a_correctly_signed_exit_zero_from_every_worker_makes_the_job_succeed(jobs):
    """Both hosts of the v4-16 sign `exited 0` with their attempt's key: SUCCEEDED, exit code 0, no rejection."""
    running(jobs, "train-1")
    jobs.handle(signed(jobs, EVENTS, exited(worker=0)))
    assert jobs.store.get("train-1").state is JobState.RUNNING
    jobs.handle(signed(jobs, EVENTS, exited(worker=1)))
    job = jobs.store.get("train-1")
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert jobs.store.attempt_workers_succeeded("train-1", 1) == 2
    assert jobs.store.rejections() == []


def test_the_last_host_of_a_two_slice_job_is_believed(jobs):
    """Slice 1, worker 1 of a 2-slice v4-16 is a host the job has: its signed `exited 0` counts."""
    running(jobs, "train-1", slices=2)
    for slice_id in (0, 1):
        for worker in (0, 1):
            jobs.handle(signed(jobs, EVENTS, {**exited(worker=worker), "slice_id": slice_id}))
    assert jobs.store.get("train-1").state is JobState.SUCCEEDED
    assert jobs.store.rejections() == []


def test_a_report_for_a_job_that_does_not_exist_is_rejected(jobs):
    """A signed-looking report naming no stored job is refused, naming the job id."""
    forged = signed(jobs, EVENTS, exited(job_id="ghost"))
    assert jobs.handle(forged) is None
    assert "job_id 'ghost': no such job" in rejection_of(jobs, forged).reason


def test_a_rejected_message_that_carries_an_attempt_key_is_stored_scrubbed(jobs):
    """A qr-state message holding an audit-log-like entry with a key: the rejection document read back lacks the key."""
    running(jobs, "train-1")
    text = signing.key_text(key_of(jobs, "train-1", 1))
    entry = {
        "protoPayload": {
            "jobsName": "compute.googleapis.com",  # not the TPU API: no audit-log target, a bad qr-state
            "request": {"metadata": {"tpujobs-report-key": text, "startup-script": "#!/bin/bash"}},
        }
    }
    message = inbound("tpujobs-qr-state", entry)
    assert jobs.handle(message) is None
    stored = stored_rejection(jobs, message)
    assert stored is not None
    body = text[len(signing.KEY_PREFIX) :]
    assert body not in json.dumps(stored, default=str)
    assert "tpujobs-key-v1:<redacted>" in stored["payload"]
    assert "tpujobs-report-key" in stored["payload"]  # the rest of the payload is kept


def test_a_forged_report_that_carries_an_attempt_key_is_stored_scrubbed(jobs):
    """An unsigned report whose detail holds the job's key text: rejected, and the key is not in the document."""
    running(jobs, "train-1")
    text = signing.key_text(key_of(jobs, "train-1", 1))
    body = {
        "at": utc_now().isoformat(),
        "nonce": secrets.token_hex(16),
        **exited(),
        "kind": "aborted",
        "detail": text,
    }
    message = inbound(EVENTS, body)
    assert jobs.handle(message) is None
    stored = stored_rejection(jobs, message)
    assert "unsigned" in stored["reason"]
    assert text[len(signing.KEY_PREFIX) :] not in json.dumps(stored, default=str)


def test_a_rejected_submission_whose_bad_field_is_an_attempt_key_keeps_no_key(jobs):
    """A spec refused for a field holding a key text: neither the payload nor the reason of its rejection
    keeps the key."""
    running(jobs, "train-1")
    text = signing.key_text(key_of(jobs, "train-1", 1))
    spec = {
        "job_id": "leak-1",
        "name": text,
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    message = inbound("tpujobs-submit", spec)
    assert jobs.handle(message).kind == "rejected"
    stored = stored_rejection(jobs, message)
    assert "name" in stored["reason"]
    assert text[len(signing.KEY_PREFIX) :] not in json.dumps(stored, default=str)
