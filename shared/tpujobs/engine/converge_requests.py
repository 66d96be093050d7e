"""tpujobs-converge: the jobs API's hand-off of capacity work, a job's id or a pool's name and
nothing else, told apart by its `action`.

The internet-facing `jobs` function commits what a user asks in Firestore and publishes one of
these; the `converge` function, which holds the TPU and Compute Engine roles, reads what is stored
and does what it says, as the reconciler would (level-based). A message carries no claim and no
change, so a forged one can make tpujobs do only what Firestore already says, a little sooner.
"""

from __future__ import annotations

from typing import Literal

from tpujobs.engine.messages import JobId, Strict, message_object, validated
from tpujobs.engine.pool_requests import PoolName


class ConvergeJob(Strict):
    """`{"action": "converge", "job_id"}`: do what the job's stored state asks (request its
    capacity, release it, or hand it on), as `JobLifecycle.converge` does."""

    action: Literal["converge"]
    job_id: JobId

    def payload(self) -> dict[str, str]:
        return {"action": self.action, "job_id": self.job_id}


class ConvergePool(Strict):
    """`{"action": "pool-converge", "name"}`: do what the warm pool's stored document says
    (`PoolManagement.converge`)."""

    action: Literal["pool-converge"]
    name: PoolName

    def payload(self) -> dict[str, str]:
        return {"action": self.action, "name": self.name}


ConvergeRequest = ConvergeJob | ConvergePool
_MODELS: dict[str, type[ConvergeRequest]] = {"converge": ConvergeJob, "pool-converge": ConvergePool}


def decode_converge(raw: bytes | None) -> ConvergeRequest:
    """A tpujobs-converge message; ReportError saying why it is not one."""
    data = message_object(raw)
    model = _MODELS.get(str(data.get("action")), ConvergeJob)  # an unknown action: ConvergeJob names it
    return validated(model, data)
