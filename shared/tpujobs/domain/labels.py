"""Changing a job's labels after submission: the new labels, checked as a spec's are, and the
timeline entry that says who changed what.

Labels stay in `spec.labels`. A change is not a transition: the job keeps its state and its
reason (a FAILED job still says why it failed), and the timeline gets one entry from the
state to itself. Capacity already requested keeps the labels it was created with (the TPU
API sets labels on a node when it is created); the next attempt's VMs carry the new ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.spec import check_labels
from tpujobs.domain.states import ATTEMPT_LIVE
from tpujobs.domain.transitions import Decision, Ignored


class LabelError(ValueError):
    """A label change that the spec's rules refuse; the message names the label."""


def parse_label_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """`key=value` arguments as a mapping; LabelError naming the first one without `=`."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabelError(f"label {pair!r} must be key=value")
        labels[key] = value
    return labels


def checked_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` if a spec would accept them (the same check), else LabelError saying why."""
    try:
        return check_labels(dict(labels))
    except ValueError as error:
        raise LabelError(str(error)) from None


def relabeled(job: Job, put: Mapping[str, str], remove: Sequence[str], by: str, now: datetime) -> Decision | Ignored:
    """The job with `put` set and `remove` removed from its labels, and the timeline entry.

    Ignored when nothing would change (a retried request). LabelError when the result breaks
    the spec's label rules, or a label is both set and removed.
    """
    both = sorted(set(put) & set(remove))
    if both:
        raise LabelError(f"label {both[0]!r} is both set and removed")
    before = dict(job.spec.labels)
    after = {k: v for k, v in {**before, **put}.items() if k not in remove}
    if after == before:
        return Ignored(f"labels of {job.job_id} are already so")
    after = checked_labels(after)
    said = [f"{k}={v}" + (f" (was {before[k]})" if k in before else "") for k, v in put.items() if before.get(k) != v]
    said += [f"removed {k}" for k in remove if k in before]
    reason = f"Labels changed by {by}: {', '.join(said)}."
    if job.state in ATTEMPT_LIVE:
        reason += f" The capacity of attempt {job.attempt} keeps its old labels; the next attempt gets these."
    seq = job.event_seq + 1
    event = JobEvent(seq, now, job.state, job.state, reason, "user", job.attempt)
    spec = job.spec.model_copy(update={"labels": after})
    return Decision(job.evolve(spec=spec, event_seq=seq, updated_at=now), event)
