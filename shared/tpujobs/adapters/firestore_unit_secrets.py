"""Each warm-pool unit VM's registered secret hash, on Firestore: `unit_secrets/{digest}`, made
with `create` so that the first registration wins (`engine.jobs_api.unit_secrets`).

No `expire_at`: a unit's VM may live for months, and a record that expired would let the next
registration, maybe a job's leftover process's, win. One small document per unit VM ever made.
"""

from __future__ import annotations

from datetime import datetime

from google.api_core import exceptions as api_exceptions
from google.cloud import firestore

from tpujobs.adapters.firestore_reads import OnFirestore, transient_on_failure

UNIT_SECRETS = "unit_secrets"  # {digest}: the SHA-256 of one unit VM's secret, and refusals counted


class FirestoreUnitSecrets(OnFirestore):
    """`ports.UnitSecretRecords` on Firestore."""

    def register_unit_secret(self, digest: str, secret_sha256: str, instance_id: str, now: datetime) -> str:
        ref = self._db.collection(UNIT_SECRETS).document(digest)
        fields = {"secret_sha256": secret_sha256, "instance_id": instance_id, "registered_at": now, "refused": 0}
        with transient_on_failure("register a unit secret"):
            try:
                ref.create(fields)
                return secret_sha256
            except api_exceptions.Conflict:  # AlreadyExists: registered before, maybe with this very hash
                pass
        return self.unit_secret_sha256(digest) or ""

    def unit_secret_sha256(self, digest: str) -> str | None:
        with transient_on_failure("read a unit secret"):
            kept = self._db.collection(UNIT_SECRETS).document(digest).get().to_dict() or {}
        return str(kept["secret_sha256"]) if kept.get("secret_sha256") else None

    def count_refused_unit_secret(self, digest: str, now: datetime) -> None:
        ref = self._db.collection(UNIT_SECRETS).document(digest)
        with transient_on_failure("count a refused unit secret"):
            ref.set({"refused": firestore.Increment(1), "last_refused_at": now}, merge=True)

    def unit_secret_document(self, digest: str) -> dict[str, object] | None:
        """The record as stored (`refused` included): what the tests read."""
        with transient_on_failure("read a unit secret"):
            snapshot = self._db.collection(UNIT_SECRETS).document(digest).get()
        return snapshot.to_dict() if snapshot.exists else None
