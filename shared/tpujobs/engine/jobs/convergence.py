"""tpujobs-converge: the capacity work the jobs API handed off, done where capacity is held.

The jobs API's engine holds no capacity (`capacity_handoff.NoCapacity`): it commits a user's
cancel, resume, rerun, submission or pool change, then publishes the job's id or the pool's name
(`engine.converge_requests`). This handler converges what is stored, as the reconciler does for
every job at every tick; a redelivered or forged message does what Firestore says, and an id
nothing is stored under changes nothing and writes nothing.
"""

from __future__ import annotations

from typing import Protocol

from tpujobs.engine import process_log
from tpujobs.engine.converge_requests import ConvergeJob, decode_converge
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.messages import ReportError


class PoolConvergence(Protocol):
    """What a pool's hand-off asks of the warm pools (`warm_pools.PoolManagement.converge`)."""

    def converge(self, name: str) -> None: ...


class Convergence:
    """Converges the job or pool a tpujobs-converge message names."""

    def __init__(self, lifecycle: JobLifecycle, rejections: Rejections, pools: PoolConvergence | None = None) -> None:
        self.lifecycle = lifecycle
        self.rejections = rejections
        self.pools = pools  # None: no warm pools in this deployment

    def on_converge(self, message: InboundMessage) -> None:
        """Converge the job or the pool named; a message that names neither is recorded (only the
        jobs function publishes here, so that is a bug worth reading)."""
        try:
            request = decode_converge(message.data)
        except ReportError as error:
            self.rejections.reject(message, message.undecodable or str(error))
            return
        if isinstance(request, ConvergeJob):
            process_log.bind_job(request.job_id)
            self.lifecycle.converge(request.job_id)
        elif self.pools is not None:
            self.pools.converge(request.name)
