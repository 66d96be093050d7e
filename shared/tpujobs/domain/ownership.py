"""What marks a holding as tpujobs' own, before tpujobs writes into it or deletes it.

Every holding tpujobs asks for carries labels it stamps at creation (a user's labels may not use
the `tpujobs` prefix: `spec.check_labels`): a job attempt's `tpujobs-job` and `tpujobs-attempt`,
a warm-pool unit's `tpujobs-pool` (and `tpujobs-unit`). Names alone prove nothing: anyone who
may create resources in the project can make a MIG or a queued resource named like a holding.
So an adapter writes metadata into, adopts, or deletes a resource of a holding's name only when
its marker (these labels, or on Compute Engine's unlabelled kinds the description that records
them) names that very holding. See docs/security.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpujobs.domain.naming import parse_queued_resource_name, parse_unit_queued_resource_name

JOB_LABEL = "tpujobs-job"
ATTEMPT_LABEL = "tpujobs-attempt"
POOL_LABEL = "tpujobs-pool"


def marked(holding: str, labels: Mapping[str, str]) -> bool:
    """Whether `labels` are tpujobs' marker of the holding `holding`: the job and attempt its
    name says (`{job}-a{N}`, `{job}-c{N}`), or the pool (`{pool}-u{i}-g{N}`, `{pool}-c{i}-g{N}`).
    A name tpujobs never makes is never marked."""
    job = parse_queued_resource_name(holding)
    if job is not None:
        return labels.get(JOB_LABEL) == job[0] and labels.get(ATTEMPT_LABEL) == str(job[1])
    unit = parse_unit_queued_resource_name(holding)
    if unit is not None:
        return labels.get(POOL_LABEL) == unit[0]
    return False


def refusal(what: str, holding: str) -> str:
    """The words of a refusal to touch `what` (a resource named for `holding`) that tpujobs did not make."""
    return (
        f"{what} is named like {holding} but does not carry tpujobs' marker: tpujobs did not make it, "
        "so it is never adopted, written or deleted"
    )
