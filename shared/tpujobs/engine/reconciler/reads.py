"""What a tick compares against: a zone's capacity and the pools that have a limit.

A read that fails is never taken for an absence: a zone whose listing failed is skipped this
tick, so an API error never looks like a lost resource.
"""

from __future__ import annotations

from tpujobs.engine.ports import Capacity, CapacityStatus, Pools
from tpujobs.engine.reconciler.report import Guard, ReconcileReport, log


def list_zone(capacity: Capacity, zone: str, report: ReconcileReport) -> dict[str, CapacityStatus] | None:
    """The zone's capacity by queued-resource name; None when its listing failed (then
    nothing of the zone is compared this tick, so an API error never looks like a loss)."""
    report.tpu_lists += 1
    try:
        seen = {status.name: status for status in capacity.list_capacity(zone)}
    except Exception as error:  # whatever it was, this zone's jobs wait for the next tick
        log.warning("reconcile: skipping zone %s this tick: %s", zone, error)
        if zone not in report.zones_skipped:
            report.zones_skipped.append(zone)
        return None
    report.zones_listed += 1
    return seen


def read_limited(pools: Pools | None, guard: Guard, report: ReconcileReport) -> set[str]:
    """The ids of the pools that have a limit now (`domain.quotas.PoolKey.id`); none when
    admission is off or the quotas unreadable (then QUEUED jobs are converged one by one,
    which admits them in their pool's order, as are those of a named reservation: its pool's
    family and region are known from its jobs only)."""
    limited: set[str] = set()

    def read() -> None:
        if pools is not None:
            limited.update(pool.id for pool in pools.quotas().limited_pools())

    guard.phase(report, "read the quotas", read)
    return limited
