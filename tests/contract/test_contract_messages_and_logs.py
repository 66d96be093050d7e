"""The contract of `ports.MessageRecords`, the rejection reads and `ports.AttemptLogStore`."""

from __future__ import annotations

from datetime import timedelta

from contract_data import T0, a_job

from tpujobs.engine.ports import AttemptLogs, Rejection


def test_a_rejection_is_kept_once_per_message_newest_first(backend):
    """A redelivery adds no second record; the payload is cut to 4 KiB; recent ones come newest first."""
    store = backend.jobs
    first = Rejection("1234", T0, "field 'name' is required", "x" * 5000, "tpujobs-submit")
    store.reject(first)
    store.reject(first)
    store.reject(Rejection("1235", T0 + timedelta(seconds=1), "bad", "{}", "tpujobs-control"))
    assert [r.message_id for r in store.rejections()] == ["1234", "1235"]
    assert [r.message_id for r in store.recent_rejections(limit=1)] == ["1235"]
    stored = store.rejection("1234")
    assert stored == Rejection("1234", T0, "field 'name' is required", "x" * 4096, "tpujobs-submit")
    assert store.rejection("9999") is None


def test_a_signed_report_is_remembered_by_its_first_message(backend):
    """The digest's first message id is the answer for every later message carrying it."""
    store = backend.jobs
    assert store.remember_report("d1", "100", "train-1", 1, T0) == "100"
    assert store.remember_report("d1", "101", "train-1", 1, T0) == "100"
    assert store.remember_report("d2", "101", "train-1", 1, T0) == "101"
    assert (store.recall_report("d1"), store.recall_report("d2"), store.recall_report("d3")) == ("100", "101", None)


def test_exported_logs_are_kept_and_the_job_points_at_the_latest_attempt(backend):
    """A late export of attempt 1 never takes log_uri from attempt 2; a re-export replaces worker_logs."""
    store = backend.jobs
    store.create(*a_job())
    uri = "gs://logs/train-1/attempt-{}/attempt.log"
    second = AttemptLogs(2, uri.format(2), {0: "gs://logs/w0", 1: "gs://logs/w1"}, T0, cut_off_workers=(1,))
    store.record_attempt_logs("train-1", second)
    store.record_attempt_logs("train-1", AttemptLogs(1, uri.format(1), {0: "gs://logs/a1w0"}, T0))
    assert store.get("train-1").log_uri == uri.format(2)
    assert store.attempt_logs("train-1", 2) == second
    again = AttemptLogs(2, uri.format(2), {0: "gs://logs/w0-again"}, T0 + timedelta(minutes=1))
    store.record_attempt_logs("train-1", again)
    assert store.attempt_logs("train-1", 2) == again
    assert [d["id"] for d in store.attempt_documents("train-1")] == ["1", "2"]
    assert store.attempt_logs("train-1", 3) is None
    store.record_attempt_logs("ghost", AttemptLogs(1, uri.format(1), {}, T0))  # no job: nothing to point
    assert store.get("ghost") is None
