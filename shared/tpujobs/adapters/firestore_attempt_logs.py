"""Where each attempt's exported output is, on Firestore: `jobs/{id}/attempts/{N}`, and the job's `log_uri`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.firestore_cas import Write, compare_and_set
from tpujobs.adapters.firestore_documents import ATTEMPTS, NOTIFICATIONS
from tpujobs.adapters.firestore_reads import OnFirestore, transient_on_failure
from tpujobs.domain.naming import exported_attempt
from tpujobs.engine.ports import AttemptLogs

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_cas import Snapshot


class FirestoreAttemptLogs(OnFirestore):
    """`ports.AttemptLogStore` on Firestore."""

    def record_attempt_logs(self, job_id: str, logs: AttemptLogs) -> None:
        """Merge the attempt's exported logs into `jobs/{id}/attempts/{N}`, then point the
        job's `log_uri` at its combined log unless a later attempt's is already there.

        The job document is written with a plain field update, outside the compare-and-set
        of `apply`: that is safe, because any write changes the document's update time, so a
        transition racing it fails its precondition, reads again (this log_uri included) and
        decides again. The update itself carries a precondition too, so that an export of
        attempt 1 finishing late never replaces attempt 2's log_uri.
        """
        job_ref = self._job_ref(job_id)
        attempt_ref = job_ref.collection(ATTEMPTS).document(str(logs.attempt))
        fields = logs.fields()
        with transient_on_failure("record exported logs"):
            # Every field named is replaced whole: a re-export's worker_logs map is the truth.
            attempt_ref.set(fields, merge=list(fields))

        def point(snapshot: Snapshot) -> tuple[None, Write | None]:
            if not snapshot.exists:
                return None, None
            current = (snapshot.to_dict() or {}).get("log_uri")
            if current == logs.log_uri or (exported_attempt(current) or 0) > logs.attempt:
                return None, None
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return None, lambda: job_ref.update({"log_uri": logs.log_uri}, option=option)

        # A job deleted meanwhile (NotFound) is looked at again too, and then left alone.
        compare_and_set(
            job_ref,
            point,
            what=f"job {job_id}",
            doing="record its log_uri",
            lost=(api_exceptions.FailedPrecondition, api_exceptions.NotFound),
        )

    def attempt_logs(self, job_id: str, attempt: int) -> AttemptLogs | None:
        ref = self._job_ref(job_id).collection(ATTEMPTS).document(str(attempt))
        with transient_on_failure("read exported logs"):
            snapshot = ref.get()
        if not snapshot.exists:
            return None
        data = snapshot.to_dict() or {}
        return AttemptLogs(
            attempt=data.get("attempt", attempt),
            log_uri=data.get("log_uri", ""),
            worker_logs={int(k): v for k, v in (data.get("worker_logs") or {}).items()},
            exported_at=data["exported_at"],
            cut_off_workers=tuple(data.get("cut_off_workers") or ()),
        )

    def attempt_documents(self, job_id: str) -> list[dict[str, Any]]:
        """`jobs/{id}/attempts/{N}` as stored, by attempt (none before an attempt's logs are exported)."""
        with transient_on_failure("read attempts"):
            docs = list(self._job_ref(job_id).collection(ATTEMPTS).stream())
        return sorted(
            ({"id": doc.id, **doc.to_dict()} for doc in docs),
            key=lambda d: int(d["id"]) if d["id"].isdigit() else 0,
        )

    def notification_documents(self, job_id: str) -> list[dict[str, Any]]:
        """`jobs/{id}/notifications/{key}` as stored (tpujobs.engine.notifications), by key."""
        with transient_on_failure("read notification records"):
            docs = list(self._job_ref(job_id).collection(NOTIFICATIONS).stream())
        return sorted(({"id": doc.id, **doc.to_dict()} for doc in docs), key=lambda d: str(d["id"]))
