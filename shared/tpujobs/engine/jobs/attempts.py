"""The capacity of a job's attempts: asked for with the hosts' boot, given back when nobody owns it."""

from __future__ import annotations

from dataclasses import dataclass

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.states import QUOTA_EXHAUSTED, REGION_QUOTA_EXHAUSTED
from tpujobs.domain.transitions import next_zone
from tpujobs.engine.errors import PermanentError, QuotaExhausted, TransientError
from tpujobs.engine.ports import Capacity, CapacityStatus, JobRecords
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import STOP_REQUEST_KEY, host_boot


def quota_reason(job: Job, error: QuotaExhausted) -> str:
    """What a job waiting for TPU quota says, quoting Google; a region's quota says what the
    zone wait will do about it, since no other zone of that region has room either."""
    said = str(error).rstrip(". ")
    waiting = "waiting, asked again at every reconciler tick"
    if not error.region:
        return f"TPU quota exhausted in {job.zone}: {said}; {waiting}."
    where = f"TPU quota of region {error.region} exhausted (in {job.zone}): {said}; {waiting}"
    if next_zone(job, error.region) is not None:
        return f"{where}; the zone wait skips the other zones of {error.region}."
    if next_zone(job) is not None:
        return f"{where}; every later zone of the job is in {error.region} too, so it waits here."
    return f"{where}."


def quota_capacity_state(error: QuotaExhausted) -> str:
    """The `capacity_state` of a job refused for quota: the region's, or the zone's (or unknown)."""
    return REGION_QUOTA_EXHAUSTED if error.region else QUOTA_EXHAUSTED


@dataclass(frozen=True)
class Asked:
    """A request's answer as the job records it: the holding's status, the `capacity_state` to
    record (its state, or why there is no holding: `QUOTA_EXHAUSTED`), and the reason to record
    ("" for the usual words)."""

    status: CapacityStatus
    capacity_state: str
    reason: str = ""


class AttemptCapacity:
    """Requests and releases the slices of a job's attempts on the capacity port."""

    def __init__(self, capacity: Capacity, store: JobRecords, settings: Settings) -> None:
        self.capacity = capacity
        self.store = store
        self.settings = settings

    def request(self, job: Job) -> CapacityStatus:
        """Ask for the current attempt's slices, its hosts booting the agent; QuotaExhausted
        when the TPU quota is full, PermanentError when refused for good."""
        return self.capacity.request(job, host_boot(job, self.settings))

    def request_or_wait(self, job: Job) -> Asked:
        """`request`, with a full TPU quota as a wait, not an error: recorded as
        `QUOTA_EXHAUSTED` or `REGION_QUOTA_EXHAUSTED`, the reason quoting Google."""
        try:
            status = self.request(job)
        except QuotaExhausted as error:
            waiting = CapacityStatus(job.queued_resource, job.zone, HoldingState.WAITING, quota_region=error.region)
            return Asked(waiting, quota_capacity_state(error), quota_reason(job, error))
        return Asked(status, status.state.value)

    def release(self, zone: str, name: str) -> None:
        """Give back the holding `name` (absent is fine)."""
        self.capacity.release(zone, name)

    def ask_to_stop(self, job: Job, why: str) -> str | None:
        """Ask the hosts of the job's current attempt to stop its command (`STOP_REQUEST_KEY` in
        their metadata); None when asked, else why it could not be (the hosts are not all up)."""
        try:
            self.capacity.tell_hosts(job.zone, job.queued_resource, job.spec.slices, {STOP_REQUEST_KEY: why})
        except (TransientError, PermanentError) as error:
            return str(error)
        return None

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        """What the holding `name` is now; None when it does not exist."""
        return self.capacity.status(zone, name)

    def release_if_orphaned(self, requested: Job) -> None:
        """After a request lost its race (a cancel, another handler), free what nobody owns."""
        current = self.store.get(requested.job_id)
        if current is None or current.state.is_terminal or current.queued_resource != requested.queued_resource:
            self.capacity.release(requested.zone, requested.queued_resource)
