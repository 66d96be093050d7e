"""cloudbuild.yaml parses, runs real Makefile targets in order, and applies only when asked."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml
from terraform_config import ROOT


@pytest.fixture(scope="module")
def build() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "cloudbuild.yaml").read_text(encoding="utf-8"))


def makefile_targets() -> set[str]:
    """The targets the Makefile defines (rules, not variable assignments)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.$()/-]+):(?!=)", text, re.MULTILINE)}


def make_goals(command: str) -> list[str]:
    """The goals of every `make ...` run as a command (VAR=value and options left out; an
    `apt-get install make` is no call)."""
    goals = []
    for match in re.finditer(r"(?:^|&&|;|\bthen|\n)\s*make\s+([^;&|\n]+)", command):
        for word in shlex.split(match.group(1)):
            if "=" not in word and not word.startswith("-"):
                goals.append(word)
    return goals


def _command(step: dict[str, Any]) -> str:
    return " ".join(str(arg) for arg in step.get("args", []))


def test_every_step_runs_real_make_targets(build: dict[str, Any]) -> None:
    """Each step calls make, and only targets the Makefile has."""
    targets = makefile_targets()
    assert {"lint", "test-unit", "test-emulator", "infra-check", "bundle", "plan", "apply", "test"} <= targets
    for step in build["steps"]:
        if step["id"] == "terraform-binary":
            continue
        goals = make_goals(_command(step))
        assert goals, f"step {step['id']} runs no make target"
        assert set(goals) <= targets, f"step {step['id']} calls unknown targets {set(goals) - targets}"


def test_the_pipeline_tests_then_bundles_plans_and_applies(build: dict[str, Any]) -> None:
    """lint, unit, emulator and infra checks before the bundle; then plan; apply last."""
    goals = [goal for step in build["steps"] for goal in make_goals(_command(step))]
    assert goals == ["lint", "test-unit", "test-emulator", "infra-check", "bundle", "plan", "apply"]
    steps = {step["id"]: step for step in build["steps"]}
    assert set(steps["bundle"]["waitFor"]) == {"test-unit", "test-emulator", "infra-check"}
    assert steps["plan"]["waitFor"] == ["bundle"] and steps["apply"]["waitFor"] == ["plan"]
    assert ":emulators" in steps["test-emulator"]["name"]


def test_apply_runs_only_when_asked(build: dict[str, Any]) -> None:
    """_APPLY defaults to false and guards the apply step's make apply."""
    assert build["substitutions"]["_APPLY"] == "false"
    apply = _command(next(step for step in build["steps"] if step["id"] == "apply"))
    assert re.search(r'if \[ "\$\{_APPLY\}" = "true" \]; then\s+[^\n]*make apply', apply)


def test_every_user_substitution_is_declared(build: dict[str, Any]) -> None:
    """Cloud Build rejects a build that uses an undeclared _SUBSTITUTION."""
    text = (ROOT / "cloudbuild.yaml").read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{?(_[A-Z0-9_]+)", text))
    assert used <= set(build["substitutions"]), used - set(build["substitutions"])


def test_plan_gets_every_variable_without_a_default(build: dict[str, Any], tf: Any) -> None:
    """The plan step sets TF_VAR_ for each required Terraform variable."""
    plan = next(step for step in build["steps"] if step["id"] == "plan")
    given = {entry.split("=", 1)[0].removeprefix("TF_VAR_") for entry in plan["env"]}
    required = {name for name, variable in tf.variables.items() if "default" not in variable}
    assert required <= given, required - given
    assert given <= set(tf.variables), given - set(tf.variables)
