"""The reconciler: level-based repair of whatever the events missed.

There is no preemption event, a host can die without a word, and a handler can die between its
commit and its action. On every tick the reconciler reads what is (the active jobs, their zones'
queued resources), compares, and repairs through the services the event functions use
(`collaborators`). It acts only on what it saw and confirmed, and one item's failure is its own
(`report.Guard`). A tick fans out: the coordinator (`coordinator`) publishes one shard per zone
and id range (`shard`), then runs the pool, export, silent-worker, announcement and pruning
phases. The whole design, and what a tick costs: docs/architecture.md.
"""

from tpujobs.engine.reconciler.collaborators import JobRepairs, PoolRepairs
from tpujobs.engine.reconciler.coordinator import Reconciler
from tpujobs.engine.reconciler.exports import EXPORT_GRACE_S, EXPORT_WINDOW_S
from tpujobs.engine.reconciler.report import ReconcileReport

__all__ = ["EXPORT_GRACE_S", "EXPORT_WINDOW_S", "JobRepairs", "PoolRepairs", "ReconcileReport", "Reconciler"]
