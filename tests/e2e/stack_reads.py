"""What end-to-end tests read back from the local stack's Storage: one worker's output as its
agent shipped it (the chunks, before any export), and the checkpoint the example trainer keeps."""

from __future__ import annotations

import json
from typing import Any


def worker_output(env: dict[str, Any], job_id: str, attempt: int = 1, worker: str = "0-0") -> str:
    """The output chunks of one worker ("slice-worker") of an attempt, in order, as text."""
    slice_id, worker_id = worker.split("-")
    prefix = f"logs/jobs/{job_id}/attempt-{attempt}/chunks/slice-{slice_id}-worker-{worker_id}/"
    blobs = sorted(
        (b for b in env["storage"].list_blobs(env["bucket"], prefix=prefix) if b.name.endswith(".log")),
        key=lambda b: b.name,
    )
    return "".join(b.download_as_text() for b in blobs)


def checkpoint_state(env: dict[str, Any], job_id: str) -> dict[str, Any]:
    """The example trainer's `state.json` under the job's checkpoint prefix; {} before its first."""
    blob = env["storage"].bucket(env["bucket"]).blob(f"checkpoints/jobs/{job_id}/state.json")
    return dict(json.loads(blob.download_as_text())) if blob.exists() else {}
