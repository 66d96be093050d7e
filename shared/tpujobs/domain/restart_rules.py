"""Restart rules: what a lost attempt or a failed command leads to, and how long to wait.

Preemptions and errors share one budget, the spec's `max_restarts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpujobs.domain.states import JobState

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0


@dataclass(frozen=True)
class RestartRuling:
    """The rules' answer: go on (RECOVERING, resuming or not) or stop (FAILED), and why."""

    to_state: JobState
    resume: bool
    reason: str


def rule_on_loss(rule: str, restarts: int, max_restarts: int, what: str) -> RestartRuling:
    """Apply `on_preemption` or `on_error` (`rule`) to a loss described by `what`."""
    if rule == "fail":
        return RestartRuling(JobState.FAILED, False, f"{what}; the job's rule is 'fail'")
    if restarts >= max_restarts:
        return RestartRuling(JobState.FAILED, False, f"{what}; all {max_restarts} restarts are used up")
    resume = rule == "resume"
    how = "resume from its checkpoint" if resume else "rerun from scratch"
    return RestartRuling(JobState.RECOVERING, resume, f"{what}; restart {restarts + 1} of {max_restarts} will {how}")


def backoff_seconds(restarts: int) -> float:
    """The wait before restart number `restarts`: none for the first, then 1 s, 2 s, 4 s, ...

    The first restart goes at once because a preemption is not the job's fault and
    every second of it is lost work; repeated losses back off, capped at half a minute.
    """
    if restarts <= 1:
        return 0.0
    doublings = min(restarts - 2, 32)  # past the cap anyway; keeps 2**n from overflowing
    return min(BACKOFF_BASE_SECONDS * 2.0**doublings, BACKOFF_CAP_SECONDS)
