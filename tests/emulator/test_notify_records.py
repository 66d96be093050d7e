"""Notification records and team defaults on the real Firestore emulator: what the notifier
writes is what `describe` reads, config/notify and config/groups decide a job's defaults, and an
expired job takes its records with it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.adapters.firestore_notifications import FirestoreDeliveryRecords, FirestoreNotifyConfig
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.domain.notify import NotifyTarget, team_defaults
from tpujobs.engine.notifications import DeliveryRecord

pytestmark = pytest.mark.emulator

AT = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)


def test_a_record_written_is_read_back_and_shown_by_describe(firestore_client) -> None:
    """Round trip through FirestoreDeliveryRecords; the job store lists it under its key."""
    records = FirestoreDeliveryRecords(firestore_client)
    record = DeliveryRecord("webhook_secret slack").after_failure(
        "j-1/4", "FAILED", "the webhook answered 503", AT, final=False
    )
    records.write("j-1", "notify-1", record)
    assert records.read("j-1", "notify-1") == record
    assert records.read("j-1", "notify-0") is None
    [shown] = FirestoreJobStore(firestore_client).notification_documents("j-1")
    assert (shown["id"], shown["target"], shown["attempts"], shown["gave_up"]) == (
        "notify-1",
        "webhook_secret slack",
        1,
        False,
    )


def test_config_notify_and_groups_give_an_owner_its_defaults(firestore_client) -> None:
    """config/notify by group, config/groups for membership; a bad entry is left out."""
    config = firestore_client.collection("config")
    config.document("groups").set({"ml": ["ada@example.com"]})
    config.document("notify").set(
        {
            "group:ml": [{"webhook_secret": "slack", "on": ["FAILED"]}],
            "bob@example.com": [{"webhook": "http://x.example.com"}],
        }
    )
    reader = FirestoreNotifyConfig(firestore_client)
    defaults = reader.notify_defaults()
    assert dict(defaults) == {"group:ml": [NotifyTarget(webhook_secret="slack", on=["FAILED"])]}
    members = reader.policies().members("ada@example.com")
    assert team_defaults(defaults, members) == [NotifyTarget(webhook_secret="slack", on=["FAILED"])]


def test_an_expired_job_is_pruned_with_its_notification_records(firestore_client) -> None:
    """prune_expired_jobs deletes jobs/{id}/notifications too: TTL would leave them behind."""
    firestore_client.collection("jobs").document("j-2").set({"expire_at": AT, "state": "SUCCEEDED"})
    FirestoreDeliveryRecords(firestore_client).write("j-2", "notify-0", DeliveryRecord("webhook"))
    assert FirestoreJobStore(firestore_client).prune_expired_jobs(AT + timedelta(seconds=1)) == ["j-2"]
    assert FirestoreJobStore(firestore_client).notification_documents("j-2") == []
