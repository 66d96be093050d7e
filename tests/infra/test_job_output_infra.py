"""Job output in Cloud Logging, as infra/ deploys it: the VM accounts may write entries and
nothing more, only the jobs API reads them (through a view of the job-output log alone), and the
functions are told the switch and the rate under the names the code reads."""

from __future__ import annotations

from typing import Any

from terraform_config import Terraform

from tpujobs.engine.settings import Settings


def test_every_vm_account_may_write_log_entries_only_when_the_feature_is_on(tf: Terraform) -> None:
    """logWriter (create entries, never read them) for each job account, and none when switched off."""
    grant = tf.resource("google_project_iam_member", "vm_log_writer")
    assert grant["for_each"] == "${var.job_output_cloud_logging ? local.job_accounts : {}}"
    assert (grant["role"], grant["member"]) == ("roles/logging.logWriter", "${each.value.member}")
    readers = [
        name
        for (kind, name), body in tf.resources.items()
        if kind == "google_project_iam_member" and "logging.viewer" in str(body.get("role"))
    ]
    assert readers == []


def test_only_the_jobs_api_reads_job_output_and_only_through_its_view(tf: Terraform) -> None:
    """viewAccessor on a view whose filter is the job-output log: the API reads no other log."""
    view = tf.resource("google_logging_log_view", "job_output")
    assert view["bucket"].endswith("/buckets/_Default")
    assert view["filter"] == 'LOG_ID("${var.prefix}tpujobs-job-output")'
    grants = [
        (name, body)
        for (kind, name), body in tf.resources.items()
        if "logging" in kind and "iam" in kind and "view" in str(body.get("role", "")).lower()
    ]
    assert [(name, body["member"], body["role"]) for name, body in grants] == [
        ("jobs_api_output_reader", '${google_service_account.function["jobs"].member}', "roles/logging.viewAccessor")
    ]
    assert grants[0][1]["name"] == "${google_logging_log_view.job_output[0].name}"


def test_the_functions_get_the_switch_and_the_rate_the_settings_read(tf: Terraform) -> None:
    """TPUJOBS_CLOUD_LOGGING and TPUJOBS_LOGGING_LINES_PER_SECOND, from the variables, parse as Settings."""
    env = tf.locals["function_env"]
    assert env["TPUJOBS_CLOUD_LOGGING"] == '${var.job_output_cloud_logging ? "true" : "false"}'
    assert env["TPUJOBS_LOGGING_LINES_PER_SECOND"] == "${tostring(var.job_output_lines_per_second)}"
    asked: dict[str, Any] = {"TPUJOBS_CLOUD_LOGGING": "true", "TPUJOBS_LOGGING_LINES_PER_SECOND": "37"}
    settings = Settings.from_env(asked)
    assert (settings.cloud_logging, settings.logging_lines_per_second) == (True, 37)
    assert tf.variables["job_output_cloud_logging"]["default"] is True
