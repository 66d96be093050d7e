"""Teams' monthly tallies on Firestore (`engine.budgets.BudgetTally`).

`team_usage/{team}:{YYYY-MM}` holds `team`, `month`, `chip_hours` (a sum) and `lifted_by`. An
attempt's chip-hours are added in one batch that creates its marker,
`team_usage/{id}/attempts/{job_id}:{attempt}`, beside a server-side increment of the sum: the
create fails when the marker exists, and with it the whole batch, so a redelivered attempt end
adds nothing. An increment takes no lock and reads nothing, so a team's many attempts ending
together do not queue on a transaction; a notice's claim is a create of
`team_usage/{id}/notices/{threshold}` alike. Reading standings is one `get_all` for all teams.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from google.api_core import exceptions as api_exceptions
from google.cloud import firestore

from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.engine.budgets import MonthTally

if TYPE_CHECKING:
    from google.cloud.firestore import DocumentReference

TEAM_USAGE = "team_usage"


def tally_id(team: str, month: str) -> str:
    return f"{team}:{month}"


class FirestoreBudgetTally:
    """`BudgetTally` on Firestore."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def _ref(self, team: str, month: str) -> DocumentReference:
        return self._db.collection(TEAM_USAGE).document(tally_id(team, month))

    def record(self, team: str, month: str, key: str, chip_hours: float) -> bool:
        tally = self._ref(team, month)
        batch = self._db.batch()
        batch.create(
            tally.collection("attempts").document(key), {"chip_hours": chip_hours, "at": firestore.SERVER_TIMESTAMP}
        )
        batch.set(
            tally,
            {
                "team": team,
                "month": month,
                "chip_hours": firestore.Increment(chip_hours),
                "updated_at": firestore.SERVER_TIMESTAMP,
            },
            merge=True,
        )
        with transient_on_failure(f"add {key}'s chip-hours to {tally.id}"):
            try:
                batch.commit()
            except api_exceptions.AlreadyExists:  # the marker: this attempt was added before
                return False
        return True

    def read(self, teams: Sequence[str], month: str) -> dict[str, MonthTally]:
        refs = [self._ref(team, month) for team in teams]
        with transient_on_failure(f"read the {month} tallies of {len(refs)} teams"):
            found = {snapshot.id: snapshot.to_dict() or {} for snapshot in self._db.get_all(refs)}
        tallies = {}
        for team in teams:
            data = found.get(tally_id(team, month), {})
            chip_hours = data.get("chip_hours")
            lifted = data.get("lifted_by")
            tallies[team] = MonthTally(
                float(chip_hours) if isinstance(chip_hours, int | float) else 0.0,
                lifted if isinstance(lifted, str) else "",
            )
        return tallies

    def claim_notice(self, team: str, month: str, threshold: int) -> bool:
        ref = self._ref(team, month).collection("notices").document(str(threshold))
        with transient_on_failure(f"claim the {threshold}% notice of {tally_id(team, month)}"):
            try:
                ref.create({"at": firestore.SERVER_TIMESTAMP})
            except api_exceptions.AlreadyExists:
                return False
        return True

    def release_notice(self, team: str, month: str, threshold: int) -> None:
        ref = self._ref(team, month).collection("notices").document(str(threshold))
        with transient_on_failure(f"release the {threshold}% notice of {tally_id(team, month)}"):
            ref.delete()

    def lift(self, team: str, month: str, by: str) -> None:
        with transient_on_failure(f"lift the budget of {tally_id(team, month)}"):
            self._ref(team, month).set({"team": team, "month": month, "lifted_by": by}, merge=True)
