"""Issue 37 item 2 in infra/: a VM asks for its key and nothing else, and the internet-facing
functions hold no capacity.

The VMs' accounts may invoke the attempt_key function and no other; the functions users reach
(jobs, dashboard) and attempt_key hold no TPU or Compute Engine role that changes capacity and no
actAs on any account (attempt_key only reads whether a slice is ACTIVE, issue 38:
test_key_function_capacity_read.py); the master key goes to the functions that sign or check
with it, never to the dashboard.
"""

from __future__ import annotations

from typing import Any

from terraform_config import Terraform, render

from tpujobs.engine import topology

INTERNET_FACING = ("jobs", "dashboard", "attempt_key")
CAPACITY_ROLES = {
    "${google_project_iam_custom_role.tpu.id}",
    "${google_project_iam_custom_role.compute.id}",
    "roles/iam.serviceAccountUser",
}


def _grants_of(tf: Terraform, role: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: body for key, body in tf.resources.items() if body.get("role") == role}


def test_the_vm_accounts_may_invoke_the_attempt_key_function_and_no_other(tf: Terraform) -> None:
    """The one run.invoker grant to the VMs' accounts is on attempt_key; jobs is invoked by var.invokers alone."""
    invokers = _grants_of(tf, "roles/run.invoker")
    to_vms = {key for key, body in invokers.items() if body.get("for_each") == "${local.job_accounts}"}
    assert to_vms == {("google_cloud_run_service_iam_member", "worker_invoker")}
    worker = invokers[("google_cloud_run_service_iam_member", "worker_invoker")]
    assert worker["service"] == '${google_cloudfunctions2_function.function["attempt_key"].service_config[0].service}'
    on_jobs = {key for key, body in invokers.items() if '.function["jobs"]' in body["service"]}
    assert on_jobs == {("google_cloud_run_service_iam_member", "api_invoker")}
    assert invokers[("google_cloud_run_service_iam_member", "api_invoker")]["for_each"] == "${toset(var.invokers)}"


def test_the_internet_facing_functions_hold_no_tpu_or_compute_role_and_act_as_no_one(tf: Terraform) -> None:
    """jobs, dashboard and attempt_key are no job engine, and every TPU, Compute Engine or actAs
    grant to a function goes to the job-engine functions only."""
    functions = tf.locals["functions"]
    for target in INTERNET_FACING:
        assert functions[target]["job_engine"] is False, target
    assert tf.locals["job_engine_functions"] == "${{for target, f in local.functions : target => f if f.job_engine}}"
    for role in CAPACITY_ROLES:
        for key, body in _grants_of(tf, role).items():
            if "google_service_account.function[" not in str(body["member"]):
                continue  # not a function's account
            assert body["for_each"] in ("${local.job_engine_functions}", "${local.job_engine_acts_as}"), key
    assert "setproduct(keys(local.job_engine_functions)" in tf.locals["job_engine_acts_as"]


def test_the_jobs_api_hands_its_capacity_work_to_the_converge_function(tf: Terraform) -> None:
    """jobs publishes its hand-offs on tpujobs-converge, which the converge function (a job
    engine) takes; no VM account publishes there."""
    functions = tf.locals["functions"]
    assert topology.CONVERGE in functions["jobs"]["publishes"]
    converge = functions["converge"]
    assert (converge["topic"], converge["job_engine"]) == (topology.CONVERGE, True)
    publishers = {t for t, f in functions.items() if topology.CONVERGE in f["publishes"]}
    assert publishers == {"jobs"}
    assert topology.CONVERGE not in tf.locals["tpu_vm_publishes"]
    assert topology.CONVERGE in tf.locals["topics"]


def test_the_attempt_key_function_reads_jobs_and_the_master_key_and_holds_nothing_else(tf: Terraform) -> None:
    """attempt_key: Firestore (jobs, and the first holder of each key), the master key, and read
    access to capacity (whether a slice is ACTIVE, its one project grant beyond Firestore and
    metrics); it publishes nothing and touches no bucket. The dashboard never holds the master key."""
    key = tf.locals["functions"]["attempt_key"]
    assert (key["signature"], key["topic"], key["account"]) == ("http", None, "attempt-key")
    assert (key["job_engine"], key["master_key"], key["publishes"], key["logs"]) == (False, True, [], None)
    assert key["firestore"] == "roles/datastore.user"
    own = {
        name
        for (kind, name), body in tf.resources.items()
        if kind == "google_project_iam_member"
        and body["member"] == '${google_service_account.function["attempt_key"].member}'
    }
    assert own == {"attempt_key_capacity_reader"}  # beyond the for_each grants of every function
    assert tf.locals["functions"]["dashboard"]["master_key"] is False
    assert tf.locals["functions"]["converge"]["master_key"] is False


def test_the_key_url_is_the_attempt_key_function(tf: Terraform) -> None:
    """TPUJOBS_KEY_URL (also the tokens' audience) is attempt_key's cloudfunctions.net URL, not the jobs API's."""
    values = {"var.region": "us-central1", "var.project": "p", "var.prefix": "dev-"}
    url = render(tf.locals["function_env"]["TPUJOBS_KEY_URL"], values)
    assert url == "https://us-central1-p.cloudfunctions.net/dev-tpujobs-attempt-key"
    name = tf.resource("google_cloudfunctions2_function", "function")["name"]
    assert render(name, {"var.prefix": "dev-", 'replace(each.key, "_", "-")': "attempt-key"}) == url.rsplit("/", 1)[1]
