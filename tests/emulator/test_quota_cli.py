"""`tpujobs quota show|set|unset` on the Firestore emulator: what admission then reads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.cli import app

pytestmark = pytest.mark.emulator


@pytest.fixture
def run(project_id, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project_id)
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))  # no local stack's settings leak in

    def invoke(*args: str):
        return CliRunner().invoke(app, ["quota", *args], env={"COLUMNS": "120"})

    return invoke


def test_set_show_and_unset_a_quota(run, firestore_client):
    assert "No quotas" in run("show").output

    result = run("set", "us-central2-b", "v4", "64")
    assert result.exit_code == 0, result.output
    assert FirestorePools(firestore_client).quotas() == {"us-central2-b": {"v4": 64}}
    run("set", "us-west4-a", "v5litepod", "128")
    shown = run("show").output
    assert "v4@us-central2-b" in shown and "64" in shown and "v5litepod@us-west4-a" in shown

    assert run("unset", "us-central2-b", "v4").exit_code == 0
    assert FirestorePools(firestore_client).quotas() == {"us-central2-b": {}, "us-west4-a": {"v5litepod": 128}}


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("set", "not a zone", "v4", "8"), "is not a zone"),
        (("set", "us-central2-b", "v9", "8"), "is not one of"),
        (("set", "us-central2-b", "v4", "-1"), "-1"),
    ],
)
def test_bad_quotas_are_refused_and_nothing_is_written(run, firestore_client, args, complaint):
    result = run(*args)
    assert result.exit_code != 0 and complaint in result.output
    assert FirestorePools(firestore_client).quotas() == {}
