"""The project's TPU quota in the simulator, counted with admission's own model.

Each queued resource that holds chips (a Compute slice's included) holds them in the pools of
`domain.quotas` (family, tier, region, or a named reservation), and a waiting one is held back
by the same `Limits.blocked_by` that admission applies to jobs: so the two cannot disagree. Compute
Engine's refusals name its quota metrics (the TPU API's quota ids are in errors.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tpujobs.domain.quotas import PoolKey, QuotaBook, Scope
from tpujobs.local.simulator.records import QueuedResourceRecord

Held = Mapping[PoolKey, list[tuple[str, int]]]  # each pool's holders: (zone, chips)


@dataclass(frozen=True)
class Shortfall:
    """The limit that holds a request back: which pool, its zone's quota or its region's (a
    reservation's size counts as its region's), and how many chips that limit is."""

    pool: PoolKey
    scope: Scope
    zone: str
    limit: int

    @property
    def location(self) -> str:
        return self.zone if self.scope == "zone" else self.pool.region


def holdings(qrs: Iterable[QueuedResourceRecord]) -> dict[PoolKey, list[tuple[str, int]]]:
    """The chips held per quota pool, by zone: every QR that holds capacity (SUSPENDED and
    FAILED ones too, until deleted, as Google counts them)."""
    held: dict[PoolKey, list[tuple[str, int]]] = {}
    for qr in qrs:
        if qr.holds_capacity:
            for pool, chips in qr.quota_demand().items():
                held.setdefault(pool, []).append((qr.zone, chips))
    return held


def shortfall(book: QuotaBook, held: Held, qr: QueuedResourceRecord) -> Shortfall | None:
    """The first limit *qr*'s chips would pass next to *held*; None: the quota takes them."""
    for pool, chips in sorted(qr.quota_demand().items(), key=lambda item: item[0].id):
        limits = book.limits(pool)
        scope = limits.blocked_by(held.get(pool, ()), qr.zone, chips)
        if scope is not None:
            return Shortfall(pool, scope, qr.zone, limits.of(scope, qr.zone) or 0)
    return None


# Compute Engine's TPU quota metrics (on-demand, preemptible), as QUOTA_EXCEEDED names them
# ("Quota 'CPUS' exceeded. Limit: 24.0 in region us-central1."): the quota id in capitals, less
# its "-per-project-region". Confirmed from public `gcloud quotas info` output and GKE guides:
# v5p TPU-V5P / PREEMPTIBLE-TPU-V5P, v6e PREEMPTIBLE-TPU-V6E with on-demand in the family-wide
# TPUS-PER-TPU-FAMILY (no TPU-V6E id exists; TPU7x is said to be the same), v5e
# TPU_LITE_PODSLICE_V5 / PREEMPTIBLE_TPU_LITE_PODSLICE_V5. Unconfirmed, by analogy: v4's
# TPU_PODSLICE_V4 pair, PREEMPTIBLE_TPU_V7X, and v2/v3 (which Compute Engine does not offer).
COMPUTE_METRICS: Mapping[str, tuple[str, str]] = {
    "v2": ("TPU_PODSLICE_V2", "PREEMPTIBLE_TPU_PODSLICE_V2"),
    "v3": ("TPU_PODSLICE_V3", "PREEMPTIBLE_TPU_PODSLICE_V3"),
    "v4": ("TPU_PODSLICE_V4", "PREEMPTIBLE_TPU_PODSLICE_V4"),
    "v5litepod": ("TPU_LITE_PODSLICE_V5", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
    "v5p": ("TPU_V5P", "PREEMPTIBLE_TPU_V5P"),
    "v6e": ("TPUS_PER_TPU_FAMILY", "PREEMPTIBLE_TPU_V6E"),
    "v7x": ("TPUS_PER_TPU_FAMILY", "PREEMPTIBLE_TPU_V7X"),
}


def compute_refusal(short: Shortfall) -> tuple[str, str]:
    """The lastAttempt error (code, message) of a Compute slice *short* holds back: QUOTA_EXCEEDED
    naming the metric and where; a full reservation is CONDITION_NOT_MET, as Compute Engine says
    it (a reservation is capacity bought, not a quota)."""
    if short.pool.tier == "reserved":
        if short.pool.reservation:
            return "CONDITION_NOT_MET", (
                f"Specified reservation '{short.pool.reservation}' does not have available resources for the request."
            )
        return "CONDITION_NOT_MET", "No available resources in specified reservations"
    on_demand, preemptible = COMPUTE_METRICS[short.pool.family]
    metric = preemptible if short.pool.tier == "spot" else on_demand
    return (
        "QUOTA_EXCEEDED",
        f"Quota '{metric}' exceeded. Limit: {float(short.limit)} in {short.scope} {short.location}.",
    )
