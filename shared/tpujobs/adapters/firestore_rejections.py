"""Messages the engine refused or has seen, on Firestore: `rejections/{message_id}` and
`reports_seen/{digest}`, each with an `expire_at` for Firestore's TTL."""

from __future__ import annotations

from datetime import datetime, timedelta

from google.api_core import exceptions as api_exceptions
from google.cloud import firestore

from tpujobs.adapters.firestore_documents import (
    MAX_PAYLOAD_CHARS,
    REJECTIONS,
    REPORT_MEMORY,
    REPORTS_SEEN,
    rejection_document_id,
    rejection_from_document,
)
from tpujobs.adapters.firestore_reads import OnFirestore, transient_on_failure
from tpujobs.engine.ports import Rejection


class FirestoreMessageRecords(OnFirestore):
    """`ports.MessageRecords` and the rejection reads, on Firestore."""

    def __init__(self, client: firestore.Client, rejection_retention: timedelta = timedelta(days=30)) -> None:
        """`rejection_retention`: how long a rejection is kept (TPUJOBS_REJECTION_RETENTION_DAYS)."""
        OnFirestore.__init__(self, client)
        self._rejection_retention = rejection_retention

    def reject(self, rejection: Rejection) -> None:
        ref = self._db.collection(REJECTIONS).document(rejection_document_id(rejection.message_id))
        with transient_on_failure("record rejection"):
            ref.set(
                {
                    "at": rejection.at,
                    "reason": rejection.reason,
                    "payload": rejection.payload[:MAX_PAYLOAD_CHARS],
                    "topic": rejection.topic,
                    "message_id": rejection.message_id,
                    # how often this message was seen (redelivered), or how many forgeries it counts
                    "deliveries": firestore.Increment(rejection.count),
                    "expire_at": rejection.at + self._rejection_retention,  # Firestore's TTL deletes it then
                },
                merge=True,
            )

    def remember_report(self, digest: str, message_id: str, job_id: str, attempt: int, now: datetime) -> str:
        """The id of the first message that carried this signed report: `message_id` if new."""
        ref = self._db.collection(REPORTS_SEEN).document(digest)
        fields = {"message_id": message_id, "job_id": job_id, "attempt": attempt, "seen_at": now,
                  "expire_at": now + REPORT_MEMORY}  # fmt: skip
        with transient_on_failure("remember a signed report"):
            try:
                ref.create(fields)
                return message_id
            except api_exceptions.Conflict:  # AlreadyExists: seen before, maybe by this very message
                pass
        with transient_on_failure("read a remembered report"):
            first = ref.get().to_dict() or {}
        return str(first.get("message_id") or message_id)

    def recall_report(self, digest: str) -> str | None:
        with transient_on_failure("read a remembered report"):
            first = self._db.collection(REPORTS_SEEN).document(digest).get().to_dict() or {}
        return str(first["message_id"]) if first.get("message_id") else None

    def rejections(self, limit: int = 100) -> list[Rejection]:
        with transient_on_failure("list rejections"):
            docs = list(self._db.collection(REJECTIONS).limit(limit).stream())
        return [
            Rejection(
                message_id=d.get("message_id") or doc.id,
                at=d["at"],
                reason=d["reason"],
                payload=d.get("payload", ""),
                topic=d.get("topic", ""),
            )
            for doc in docs
            for d in [doc.to_dict() or {}]
        ]

    def recent_rejections(self, limit: int = 50) -> list[Rejection]:
        """The newest rejections first (`tpujobs rejections`)."""
        with transient_on_failure("list recent rejections"):
            docs = list(
                self._db.collection(REJECTIONS)
                .order_by("at", direction=firestore.Query.DESCENDING)
                .limit(limit)
                .stream()
            )
        return [rejection_from_document(doc.id, doc.to_dict() or {}) for doc in docs]

    def rejection(self, message_id: str) -> Rejection | None:
        """The rejection of one message, if it was refused (`submit --wait`)."""
        with transient_on_failure("read a rejection"):
            doc = self._db.collection(REJECTIONS).document(rejection_document_id(message_id)).get()
        return rejection_from_document(doc.id, doc.to_dict() or {}) if doc.exists else None
