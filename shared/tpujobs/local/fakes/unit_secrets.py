"""Each warm-pool unit VM's registered secret hash, in memory: `unit_secrets/{digest}`, create-only."""

from __future__ import annotations

from datetime import datetime

from tpujobs.local.fakes.documents import Collections


class InMemoryUnitSecrets(Collections):
    """`ports.UnitSecretRecords`: the first registration per digest is kept, refusals counted."""

    def register_unit_secret(self, digest: str, secret_sha256: str, instance_id: str, now: datetime) -> str:
        with self._lock:
            kept = self._unit_secrets.setdefault(
                digest, {"secret_sha256": secret_sha256, "instance_id": instance_id, "registered_at": now, "refused": 0}
            )
            return str(kept["secret_sha256"])

    def unit_secret_sha256(self, digest: str) -> str | None:
        with self._lock:
            kept = self._unit_secrets.get(digest) or {}
            return str(kept["secret_sha256"]) if kept.get("secret_sha256") else None

    def count_refused_unit_secret(self, digest: str, now: datetime) -> None:
        with self._lock:
            document = self._unit_secrets.setdefault(digest, {})
            document.update(refused=document.get("refused", 0) + 1, last_refused_at=now)

    def unit_secret_document(self, digest: str) -> dict[str, object] | None:
        """The record as stored (`refused` included): what the tests read."""
        with self._lock:
            document = self._unit_secrets.get(digest)
            return dict(document) if document is not None else None
