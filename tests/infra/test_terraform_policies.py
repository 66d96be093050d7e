"""infra/ grants least privilege, keeps things private, and explains every checkov skip."""

from __future__ import annotations

import ast
import re

from terraform_config import ROOT, Terraform, block

from tpujobs.engine import topology

# What a function's body calls in functions/main.py decides the rights its account needs.
ENGINE = ("instances.engine()", "instances.reconciler()")  # Firestore, TPU and Compute Engine, status
# The jobs API's engine: Firestore and status, no capacity; it hands capacity work to `converge`.
API_ENGINE = "instances.jobs_api()"
LOG_EXPORTER = "instances.output_exporter()"  # Firestore and the logs bucket
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}


def _bodies() -> dict[str, str]:
    """Each function target of functions/main.py -> the source of its body."""
    source = (ROOT / "functions" / "main.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node) or ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.decorator_list
    }


def test_only_functions_that_run_the_job_service_may_touch_tpus(tf: Terraform) -> None:
    """The TPU role, actAs on the TPU VM account and status publishing go to exactly the
    functions whose code runs the job service (it creates and deletes queued resources); the
    jobs API publishes status and its hand-offs (tpujobs-converge), and holds no TPU role."""
    bodies = _bodies()
    for target, function in tf.locals["functions"].items():
        runs_engine = any(call in bodies[target] for call in ENGINE)
        assert function["job_engine"] is runs_engine, target
        api = API_ENGINE in bodies[target]
        publishes = {topology.STATUS, topology.LOG_EXPORT} if runs_engine or api else set()
        if api:
            publishes.add(topology.CONVERGE)
        if "instances.reconciler()" in bodies[target]:  # a tick publishes its shards on its own topic
            publishes.add(topology.RECONCILE)
        assert set(function["publishes"]) == publishes, target
    tpu = tf.resource("google_project_iam_member", "function_tpu")
    assert (tpu["for_each"], tpu["role"]) == (
        "${local.job_engine_functions}",
        "${google_project_iam_custom_role.tpu.id}",
    )
    acts_as = tf.resource("google_service_account_iam_member", "function_acts_as_tpu_vm")
    assert acts_as["for_each"] == "${local.job_engine_functions}"
    assert acts_as["service_account_id"] == "${google_service_account.tpu_vm.id}"
    assert tf.locals["job_engine_functions"] == "${{for target, f in local.functions : target => f if f.job_engine}}"


def test_only_the_log_exporter_may_use_the_logs_bucket(tf: Terraform) -> None:
    """Of the functions, only export_logs reads and writes objects in the logs bucket."""
    bodies = _bodies()
    for target, function in tf.locals["functions"].items():
        wanted = "roles/storage.objectUser" if LOG_EXPORTER in bodies[target] else None
        assert function["logs"] == wanted, target


def test_functions_that_only_read_or_record_get_no_more(tf: Terraform) -> None:
    """record_dead_letter writes Firestore and nothing else: replays are the CLI's."""
    dead_letter = tf.locals["functions"]["record_dead_letter"]
    assert (dead_letter["job_engine"], dead_letter["publishes"], dead_letter["logs"]) == (False, [], None)
    roles = {f["firestore"] for f in tf.locals["functions"].values()}
    assert roles <= {"roles/datastore.user", "roles/datastore.viewer"}


def test_every_function_runs_as_its_own_account(tf: Terraform) -> None:
    """One service account per function, ids unique and within the 30-character limit with
    the longest prefix the variable allows."""
    accounts = [f["account"] for f in tf.locals["functions"].values()]
    assert len(set(accounts)) == len(accounts)
    account = tf.resource("google_service_account", "function")
    assert account["account_id"] == "${var.prefix}tpujobs-${each.value.account}"
    longest_prefix = 10
    for name in [*accounts, "push", "build", "tpu-vm"]:
        assert re.fullmatch(r"[a-z][a-z0-9-]*", name) and longest_prefix + len("tpujobs-") + len(name) <= 30, name
    config = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert config["service_account_email"] == "${google_service_account.function[each.key].email}"


