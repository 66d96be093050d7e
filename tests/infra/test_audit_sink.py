"""The TPU audit-log sink (infra/logging.tf) takes this project's admin-activity audit log only
(issue 37): every job account may write log entries, and one shaped like a TPU audit entry in any
other log must not reach tpujobs-qr-state."""

from __future__ import annotations

import json

from terraform_config import Terraform, render

from tpujobs.engine.qr_state_reports import activity_log

PROJECT = "my-project"
JOIN = '${join(" AND ", '


def _clauses(tf: Terraform) -> list[str]:
    """The sink filter's clauses, all of which an entry must match, with the project filled in."""
    expression = tf.resource("google_logging_project_sink", "qr_state")["filter"]
    assert expression.startswith(JOIN) and expression.endswith(")}"), expression
    clauses = json.loads(expression[len(JOIN) : -2])
    return [render(clause, {"var.project": PROJECT}) if "${" in clause else clause for clause in clauses]


def test_the_sink_filter_pins_log_name_to_the_projects_admin_activity_audit_log(tf: Terraform) -> None:
    """One clause, ANDed with the rest, names exactly the log the handler accepts entries from."""
    clauses = _clauses(tf)
    assert f'logName="{activity_log(PROJECT)}"' in clauses
    assert activity_log(PROJECT) == "projects/my-project/logs/cloudaudit.googleapis.com%2Factivity"
    assert [c for c in clauses if "logName" in c or "LOG_ID" in c] == [f'logName="{activity_log(PROJECT)}"']
    assert not any(" OR " in c or c.startswith("-") or c.startswith("NOT") for c in clauses)
