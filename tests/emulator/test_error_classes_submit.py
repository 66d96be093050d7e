"""Error classes through the real submit path on the Firestore emulator: a retry_on.output
pattern that is not a regular expression is a rejection with its sentence, and no job."""

from __future__ import annotations

from typing import Any

import pytest

from tpujobs.adapters.firestore_store import JOBS, REJECTIONS
from tpujobs.local.testing import inbound

pytestmark = pytest.mark.emulator


def a_spec(**changes: Any) -> dict[str, Any]:
    return {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        **changes,
    }


def test_a_retry_on_pattern_that_does_not_compile_is_a_rejection_naming_it(job_service, firestore_client):
    """tpujobs-submit with retry_on.output ["(unclosed"]: rejected, the sentence stored, no job."""
    service = job_service()
    outcome = service.submit(inbound("tpujobs-submit", a_spec(retry_on={"output": ["ok", "(unclosed"]}), "701"))
    assert outcome.kind == "rejected"
    docs = [doc.to_dict() for doc in firestore_client.collection(REJECTIONS).stream()]
    assert len(docs) == 1
    assert docs[0]["message_id"] == "701"
    assert "retry_on.output pattern '(unclosed' is not a regular expression" in docs[0]["reason"]
    assert firestore_client.collection(JOBS).document("train-1").get().exists is False


def test_valid_patterns_make_a_job_that_keeps_them(job_service, firestore_client):
    """The same spec with patterns that compile becomes a job whose stored spec has them."""
    service = job_service()
    outcome = service.submit(inbound("tpujobs-submit", a_spec(retry_on={"output": ["DEADLINE_EXCEEDED"]})))
    assert outcome.kind != "rejected", outcome.reason
    job = service.store.get("train-1")
    assert job is not None and job.spec.retry_on is not None
    assert job.spec.retry_on.output == ["DEADLINE_EXCEEDED"]
