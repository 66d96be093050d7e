"""The `jobs` API's team actions (`tpujobs team`): set, unset and show teams in `config/teams`.

Admins only (`TPUJOBS_ADMINS`): a team's share decides whose jobs get chips. An edit is a
compare-and-set on `config/teams` (`ports.Teams.edit_team`), so an admin's edit in the console in
between is kept. `set_team` and `unset_team` are what the CLI runs too, without the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpujobs.domain.team_edits import with_team, without_team
from tpujobs.engine.jobs_api.answers import ApiError, Response
from tpujobs.engine.jobs_api.requests import NothingRequest, TeamRequest, TeamSetRequest
from tpujobs.engine.jobs_api.team_answers import team_document

if TYPE_CHECKING:
    from tpujobs.engine.ports import Pools, Teams
    from tpujobs.engine.settings import Settings


def set_team(teams: Teams, name: str, **fields: Any) -> list[str]:
    """Create or change team `name` (`domain.team_edits.with_team`'s fields); the problems of
    `config/teams` as it then reads. ValueError, raised by the edit before anything is written,
    for what it refuses."""
    teams.edit_team(name, lambda document: with_team(document, name, **fields))
    return teams.teams().problems


def unset_team(teams: Teams, name: str) -> bool:
    """Remove team `name`; whether there was one."""
    found: list[bool] = []

    def edit(document: dict[str, object]) -> dict[str, object]:
        found[:] = [name in document]
        return without_team(document, name)

    teams.edit_team(name, edit)
    return bool(found and found[0])


class TeamActions:
    """`team-set`, `team-unset`, `team-show`, on the deployment's teams and quota pools."""

    def __init__(self, teams: Teams | None, pools: Pools | None, settings: Settings) -> None:
        """`teams`: config/teams (None: this API was built without); `pools`: the quota pools
        whose holders and queues the positions are read from (None: no quotas)."""
        self.teams_kept = teams
        self.pools = pools
        self.settings = settings

    def set(self, caller: str, request: TeamSetRequest) -> Response:
        """Create or change a team: 200 with `config/teams`' problems as it then reads, 400 for an
        edit it cannot hold (a bad e-mail, a principal of another team, a limit that does not parse)."""
        teams = self._admin_only(caller, "change teams")
        fields = request.model_dump(exclude_unset=True, exclude={"team"})
        try:
            problems = set_team(teams, request.team, **fields)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        return Response(200, {"team": request.team, "problems": problems})

    def unset(self, caller: str, request: TeamRequest) -> Response:
        """Remove a team: 200, `removed` false when there was none."""
        teams = self._admin_only(caller, "change teams")
        try:
            removed = unset_team(teams, request.team)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        return Response(200, {"team": request.team, "removed": removed})

    def show(self, caller: str, request: NothingRequest) -> Response:
        """Every team with its shares and positions (`team_answers.team_document`)."""
        return Response(200, team_document(self._admin_only(caller, "read teams"), self.pools))

    def _admin_only(self, caller: str, what: str) -> Teams:
        if caller not in self.settings.admins:
            raise ApiError(403, f"{caller} may not {what}: only an admin (TPUJOBS_ADMINS) may.")
        if self.teams_kept is None:
            raise ApiError(503, "This deployment's API was built without teams.")
        return self.teams_kept
