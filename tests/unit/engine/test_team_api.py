"""The jobs API's `team-set`, `team-unset` and `team-show` on in-memory fakes: admins only, every
edit a compare-and-set that keeps an edit made in between, and each team's position under its
limits; and a job's team, set at submit from its verified owner."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.admission import Holder
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.api import CALLER_HEADER, JobsApi, Response
from tpujobs.engine.services import Engine
from tpujobs.local.fakes import InMemoryCapacity, InMemoryJobStore, InMemoryPools, RecordingPublisher
from tpujobs.local.fakes.access import InMemoryAccessPolicies
from tpujobs.local.fakes.teams import FakeTeams
from tpujobs.local.testing import inbound, local_settings

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
ZONE = "us-central2-b"
POOL = "v4@us-central2"
ADMIN = "root@example.com"


class RacingTeams(FakeTeams):
    """The fake, with an admin's edit in the console landing while the first edit is decided."""

    def __init__(self, pools: InMemoryPools) -> None:
        super().__init__(pools)
        self.raced = False

    def edit_team(self, name: str, edit: Callable[[dict[str, object]], dict[str, object]]) -> None:
        def racing(document: dict[str, object]) -> dict[str, object]:
            if not self.raced:
                self.raced = True
                super(RacingTeams, self).edit_team("team-z", lambda d: {**d, "team-z": {"members": ["z@example.com"]}})
            return edit(document)

        super().edit_team(name, racing)


@dataclasses.dataclass
class Deployment:
    store: InMemoryJobStore
    pools: InMemoryPools
    teams: RacingTeams
    access: InMemoryAccessPolicies
    service: Engine

    def ask(self, caller: str, **body: Any) -> Response:
        api = JobsApi(self.service, self.store, dataclasses.replace(self.service.settings, local_stack=True))
        return api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: caller}, json.dumps(body).encode())


@pytest.fixture
def deployment() -> Deployment:
    """A zone's 16 v4 chips; an engine on fakes with teams, access policies, and one admin."""
    store = InMemoryJobStore()
    pools = InMemoryPools(store)
    pools.set_quota(ZONE, "v4", "on-demand", 16)
    teams = RacingTeams(pools)
    access = InMemoryAccessPolicies()
    published = RecordingPublisher()
    service = Engine(
        store,
        InMemoryCapacity(),
        local_settings(default_zone=ZONE, logs_bucket="logs", admins=(ADMIN,)),
        lambda: T0,
        lambda seconds: None,
        status=published,
        exports=published,
        pools=pools,
        access=access,
        teams=teams,
    )
    return Deployment(store, pools, teams, access, service)


def queued(deployment: Deployment, job_id: str, team: str) -> None:
    """A QUEUED v4-8 job (4 chips) of `team`, stored as submission stores it."""
    spec = parse_spec({"job_id": job_id, "name": job_id, "owner": "x@example.com", "accelerator_type": "v4-8",
                       "command": "x", "zone": ZONE})  # fmt: skip
    job, event = new_job(spec, ZONE, T0)
    assert deployment.store.create(dataclasses.replace(job, team=team), event)


@pytest.mark.parametrize(
    "body",
    [
        {"action": "team-set", "team": "team-a", "members": ["alice@example.com"]},
        {"action": "team-unset", "team": "team-a"},
        {"action": "team-show"},
    ],
)
def test_only_an_admin_may_set_unset_or_show_teams(deployment, body):
    """403 for anyone else, and nothing written."""
    answer = deployment.ask("alice@example.com", **body)
    assert answer.status == 403, answer.body
    assert "only an admin" in answer.body["error"]
    assert deployment.teams.document() == {}


def test_a_set_keeps_an_admins_edit_made_while_it_was_decided(deployment):
    """The console's team-z lands first; the API's team-a is decided again on top of it."""
    answer = deployment.ask(
        ADMIN, action="team-set", team="team-a", members=["alice@example.com"], chips={f"{ZONE}/v4": 8}, weight=2
    )
    assert answer.status == 200, answer.body
    assert answer.body == {"team": "team-a", "problems": []}
    assert deployment.teams.raced
    assert deployment.teams.document() == {
        "team-z": {"members": ["z@example.com"]},
        "team-a": {"members": ["alice@example.com"], "limits": {f"{ZONE}/v4": {"nominal": 8, "weight": 2}}},
    }


