"""A pool as the jobs API and `tpujobs pool describe` show it."""

from __future__ import annotations

from datetime import datetime

from tpujobs.domain import pools
from tpujobs.domain.job import Job
from tpujobs.domain.pools import Pool


def pool_summary(pool: Pool, now: datetime, waiting: list[Job], *, show_jobs: bool = True) -> dict[str, object]:
    """A pool as the jobs API and `tpujobs pool describe` show it: settings, units, the queue, and
    its chip-hours (busy, charged to the jobs that ran; idle, the pool's own) with the last day's
    utilisation. `show_jobs` false hides which jobs run or wait (a caller the pool is not for)."""
    day = pools.usage_since(pool, now - pools.RECENT_WINDOW, now)
    total = pools.total_usage(pool, now)
    return {
        **pools.settings_of(pool),
        "reason": pool.reason if show_jobs else "(hidden: it may name a job)",
        "units": [
            {
                "index": u.index,
                "state": u.state.value,
                "queued_resource": u.queued_resource(pool.name),
                "zone": u.zone,
                "capacity_state": u.capacity_state,
                "job_id": u.job_id if show_jobs else ("(hidden)" if u.job_id else None),
                "attempt": u.attempt if show_jobs else None,
                "since": u.since,
                "removing": u.removing,
            }
            for u in pool.units
        ],
        "waiting": [j.job_id for j in waiting] if show_jobs else len(waiting),
        "busy_chip_hours": round(total.busy_chip_hours, 6),
        "idle_chip_hours": round(total.idle_chip_hours, 6),
        "last_day": {
            "busy_chip_hours": round(day.busy_chip_hours, 6),
            "idle_chip_hours": round(day.idle_chip_hours, 6),
            "utilisation": None if day.utilisation is None else round(day.utilisation, 4),
        },
    }
