"""Time limits and hang detection: when a job has run too long, or an attempt has gone quiet.

Pure: every answer is computed from the job (its spec and its attempts' timestamps) and `now`, which the
caller passes. Two callers ask: the reconciler on every tick, and the agent on the host, which gets its
deadline in its config (`agent_deadlines`) so a host cut off from its control plane still stops.
What each limit counts, and from when:
docs/recovery.md#time-limits-and-hang-detection-time_limit-attempt_time_limit-hang_timeout-on_hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tpujobs.domain.job import Job
from tpujobs.domain.spec import MAX_RUN_SECONDS, MIN_RUN_SECONDS, JobSpec
from tpujobs.domain.states import JobState

TIME_LIMIT = "time_limit"
ATTEMPT_TIME_LIMIT = "attempt_time_limit"
LIMITS = (TIME_LIMIT, ATTEMPT_TIME_LIMIT)
"""The limit names: spec fields, the agent's `exited.limit` and the words of the reason."""


@dataclass(frozen=True)
class LimitReached:
    """A time limit that has run out: which one, what it was, and how much time was used."""

    limit: str  # TIME_LIMIT or ATTEMPT_TIME_LIMIT
    limit_seconds: int
    used_seconds: float

    @property
    def reason(self) -> str:
        """The timeline's sentence: it names the limit and the time used."""
        spelled = _spelled(self.limit_seconds)
        if self.limit == TIME_LIMIT:
            return (
                f"The job's time_limit of {spelled} was reached: it used {self.used_seconds:.0f} s "
                "since its first attempt's capacity was held"
            )
        return f"The attempt's attempt_time_limit of {spelled} was reached: it used {self.used_seconds:.0f} s"


