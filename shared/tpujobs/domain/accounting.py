"""What a job's capacity cost and how much of it preemption threw away.

Pure arithmetic on the timestamps the transitions record in each attempt's usage (`waiting_since`,
`held_from`, `ended_at`, `last_checkpoint_at`): chip-hours from capacity held to the attempt's end, the
queue wait, the time a lost attempt threw away since its last checkpoint, and the job's goodput. A running
attempt counts up to `now`, which the caller passes.
The fields and formulas: docs/records.md#accounting-chip-hours-lost-time-goodput.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class AttemptUsage:
    """The timestamps of one attempt that its cost is computed from."""

    attempt: int
    chips: int
    waiting_since: datetime
    held_from: datetime | None = None
    ended_at: datetime | None = None
    last_checkpoint_at: datetime | None = None
    capacity_lost: bool = False  # it ended because its capacity went away
    zone: str = ""  # where the attempt asked for capacity
    work_kept: bool = True  # the job goes on from the attempt's checkpoint, not from scratch
    started_at: datetime | None = None  # the first worker said `started`
    all_started_at: datetime | None = None  # every host known to have reported: boot is over
    image_digest: str | None = None  # the container image that ran (the first host's pull)
    other_image_digest: str | None = None  # another digest a host of the same attempt pulled
    pool: str = ""  # the warm pool whose unit the attempt ran on ("" for capacity of its own)
    last_checkpoint_step: int | None = None  # the step of `last_checkpoint_at`, when the host said it

    def held_seconds(self, now: datetime) -> float:
        if self.held_from is None:
            return 0.0
        return max(0.0, ((self.ended_at or now) - self.held_from).total_seconds())

    def chip_hours(self, now: datetime) -> float:
        return self.chips * self.held_seconds(now) / SECONDS_PER_HOUR

    def queue_wait_seconds(self, now: datetime) -> float:
        waited_until = self.held_from or self.ended_at or now
        return max(0.0, (waited_until - self.waiting_since).total_seconds())

    def lost_seconds(self) -> float:
        """Held time whose work is gone: since the last checkpoint when capacity was lost."""
        if not self.capacity_lost or self.held_from is None or self.ended_at is None:
            return 0.0
        kept_until = self.held_from
        if self.work_kept and self.last_checkpoint_at is not None:
            kept_until = max(kept_until, self.last_checkpoint_at)
        return max(0.0, (self.ended_at - kept_until).total_seconds())

    def lost_chip_hours(self) -> float:
        return self.chips * self.lost_seconds() / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Accounting:
    """A job's totals over all its attempts."""

    chip_hours: float
    lost_chip_hours: float
    queue_wait_seconds: float
    lost_seconds: float

    @property
    def useful_chip_hours(self) -> float:
        return self.chip_hours - self.lost_chip_hours

    @property
    def goodput(self) -> float | None:
        """Useful chip-hours over all chip-hours; None while no chip time was paid for."""
        if self.chip_hours <= 0:
            return None
        return self.useful_chip_hours / self.chip_hours


def account(usage: tuple[AttemptUsage, ...], now: datetime) -> Accounting:
    """Sum every attempt's usage, counting an unfinished attempt up to `now`."""
    return Accounting(
        chip_hours=sum(u.chip_hours(now) for u in usage),
        lost_chip_hours=sum(u.lost_chip_hours() for u in usage),
        queue_wait_seconds=sum(u.queue_wait_seconds(now) for u in usage),
        lost_seconds=sum(u.lost_seconds() for u in usage),
    )


# -- how transitions change the usage ------------------------------------------------


def first_attempt(chips: int, submitted_at: datetime, zone: str = "") -> tuple[AttemptUsage, ...]:
    return (AttemptUsage(1, chips, submitted_at, zone=zone),)


def capacity_held(usage: tuple[AttemptUsage, ...], attempt: int, now: datetime) -> tuple[AttemptUsage, ...]:
    """The attempt's capacity is active: its chip time starts now, if it has not already."""
    return _amend(usage, attempt, lambda u: u if u.held_from or u.ended_at else replace(u, held_from=now))


