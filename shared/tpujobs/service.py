"""The job service: decode, decide, commit, act. Every function handler calls into it.

The order is always the same: commit the decision in one transaction, then perform
the action it implies. A crash in between leaves a job whose record says what should
happen next, and the redelivered message (or the reconciler) finishes it, because
every action is idempotent: queued-resource names are deterministic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from tpujobs.agent.startup import render_startup_script
from tpujobs.config import Settings
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import SpecError, decode_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.errors import PermanentError
from tpujobs.inbound import InboundMessage
from tpujobs.ports import Clock, JobStore, Rejection, Tpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitOutcome:
    """What became of one submission message."""

    kind: Literal["provisioning", "duplicate", "rejected", "failed"]
    job_id: str | None
    reason: str


class JobService:
    """The use cases of tpujobs, on explicit ports: no global clients, no clock of its own."""

    def __init__(self, store: JobStore, tpu: Tpu, settings: Settings, clock: Clock) -> None:
        self.store = store
        self.tpu = tpu
        self.settings = settings
        self.clock = clock

    def reject(self, message: InboundMessage, reason: str) -> None:
        """Record why a message could not be used; the caller then acknowledges it."""
        log.warning("rejected message %s on %s: %s", message.message_id, message.topic, reason)
        self.store.reject(
            Rejection(message.message_id, self.clock(), reason, message.payload_text(), message.topic)
        )

    def submit(self, message: InboundMessage) -> SubmitOutcome:
        """A job spec message becomes one job and one queued-resource request, at most once."""
        if message.data is None:
            self.reject(message, message.undecodable)
            return SubmitOutcome("rejected", None, message.undecodable)
        try:
            spec = decode_spec(message.data, message_id=message.message_id)
        except SpecError as error:
            self.reject(message, str(error))
            return SubmitOutcome("rejected", None, str(error))

        job, first_event = new_job(spec, self.settings.default_zone, self.clock())
        if not self.store.create(job, first_event):
            existing = self.store.get(job.job_id)
            if existing is None:  # deleted between the two reads: treat as new next time
                return SubmitOutcome("duplicate", job.job_id, "job vanished during submission")
            if existing.spec != spec:
                self.reject(
                    message,
                    f"job_id {job.job_id!r} already exists with a different spec; "
                    "a job_id names one job, so this submission was ignored",
                )
            if existing.state is not JobState.QUEUED:
                return SubmitOutcome("duplicate", job.job_id, f"job is already {existing.state.value}")
            job = existing  # an earlier delivery stopped half-way: finish its work
        return self._admit(job)

    def _admit(self, job: Job) -> SubmitOutcome:
        """Request the attempt's capacity, then record PROVISIONING (or FAILED for good)."""
        try:
            status = self.tpu.request(job, render_startup_script(job))
        except PermanentError as error:
            self.store.apply(
                job.job_id,
                Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error)),
                self.clock,
            )
            return SubmitOutcome("failed", job.job_id, str(error))
        outcome = self.store.apply(
            job.job_id,
            Observation(EventKind.ADMITTED, job.attempt, "submit", capacity_state=status.state),
            self.clock,
        )
        if isinstance(outcome, Decision):
            return SubmitOutcome("provisioning", job.job_id, outcome.event.reason)
        return SubmitOutcome("duplicate", job.job_id, outcome.reason)