@dataclass(frozen=True)
class WorkerProgress:
    """The latest sign of progress the control plane knows of one worker of an attempt."""

    worker: str  # "slice-worker"
    last_output_at: datetime | None = None
    checkpoint_at: datetime | None = None
    started_at: datetime | None = None
    exit_code: int | None = None  # the command's, once this host's `exited` was heard

    def last_progress(self) -> datetime | None:
        known = [t for t in (self.last_output_at, self.checkpoint_at, self.started_at) if t is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class Hung:
    """A RUNNING attempt that went quiet: each silent worker and for how long."""

    attempt: int
    hang_timeout_seconds: int
    silent: tuple[tuple[str, float], ...]  # (worker, seconds since its last progress)

    @property
    def reason(self) -> str:
        """The timeline's sentence: the silent workers and for how long each."""
        names = ", ".join(f"{worker} for {quiet:.0f} s" for worker, quiet in self.silent)
        return (
            f"Attempt {self.attempt} is hung: no output line and no checkpoint from any worker "
            f"within its hang_timeout of {_spelled(self.hang_timeout_seconds)} (silent: {names})"
        )


# A flex-start VM's maxRunDuration is the attempt's own limit and these, so tpujobs' limit always
# comes first: the hosts boot and start the agent (whose deadline counts from its own start, the
# VM's run duration from RUNNING), the command saves on SIGTERM, and Google may be late or early.
RUN_BOOT_ALLOWANCE_SECONDS = 600  # RUNNING to the agent's start (boot, startup script)
RUN_SIGTERM_GRACE_SECONDS = 60  # at least the agent's SIGTERM-to-SIGKILL grace (AgentTimings: 30 s)
RUN_MARGIN_SECONDS = 120  # Compute Engine may end a VM up to 30 s late [limit-vm-runtime]; clocks drift

# A loss this close before the VMs' terminationTimestamp is their run duration's end too (clocks differ).
RUN_END_SKEW_SECONDS = 10


def flex_run_seconds(spec: JobSpec) -> int:
    """A flex-start VM's maxRunDuration: the smaller of the job's time limits plus the allowances
    above, within Compute Engine's 10 minutes to 7 days. The spec's validation requires a limit."""
    limits = [s for s in (spec.time_limit_seconds, spec.attempt_time_limit_seconds) if s]
    if not limits:
        raise ValueError("capacity 'flex-start' needs time_limit or attempt_time_limit: its VMs' maxRunDuration")
    wanted = min(limits) + RUN_BOOT_ALLOWANCE_SECONDS + RUN_SIGTERM_GRACE_SECONDS + RUN_MARGIN_SECONDS
    return max(MIN_RUN_SECONDS, min(wanted, MAX_RUN_SECONDS))


def time_is_up(job: Job, now: datetime) -> str | None:
    """Why the attempt's time is up at `now`, or None: a time limit reached, or (flex-start) its
    VMs' maxRunDuration over by the control plane's count, which starts no later than Compute
    Engine's (the VMs ran before the capacity was seen ACTIVE) and loses at most the boot
    allowance. A capacity lost then was ended by its time (`transitions`), never preempted."""
    reached = limit_reached(job, now)
    if reached is not None:
        return reached.reason
    if job.run_ends_at is not None and now >= job.run_ends_at - timedelta(seconds=RUN_END_SKEW_SECONDS):
        when = job.run_ends_at.isoformat(timespec="seconds")
        return f"Compute Engine ends its VMs at {when}, by their maxRunDuration (their terminationTimestamp)"
    held = attempt_held(job)
    if job.capacity != "flex-start" or held is None or job.state.is_terminal:
        return None
    run = flex_run_seconds(job.spec)
    if (now - held).total_seconds() < run - RUN_BOOT_ALLOWANCE_SECONDS:
        return None
    return f"its flex-start VMs' maxRunDuration of {_spelled(run)} ran out (Compute Engine ends them then)"


def first_held(job: Job) -> datetime | None:
    """When the job's capacity was first held, in any attempt since it was submitted or last
    resumed or rerun (`Job.run_first_attempt`): a resume starts the clock again; None if never."""
    held = [u.held_from for u in job.usage if u.held_from is not None and u.attempt >= job.run_first_attempt]
    return min(held) if held else None


def attempt_held(job: Job) -> datetime | None:
    """When the current attempt's capacity was held; None if not (yet)."""
    usage = job.usage_of()
    return usage.held_from if usage is not None else None


def limit_reached(job: Job, now: datetime, which: str | None = None) -> LimitReached | None:
    """The first time limit the job is past at `now` (the whole job's before the attempt's), or
    None. `which` asks about one limit only. An ended job, or one never started, is past none."""
    if job.state.is_terminal:
        return None
    for name in LIMITS:
        if which not in (None, name):
            continue
        limit, since = _limit_and_since(job, name)
        if limit is None or since is None:
            continue
        used = (now - since).total_seconds()
        if used >= limit:
            return LimitReached(name, limit, used)
    return None


def limit_as_reported(job: Job, which: str, now: datetime) -> LimitReached | None:
    """What the agent's `exited` with `limit` means: that limit, with the time the control
    plane counts (the agent counts from its own start, a little later than the capacity's).
    None when the job has no such limit (a report the job's own spec does not back)."""
    if which not in LIMITS:
        return None
    limit, since = _limit_and_since(job, which)
    if limit is None:
        return None
    used = (now - since).total_seconds() if since is not None else float(limit)
    return LimitReached(which, limit, max(used, 0.0))


def _limit_and_since(job: Job, which: str) -> tuple[int | None, datetime | None]:
    """The spec's seconds for the limit `which`, and since when it counts (None: not yet)."""
    if which == TIME_LIMIT:
        return job.spec.time_limit_seconds, first_held(job)
    return job.spec.attempt_time_limit_seconds, attempt_held(job)


def agent_deadlines(job: Job) -> dict[str, object]:
    """The agent's config keys for the attempt being requested (`job` is that attempt).

    The capacity is not held yet when the startup script is written, so the agent finishes the
    sum at its own start: its deadline is the earliest of `time_limit_at` (the whole job's,
    absolute, known once an earlier attempt has held capacity), its start plus
    `time_limit_seconds` (the first attempt only) and its start plus
    `attempt_time_limit_seconds`. Null keys: no such limit.
    """
    spec = job.spec
    first = first_held(job)
    total = spec.time_limit_seconds
    at = first + timedelta(seconds=total) if first is not None and total is not None else None
    return {
        "time_limit_at": at.isoformat().replace("+00:00", "Z") if at is not None else None,
        "time_limit_seconds": total if first is None else None,
        "attempt_time_limit_seconds": spec.attempt_time_limit_seconds,
    }


def might_hang(job: Job, now: datetime) -> bool:
    """Whether the attempt could be hung, from the job alone: RUNNING, with a hang_timeout, and
    nothing the job knows (the attempt's start, its last checkpoint) newer than the timeout.
    Only then are its workers' records worth reading."""
    timeout = job.spec.hang_timeout_seconds
    if job.state is not JobState.RUNNING or timeout is None:
        return False
    usage = job.usage_of()
    if usage is None:
        return False
    known = [t for t in (usage.held_from, usage.started_at, usage.last_checkpoint_at) if t]
    return bool(known) and (now - max(known)).total_seconds() >= timeout


def hung(job: Job, workers: list[WorkerProgress], now: datetime) -> Hung | None:
    """The attempt is hung when none of its workers still running showed progress within the
    hang_timeout; None otherwise (or when nothing is running)."""
    timeout = job.spec.hang_timeout_seconds
    if job.state is not JobState.RUNNING or timeout is None:
        return None
    usage = job.usage_of()
    start = usage.started_at or usage.held_from if usage is not None else None
    by_worker = {w.worker: w for w in workers}
    silent = []
    for key in job.worker_keys:
        seen = by_worker.get(key)
        # Exited 0 (counted on its record, or in `workers_done`): done, never silent itself. Its
        # record may still show the attempt moving: worker 0 that outlives its command carries
        # its slice's progress in its heartbeats, for peers it speaks for that write nothing.
        done = key in job.workers_done or (seen is not None and seen.exit_code == 0)
        last = (seen.last_progress() if seen is not None else None) or start
        if last is None:
            if done:
                continue
            return None  # nothing to count from
        quiet = (now - last).total_seconds()
        if quiet < timeout:
            return None  # this one moved: the attempt is not hung
        if not done:
            silent.append((key, quiet))
    return Hung(job.attempt, timeout, tuple(silent)) if silent else None


def _spelled(seconds: int) -> str:
    """A duration as the spec writes it: 90s, 45m, 2h, 1h30m."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"
