"""infra/notify.tf: the notify function reads the notify master key and the `notify-` webhook secrets
of each job account, nothing else; the master key is the notify and jobs functions' alone, mounted
at pinned versions (the previous one beside it while a rotation lasts)."""

from __future__ import annotations

import re

from terraform_config import Terraform, block, render, secret_reader

from tpujobs.domain import notify, secrets

PREFIX = "dev-"
PROJECT_NUMBER = "123456789012"
NOTIFY_MEMBER = '${google_service_account.function["notify"].member}'


def test_the_notify_function_reads_only_the_webhook_secrets_of_each_job_account(tf: Terraform) -> None:
    """The condition holds for `webhook_secret: NAME` of a job of that account, and not for the same
    account's other secrets, another account's webhooks, the report key or the signing key."""
    grant = tf.resource("google_project_iam_member", "notify_webhook_secrets")
    assert grant["for_each"] == "${toset(keys(local.job_accounts))}"
    assert (grant["role"], grant["member"]) == ("roles/secretmanager.secretAccessor", NOTIFY_MEMBER)
    readable = secret_reader(tf, grant, PREFIX, PROJECT_NUMBER)

    team_a, team_b = f"{PREFIX}team-a", f"{PREFIX}team-ab"
    email = {account: f"{account}@proj.iam.gserviceaccount.com" for account in (team_a, team_b)}
    for account in email:
        webhook = notify.webhook_secret_version("slack", PROJECT_NUMBER, PREFIX, email[account])
        assert readable(account, webhook), account
        assert not readable(account, secrets.secret_version_name("hf-token", PROJECT_NUMBER, PREFIX, email[account]))
        other = next(iter(set(email) - {account}))
        assert not readable(other, webhook), (account, other)
    for secret in ("report_key", "notify_signing_key"):
        secret_id = render(tf.resource("google_secret_manager_secret", secret)["secret_id"], {"var.prefix": PREFIX})
        assert not readable(team_a, f"projects/{PROJECT_NUMBER}/secrets/{secret_id}/versions/1"), secret


def test_the_master_key_is_a_secret_without_a_value_for_the_notify_and_jobs_functions_only(tf: Terraform) -> None:
    """Terraform makes the secret and a grant each to the notify function (it signs) and the jobs
    function (`notify-key`); no job account's namespace holds it; it is mounted into those two
    alone, at pinned versions, the previous one only while a rotation lasts."""
    secret = tf.resource("google_secret_manager_secret", "notify_signing_key")
    assert not render(secret["secret_id"], {"var.prefix": PREFIX}).startswith(f"{PREFIX}{secrets.NAMESPACE_MARK}")
    assert secret["deletion_protection"] is True
    assert tf.locals["notify_key_functions"] == ["notify", "jobs"]
    grant = tf.resource("google_secret_manager_secret_iam_member", "notify_signing_key")
    assert grant["for_each"] == "${toset(local.notify_key_functions)}"
    assert (grant["role"], grant["member"]) == (
        "roles/secretmanager.secretAccessor",
        "${google_service_account.function[each.key].member}",
    )
    function = tf.resource("google_cloudfunctions2_function", "function")
    mounts = [d["secret_environment_variables"] for d in block(function, "service_config")["dynamic"]]
    mine = [m for m in mounts if "notify_signing_key" in m["content"][0]["secret"]]
    assert len(mine) == 1
    assert mine[0]["for_each"] == "${contains(local.notify_key_functions, each.key) ? local.notify_key_mounts : {}}"
    mounted = tf.locals["notify_key_mounts"]
    assert "{(local.notify_key_env) = var.notify_signing_key_version}" in mounted
    previous = '{"${local.notify_key_env}_PREVIOUS" = var.notify_signing_key_previous_version}'
    assert f'var.notify_signing_key_previous_version == "" ? {{}} : {previous}' in mounted
    assert tf.locals["notify_key_env"] == "TPUJOBS_NOTIFY_SIGNING_KEY"
    for name in ("notify_signing_key_version", "notify_signing_key_previous_version"):
        assert "^[1-9][0-9]*$" in block(tf.variables[name], "validation")["condition"], name
    assert tf.variables["notify_signing_key_previous_version"]["default"] == ""


def test_the_notify_function_runs_enough_posts_at_once_for_its_host_lanes(tf: Terraform) -> None:
    """Posts to one host take at most PER_HOST of the notify function's requests at once, a share
    that leaves most of them to other hosts; a job's targets, posted side by side, fit its timeout."""
    from tpujobs.adapters.webhooks import DEADLINE_S, LANE_WAIT_S, PER_HOST

    function = tf.locals["functions"]["notify"]
    assert function["concurrent"] >= 4 * PER_HOST
    assert function["timeout"] >= 3 * (DEADLINE_S + LANE_WAIT_S)


def test_the_notify_function_is_no_job_engine_and_publishes_nothing(tf: Terraform) -> None:
    """It reads jobs and writes its records: no TPU, Compute or actAs rights, no topic."""
    function = tf.locals["functions"]["notify"]
    assert (function["topic"], function["job_engine"], function["publishes"]) == ("tpujobs-status", False, [])


def test_notifications_link_to_the_dashboard_where_it_is_served(tf: Terraform) -> None:
    """The master key's holders get TPUJOBS_DASHBOARD_URL, https on the dashboard's domain, and
    only when a domain is set (no link is better than a link to nothing), and each mounted key's
    version number; the domain is a bare host."""
    assert tf.locals["notify_env"] == (
        '${merge(local.dashboard_on ? {TPUJOBS_DASHBOARD_URL = "https://${var.dashboard_domain}"} : {}, '
        '{for env, version in local.notify_key_mounts : "${env}_VERSION" => version})}'
    )
    assert tf.locals["dashboard_on"] == '${var.dashboard_domain != ""}'
    environment = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert (
        "contains(local.notify_key_functions, each.key) ? local.notify_env : {}" in environment["environment_variables"]
    )
    condition = block(tf.variables["dashboard_domain"], "validation")["condition"]
    pattern = re.search(r'regex\("(.+)", var\.dashboard_domain\)', condition)
    assert pattern is not None
    host = re.compile(pattern[1].replace("\\\\", "\\"))
    assert host.fullmatch("tpujobs.example.com")
    for bad in ("https://tpujobs.example.com", "tpujobs.example.com/x", "tpujobs.example.com:443", "localhost"):
        assert not host.fullmatch(bad), bad
