"""Rejections and the signed reports seen, in memory: `rejections/{id}` and `reports_seen/{digest}`."""

from __future__ import annotations

import copy
from datetime import datetime

from tpujobs.adapters.firestore_documents import (
    MAX_PAYLOAD_CHARS,
    REPORT_MEMORY,
    rejection_document_id,
    rejection_from_document,
)
from tpujobs.engine.ports import Rejection
from tpujobs.local.fakes.documents import Collections, Document


class InMemoryMessageRecords(Collections):
    """`ports.MessageRecords` and the rejection reads."""

    def reject(self, rejection: Rejection) -> None:
        with self._lock:
            document = self._rejections.setdefault(rejection_document_id(rejection.message_id), {})
            document.update(
                at=rejection.at,
                reason=rejection.reason,
                payload=rejection.payload[:MAX_PAYLOAD_CHARS],
                topic=rejection.topic,
                message_id=rejection.message_id,
                deliveries=document.get("deliveries", 0) + rejection.count,
                expire_at=rejection.at + self._rejection_retention,
            )

    def remember_report(self, digest: str, message_id: str, job_id: str, attempt: int, now: datetime) -> str:
        with self._lock:
            first = self._reports_seen.setdefault(
                digest,
                {"message_id": message_id, "job_id": job_id, "attempt": attempt, "seen_at": now,
                 "expire_at": now + REPORT_MEMORY},
            )  # fmt: skip
            return str(first.get("message_id") or message_id)

    def recall_report(self, digest: str) -> str | None:
        with self._lock:
            first = self._reports_seen.get(digest) or {}
            return str(first["message_id"]) if first.get("message_id") else None

    def rejections(self, limit: int = 100) -> list[Rejection]:
        """Rejections in document-id order, as a plain listing of the collection returns them."""
        with self._lock:
            return [rejection_from_document(k, dict(d)) for k, d in sorted(self._rejections.items())[:limit]]

    def rejection_documents(self) -> list[Document]:
        """Every rejection as stored (`deliveries` and `expire_at` included), in document-id order."""
        with self._lock:
            return [copy.deepcopy(d) for _, d in sorted(self._rejections.items())]

    def recent_rejections(self, limit: int = 50) -> list[Rejection]:
        with self._lock:
            newest = sorted(self._rejections.items(), key=lambda kv: (kv[1]["at"], kv[0]), reverse=True)
            return [rejection_from_document(k, dict(d)) for k, d in newest[:limit]]

    def rejection(self, message_id: str) -> Rejection | None:
        with self._lock:
            document_id = rejection_document_id(message_id)
            document = self._rejections.get(document_id)
            return rejection_from_document(document_id, dict(document)) if document is not None else None
