"""What the handler fuzz tests share, on the fakes (tests/unit/engine) and on the emulators
(tests/emulator): message ids, a spec that survives errors, and three live jobs to report about."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from tpujobs.engine.inbound import InboundMessage

OWNER = "ada@example.com"
ADMIN = "root@example.com"

_ids = itertools.count(500_000)


def next_id() -> str:
    return str(next(_ids))


def spec_of(job_id: str, **changes: Any) -> dict[str, Any]:
    """A job that outlives what a fuzzed report does to it: it resumes on errors, 100 times."""
    return {
        "job_id": job_id,
        "name": "fuzz",
        "owner": OWNER,
        "accelerator_type": "v4-16",
        "command": "python train.py",
        "on_preemption": "resume",
        "on_error": "resume",
        "max_restarts": 100,
        **changes,
    }


def message(topic: str, payload: Any, message_id: str | None = None) -> InboundMessage:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return InboundMessage(message_id or next_id(), topic, data)


def three_live_jobs(submit: Callable[[InboundMessage], Any]) -> list[str]:
    """Three jobs the reports of a test talk about, submitted with `submit` and PROVISIONING:
    a v4-16, a v4-8 that reruns on errors, and two slices."""
    ids = []
    for n, changes in enumerate([{}, {"on_error": "rerun", "accelerator_type": "v4-8"}, {"slices": 2}]):
        job_id = f"known-{n}-{next_id()}"
        outcome = submit(message("tpujobs-submit", spec_of(job_id, **changes)))
        assert outcome.kind == "provisioning", outcome
        ids.append(job_id)
    return ids
