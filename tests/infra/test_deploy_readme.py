"""The deploy section of the docs (docs/operations.md) says what infra/ needs: its variables, APIs,
targets, outputs. The README links to it."""

from __future__ import annotations

import re

import pytest
from terraform_config import ROOT, Terraform
from test_cloudbuild import makefile_targets

PAGE = ROOT / "docs" / "operations.md"
HEADING = "## Deploying to a real project"


@pytest.fixture(scope="module")
def section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    assert HEADING in text, f"{PAGE.name} has no section {HEADING!r}"
    rest = text.split(HEADING, 1)[1]
    return re.split(r"^## ", rest, flags=re.MULTILINE)[0]


def test_every_required_variable_is_explained(section: str, tf: Terraform) -> None:
    """A variable without a default must be set, so the deploy section names it."""
    required = [name for name, variable in tf.variables.items() if "default" not in variable]
    assert required, "expected at least `project` to be required"
    for name in required:
        assert f"`{name}`" in section, f"variable {name} has no default and the deploy section does not mention it"


def test_every_variable_is_mentioned(section: str, tf: Terraform) -> None:
    """Optional variables are listed too, so nobody has to read variables.tf to find them."""
    for name in tf.variables:
        assert f"`{name}`" in section, f"variable {name} is not mentioned"


def test_every_api_infra_enables_is_listed(section: str, tf: Terraform) -> None:
    """The `gcloud services enable` line lists exactly the APIs infra/apis.tf enables."""
    enabled = set(tf.locals["apis"])
    listed = set(
        re.findall(r"[a-z]+\.googleapis\.com", section.split("gcloud services enable", 1)[1].split("```", 1)[0])
    )
    assert listed == enabled


def test_make_targets_and_outputs_it_uses_exist(section: str, tf: Terraform) -> None:
    """Every `make X` and `terraform output X` in the section is real."""
    goals = [goal for run in re.findall(r"\bmake((?: [a-z][a-z-]*)+)", section) for goal in run.split()]
    assert "bundle" in goals
    assert set(goals) <= makefile_targets()
    outputs = re.findall(r"output -raw (\w+)", section)
    assert outputs and set(outputs) <= set(tf.outputs)
    for name in re.findall(r"`(\w+)` output", section):
        assert name in tf.outputs, name


def test_the_cost_estimate_is_there(section: str) -> None:
    """Idle and per-1,000-jobs costs, with the assumptions they rest on."""
    assert "At idle" in section and "Per 1,000 jobs" in section
    assert "$40 per TiB" in section and "$0.40 per million requests" in section