def test_an_edit_the_document_cannot_hold_is_400(deployment):
    """A bad e-mail, a principal of another team, a limit that does not parse, an unknown field."""
    assert deployment.ask(ADMIN, action="team-set", team="team-b", members=["bob@example.com"]).status == 200
    refusals = {
        "'bob' is not an e-mail": {"members": ["bob"]},
        "in team team-b already": {"members": ["bob@example.com"]},
        "is no limit": {"chips": {"us-central2-b": 8}},
        "Unknown field 'owners'": {"owners": ["x@example.com"]},
        "'weight' must be a number above 0": {"weight": 0},
    }
    for sentence, fields in refusals.items():
        answer = deployment.ask(ADMIN, action="team-set", team="team-a", **fields)
        assert answer.status == 400, (sentence, answer.body)
        assert sentence in answer.body["error"], answer.body
    assert "team-a" not in deployment.teams.document()


def test_unset_says_whether_there_was_a_team(deployment):
    """removed: true once, then false."""
    deployment.ask(ADMIN, action="team-set", team="team-a", members=["alice@example.com"])
    assert deployment.ask(ADMIN, action="team-unset", team="team-a").body == {"team": "team-a", "removed": True}
    assert deployment.ask(ADMIN, action="team-unset", team="team-a").body == {"team": "team-a", "removed": False}
    assert deployment.teams.document() == {"team-z": {"members": ["z@example.com"]}}


def test_show_gives_each_teams_share_and_its_chips_now(deployment):
    """16 chips split 8/8: team-a holds 12 (4 borrowed, lent by team-b, idle), team-b waits for 4;
    a limit config/quotas lacks is a problem, not a row."""
    ask = deployment.ask
    ask(ADMIN, action="team-set", team="team-a", members=["alice@example.com"], chips={f"{ZONE}/v4": 8},
        borrowing_limit=8, budget_chip_hours=1000)  # fmt: skip
    ask(ADMIN, action="team-set", team="team-b", accounts=["ci@p.iam.gserviceaccount.com"], chips={f"{ZONE}/v4": 8})
    ask(ADMIN, action="team-set", team="team-c", chips={"us-east5-a/v5p": 4})
    view = deployment.pools.view(POOL)
    holders = [Holder(f"a-{i}", 4, 1, "medium", T0, zone=ZONE, team="team-a") for i in range(3)]
    assert deployment.pools.change(view, add=holders)
    queued(deployment, "b-1", "team-b")

    answer = ask(ADMIN, action="team-show")
    assert answer.status == 200, answer.body
    assert answer.body["problems"] == ["team-c.limits.us-east5-a/v5p: config/quotas has no such limit; skipped"]
    teams = {team["name"]: team for team in answer.body["teams"]}
    assert sorted(teams) == ["team-a", "team-b", "team-c", "team-z"]
    assert teams["team-a"]["members"] == ["alice@example.com"] and teams["team-a"]["budget_chip_hours"] == 1000
    assert teams["team-b"]["accounts"] == ["ci@p.iam.gserviceaccount.com"]
    assert teams["team-a"]["limits"] == [
        {"location": ZONE, "family": "v4", "tier": "on-demand", "nominal": 8, "borrowing_limit": 8,
         "lending_limit": None, "weight": 1.0, "held": 12, "borrowed": 4, "lent": 0, "waiting": 0},
    ]  # fmt: skip
    (team_b,) = teams["team-b"]["limits"]
    assert (team_b["held"], team_b["borrowed"], team_b["lent"], team_b["waiting"]) == (0, 0, 4, 4)
    assert teams["team-c"]["limits"] == []


def test_a_jobs_team_is_its_verified_owners(deployment):
    """The API's caller is verified: its team is the job's; a topic's claimed owner gets none
    unless config/policies trusts topic owners."""
    deployment.ask(ADMIN, action="team-set", team="team-a", members=["alice@example.com"])
    spec = {"name": "train", "accelerator_type": "v4-8", "command": "x", "zone": ZONE}
    answer = deployment.ask("Alice@example.com", action="submit", **spec)
    assert answer.status == 200, answer.body
    assert deployment.store.get(answer.body["job_id"]).team == "team-a"

    claimed = deployment.service.submission.submit(inbound("tpujobs-submit", {**spec, "owner": "alice@example.com"}))
    assert deployment.store.get(claimed.job_id).team == ""
    deployment.access.allowed = AccessPolicies(trust_topic_owners=True)
    trusted = deployment.service.submission.submit(inbound("tpujobs-submit", {**spec, "owner": "alice@example.com"}))
    assert deployment.store.get(trusted.job_id).team == "team-a"
    described = deployment.ask(ADMIN, action="describe", job_id=trusted.job_id).body
    assert described["job"]["team"] == "team-a"