def test_the_tpu_vm_account_may_only_report_and_keep_output(tf: Terraform) -> None:
    """The TPU VMs' account publishes to worker-events and preemption and uses objects under
    logs/jobs/ and checkpoints/jobs/ and reads code/jobs/; with every job account it reads its own
    secrets and the images of var.image_repositories; nothing else anywhere."""
    member = "${google_service_account.tpu_vm.member}"
    grants = {(kind, name) for (kind, name), body in tf.resources.items() if body.get("member") == member}
    assert grants == {
        ("google_pubsub_topic_iam_member", "tpu_vm_publisher"),
        ("google_storage_managed_folder_iam_member", "tpu_vm_jobs"),
        ("google_storage_managed_folder_iam_member", "tpu_vm_code"),
    }
    # Grants to every job account, tpu_vm among them (local.job_accounts).
    every = {
        (kind, name)
        for (kind, name), body in tf.resources.items()
        if body.get("for_each") == "${local.job_accounts}" or "local.job_accounts[" in str(body.get("member"))
    }
    assert every == {
        ("google_project_iam_member", "job_account_secrets"),
        ("google_artifact_registry_repository_iam_member", "job_account_images"),
        ("google_cloud_run_service_iam_member", "worker_invoker"),  # fetches its attempt's report key (attempt_key)
    }
    worker = tf.resource("google_cloud_run_service_iam_member", "worker_invoker")
    assert (worker["role"], worker["member"]) == ("roles/run.invoker", "${each.value.member}")
    assert worker["service"] == '${google_cloudfunctions2_function.function["attempt_key"].service_config[0].service}'
    assert sorted(tf.locals["tpu_vm_publishes"]) == sorted([topology.WORKER_EVENTS, topology.PREEMPTION])
    publisher = tf.resource("google_pubsub_topic_iam_member", "tpu_vm_publisher")
    assert (publisher["for_each"], publisher["role"]) == ("${toset(local.tpu_vm_publishes)}", "roles/pubsub.publisher")
    jobs = tf.resource("google_storage_managed_folder_iam_member", "tpu_vm_jobs")
    assert (jobs["for_each"], jobs["managed_folder"], jobs["role"]) == (
        "${google_storage_managed_folder.jobs}",
        "${each.value.name}",
        "roles/storage.objectUser",
    )
    folders = tf.resource("google_storage_managed_folder", "jobs")
    assert (folders["for_each"], folders["name"]) == ("${toset(local.job_object_kinds)}", "${each.key}/jobs/")
    # At project level only the conditional secretAccessor (tests/infra/test_trust.py), never unconditioned.
    project_grants = [body for body in tf.of_kind("google_project_iam_member").values() if "tpu_vm" in str(body)]
    assert project_grants == []
    secrets = tf.resource("google_project_iam_member", "job_account_secrets")
    assert secrets["role"] == "roles/secretmanager.secretAccessor" and block(secrets, "condition")["expression"]


def test_no_primitive_roles_and_no_public_members(tf: Terraform) -> None:
    """No owner/editor/viewer, no allUsers or allAuthenticatedUsers, no project-wide publisher."""
    for (kind, name), body in tf.resources.items():
        assert body.get("role") not in PRIMITIVE_ROLES, f"{kind}.{name}"
        assert body.get("member") not in ("allUsers", "allAuthenticatedUsers"), f"{kind}.{name}"
        if kind == "google_project_iam_member":
            assert "pubsub" not in str(body.get("role")), f"{kind}.{name}: grant on the topic instead"
    validation = block(tf.variables["invokers"], "validation")
    assert "allUsers" in validation["condition"] and "allAuthenticatedUsers" in validation["condition"]


