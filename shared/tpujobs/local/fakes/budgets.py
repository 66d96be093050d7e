"""The per-team monthly tallies in memory (`engine.budgets.BudgetTally`), as the Firestore adapter
keeps them: a total per team and month, the attempts already added, the notices already sent."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpujobs.engine.budgets import MonthTally


@dataclass
class _Month:
    chip_hours: float = 0.0
    lifted_by: str = ""
    attempts: set[str] = field(default_factory=set)
    notices: set[int] = field(default_factory=set)


class InMemoryBudgetTally:
    """`BudgetTally` in memory; `reads` counts the round trips `read` made."""

    def __init__(self) -> None:
        self._months: dict[tuple[str, str], _Month] = {}
        self._lock = threading.Lock()
        self.reads = 0

    def _month(self, team: str, month: str) -> _Month:
        return self._months.setdefault((team, month), _Month())

    def record(self, team: str, month: str, key: str, chip_hours: float) -> bool:
        with self._lock:
            tally = self._month(team, month)
            if key in tally.attempts:
                return False
            tally.attempts.add(key)
            tally.chip_hours += chip_hours
            return True

    def read(self, teams: Sequence[str], month: str) -> dict[str, MonthTally]:
        with self._lock:
            self.reads += 1
            found = {team: self._months.get((team, month)) for team in teams}
        return {team: MonthTally(t.chip_hours, t.lifted_by) if t else MonthTally() for team, t in found.items()}

    def claim_notice(self, team: str, month: str, threshold: int) -> bool:
        with self._lock:
            notices = self._month(team, month).notices
            if threshold in notices:
                return False
            notices.add(threshold)
            return True

    def release_notice(self, team: str, month: str, threshold: int) -> None:
        with self._lock:
            self._month(team, month).notices.discard(threshold)

    def lift(self, team: str, month: str, by: str) -> None:
        with self._lock:
            self._month(team, month).lifted_by = by
