"""The account each function runs as, named as infra/ names it (functions.tf's `account`), for the
local stack: each local function presents its own (`simulated:EMAIL`, TPUJOBS_FUNCTION_ACCOUNT),
and the local Cloud Monitoring lets these accounts write, as infra/iam.tf grants
roles/monitoring.metricWriter to them and no other. tests/infra holds the table to functions.tf.
"""

from __future__ import annotations

ACCOUNT_IDS = {
    "submit_job": "submit",
    "on_worker_event": "worker-event",
    "on_preemption": "preemption",
    "on_qr_state": "qr-state",
    "on_control": "control",
    "converge": "converge",
    "reconcile": "reconcile",
    "record_dead_letter": "dead-letter",
    "export_logs": "export-logs",
    "notify": "notify",
    "jobs": "jobs",
    "attempt_key": "attempt-key",
    "dashboard": "dashboard",
}
"""Function target -> its account id, less the deployment's prefix and `tpujobs-`."""


def function_account(target: str, project: str, prefix: str = "") -> str:
    """The email of the account the function `target` runs as."""
    return f"{prefix}tpujobs-{ACCOUNT_IDS[target]}@{project}.iam.gserviceaccount.com"


def function_accounts(project: str, prefix: str = "") -> list[str]:
    """Every function's account: those holding roles/monitoring.metricWriter."""
    return [function_account(target, project, prefix) for target in ACCOUNT_IDS]
