"""cloudbuild.yaml parses, runs real Makefile targets in order, applies only when asked, and every
step runs: what it uses that an earlier step made (a venv, Terraform's plugins, a copied binary)
was made in its own image, and every path it names is in its image or in /workspace."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from terraform_config import ROOT

WORKSPACE = "/workspace/"  # the one folder Cloud Build shares between steps: the checkout


@dataclass(frozen=True)
class Image:
    """What a step image is known to hold, from its Dockerfile."""

    installer: str  # how a step adds a package to its own container
    paths: tuple[str, ...]  # absolute paths a command may name, beside COMMON_PATHS


IMAGES = {
    "google/cloud-sdk": Image("apt-get", ("/google-cloud-sdk/", "/usr/bin/")),  # Debian
    "python": Image("apt-get", ("/usr/local/bin/", "/usr/bin/")),  # Debian
    "hashicorp/terraform": Image("apk", ("/bin/terraform",)),  # Alpine
}
COMMON_PATHS = ("/dev/null", "/tmp/", "/bin/sh")
INSTALLERS = {image.installer for image in IMAGES.values()}
# An absolute path in a command (not part of a URL, a $(...) or another path).
_ABSOLUTE = re.compile(r"(?<![\w.$:/-])/[\w.-]+(?:/[\w.-]*)*")


@pytest.fixture(scope="module")
def build() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "cloudbuild.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def makefile() -> Makefile:
    return Makefile.load((ROOT / "Makefile").read_text(encoding="utf-8"))


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
    """The step's arguments, one a line: `-c`, then the script."""
    return "\n".join(str(arg) for arg in step.get("args", []))


@dataclass(frozen=True)
class Makefile:
    """Rules with their variables expanded: target -> (prerequisites, recipe lines)."""

    rules: dict[str, tuple[list[str], list[str]]]

    @classmethod
    def load(cls, text: str) -> Makefile:
        variables: dict[str, str] = {}
        rules: dict[str, tuple[list[str], list[str]]] = {}
        current: list[str] = []
        for line in text.replace("\\\n", " ").splitlines():
            if line.startswith("\t"):
                current.append(line.strip())
            elif assignment := re.match(r"^([A-Z_]+)\s*(?::=|\?=|=)\s*(.*)$", line):
                variables[assignment.group(1)] = assignment.group(2).strip()
            elif (rule := re.match(r"^([^\s#:=][^:=]*):(?!=)(.*)$", line)) and not line.startswith("."):
                current = []
                for target in _expand(rule.group(1), variables).split():
                    rules[target] = (_expand(rule.group(2), variables).split(), current)
        expanded = {t: (pre, [_expand(line, variables) for line in recipe]) for t, (pre, recipe) in rules.items()}
        return cls(expanded)

    def closure(self, goal: str) -> set[str]:
        """goal and every rule it depends on, however deep."""
        found, todo = set(), [goal]
        while todo:
            target = todo.pop()
            if target in self.rules and target not in found:
                found.add(target)
                todo += self.rules[target][0]
        return found

    def recipes(self, goals: list[str]) -> str:
        return "\n".join(line for goal in goals for t in self.closure(goal) for line in self.rules[t][1])

    def makes(self, goals: list[str]) -> set[str]:
        """The tool folders running these goals creates: venvs, Terraform's working folder."""
        recipes = self.recipes(goals)
        venvs = set(re.findall(r"-m venv (\S+)", recipes))
        return venvs | {f"{d}/.terraform" for d in re.findall(r"-chdir=(\S+) init\b", recipes)}

    def uses(self, goals: list[str]) -> set[str]:
        """The tool folders these goals run something from."""
        recipes = self.recipes(goals)
        every_venv = set(re.findall(r"-m venv (\S+)", self.recipes(list(self.rules))))
        venvs = {venv for venv in every_venv if f"{venv}/bin/" in recipes}
        return venvs | {f"{d}/.terraform" for d in re.findall(r"-chdir=(\S+) (?:plan|apply|output)\b", recipes)}


def _expand(text: str, variables: dict[str, str]) -> str:
    """$(NAME) replaced by its value, until none is left (make's functions stay as written)."""
    for _ in range(10):
        text = re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m.group(1), m.group(0)), text)
    return text


def _image(step: dict[str, Any], build: dict[str, Any]) -> str:
    """The step's image with the build's default substitutions in place."""
    subs = build.get("substitutions", {})
    return re.sub(r"\$\{(_[A-Z0-9_]+)\}", lambda m: str(subs[m.group(1)]), step["name"])


