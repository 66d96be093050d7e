"""What happens to a job's capacity: a host's preemption notice, a holding's new state.

tpujobs-preemption carries a worker's signed notice; tpujobs-qr-state a holding's state, from
the reconciler or the audit log's sink (then read again, since the log says only what was done,
in the zone tpujobs requested the holding in, once `AuditEntries` has checked what the entry
names). A warm-pool unit's state goes to its pool.
"""

from __future__ import annotations

from typing import Protocol

from tpujobs.domain.holdings import HOLDING_LOST, HOLDING_PENDING, HoldingState, holding_state
from tpujobs.domain.job import Source, worker_key
from tpujobs.domain.naming import parse_queued_resource_name, parse_unit_queued_resource_name
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.audit_entries import AuditEntries
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.signed_reports import SignedReports
from tpujobs.engine.ports import Capacity
from tpujobs.engine.qr_state_reports import QrStateReport, audit_log_target
from tpujobs.engine.worker_reports import PreemptionNotice


class UnitObserver(Protocol):
    """A warm pool told that one of its units' holdings was seen in some state."""

    def observe_unit(
        self, queued_resource: str, state: HoldingState, detail: str = "", unhealthy_hosts: int = 0
    ) -> None: ...


class CapacityEvents:
    """Turns what is seen of a job's capacity into the observation it means for the job."""

    def __init__(
        self,
        capacity: Capacity,
        reports: SignedReports,
        lifecycle: JobLifecycle,
        audits: AuditEntries,
        units: UnitObserver | None = None,
    ) -> None:
        self.capacity = capacity
        self.reports = reports
        self.lifecycle = lifecycle
        self.audits = audits
        self.units = units  # None: no warm pools

    def on_preemption(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-preemption: a worker's notice that its capacity is going away, at once."""
        notice = self.reports.decode(PreemptionNotice, message)
        if notice is None or self.reports.believed(notice, message) is None:
            return None
        worker = worker_key(notice.slice_id, notice.worker_id)
        reason = f"Preempted: worker {worker} of attempt {notice.attempt} got notice ({notice.reason})"
        seen = Observation(EventKind.CAPACITY_LOST, notice.attempt, "agent", reason=reason, worker=worker)
        return self.lifecycle.observe(notice.job_id, seen)

    def on_qr_state(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-qr-state: a holding was seen in some state (a report, the audit log)."""
        audited = audit_log_target(message.data)
        if audited is not None:  # the log sink: something was done to it; see what it is now
            zone = self.audits.zone_to_read(message, audited)
            if zone is None:
                return None  # refused and counted: not a holding of ours where the entry says
            name = audited.holding
            status = self.capacity.status(zone, name)
            if status is None:
                return self.observe_capacity(name, HoldingState.GONE, "it no longer exists")
            return self.observe_capacity(name, status.state, status.detail, status.unhealthy_hosts)
        report = self.reports.decode(QrStateReport, message, signed=False)
        if report is None:
            return None
        state = holding_state(report.state)
        return self.observe_capacity(report.queued_resource, state, report.detail, report.unhealthy_hosts)

    def observe_capacity(
        self,
        queued_resource: str,
        state: HoldingState,
        detail: str = "",
        unhealthy_hosts: int = 0,
        source: Source = "tpu",
    ) -> Decision | Ignored | None:
        """Turn a holding's state into the observation it means for its job (or its pool's unit)."""
        owner = parse_queued_resource_name(queued_resource)
        if owner is None and self.units is not None and parse_unit_queued_resource_name(queued_resource):
            self.units.observe_unit(queued_resource, state, detail, unhealthy_hosts)
            return Ignored(f"{queued_resource} is a warm pool's unit: its pool was told")
        if owner is None:
            return Ignored(f"{queued_resource} is not a tpujobs queued resource")
        job_id, attempt = owner
        if state in HOLDING_LOST or unhealthy_hosts:
            what = lost_reason(queued_resource, state, detail, unhealthy_hosts)
            seen = Observation(EventKind.CAPACITY_LOST, attempt, source, reason=what, capacity_state=state.value)
        elif state in HOLDING_PENDING:
            seen = Observation(EventKind.CAPACITY_CHANGED, attempt, source, capacity_state=state.value)
        else:
            return Ignored(f"{queued_resource} is {state}: nothing to do")
        return self.lifecycle.observe(job_id, seen)


def lost_reason(holding: str, state: HoldingState, detail: str, unhealthy_hosts: int) -> str:
    """Why the job's attempt lost its capacity, as its timeline says it."""
    if state is HoldingState.LOSING:
        return f"Preempted: Google is taking back holding {holding} (LOSING)"
    if state is HoldingState.LOST:
        return f"Preempted: Google took back holding {holding} (LOST)"
    if state is HoldingState.GONE:
        return f"Preempted: holding {holding} no longer exists"
    if state is HoldingState.FAILED:
        return f"Holding {holding} FAILED" + (f": {detail}" if detail else "")
    return f"{unhealthy_hosts} host(s) of holding {holding} were lost"
