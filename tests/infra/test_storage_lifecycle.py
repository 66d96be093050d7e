"""The logs bucket's lifecycle rules (infra/storage.tf) delete each kind of object under its own
prefix only: old logs go, checkpoints stay unless asked, code goes only after it was last used.

A rule may delete a live object under a prefix when its action is Delete, its condition is not
limited to noncurrent versions, and its `matches_prefix` (none means every object) overlaps the
prefix. Noncurrent versions are what an overwrite or a delete left behind; no live object is one.
"""

from __future__ import annotations

from typing import Any

import pytest
from terraform_config import Terraform, block, parse

from tpujobs.domain import naming

# Conditions that hold for noncurrent versions only (Cloud Storage's lifecycle conditions).
NONCURRENT_ONLY = ("days_since_noncurrent_time", "noncurrent_time_before", "num_newer_versions")
KINDS = {"logs": naming.LOGS_PREFIX, "checkpoints": naming.CHECKPOINTS_PREFIX, "code": naming.CODE_PREFIX}
EMAIL = "team-a@proj.iam.gserviceaccount.com"


def rules(bucket: dict[str, Any]) -> list[dict[str, Any]]:
    """Every lifecycle rule of a bucket body: the static ones and each dynamic one's content."""
    found = list(bucket.get("lifecycle_rule", []))
    for entry in bucket.get("dynamic", []):
        if "lifecycle_rule" in entry:
            found += entry["lifecycle_rule"]["content"]
    return found


def deletes_live_objects(rule: dict[str, Any]) -> bool:
    condition = block(rule, "condition")
    if block(rule, "action")["type"] != "Delete":
        return False
    return not any(key in condition for key in NONCURRENT_ONLY) and condition.get("with_state") != "ARCHIVED"


def reaches(rule: dict[str, Any], prefix: str) -> bool:
    """Whether the rule may delete a live object whose name starts with `prefix`."""
    if not deletes_live_objects(rule):
        return False
    matches = block(rule, "condition").get("matches_prefix") or [""]
    return any(m.startswith(prefix) or prefix.startswith(m) for m in matches)


@pytest.fixture(scope="module")
def logs_rules(tf: Terraform) -> list[dict[str, Any]]:
    return rules(tf.resource("google_storage_bucket", "logs"))


def test_the_three_prefixes_are_the_codes_and_none_is_a_prefix_of_another(tf: Terraform) -> None:
    """local.storage_prefixes is tpujobs.domain.naming's table, and no two kinds overlap."""
    assert tf.locals["storage_prefixes"] == KINDS
    assert set(naming.STORAGE_PREFIXES) == set(KINDS.values())
    for a in naming.STORAGE_PREFIXES:
        for b in naming.STORAGE_PREFIXES:
            assert a == b or not b.startswith(a), (a, b)


def test_no_rule_deletes_under_a_kinds_prefix_but_its_own(logs_rules: list[dict[str, Any]]) -> None:
    """Under logs/ only the logs rule, under checkpoints/ only the checkpoints rule, under code/
    only the code rule; each rule that deletes live objects names exactly one prefix."""
    for rule in logs_rules:
        if deletes_live_objects(rule):
            assert block(rule, "condition").get("matches_prefix") in ([p] for p in KINDS.values()), rule
    for kind, prefix in KINDS.items():
        reaching = [rule for rule in logs_rules if reaches(rule, prefix)]
        assert len(reaching) == 1, (kind, reaching)
        assert block(reaching[0], "condition")["matches_prefix"] == [prefix], kind


def test_every_object_a_job_writes_falls_under_its_own_kinds_rule_only(logs_rules: list[dict[str, Any]]) -> None:
    """The names the code makes (naming.job_prefix, checkpoint_prefix, code_object), on the
    default account and an own one, are each reached by one rule: the one of their kind."""
    names = {
        "logs": [naming.job_prefix("train-1") + "attempt-1/attempt.log", naming.job_prefix("train-1", EMAIL)],
        "checkpoints": [naming.checkpoint_prefix("train-1") + "state.json", naming.checkpoint_prefix("t", EMAIL)],
        "code": [naming.code_object("0" * 64)],
    }
    for kind, objects in names.items():
        for name in objects:
            reaching = [rule for rule in logs_rules if reaches(rule, name)]
            assert [block(r, "condition")["matches_prefix"] for r in reaching] == [[KINDS[kind]]], name


def test_logs_go_after_their_retention_and_code_after_its_last_use(logs_rules: list[dict[str, Any]]) -> None:
    """logs/: age logs_retention_days; code/: days since its custom time, code_retention_days."""
    by_prefix = {
        block(r, "condition")["matches_prefix"][0]: block(r, "condition") for r in logs_rules if reaches(r, "")
    }
    assert by_prefix["logs/"] == {"age": "${var.logs_retention_days}", "matches_prefix": ["logs/"]}
    assert by_prefix["code/"] == {"days_since_custom_time": "${var.code_retention_days}", "matches_prefix": ["code/"]}


def test_checkpoints_are_kept_unless_a_retention_is_set(tf: Terraform) -> None:
    """The checkpoints rule exists only when checkpoint_retention_days > 0, and the default is 0:
    an `age = 0` rule would delete every checkpoint at once."""
    bucket = tf.resource("google_storage_bucket", "logs")
    [dynamic] = [entry["lifecycle_rule"] for entry in bucket["dynamic"] if "lifecycle_rule" in entry]
    assert dynamic["for_each"] == "${var.checkpoint_retention_days > 0 ? [var.checkpoint_retention_days] : []}"
    assert block(dynamic["content"][0], "condition") == {
        "age": "${lifecycle_rule.value}",
        "matches_prefix": ["checkpoints/"],
    }
    assert tf.variables["checkpoint_retention_days"]["default"] == 0
    assert "loses the training" in tf.variables["checkpoint_retention_days"]["description"]
    for name in ("logs_retention_days", "code_retention_days"):
        assert tf.variables[name]["default"] >= 1, name
        assert f"var.{name} >= 1" in block(tf.variables[name], "validation")["condition"], name


def test_only_noncurrent_versions_go_bucket_wide(logs_rules: list[dict[str, Any]]) -> None:
    """The one rule without matches_prefix that deletes, deletes versions a week after they
    stopped being current; no live object is touched by it."""
    wide = [r for r in logs_rules if "matches_prefix" not in block(r, "condition")]
    deleting = [r for r in wide if block(r, "action")["type"] == "Delete"]
    assert [block(r, "condition") for r in deleting] == [{"days_since_noncurrent_time": 7}]
    assert not any(deletes_live_objects(r) for r in wide)


def test_the_check_catches_a_rule_that_would_delete_checkpoints_with_the_logs() -> None:
    """The rule this layout replaced (every object after logs_retention_days), and one whose
    prefix swallows another kind's, are caught."""
    old = parse('lifecycle_rule {\n condition {\n age = 90\n }\n action {\n type = "Delete"\n }\n}\n')
    [rule] = old["lifecycle_rule"]
    assert reaches(rule, naming.CHECKPOINTS_PREFIX) and reaches(rule, naming.CODE_PREFIX)
    broad = parse(
        'lifecycle_rule {\n condition {\n age = 9\n matches_prefix = ["c"]\n }\n action {\n type = "Delete"\n }\n}\n'
    )
    assert reaches(broad["lifecycle_rule"][0], naming.checkpoint_prefix("train-1"))
    assert not reaches(broad["lifecycle_rule"][0], naming.job_prefix("train-1"))