def _before(steps: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each step's id -> the ids of every step it waits for, directly or not. Without waitFor a
    step waits for all steps above it; waitFor ["-"] starts it at once."""
    before: dict[str, set[str]] = {}
    for index, step in enumerate(steps):
        direct = step.get("waitFor", [s["id"] for s in steps[:index]])
        before[step["id"]] = set().union(*({d} | before[d] for d in direct if d != "-"))
    return before


def problems(build: dict[str, Any], makefile: Makefile) -> list[str]:
    """Why a step would fail in the image it runs in."""
    steps = build["steps"]
    before = _before(steps)
    image = {s["id"]: _image(s, build) for s in steps}
    command = {s["id"]: _command(s) for s in steps}
    goals = {s["id"]: make_goals(command[s["id"]]) for s in steps}
    found = []
    for step in steps:
        sid, known = step["id"], IMAGES.get(image[step["id"]].split(":")[0])
        if known is None:
            found.append(f"{sid}: image {image[sid]} is not in IMAGES: say what it holds")
            continue
        for installer in INSTALLERS - {known.installer}:
            if re.search(rf"\b{installer}\b", command[sid]):
                found.append(f"{sid}: {image[sid]} has no {installer}")
        for path in _ABSOLUTE.findall(command[sid]):
            if path.startswith(WORKSPACE):
                relative = path.removeprefix(WORKSPACE)
                parts = relative.strip("/").split("/")
                names = {WORKSPACE + "/".join(parts[:n]) for n in range(1, len(parts) + 1)}
                made = [
                    b for b in before[sid] if any(re.search(rf"{re.escape(n)}(?![\w.-])", command[b]) for n in names)
                ]
                found += [
                    f"{sid}: {path} was made by {b} in {image[b]}, used in {image[sid]}"
                    for b in made
                    if image[b] != image[sid]
                ]
            elif not path.startswith(COMMON_PATHS + known.paths):
                found.append(f"{sid}: {path} is not known to be in {image[sid]}")
        for tool in sorted(makefile.uses(goals[sid])):
            makers = [b for b in before[sid] if tool in makefile.makes(goals[b])]
            found += [
                f"{sid}: uses {tool} made by {b} in {image[b]}, but runs in {image[sid]}"
                for b in makers
                if image[b] != image[sid]
            ]
            if makers:
                continue
            if tool not in makefile.makes(goals[sid]):
                found.append(f"{sid}: uses {tool}, which no earlier step makes")
            for other in steps:
                oid = other["id"]
                apart = oid != sid and oid not in before[sid] and sid not in before[oid]
                if (
                    apart
                    and sid < oid
                    and tool in makefile.makes(goals[oid])
                    and not any(tool in makefile.makes(goals[b]) for b in before[oid])
                ):
                    found.append(f"{sid} and {oid} both make {tool} at the same time")
    return found


def test_every_step_runs_real_make_targets(build: dict[str, Any]) -> None:
    """Each step calls make, and only targets the Makefile has."""
    targets = makefile_targets()
    assert {
        "lint",
        "test-unit",
        "test-emulator",
        "infra-check",
        "infra-fmt",
        "infra-test",
        "bundle",
        "plan",
        "apply",
        "test",
    } <= targets
    for step in build["steps"]:
        goals = make_goals(_command(step))
        assert goals, f"step {step['id']} runs no make target"
        assert set(goals) <= targets, f"step {step['id']} calls unknown targets {set(goals) - targets}"


def test_the_pipeline_tests_then_bundles_plans_and_applies(build: dict[str, Any], makefile: Makefile) -> None:
    """lint, unit, emulator and infra checks (both halves of infra-check) before the bundle;
    then plan; apply last."""
    goals = [goal for step in build["steps"] for goal in make_goals(_command(step))]
    assert goals == ["lint", "test-unit", "test-emulator", "infra-fmt", "infra-test", "bundle", "plan", "apply"]
    assert makefile.rules["infra-check"][0] == ["infra-fmt", "infra-test"]
    steps = {step["id"]: step for step in build["steps"]}
    assert set(steps["bundle"]["waitFor"]) == {"test-unit", "test-emulator", "infra-fmt", "infra-test"}
    assert steps["plan"]["waitFor"] == ["bundle"] and steps["apply"]["waitFor"] == ["plan"]
    assert ":emulators" in _image(steps["test-emulator"], build)


def test_every_step_runs_in_the_image_that_made_what_it_uses(build: dict[str, Any], makefile: Makefile) -> None:
    """No step uses a venv, Terraform's plugins or a copied binary made in another image, no two
    steps make one at once, and every path a command names is in its image or /workspace."""
    assert makefile.uses(["test-emulator"]) == {".venv"} and makefile.uses(["apply"]) == {"infra/.terraform"}
    assert problems(build, makefile) == []


def test_the_image_check_finds_the_old_pipelines_broken_steps(makefile: Makefile) -> None:
    """The pipeline before this check: .venv made in python:3.12-slim and run in the emulators
    image (its interpreter link points nowhere there), and terraform copied from the Terraform
    image into /workspace and run in the Python one."""
    old = yaml.safe_load(
        """
        substitutions: {_TERRAFORM_IMAGE: "hashicorp/terraform:1.11"}
        steps:
          - {id: lint, name: "python:3.12-slim", args: ["-c", "apt-get install -y make && make lint"], waitFor: ["-"]}
          - {id: test-emulator, name: "google/cloud-sdk:emulators", args: ["-c", "make test-emulator"], waitFor: [lint]}
          - {id: terraform-binary, name: "${_TERRAFORM_IMAGE}", waitFor: ["-"],
             args: ["-c", "mkdir -p /workspace/.tools && cp $$(command -v terraform) /workspace/.tools/"]}
          - {id: infra-check, name: "python:3.12-slim", waitFor: [lint, terraform-binary],
             args: ["-c", "make infra-check TERRAFORM=/workspace/.tools/terraform"]}
          - {id: unit-a, name: "python:3.12-slim", args: ["-c", "apk add make && make test-unit"],
             waitFor: [infra-check]}
          - {id: unit-b, name: "python:3.12-slim", args: ["-c", "make test-unit"], waitFor: ["-"]}
          - {id: apply, name: "python:3.12-slim", args: ["-c", "make apply"], waitFor: ["-"]}
          - {id: plan, name: "alpine:3", args: ["-c", "ls /opt/x"]}
        """
    )
    assert sorted(problems(old, makefile)) == sorted(
        [
            "test-emulator: uses .venv made by lint in python:3.12-slim, but runs in google/cloud-sdk:emulators",
            "infra-check: /workspace/.tools/terraform was made by terraform-binary in hashicorp/terraform:1.11, "
            "used in python:3.12-slim",
            "unit-a: python:3.12-slim has no apk",
            "lint and unit-b both make .venv at the same time",
            "apply: uses infra/.terraform, which no earlier step makes",
            "plan: image alpine:3 is not in IMAGES: say what it holds",
        ]
    )


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
