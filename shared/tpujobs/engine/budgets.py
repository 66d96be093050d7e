"""Teams' monthly chip-hour budgets: the month's tally, who is over, and the 80% and 100% notices.

A team's use in a month is a tally (`team_usage/{team}:{YYYY-MM}`) that an attempt adds its chip
time to once, when it ends and its chip-hours are final (`record_attempt`, called by the notify
function on the status change that ended it, `engine.notifications.Notifier`): the addition is
keyed by job and attempt, so a redelivered end adds nothing, and an attempt that spans two months
adds each month's part to that month. Reading a team's standing is one document, and
`over_budget` one round trip for every team with a budget. A running attempt counts once it ends.
At 80% and 100% of the month's budget the team's members and the admins are told, once each per
month, through their `config/notify` targets. An admin lifts a team over its budget for a month
with `lift` (`tpujobs usage lift TEAM`), or raises or drops the budget (`tpujobs team set`).
See docs/usage.md#budgets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.notify import NotifyTarget, team_defaults
from tpujobs.domain.usage import Month, month_chip_hours
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import Clock

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.domain.teams import Team, TeamBook
    from tpujobs.engine.notifications import NotifyConfig
    from tpujobs.engine.ports import Teams

log = logging.getLogger(__name__)

THRESHOLDS = (80, 100)  # percent of the month's budget at which the team and the admins are told


@dataclass(frozen=True)
class MonthTally:
    """A team's month as the tally holds it."""

    chip_hours: float = 0.0
    lifted_by: str = ""  # the admin who let the team past its budget for this month; "": not lifted


class BudgetTally(Protocol):
    """The per-team monthly tallies (`adapters.firestore_budgets`, `local.fakes.budgets`)."""

    def record(self, team: str, month: str, key: str, chip_hours: float) -> bool:
        """Add `chip_hours` to the team's month once for `key` (`{job_id}:{attempt}`), in one
        atomic write; False when `key` was recorded before (nothing added)."""

    def read(self, teams: Sequence[str], month: str) -> dict[str, MonthTally]:
        """Each team's tally of the month, in one round trip; an absent one is MonthTally()."""

    def claim_notice(self, team: str, month: str, threshold: int) -> bool:
        """Mark the month's `threshold` notice as sent; False when it was already marked."""

    def release_notice(self, team: str, month: str, threshold: int) -> None:
        """Undo a claim whose notice could not be delivered, so the next attempt end tries again."""

    def lift(self, team: str, month: str, by: str) -> None:
        """Let the team past its budget for the month (`by` ""): hold it back again."""


@dataclass(frozen=True)
class BudgetNotice:
    """A team crossed `threshold`% of its month's budget."""

    team: str
    month: str
    used: float
    budget: float
    threshold: int

    def text(self) -> str:
        return (
            f"tpujobs team {self.team} has used {self.used:,.0f} of its {self.budget:,.0f} chip-hour budget for "
            f"{self.month} ({self.threshold}%)"
            + ("; its new jobs wait until an admin lifts it or the month ends" if self.threshold >= 100 else "")
        )

    def fields(self) -> dict[str, object]:
        return {
            "text": self.text(),
            "team": self.team,
            "month": self.month,
            "used_chip_hours": round(self.used, 3),
            "budget_chip_hours": self.budget,
            "threshold": self.threshold,
        }


class BudgetNotices(Protocol):
    """Posts a budget notice to one target (`engine.budget_notices.WebhookBudgetNotices`)."""

    def post(self, target: NotifyTarget, notice: BudgetNotice) -> None:
        """Deliver once; PermanentError or TransientError when it could not."""


def waiting_reason(team: str, used: float, budget: float, month: str) -> str:
    return (
        f"{team} has used {used:,.0f} of its {budget:,.0f} chip-hour budget for {month}; "
        f"an admin may lift it (tpujobs usage lift {team})"
    )


def attempt_months(usage: AttemptUsage) -> dict[str, float]:
    """Month (YYYY-MM) -> the ended attempt's chip-hours in it; empty while it never held capacity."""
    if usage.held_from is None or usage.ended_at is None:
        return {}
    found: dict[str, float] = {}
    month = Month.of(usage.held_from)
    while month.start < usage.ended_at:
        chip_hours, _ = month_chip_hours(usage, month, usage.ended_at)
        if chip_hours > 0:
            found[str(month)] = chip_hours
        month = Month.of(month.end)
    return found


