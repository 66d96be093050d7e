"""Hostile messages only Firestore refuses, on the emulators: the handler returns and records a rejection.

Integers beyond Firestore's 64 bits, timestamps whose UTC time leaves years 1..9999 and lone
surrogates in env values pass the engine's validation, then the Firestore client cannot encode
them. The properties (every handler, random and hostile input, each message accounted for) run
on the fakes: tests/unit/engine/test_engine_fuzz_handlers.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.fuzz_messages import ADMIN, message, next_id, spec_of, three_live_jobs
from tpujobs.adapters.firestore_store import REJECTIONS
from tpujobs.engine.services import Engine
from tpujobs.local.testing import signed

pytestmark = pytest.mark.emulator


@pytest.fixture
def service(job_service) -> Engine:
    """ONE JobService for the whole test function: every hypothesis example shares it."""
    return job_service(admins=(ADMIN,), stuck_after_seconds=0.0)


@pytest.fixture
def jobs(service: Engine) -> list[str]:
    return three_live_jobs(service.submission.submit)


def rejection(firestore_client, message_id: str) -> dict[str, Any] | None:
    snapshot = firestore_client.collection(REJECTIONS).document(message_id).get()
    return snapshot.to_dict() if snapshot.exists else None


def test_an_env_value_holding_a_lone_surrogate_is_rejected_not_raised(service, firestore_client) -> None:
    """{"env": {"A": "\\ud800"}} passes validation, then Firestore cannot encode it: UnicodeEncodeError."""
    payload = json.dumps(spec_of(f"surrogate-{next_id()}", env={"A": "\ud800"})).encode()
    inbound = message("tpujobs-submit", payload)
    outcome = service.submission.submit(inbound)  # today: UnicodeEncodeError from the Firestore client
    assert outcome.kind == "rejected"
    assert (rejection(firestore_client, inbound.message_id) or {}).get("reason")


@pytest.mark.parametrize(
    "extra",
    [
        {"kind": "exited", "exit_code": 2**63},
        {"kind": "exited", "exit_code": -(2**63) - 1},
        {"kind": "checkpoint", "step": 2**64},
        {"kind": "started", "at": "9999-12-31T23:59:59-14:00"},
        {"kind": "exited", "exit_code": 0, "at": "0001-01-01T00:00:00+14:00"},
    ],
    ids=[
        "exit-code-2^63",
        "exit-code-below-int64",
        "step-2^64",
        "at-after-9999-utc",
        "at-before-0001-utc",
    ],
)
def test_a_worker_report_firestore_cannot_store_is_rejected_not_raised(service, firestore_client, jobs, extra) -> None:
    """Unbounded ints and offsets pushing `at` out of years 1..9999 pass WorkerReport, then record_worker raises."""
    payload = {"job_id": jobs[0], "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
    inbound = signed(service, "tpujobs-worker-events", payload)
    result = service.worker_events.on_worker_report(inbound)  # today: ValueError (int64) or OverflowError (date)
    assert result is not None or (rejection(firestore_client, inbound.message_id) or {}).get("reason")
