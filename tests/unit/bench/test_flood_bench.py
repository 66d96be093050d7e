"""bench/flood.py's pure parts: its forgeries are refused by the engine's check, its schedule and percentile.

A full run takes minutes and is a measurement, not a test: nothing here starts an emulator.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from tpujobs.domain import signing
from tpujobs.local.testing import local_settings

_PATH = Path(__file__).resolve().parents[3] / "bench" / "flood.py"
sys.path.insert(0, str(_PATH.parent))  # as when it runs: the bench folder's helpers import by name
_SPEC = importlib.util.spec_from_file_location("bench_flood", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
flood = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_flood"] = flood  # dataclasses look their module up by name
_SPEC.loader.exec_module(flood)

JOB = SimpleNamespace(job_id="train-1", created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_each_kind_of_forgery_is_refused_unread_for_its_own_reason() -> None:
    """Unsigned, a signature of zeros and a wrong key: three forgeries, three different refusals."""
    keys = local_settings().master_keys()
    reasons = {}
    for kind in flood.FORGERY_KINDS:
        message = flood.forgery(kind, JOB, keys, datetime.now(timezone.utc).isoformat())
        reasons[kind] = signing.forgery(keys, "train-1", 1, message.data, message.attributes)
    assert reasons == {
        "unsigned": signing.UNSIGNED,
        "zero signature": signing.MALFORMED,
        "wrong key": signing.MISMATCH,
    }


def test_a_forgery_names_a_real_jobs_attempt_and_is_a_well_formed_heartbeat() -> None:
    """The flood must reach the signature check, not fail decoding: it reads like a real heartbeat."""
    message = flood.forgery("wrong key", JOB, None, "2026-01-01T00:00:00+00:00")
    body = json.loads(message.data)
    assert body["kind"] == "heartbeat" and body["job_id"] == "train-1" and body["attempt"] == 1
    assert message.topic == flood.EVENTS
    assert signing.KEY_VERSION_ATTRIBUTE not in message.attributes  # a tree without key versions: none named


def test_the_schedule_spreads_messages_evenly_over_the_phase() -> None:
    """1,000 messages in 10 s: one every 10 ms, the last before the end."""
    due = flood.schedule(1000, 10.0)
    assert len(due) == 1000 and due[0] == 0.0 and due[1] == 0.01 and due[-1] < 10.0


def test_the_p95_is_the_nearest_rank() -> None:
    """Of 1..100, the p95 is 95 (nearest rank), the p50 is 50 or 51."""
    values = [float(v) for v in range(100, 0, -1)]
    assert flood.percentile(values, 0.95) == 95.0
    assert flood.percentile(values, 0.5) in (50.0, 51.0)