def attempt_ended(
    usage: tuple[AttemptUsage, ...],
    attempt: int,
    now: datetime,
    capacity_lost: bool = False,
    work_kept: bool = True,
) -> tuple[AttemptUsage, ...]:
    """The attempt is over: its chip time stops now. Ending twice keeps the first end."""
    return _amend(
        usage,
        attempt,
        lambda u: u if u.ended_at else replace(u, ended_at=now, capacity_lost=capacity_lost, work_kept=work_kept),
    )


def next_attempt(
    usage: tuple[AttemptUsage, ...], attempt: int, chips: int, now: datetime, zone: str = ""
) -> tuple[AttemptUsage, ...]:
    """A new attempt waits for capacity from the moment the previous one ended."""
    if any(u.attempt == attempt for u in usage):
        return usage
    previous = usage[-1] if usage else None
    since = (previous.ended_at if previous else None) or now
    return (*usage, AttemptUsage(attempt, chips, since, zone=zone))


def workers_started(
    usage: tuple[AttemptUsage, ...], attempt: int, now: datetime, every: bool = False
) -> tuple[AttemptUsage, ...]:
    """A worker of the attempt started: the first one starts the boot clock of the others
    (`every`: it was the attempt's only host, so boot is over too)."""

    def started(u: AttemptUsage) -> AttemptUsage:
        first = u.started_at or now
        return replace(u, started_at=first, all_started_at=u.all_started_at or (first if every else None))

    return _amend(usage, attempt, started)


def all_started(usage: tuple[AttemptUsage, ...], attempt: int, at: datetime) -> tuple[AttemptUsage, ...] | None:
    """Every host of the attempt has reported, by `at`; None when that is already noted."""
    if any(u.attempt == attempt and u.all_started_at is not None for u in usage):
        return None
    if not any(u.attempt == attempt for u in usage):
        return None
    return _amend(usage, attempt, lambda u: replace(u, all_started_at=at))


def on_pool(usage: tuple[AttemptUsage, ...], attempt: int, pool: str, zone: str) -> tuple[AttemptUsage, ...]:
    """The attempt runs on a unit of warm pool `pool`, in `zone`."""
    return _amend(usage, attempt, lambda u: replace(u, pool=pool, zone=zone))


def attempt_moved(usage: tuple[AttemptUsage, ...], attempt: int, zone: str) -> tuple[AttemptUsage, ...]:
    """An attempt that never asked for capacity waits in another zone now."""
    return _amend(usage, attempt, lambda u: replace(u, zone=zone))


def checkpoint_reported(
    usage: tuple[AttemptUsage, ...], attempt: int, at: datetime, step: int | None = None
) -> tuple[AttemptUsage, ...] | None:
    """The usage with a newer checkpoint for `attempt`, or None when it changes nothing.

    Newer by its step when both are known: every host of a slice reports the same step a few
    moments apart, and only the first of them changes the job (one write per checkpoint, not
    one per host); by its time otherwise.
    """
    for u in usage:
        if u.attempt == attempt:
            if step is not None and u.last_checkpoint_step is not None:
                if step <= u.last_checkpoint_step:
                    return None
            elif u.last_checkpoint_at is not None and u.last_checkpoint_at >= at:
                return None
            kept = u.last_checkpoint_step if step is None else step
            return tuple(replace(v, last_checkpoint_at=at, last_checkpoint_step=kept) if v is u else v for v in usage)
    return None


def image_reported(usage: tuple[AttemptUsage, ...], attempt: int, digest: str) -> tuple[AttemptUsage, ...] | None:
    """The usage with the image digest a host of `attempt` ran, or None when it changes nothing.

    The first digest reported is the attempt's; a different one is kept once beside it, so two
    hosts that ran different images (a tag moved between their pulls) are never shown as one.
    """
    current = next((u for u in usage if u.attempt == attempt), None)
    if current is None:
        return None
    if current.image_digest is None:
        return _amend(usage, attempt, lambda u: replace(u, image_digest=digest))
    if digest == current.image_digest or current.other_image_digest is not None:
        return None
    return _amend(usage, attempt, lambda u: replace(u, other_image_digest=digest))


def _amend(
    usage: tuple[AttemptUsage, ...], attempt: int, change: Callable[[AttemptUsage], AttemptUsage]
) -> tuple[AttemptUsage, ...]:
    return tuple(change(u) if u.attempt == attempt else u for u in usage)
