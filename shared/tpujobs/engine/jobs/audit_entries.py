"""Audit-log entries on tpujobs-qr-state: which holding one may make the engine read, and where.

An entry says only that something was done to a holding; the engine then reads what the holding
is now, and a holding that is not there is a lost attempt. So an entry must not choose where to
look. The sink takes this project's admin-activity audit log alone (infra/logging.tf), which only
Google writes; and here, whatever reaches the topic, an entry moves something only when it is
from that log, names this project, names a holding tpujobs holds now (the current attempt of a job
with capacity of its own, or the current generation of a warm pool's unit, both on the TPU API,
the only platform whose audit entries the sink takes), and names the zone that holding was
requested in. The read is then made in that recorded zone. Anything else changes nothing and is
counted like a forged report (`ForgeryCounts`): a flood costs no write per entry.

Google's own entries about a holding tpujobs let go of (an earlier attempt's, a unit's earlier
generation, deleted after the next was asked for) are counted the same way; they would have
changed nothing either.
"""

from __future__ import annotations

from typing import Protocol

from tpujobs.domain.naming import parse_queued_resource_name, parse_unit_queued_resource_name, platform_of
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.rejections import ForgeryCounts
from tpujobs.engine.ports import JobRecords
from tpujobs.engine.qr_state_reports import AuditTarget, activity_log

# Why an entry was refused: fixed sentences, so the tallies stay few whatever a flood names.
NOT_THE_AUDIT_LOG = "it is not an entry of this project's admin-activity audit log"
OTHER_PROJECT = "it is an audit entry about another project's holding"
NOT_HELD = "it is an audit entry about a holding tpujobs does not hold now"
OTHER_ZONE = "it is an audit entry naming a zone its holding was not requested in"


class UnitZones(Protocol):
    """The warm pools, asked where a unit's holding was requested."""

    def unit_zone(self, queued_resource: str) -> str | None: ...


class AuditEntries:
    """Checks what an audit entry names against what tpujobs holds, before any capacity read."""

    def __init__(
        self, project: tuple[str, str], jobs: JobRecords, forgeries: ForgeryCounts, units: UnitZones | None
    ) -> None:
        """`project`: this project's id, and its number where known (a resource path may name either;
        the log name names the id)."""
        self.project, number = project
        self.project_names = {self.project, *([number] if number else [])}
        self.jobs = jobs
        self.forgeries = forgeries
        self.units = units  # None: no warm pools

    def zone_to_read(self, message: InboundMessage, target: AuditTarget) -> str | None:
        """The zone to read the entry's holding in (where tpujobs requested it); None when the
        entry is refused, counted, and changes nothing."""
        requested_in: str | None = None
        if target.log_name != activity_log(self.project):
            refusal = NOT_THE_AUDIT_LOG
        elif target.project not in self.project_names:
            refusal = OTHER_PROJECT
        else:
            requested_in = self.requested_in(target.holding)
            refusal = NOT_HELD if requested_in is None else OTHER_ZONE if requested_in != target.zone else ""
        if refusal:
            said = f"Audit entry about {target.holding} in {target.zone} refused unread: {refusal}."
            self.forgeries.count(message, refusal, said)
            return None
        self.forgeries.flush_due()
        return requested_in

    def requested_in(self, holding: str) -> str | None:
        """The zone tpujobs requested `holding` in, if it holds it now on the TPU API: the current
        attempt of a job not on a warm pool, or a unit's current generation. Else None."""
        if platform_of(holding) != "tpu-api":
            return None  # a Compute Engine holding is never in the TPU API's audit log
        owner = parse_queued_resource_name(holding)
        if owner is not None:
            job = self.jobs.get(owner[0])
            if job is None or job.warm_pool or job.attempt != owner[1] or job.queued_resource != holding:
                return None
            return job.zone
        if self.units is not None and parse_unit_queued_resource_name(holding) is not None:
            return self.units.unit_zone(holding)
        return None