class TeamBudgets:
    """Standing, who is over, and the notices; `teams` is the `Teams` port (engine.ports)."""

    def __init__(
        self,
        tally: BudgetTally,
        clock: Clock,
        notices: BudgetNotices | None = None,
        notify_config: NotifyConfig | None = None,
        admins: Sequence[str] = (),
        teams: Teams | None = None,
    ) -> None:
        """`teams`: config/teams, read only when an attempt's end may cross a threshold."""
        self.tally, self.clock, self.notices = tally, clock, notices
        self.notify_config, self.admins, self.teams = notify_config, tuple(admins), teams

    def standing(self, team: Team, month: str | None = None) -> tuple[float, float | None]:
        """(chip-hours used, budget) of the team in `month` (default: the current one, UTC)."""
        wanted = month or str(Month.of(self.clock()))
        return self.tally.read([team.name], wanted)[team.name].chip_hours, team.budget_chip_hours

    def over_budget(self, book: TeamBook, month: str | None = None) -> dict[str, str]:
        """Team name -> why its new jobs wait, for every team at or past its budget this month
        (default: the current one, UTC) and not lifted; one tally read for all teams with a budget."""
        wanted = month or str(Month.of(self.clock()))
        budgeted = [team for team in book.teams if team.budget_chip_hours is not None]
        if not budgeted:
            return {}
        tallies = self.tally.read([team.name for team in budgeted], wanted)
        over: dict[str, str] = {}
        for team in budgeted:
            budget, tally = team.budget_chip_hours, tallies[team.name]
            assert budget is not None
            if tally.chip_hours >= budget and not tally.lifted_by:
                over[team.name] = waiting_reason(team.name, tally.chip_hours, budget, wanted)
        return over

    def record_attempt(self, job: Job, attempt: int) -> None:
        """Add an ended attempt's chip-hours to its team's months (once, whatever redelivers it);
        then tell the team and the admins of a threshold this month crossed. An attempt not
        ended, or that never held capacity, or of a job in no team, adds nothing."""
        usage = job.usage_of(attempt)
        months = attempt_months(usage) if job.team and usage is not None else {}
        for month, chip_hours in months.items():
            self.tally.record(job.team, month, f"{job.job_id}:{attempt}", chip_hours)
        current = str(Month.of(self.clock()))
        if current not in months or self.teams is None:
            return  # a redelivered end still gets here: a notice whose delivery failed is tried again
        team = self.teams.teams().get(job.team)
        if team is not None and team.budget_chip_hours is not None:
            self.notify_crossed(team, current)

    def notify_crossed(self, team: Team, month: str) -> list[int]:
        """Tell of each threshold the team's month has reached and not yet told; the thresholds told."""
        budget = team.budget_chip_hours
        if budget is None or budget <= 0:
            return []
        used = self.tally.read([team.name], month)[team.name].chip_hours
        told = []
        for threshold in THRESHOLDS:
            if used < budget * threshold / 100 or not self.tally.claim_notice(team.name, month, threshold):
                continue
            notice = BudgetNotice(team.name, month, used, budget, threshold)
            try:
                self._deliver(team, notice)
            except TransientError:
                self.tally.release_notice(team.name, month, threshold)  # the next attempt end tries again
                raise
            told.append(threshold)
        return told

    def _deliver(self, team: Team, notice: BudgetNotice) -> None:
        """Post to every target of the members' and admins' config/notify entries; a target refused
        for good is logged and skipped, a passing failure raised (after the others were tried)."""
        targets = self.targets(team)
        log.info("%s (%d targets)", notice.text(), len(targets))
        if self.notices is None:
            return
        passing: list[str] = []
        for target in targets:
            try:
                self.notices.post(target, notice)
            except PermanentError as error:
                log.warning("budget notice of %s to %s refused: %s", team.name, target.label(), error)
            except TransientError as error:
                passing.append(f"{target.label()}: {error}")
        if passing:
            raise TransientError(f"budget notice of {team.name} not delivered: {'; '.join(passing)}")

    def targets(self, team: Team) -> list[NotifyTarget]:
        """The config/notify targets of each member and admin (and their groups), each once."""
        if self.notify_config is None:
            return []
        defaults: Mapping[str, Sequence[NotifyTarget]] = self.notify_config.notify_defaults()
        if not defaults:
            return []
        policies = self.notify_config.policies()
        found: list[NotifyTarget] = []
        for person in _people(team.members, self.admins):
            found.extend(t for t in team_defaults(defaults, policies.members(person)) if t not in found)
        return found

    def lift(self, team: str, month: str | None = None, by: str = "") -> None:
        """Let `team` past its budget for `month` (default: the current one); `by` "" holds it back again."""
        self.tally.lift(team, month or str(Month.of(self.clock())), by)


def _people(members: Iterable[str], admins: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for person in (*members, *admins):
        if person not in seen:
            seen.append(person)
    return seen
