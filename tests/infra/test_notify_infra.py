"""infra/notify.tf: the notify function reads its signing key and the `notify-` webhook secrets of
each job account, nothing else; the key is its alone, mounted at a pinned version."""

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


def test_the_signing_key_is_a_secret_without_a_value_for_the_notify_function_only(tf: Terraform) -> None:
    """Terraform makes the secret and one grant, to the notify function; no job account's namespace
    holds it; it is mounted as TPUJOBS_NOTIFY_SIGNING_KEY into that function alone, never at latest."""
    secret = tf.resource("google_secret_manager_secret", "notify_signing_key")
    assert not render(secret["secret_id"], {"var.prefix": PREFIX}).startswith(f"{PREFIX}{secrets.NAMESPACE_MARK}")
    assert secret["deletion_protection"] is True
    grant = tf.resource("google_secret_manager_secret_iam_member", "notify_signing_key")
    assert (grant["role"], grant["member"]) == ("roles/secretmanager.secretAccessor", NOTIFY_MEMBER)
    assert "for_each" not in grant
    function = tf.resource("google_cloudfunctions2_function", "function")
    mounts = [d["secret_environment_variables"] for d in block(function, "service_config")["dynamic"]]
    mine = [m for m in mounts if "notify_signing_key" in m["content"][0]["secret"]]
    assert len(mine) == 1
    assert mine[0]["for_each"] == (
        '${each.key == "notify" ? {TPUJOBS_NOTIFY_SIGNING_KEY = var.notify_signing_key_version} : {}}'
    )
    assert "^[1-9][0-9]*$" in block(tf.variables["notify_signing_key_version"], "validation")["condition"]


def test_the_notify_function_is_no_job_engine_and_publishes_nothing(tf: Terraform) -> None:
    """It reads jobs and writes its records: no TPU, Compute or actAs rights, no topic."""
    function = tf.locals["functions"]["notify"]
    assert (function["topic"], function["job_engine"], function["publishes"]) == ("tpujobs-status", False, [])


def test_notifications_link_to_the_dashboard_where_it_is_served(tf: Terraform) -> None:
    """The notify function alone gets TPUJOBS_DASHBOARD_URL, https on the dashboard's domain, and
    only when a domain is set (no link is better than a link to nothing); the domain is a bare host."""
    assert tf.locals["notify_env"] == (
        '${local.dashboard_on ? {TPUJOBS_DASHBOARD_URL = "https://${var.dashboard_domain}"} : {}}'
    )
    assert tf.locals["dashboard_on"] == '${var.dashboard_domain != ""}'
    environment = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert 'each.key == "notify" ? local.notify_env : {}' in environment["environment_variables"]
    condition = block(tf.variables["dashboard_domain"], "validation")["condition"]
    pattern = re.search(r'regex\("(.+)", var\.dashboard_domain\)', condition)
    assert pattern is not None
    host = re.compile(pattern[1].replace("\\\\", "\\"))
    assert host.fullmatch("tpujobs.example.com")
    for bad in ("https://tpujobs.example.com", "tpujobs.example.com/x", "tpujobs.example.com:443", "localhost"):
        assert not host.fullmatch(bad), bad