def test_only_the_api_is_reachable_from_outside_and_only_by_the_invokers(tf: Terraform) -> None:
    """Cloudevent functions accept internal traffic (Pub/Sub push) only; the jobs API is open
    to the network but callable only by var.invokers."""
    config = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert config["ingress_settings"] == (
        '${each.key == "dashboard" ? "ALLOW_INTERNAL_AND_GCLB" : '
        '(each.value.signature == "http" ? "ALLOW_ALL" : "ALLOW_INTERNAL_ONLY")}'
    ), "the dashboard only through its load balancer, where IAP stands"
    assert config["min_instance_count"] == 0
    api = tf.resource("google_cloud_run_service_iam_member", "api_invoker")
    assert (api["for_each"], api["role"], api["member"]) == (
        "${toset(var.invokers)}",
        "roles/run.invoker",
        "${each.key}",
    )
    assert api["service"] == '${google_cloudfunctions2_function.function["jobs"].service_config[0].service}'
    push = tf.resource("google_cloud_run_service_iam_member", "push_invoker")
    assert (push["for_each"], push["member"]) == (
        "${local.cloudevent_functions}",
        "${google_service_account.push.member}",
    )


def test_buckets_are_private_uniform_and_expire(tf: Terraform) -> None:
    """Every bucket: uniform bucket-level access, public access prevented, a delete rule."""
    buckets = tf.of_kind("google_storage_bucket")
    assert set(buckets) == {"logs", "staging"}
    for name, bucket in buckets.items():
        assert bucket["uniform_bucket_level_access"] is True, name
        assert bucket["public_access_prevention"] == "enforced", name
        actions = [block(rule, "action")["type"] for rule in bucket["lifecycle_rule"]]
        assert "Delete" in actions, name
    assert tf.locals["function_env"]["TPUJOBS_LOGS_BUCKET"] == "${google_storage_bucket.logs.name}"


def test_every_checkov_skip_says_why(tf: Terraform) -> None:
    """A skipped check names its id and a reason of a sentence, right where it applies."""
    skips = re.findall(r"checkov:skip=([^\s:]*)(?::(.*))?", tf.text)
    assert skips, "expected the documented skips"
    for check, reason in skips:
        assert re.fullmatch(r"CKV2?_GCP_\d+", check), check
        assert len((reason or "").strip()) >= 40, f"{check} is skipped without a reason"


def test_no_secrets_in_terraform(tf: Terraform) -> None:
    """Secret values never go into Terraform (its state is plain text): secrets and their IAM
    are declared, never a version or a data source that reads one, and nothing is passed."""
    secret_kinds = {kind for kind, _ in tf.resources if "secret" in kind}
    assert secret_kinds == {"google_secret_manager_secret", "google_secret_manager_secret_iam_member"}
    assert not re.search(r'(resource|data)\s+"google_secret_manager_(regional_)?secret_version', tf.text)
    assert not re.search(r"(?i)(password|secret_data|private_key|api_key)\s*=", tf.text)


def test_every_api_a_resource_needs_is_enabled(tf: Terraform) -> None:
    """Each resource kind's service is in local.apis, so a new project deploys in one apply."""
    needs = {
        "google_cloudfunctions2_function": {"cloudfunctions", "run", "cloudbuild", "artifactregistry"},
        "google_cloud_run_service_iam_member": {"run"},
        "google_pubsub_": {"pubsub"},
        "google_firestore_": {"firestore"},
        "google_cloud_scheduler_job": {"cloudscheduler"},
        "google_logging_": {"logging"},
        "google_storage_": {"storage"},
        "google_service_account": {"iam"},
        "google_project_iam_custom_role": {"iam"},
        "google_secret_manager_": {"secretmanager"},
    }
    enabled = {api.removesuffix(".googleapis.com") for api in tf.locals["apis"]}
    assert "tpu" in enabled  # what the functions call
    for kind, _ in tf.resources:
        for prefix, services in needs.items():
            if kind.startswith(prefix):
                assert services <= enabled, f"{kind} needs {services - enabled}"
