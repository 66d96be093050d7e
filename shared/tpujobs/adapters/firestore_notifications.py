"""Notification records and team defaults in Firestore.

- `jobs/{id}/notifications/{key}`: what became of a job's notifications to one target (key
  `notify-N` for its own N-th target, `team-N` for a default), read by `tpujobs describe`.
- `config/notify`: owner e-mail or `group:NAME` (config/groups) -> a list of targets, as a
  spec's `notify` holds them; an admin edits it in the console. An entry that fails validation
  is left out and logged, so a typo never sends anything anywhere unintended.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.adapters.firestore_documents import JOBS, NOTIFICATIONS
from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.notify import NotifyTarget, targets_from
from tpujobs.engine.notifications import DeliveryRecord

if TYPE_CHECKING:
    from google.cloud import firestore

log = logging.getLogger(__name__)

CONFIG, NOTIFY = "config", "notify"


class FirestoreNotifyConfig:
    """The NotifyConfig port: config/notify, and config/groups through the access policies."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client
        self._policies = FirestoreAccessPolicies(client)

    def notify_defaults(self) -> Mapping[str, Sequence[NotifyTarget]]:
        with transient_on_failure("read config/notify"):
            document = self._db.collection(CONFIG).document(NOTIFY).get().to_dict() or {}
        return defaults_from_document(document)

    def policies(self) -> AccessPolicies:
        return self._policies.policies()


def defaults_from_document(document: Mapping[str, Any]) -> dict[str, list[NotifyTarget]]:
    """config/notify's entries that validate; each other one logged and left out."""
    found: dict[str, list[NotifyTarget]] = {}
    for who, entries in document.items():
        if not isinstance(entries, list):
            log.warning("config/notify.%s is not a list of targets: ignored", who)
            continue
        try:
            found[who] = targets_from(entries, f"config/notify.{who}")
        except ValueError as error:
            log.warning("%s: ignored", error)
    return found


class FirestoreDeliveryRecords:
    """The DeliveryRecords port: one document per job and target."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def _doc(self, job_id: str, key: str) -> Any:
        return self._db.collection(JOBS).document(job_id).collection(NOTIFICATIONS).document(key)

    def read(self, job_id: str, key: str) -> DeliveryRecord | None:
        with transient_on_failure(f"read notification record {job_id}/{key}"):
            data = self._doc(job_id, key).get().to_dict()
        return record_from_document(data) if data else None

    def write(self, job_id: str, key: str, record: DeliveryRecord) -> None:
        with transient_on_failure(f"write notification record {job_id}/{key}"):
            self._doc(job_id, key).set(record_document(record))


def record_document(record: DeliveryRecord) -> dict[str, Any]:
    return {
        "target": record.target,
        "event": record.event,
        "state": record.state,
        "attempts": record.attempts,
        "delivered": list(record.delivered),
        "last_error": record.last_error,
        "gave_up": record.gave_up,
        "updated_at": record.updated_at,
    }


def record_from_document(data: Mapping[str, Any]) -> DeliveryRecord:
    updated = data.get("updated_at")
    return DeliveryRecord(
        target=str(data.get("target", "")),
        event=str(data.get("event", "")),
        state=str(data.get("state", "")),
        attempts=int(data.get("attempts", 0)),
        delivered=tuple(str(event) for event in data.get("delivered", [])),
        last_error=str(data.get("last_error", "")),
        gave_up=bool(data.get("gave_up", False)),
        updated_at=updated if isinstance(updated, datetime) else None,
    )
