"""Resume and rerun of an ended job: which fields a new attempt may change, and how.

A resumed or rerun job keeps its job_id, so its checkpoint prefix, its logs and its history:
only what cannot change what the job *is* may be overridden. Where it runs (`zone`/`zones`),
on what capacity, how many restarts it gets and how long it may take are such fields; its
command, code, accelerator or environment are not (submit a new job for those). An override is
validated as the whole spec would be at submit, so `capacity: reserved` or a zone the job's
disks are not in is refused with the same sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from tpujobs.domain.spec import JobSpec, SpecError, parse_spec

RestartAction = Literal["resume", "rerun"]
RESTART_ACTIONS: tuple[RestartAction, ...] = ("resume", "rerun")

OVERRIDABLE = ("zone", "zones", "capacity", "max_restarts", "time_limit")
"""The spec fields a resume or rerun may change: none of them changes the job's identity."""

REQUEST_MEMORY = 20
"""How many request ids of resumes and reruns a job remembers (`Job.restart_requests`): a
retried request among them starts nothing."""

# Fields another override makes meaningless, dropped with it (they are not overridable themselves):
# a reservation only means something on reserved capacity, the on-demand fallback only on spot.
_CAPACITY_BOUND = {"reservation": "reserved", "on_demand_after_preemptions": "spot"}


def overridden_spec(spec: JobSpec, overrides: Mapping[str, Any]) -> JobSpec:
    """The spec the new attempt runs with: `spec` with `overrides`, validated as at submit.

    SpecError with one sentence naming the field when a field may not be overridden or its
    value is not valid. `zone` replaces `zones` and the other way round; a capacity change
    drops the fields that belonged to the old capacity (a reservation, the spot fallback).
    """
    if not isinstance(overrides, Mapping):
        raise SpecError("overrides must be an object of field: value")
    refused = sorted(set(overrides) - set(OVERRIDABLE))
    if refused:
        raise SpecError(
            f"field {refused[0]!r} cannot be changed on resume or rerun: only {', '.join(OVERRIDABLE)} may "
            "(they keep the job what it is); submit a new job to change anything else"
        )
    if not overrides:
        return spec
    data = spec.to_document()
    if "zone" in overrides and "zones" in overrides:
        raise SpecError("give either zone or zones as an override, not both")
    if "zone" in overrides:
        data["zones"] = None
    if "zones" in overrides:
        data["zone"] = None
    capacity = overrides.get("capacity", spec.capacity)
    for field, needs in _CAPACITY_BOUND.items():
        if capacity != needs:
            data[field] = None
    data.update(overrides)
    return parse_spec(data)


def describe_overrides(before: JobSpec, after: JobSpec) -> str:
    """The overrides as the timeline says them: `zone=us-east5-a, max_restarts=3`, or ""."""
    changed = []
    for name in (*OVERRIDABLE, *_CAPACITY_BOUND):
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            shown = ",".join(new) if isinstance(new, list) else ("none" if new is None else str(new))
            changed.append(f"{name}={shown}")
    return ", ".join(changed)
