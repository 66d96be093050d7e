"""infra/ narrows what each identity may do (issue 11): a TPU role of exactly the calls the
functions make, job accounts confined to their own bucket prefix and secret namespace, the
report-signing key in Secret Manager for the job-engine functions only, the jobs API's
platform-auth switch backed by IAM that admits no anonymous caller."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest
from terraform_config import ROOT, Terraform, block, render, secret_reader, starts_with

from tpujobs.adapters import firestore_store
from tpujobs.domain import naming, secrets
from tpujobs.engine import topology
from tpujobs.engine.settings import Settings

# What shared/tpujobs/adapters/tpu.py calls, as Cloud TPU checks it: queued resources have no
# permissions of their own, the node permissions cover them (Google's Cloud TPU roles page
# lists tpu.* with no tpu.queuedResources.* permission; queuedResources.reset needs
# tpu.nodes.reset). Operations: what create and delete answer with.
TPU_PERMISSIONS = [
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.nodes.update",
    "tpu.operations.get",
]
TPU_CALLS = {
    "create_queued_resource",
    "get_queued_resource",
    "delete_queued_resource",
    "list_queued_resources",
    "list_nodes",
    "get_node",  # tpu.nodes.get: a node's metadata, read before a unit's assignment is merged into it
    "update_node",  # tpu.nodes.update: a warm pool unit's assignment (tell_hosts)
    "get_operation",  # tpu.operations.get: the error of a create that failed (create_error)
}
FORBIDDEN_ROLES = {"roles/tpu.admin", "roles/owner", "roles/editor", "roles/viewer", "roles/secretmanager.admin"}
PREFIX = "dev-"
PROJECT_NUMBER = "123456789012"
TPU_VM = "${google_service_account.tpu_vm.member}"


def _roles(value: Any) -> list[str]:
    """Every `role` (and list of roles) anywhere in a parsed body."""
    if isinstance(value, dict):
        found = [value["role"]] if isinstance(value.get("role"), str) else []
        return found + [role for item in value.values() for role in _roles(item)]
    if isinstance(value, list):
        return [role for item in value for role in _roles(item)]
    return []


def _function_env(tf: Terraform, target: str, function: dict[str, Any]) -> set[str]:
    """The names of the plain environment variables infra sets on one function."""
    names = set(tf.locals["function_env"])
    if function["job_engine"] or target == "jobs":
        names |= set(tf.locals["job_engine_env"])
    if target in ("jobs", "attempt_key"):
        names |= set(tf.locals["api_env"])
    if target == "reconcile":
        names |= set(tf.locals["reconcile_env"])
    return names


def test_the_tpu_role_holds_exactly_the_permissions_the_functions_call(tf: Terraform) -> None:
    """A custom role with the pinned permissions, bound only to the job-engine functions; the
    adapter calls no TPU method beyond those the permissions cover."""
    role = tf.resource("google_project_iam_custom_role", "tpu")
    assert role["permissions"] == "${local.tpu_permissions}"
    assert tf.locals["tpu_permissions"] == TPU_PERMISSIONS
    assert render(role["role_id"], {'replace(var.prefix, "-", "_")': "dev_"}) == "dev_tpujobsQueuedResources"
    binding = tf.resource("google_project_iam_member", "function_tpu")
    assert binding["role"] == "${google_project_iam_custom_role.tpu.id}"
    assert binding["for_each"] == "${local.job_engine_functions}"
    source = (ROOT / "shared" / "tpujobs" / "adapters" / "tpu.py").read_text(encoding="utf-8")
    called = {
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "_client"
    }
    assert called == TPU_CALLS, f"the TPU adapter now calls {called - TPU_CALLS}: add their permissions"


def test_no_binding_uses_a_broad_predefined_role(tf: Terraform) -> None:
    """Nothing grants tpu.admin, owner, editor, viewer or secretmanager.admin, in any resource
    or role table."""
    roles = _roles(list(tf.resources.values())) + list(tf.locals["build_roles"])
    roles += [f[key] for f in tf.locals["functions"].values() for key in ("firestore", "logs") if f[key]]
    assert roles
    assert not FORBIDDEN_ROLES & set(roles), FORBIDDEN_ROLES & set(roles)


def test_job_service_accounts_are_made_from_the_variable_and_validated(tf: Terraform) -> None:
    """One account per entry, "{prefix}{id}", whose id is checked against the pattern the spec
    accepts; ids starting with "tpujobs" (the deployment's own accounts) are refused."""
    account = tf.resource("google_service_account", "job")
    assert account["for_each"] == "${var.job_service_accounts}"
    assert account["account_id"] == "${var.prefix}${each.key}"
    assert account["description"] == "${each.value.description}"
    precondition = block(block(account, "lifecycle"), "precondition")
    assert "^[a-z][a-z0-9-]{4,28}[a-z0-9]$" in precondition["condition"]
    assert '"${var.prefix}${each.key}"' in precondition["condition"]
    variable = tf.variables["job_service_accounts"]
    assert variable["default"] == {} and variable["type"] == "${map(object({description = string}))}"
    assert '!startswith(id, "tpujobs")' in block(variable, "validation")["condition"]
    assert tf.outputs["job_service_accounts"]["value"] == (
        "${{for id, account in google_service_account.job : id => account.email}}"
    )


def test_every_job_account_is_the_default_or_a_named_one_keyed_by_its_id(tf: Terraform) -> None:
    """local.job_accounts: tpu_vm under "{prefix}tpujobs-tpu-vm", each named one under
    "{prefix}{id}": the keys are the local parts of their emails."""
    assert tf.locals["job_accounts"] == (
        '${merge({"${var.prefix}tpujobs-tpu-vm" = google_service_account.tpu_vm}, '
        '{for id, account in google_service_account.job : "${var.prefix}${id}" => account})}'
    )
    tpu_vm = tf.resource("google_service_account", "tpu_vm")
    assert tpu_vm["account_id"] == "${var.prefix}tpujobs-tpu-vm"


def test_every_job_account_may_report_and_be_attached_by_the_job_engine(tf: Terraform) -> None:
    """Each named account publishes to worker-events and preemption, like tpu_vm; each job-engine
    function has actAs on tpu_vm and on each named account, and no other function does."""
    publishes = tf.locals["job_account_publishes"]
    assert publishes == (
        "${{for pair in setproduct(keys(var.job_service_accounts), local.tpu_vm_publishes) : "
        '"${pair[0]}/${pair[1]}" => {account = pair[0], topic = pair[1]}}}'
    )
    publisher = tf.resource("google_pubsub_topic_iam_member", "job_account_publisher")
    assert publisher["for_each"] == "${local.job_account_publishes}"
    assert (publisher["role"], publisher["member"]) == (
        "roles/pubsub.publisher",
        "${google_service_account.job[each.value.account].member}",
    )
    assert publisher["topic"] == "${google_pubsub_topic.topic[each.value.topic].id}"
    assert sorted(tf.locals["tpu_vm_publishes"]) == sorted([topology.WORKER_EVENTS, topology.PREEMPTION])

    assert tf.locals["job_engine_acts_as"] == (
        "${{for pair in setproduct(keys(local.job_engine_functions), keys(var.job_service_accounts)) : "
        '"${pair[0]}/${pair[1]}" => {target = pair[0], account = pair[1]}}}'
    )
    acts_as = tf.resource("google_service_account_iam_member", "function_acts_as_job_account")
    assert acts_as["for_each"] == "${local.job_engine_acts_as}"
    assert acts_as["service_account_id"] == "${google_service_account.job[each.value.account].id}"
    assert acts_as["member"] == "${google_service_account.function[each.value.target].member}"
    assert acts_as["role"] == "roles/iam.serviceAccountUser"
    default = tf.resource("google_service_account_iam_member", "function_acts_as_tpu_vm")
    assert (default["for_each"], default["role"]) == ("${local.job_engine_functions}", "roles/iam.serviceAccountUser")


def test_each_vm_account_uses_only_its_own_prefixes_of_the_logs_bucket(tf: Terraform) -> None:
    """Managed folders logs/jobs/, checkpoints/jobs/ and code/jobs/ (tpu_vm), logs/accounts/{email}/,
    checkpoints/accounts/{email}/ and code/accounts/{email}/ (each named account); objectUser on
    one's own log and checkpoint folders, objectViewer on one's own code folder only; no
    bucket-wide grant but export_logs'."""
    folders = tf.of_kind("google_storage_managed_folder")
    assert {name: folder["name"] for name, folder in folders.items()} == {
        "jobs": "${each.key}/jobs/",
        "code": "code/jobs/",
        "account_code": "code/accounts/${google_service_account.job[each.key].email}/",
        "account": "${each.value.kind}/accounts/${google_service_account.job[each.value.account].email}/",
    }
    assert tf.locals["job_object_kinds"] == ["logs", "checkpoints"]
    assert folders["jobs"]["for_each"] == "${toset(local.job_object_kinds)}"
    assert folders["account"]["for_each"] == "${local.job_account_folders}"
    assert tf.locals["job_account_folders"] == (
        "${{for pair in setproduct(keys(var.job_service_accounts), local.job_object_kinds) : "
        '"${pair[0]}/${pair[1]}" => {account = pair[0], kind = pair[1]}}}'
    )
    for folder in folders.values():
        assert folder["bucket"] == "${google_storage_bucket.logs.name}"
        assert folder["force_destroy"] is True  # removes the folder's grants, never its objects

    grants = tf.of_kind("google_storage_managed_folder_iam_member")
    assert set(grants) == {"tpu_vm_jobs", "job_account_folder", "tpu_vm_code", "job_account_code", "dashboard_logs"}
    dashboard = grants["dashboard_logs"]  # reads the output folders only: no checkpoints, no code
    assert (dashboard["role"], dashboard["member"]) == (
        "roles/storage.objectViewer",
        '${google_service_account.function["dashboard"].member}',
    )
    assert 'if kind == "logs"' in dashboard["for_each"] and 'if endswith(key, "/logs")' in dashboard["for_each"]
    jobs = grants["tpu_vm_jobs"]
    assert jobs["for_each"] == "${google_storage_managed_folder.jobs}"
    assert (jobs["managed_folder"], jobs["role"], jobs["member"]) == (
        "${each.value.name}",
        "roles/storage.objectUser",
        TPU_VM,
    )
    own = grants["job_account_folder"]
    assert own["for_each"] == "${local.job_account_folders}"
    assert (own["managed_folder"], own["role"], own["member"]) == (
        "${google_storage_managed_folder.account[each.key].name}",
        "roles/storage.objectUser",
        "${google_service_account.job[each.value.account].member}",
    )
    default_code = grants["tpu_vm_code"]
    assert "for_each" not in default_code
    assert (default_code["managed_folder"], default_code["role"], default_code["member"]) == (
        "${google_storage_managed_folder.code.name}",
        "roles/storage.objectViewer",
        TPU_VM,
    )
    code = grants["job_account_code"]
    assert folders["account_code"]["for_each"] == "${var.job_service_accounts}"
    assert code["for_each"] == "${google_storage_managed_folder.account_code}"
    assert (code["managed_folder"], code["role"], code["member"]) == (
        "${each.value.name}",
        "roles/storage.objectViewer",
        "${google_service_account.job[each.key].member}",
    )

    # Bucket-wide: only the functions' table, and there only export_logs.
    assert set(tf.of_kind("google_storage_bucket_iam_member")) == {"function_logs"}
    with_logs = {target for target, f in tf.locals["functions"].items() if f["logs"]}
    assert with_logs == {"export_logs"}
    for kind in (
        "google_storage_bucket_iam_binding",
        "google_storage_bucket_iam_policy",
        "google_storage_managed_folder_iam_binding",
        "google_storage_managed_folder_iam_policy",
    ):
        assert not tf.of_kind(kind), kind


def _folder(tf: Terraform, name: str, kind: str, email: str | None = None) -> str:
    """A managed folder's name as Terraform makes it, for one kind (and one account's email)."""
    template = tf.of_kind("google_storage_managed_folder")[name]["name"]
    values = {"each.key": kind} if email is None else {"each.value.kind": kind}
    if email is not None:
        values["google_service_account.job[each.value.account].email"] = email
    return render(template, values)


def test_each_job_writes_inside_the_folders_its_account_may_use(tf: Terraform) -> None:
    """The prefixes the code gives a job's logs and checkpoints (tpujobs.domain.naming) lie
    inside the managed folders its account holds objectUser on: logs/jobs/ and checkpoints/jobs/
    for the default account, logs/accounts/{email}/ and checkpoints/accounts/{email}/ for a named
    one; never inside another account's, never in code/."""
    email = f"{PREFIX}team-a@proj.iam.gserviceaccount.com"
    other = f"{PREFIX}team-b@proj.iam.gserviceaccount.com"
    for kind, prefix_of in (("logs", naming.job_prefix), ("checkpoints", naming.checkpoint_prefix)):
        assert prefix_of("train-1", email).startswith(_folder(tf, "account", kind, email)), kind
        assert prefix_of("train-1", None).startswith(_folder(tf, "jobs", kind)), kind
        assert not prefix_of("train-1", None).startswith(_folder(tf, "account", kind, "")), kind
        assert not prefix_of("train-1", email).startswith(_folder(tf, "account", kind, other)), kind
        for account in (None, email):
            assert not prefix_of("train-1", account).startswith("code/"), (kind, account)
    code_folders = tf.of_kind("google_storage_managed_folder")
    own_code = render(code_folders["account_code"]["name"], {"google_service_account.job[each.key].email": email})
    other_code = render(code_folders["account_code"]["name"], {"google_service_account.job[each.key].email": other})
    assert naming.code_object("ab" * 32).startswith(code_folders["code"]["name"])
    assert naming.code_object("ab" * 32, email).startswith(own_code)
    assert not naming.code_object("ab" * 32, email).startswith(other_code)
    assert not naming.code_object("ab" * 32, email).startswith(code_folders["code"]["name"])
    assert not naming.code_object("ab" * 32).startswith("code/accounts/")


def test_every_vm_account_may_pull_images_from_the_listed_repositories_only(tf: Terraform) -> None:
    """roles/artifactregistry.reader on each repository of var.image_repositories, for every VM
    account (local.job_accounts); nothing project-wide, nothing that writes."""
    variable = tf.variables["image_repositories"]
    assert variable["default"] == []
    assert tf.locals["image_pulls"] == (
        "${{for pair in setproduct(keys(local.job_accounts), var.image_repositories) : "
        '"${pair[0]}/${pair[1]}" => {account = pair[0], location = split("/", pair[1])[0], '
        'repository = split("/", pair[1])[1]}}}'
    )
    pull = tf.resource("google_artifact_registry_repository_iam_member", "job_account_images")
    assert pull["for_each"] == "${local.image_pulls}"
    assert (pull["project"], pull["location"], pull["repository"], pull["role"], pull["member"]) == (
        "${var.project}",
        "${each.value.location}",
        "${each.value.repository}",
        "roles/artifactregistry.reader",
        "${local.job_accounts[each.value.account].member}",
    )
    assert set(tf.of_kind("google_artifact_registry_repository_iam_member")) == {"job_account_images"}
    pattern = re.compile(block(variable, "validation")["condition"].split('regex("')[1].split('", r)')[0])
    for good in ("us/trainers", "us-central1/team-a", "europe-west4/r1"):
        assert pattern.fullmatch(good), good
    for bad in ("us", "us/Trainers", "us/trainers/extra", "us/-x", "projects/p/locations/us/repositories/r"):
        assert not pattern.fullmatch(bad), bad


def test_job_accounts_read_only_their_own_secret_namespace(tf: Terraform) -> None:
    """Each job account gets secretAccessor on the project only under a condition on its own
    namespace, and the condition holds for exactly the secrets tpujobs.domain.secrets names for
    it: not another account's, not the report key."""
    grant = tf.resource("google_project_iam_member", "job_account_secrets")
    assert grant["for_each"] == "${local.job_accounts}"
    assert (grant["role"], grant["member"]) == ("roles/secretmanager.secretAccessor", "${each.value.member}")
    readable = secret_reader(tf, grant, PREFIX, PROJECT_NUMBER)

    team_a, team_b = f"{PREFIX}team-a", f"{PREFIX}team-ab"
    tpu_vm = render(tf.resource("google_service_account", "tpu_vm")["account_id"], {"var.prefix": PREFIX})
    email = {account: f"{account}@proj.iam.gserviceaccount.com" for account in (team_a, team_b, tpu_vm)}

    def version(name: str, account: str) -> str:
        return secrets.secret_version_name(name, PROJECT_NUMBER, PREFIX, email[account])

    for account in email:
        assert readable(account, version("hf-token", account)), account
        assert readable(account, version("hf-token@3", account)), account
        for other in set(email) - {account}:
            assert not readable(account, version("hf-token", other)), (account, other)
    report_key = render(tf.resource("google_secret_manager_secret", "report_key")["secret_id"], {"var.prefix": PREFIX})
    for account in email:
        assert not readable(account, f"projects/{PROJECT_NUMBER}/secrets/{report_key}/versions/latest")
    assert not readable(tpu_vm, f"projects/{PROJECT_NUMBER}/secrets/{PREFIX}other_secret/versions/1")


def test_secret_managers_may_write_only_tpujobs_secrets_and_never_read_values(tf: Terraform) -> None:
    """var.secret_managers: create and list on the project (they are checked there), everything
    else only under the tpujobs prefix; no role of theirs reads values or changes IAM."""
    variable = tf.variables["secret_managers"]
    assert variable["default"] == []
    assert "allUsers" in block(variable, "validation")["condition"]
    creator = tf.resource("google_project_iam_custom_role", "secret_creator")
    writer = tf.resource("google_project_iam_custom_role", "secret_writer")
    assert creator["permissions"] == "${local.secret_creator_permissions}"
    assert writer["permissions"] == "${local.secret_writer_permissions}"
    assert sorted(tf.locals["secret_creator_permissions"]) == [
        "secretmanager.secrets.create",
        "secretmanager.secrets.list",
    ]
    for permission in [*tf.locals["secret_creator_permissions"], *tf.locals["secret_writer_permissions"]]:
        assert permission.startswith("secretmanager."), permission
        assert permission not in {"secretmanager.versions.access", "secretmanager.secrets.setIamPolicy"}, permission
    create = tf.resource("google_project_iam_member", "secret_manager_create")
    write = tf.resource("google_project_iam_member", "secret_manager_write")
    assert (create["role"], write["role"]) == (
        "${google_project_iam_custom_role.secret_creator.id}",
        "${google_project_iam_custom_role.secret_writer.id}",
    )
    assert create["for_each"] == write["for_each"] == "${toset(var.secret_managers)}"
    assert "condition" not in create
    values = {
        "local.project_secrets": f"projects/{PROJECT_NUMBER}/secrets/",
        "local.job_secret_prefix": render(tf.locals["job_secret_prefix"], {"var.prefix": PREFIX}),
    }
    prefix = starts_with(render(block(write, "condition")["expression"], values))
    assert prefix == f"projects/{PROJECT_NUMBER}/secrets/{PREFIX}tpujobs_"
    report_key = render(tf.resource("google_secret_manager_secret", "report_key")["secret_id"], {"var.prefix": PREFIX})
    assert not f"projects/{PROJECT_NUMBER}/secrets/{report_key}".startswith(prefix)
    assert secrets.namespace(PREFIX, "team-a1@p.iam.gserviceaccount.com").startswith(prefix.rsplit("/", 1)[1])


def test_team_secret_managers_write_only_their_own_accounts_namespace(tf: Terraform) -> None:
    """var.team_secret_managers: the writer role under one condition, the namespace that
    tpujobs.domain.secrets gives the team's account (team-a's managers never reach team-ab's);
    the creator role project-wide (create is checked on the project), once per member."""
    variable = tf.variables["team_secret_managers"]
    assert variable["default"] == {}
    assert "allUsers" in block(variable, "validation")["condition"]
    write = tf.resource("google_project_iam_member", "team_secret_manager_write")
    create = tf.resource("google_project_iam_member", "team_secret_manager_create")
    assert (write["role"], write["member"]) == (
        "${google_project_iam_custom_role.secret_writer.id}",
        "${each.value.member}",
    )
    assert create["role"] == "${google_project_iam_custom_role.secret_creator.id}" and "condition" not in create
    assert create["for_each"] == "${setsubtract(local.team_secret_creators, var.secret_managers)}"
    assert "contains(keys(local.job_accounts), each.value.account)" in str(write["lifecycle"])
    values = {
        "local.project_secrets": f"projects/{PROJECT_NUMBER}/secrets/",
        "local.job_secret_prefix": render(tf.locals["job_secret_prefix"], {"var.prefix": PREFIX}),
    }

    def writable(account_id: str, secret: str) -> bool:
        expression = render(block(write, "condition")["expression"], {**values, "each.value.account": account_id})
        return f"projects/{PROJECT_NUMBER}/secrets/{secret}".startswith(starts_with(expression))

    team_a, team_ab = f"{PREFIX}team-a", f"{PREFIX}team-ab"
    email = {account: f"{account}@proj.iam.gserviceaccount.com" for account in (team_a, team_ab)}
    for account in email:
        assert writable(account, secrets.secret_id("hf-token", PREFIX, email[account])), account
        for other in set(email) - {account}:
            assert not writable(account, secrets.secret_id("hf-token", PREFIX, email[other])), (account, other)
    report_key = render(tf.resource("google_secret_manager_secret", "report_key")["secret_id"], {"var.prefix": PREFIX})
    assert not writable(team_a, report_key)


def test_each_function_has_an_instance_cap_that_a_variable_may_change(tf: Terraform) -> None:
    """max_instance_count: var.max_instances for the functions it names, else the table's
    default; every default is set, and reconcile keeps the cap its fan-out is sized for."""
    config = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert config["max_instance_count"] == "${lookup(var.max_instances, each.key, each.value.max)}"
    assert all(isinstance(f["max"], int) and f["max"] >= 1 for f in tf.locals["functions"].values())
    assert tf.locals["functions"]["reconcile"]["max"] == 20
    assert tf.variables["max_instances"]["default"] == {}
    assert "keys(local.functions)" in str(tf.resource("google_cloudfunctions2_function", "function")["lifecycle"])


def test_the_report_key_is_a_secret_without_a_value_read_by_the_master_key_functions_only(tf: Terraform) -> None:
    """Terraform makes the secret (auto replication, protected from destroy) and its
    secretAccessor grants for the functions with master_key = true, and no version: the value
    never enters the state."""
    secret = tf.resource("google_secret_manager_secret", "report_key")
    assert secret["secret_id"] == "${var.prefix}tpujobs-report-key"
    assert block(secret, "replication") == {"auto": [{}]}
    assert secret["deletion_protection"] is True
    grant = tf.resource("google_secret_manager_secret_iam_member", "report_key")
    assert grant["for_each"] == "${local.master_key_functions}"
    assert tf.locals["master_key_functions"] == "${{for target, f in local.functions : target => f if f.master_key}}"
    assert grant["secret_id"] == "${google_secret_manager_secret.report_key.id}"
    assert (grant["role"], grant["member"]) == (
        "roles/secretmanager.secretAccessor",
        "${google_service_account.function[each.key].member}",
    )
    assert set(tf.of_kind("google_secret_manager_secret")) == {"report_key", "notify_signing_key"}  # notify.tf
    assert not tf.of_kind("google_secret_manager_secret_version")
    assert not re.search(r'data\s+"google_secret_manager_secret_version', tf.text)


def test_the_report_key_is_mounted_into_exactly_the_master_key_functions(tf: Terraform) -> None:
    """TPUJOBS_REPORT_KEY at var.report_key_version and, while a rotation lasts,
    TPUJOBS_REPORT_KEY_PREVIOUS at var.report_key_previous_version (never "latest"; project by
    number), on the functions with master_key = true and no other (never the dashboard, nor the
    converge function, which signs nothing); they deploy after their grant."""
    function = tf.resource("google_cloudfunctions2_function", "function")
    mount = block(function, "service_config")["dynamic"][0]["secret_environment_variables"]
    assert mount["for_each"] == "${each.value.master_key ? local.report_key_mounts : {}}"
    assert block(mount, "content") == {
        "key": "${secret_environment_variables.key}",
        "project_id": "${data.google_project.this.number}",
        "secret": "${google_secret_manager_secret.report_key.secret_id}",
        "version": "${secret_environment_variables.value}",
    }
    assert tf.locals["report_key_env"] == "TPUJOBS_REPORT_KEY"
    mounts = tf.locals["report_key_mounts"]
    assert "{(local.report_key_env) = var.report_key_version}" in mounts
    previous = '{"${local.report_key_env}_PREVIOUS" = var.report_key_previous_version}'
    assert f'var.report_key_previous_version == "" ? {{}} : {previous}' in mounts
    for name in ("report_key_version", "report_key_previous_version"):
        assert "^[1-9][0-9]*$" in block(tf.variables[name], "validation")["condition"], name
    assert tf.variables["report_key_version"]["default"] == "1"
    assert tf.variables["report_key_previous_version"]["default"] == ""
    assert "${google_secret_manager_secret_iam_member.report_key}" in function["depends_on"]
    mounted = {target for target, f in tf.locals["functions"].items() if f["master_key"]}
    assert mounted == {
        "submit_job",
        "on_worker_event",
        "on_preemption",
        "on_qr_state",
        "on_control",
        "reconcile",
        "jobs",  # `logs` checks each entry's signature
        "attempt_key",  # derives each attempt's key
    }


def test_environment_goes_to_the_functions_that_use_it(tf: Terraform) -> None:
    """Every function: the common settings and TPUJOBS_TPU_SERVICE_ACCOUNT; the job-engine
    functions and `jobs` also TPUJOBS_JOB_SERVICE_ACCOUNTS (the named accounts' emails); `jobs`
    and `attempt_key` alone TPUJOBS_API_PLATFORM_AUTH=1; `reconcile` alone
    TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT."""
    config = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert config["environment_variables"] == (
        "${merge(local.function_env, {THREADS = tostring(each.value.concurrent)}, "
        'each.value.job_engine || each.key == "jobs" ? local.job_engine_env : {}, '
        "each.value.master_key ? local.report_key_version_env : {}, "
        'contains(["jobs", "attempt_key"], each.key) ? local.api_env : {}, '
        'each.key == "dashboard" ? local.dashboard_env : {}, '
        "contains(local.notify_key_functions, each.key) ? local.notify_env : {}, "
        'each.key == "reconcile" ? local.reconcile_env : {})}'
    )
    # Beside each mounted key, its version number in plain env: TPUJOBS_REPORT_KEY_VERSION, and
    # TPUJOBS_REPORT_KEY_PREVIOUS_VERSION while a rotation lasts.
    assert tf.locals["report_key_version_env"] == (
        '${{for env, version in local.report_key_mounts : "${env}_VERSION" => version}}'
    )
    assert tf.locals["function_env"]["TPUJOBS_TPU_SERVICE_ACCOUNT"] == "${google_service_account.tpu_vm.email}"
    assert tf.locals["job_engine_env"] == {
        "TPUJOBS_JOB_SERVICE_ACCOUNTS": '${join(",", [for id, account in google_service_account.job : account.email])}'
    }
    assert tf.locals["api_env"] == {"TPUJOBS_API_PLATFORM_AUTH": "1"}
    assert set(tf.locals["reconcile_env"]) == {"TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT"}
    for target, function in tf.locals["functions"].items():
        env = _function_env(tf, target, function)
        assert "TPUJOBS_TPU_SERVICE_ACCOUNT" in env, target
        assert ("TPUJOBS_JOB_SERVICE_ACCOUNTS" in env) is (function["job_engine"] or target == "jobs"), target
        assert ("TPUJOBS_API_PLATFORM_AUTH" in env) is (target in ("jobs", "attempt_key")), target
        assert "TPUJOBS_REPORT_KEY" not in env, "a secret is mounted, never a plain variable"


def test_what_platform_auth_claims_is_what_iam_holds(tf: Terraform) -> None:
    """TPUJOBS_API_PLATFORM_AUTH says Cloud Run's IAM check admits only known callers: run.invoker
    is granted only by the three member resources (push account, var.invokers, the VM accounts),
    never authoritatively, never to allUsers or allAuthenticatedUsers, and nothing turns the check off."""
    invokers = {(kind, name) for (kind, name), body in tf.resources.items() if "roles/run.invoker" in _roles(body)}
    assert invokers == {
        ("google_cloud_run_service_iam_member", "push_invoker"),
        ("google_cloud_run_service_iam_member", "api_invoker"),
        ("google_cloud_run_service_iam_member", "worker_invoker"),
        ("google_cloud_run_service_iam_member", "dashboard_iap_invoker"),  # IAP's agent, dashboard.tf
    }
    iap = tf.resource("google_cloud_run_service_iam_member", "dashboard_iap_invoker")
    assert iap["service"] == '${google_cloudfunctions2_function.function["dashboard"].service_config[0].service}'
    assert iap["member"] == "${local.iap_service_agent}"
    assert tf.resource("google_cloud_run_service_iam_member", "worker_invoker")["for_each"] == "${local.job_accounts}"
    for kind, _ in tf.resources:
        assert not re.fullmatch(
            r"google_(cloud_run|cloud_run_v2|cloudfunctions2?)_(service|function)_iam_(binding|policy)", kind
        ), kind
        assert not kind.startswith("google_cloudfunctions2_function_iam"), kind
    assert not re.search(r'invoker_iam_disabled|members?\s*=\s*\[?\s*"all(Authenticated)?Users"', tf.text)
    validation = block(tf.variables["invokers"], "validation")["condition"]
    assert "allUsers" in validation and "allAuthenticatedUsers" in validation


def test_signed_reports_expire_by_ttl(tf: Terraform) -> None:
    """reports_seen.expire_at has a TTL policy (and no single-field index), in the default database."""
    field = tf.resource("google_firestore_field", "reports_seen_expire_at")
    assert (field["collection"], field["field"]) == ("reports_seen", "expire_at")
    assert field["database"] == "${google_firestore_database.default.name}"
    assert field.get("ttl_config") == [{}], "expire_at needs a TTL policy"
    assert field.get("index_config") == [{}], "an empty index_config: no single-field index"
    assert field["collection"] == firestore_store.REPORTS_SEEN


@pytest.mark.parametrize("name", ["TPUJOBS_JOB_SERVICE_ACCOUNTS", "TPUJOBS_API_PLATFORM_AUTH", "TPUJOBS_REPORT_KEY"])
def test_the_code_reads_what_infra_sets(tf: Terraform, name: str) -> None:
    """Each variable issue 11 sets on the functions is read by Settings.from_env: a name that
    differs would leave the feature off in production and no test would notice."""
    asked: set[str] = set()

    class Recording(dict[str, str]):
        def get(self, key: str, default: Any = None) -> Any:
            asked.add(key)
            return super().get(key, default)

    Settings.from_env(Recording())
    assert name in asked, f"infra sets {name} on the functions, and Settings.from_env never reads it"
