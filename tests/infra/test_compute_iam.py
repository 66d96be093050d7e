"""infra/ deploys the Compute Engine platform (issue 27, item 7): the API, a custom role of exactly
the google-cloud-compute calls the functions make, actAs on the jobs' accounts, and the
TPUJOBS_COMPUTE_* variables as Settings reads them."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from google.cloud import compute_v1
from terraform_config import INFRA, ROOT, Terraform, block, render

from tpujobs.domain.platforms import COMPUTE, COMPUTE_FAMILIES, SERVED_BY, TPU_API
from tpujobs.engine.settings import Settings

ADAPTERS = ROOT / "shared" / "tpujobs" / "adapters"

# Each google-cloud-compute method the functions may call, and what Compute Engine checks for it:
# the IAM block of the method's REST reference page (cloud.google.com/compute/docs/reference/rest/v1),
# plus what the request's own fields need (Google's "Create a VM" page: labels, tags, a service
# account, an external IP). Templates, global or regional, use compute.instanceTemplates.*: no
# compute.regionInstanceTemplates.* permission exists. `x_unary` is `x` without the operation wrapper.
_VM = (  # every VM made, by instances.insert or by a MIG from its template
    "compute.instances.create",
    "compute.disks.create",  # its boot disk
    "compute.images.useReadOnly",  # from the accelerator image
    "compute.subnetworks.use",
    "compute.instances.setMetadata",
)
COMPUTE_CALLS: dict[tuple[str, str], tuple[str, ...]] = {
    ("InstancesClient", "insert"): (
        *_VM,
        "compute.subnetworks.useExternalIp",  # an access config, unless internal IPs only
        "compute.networks.use",  # a legacy network
        "compute.instances.setLabels",
        "compute.instances.setTags",
        "compute.instances.setServiceAccount",
        "compute.reservations.get",  # a specific reservation's affinity (not confirmed to be checked)
    ),
    ("InstancesClient", "get"): ("compute.instances.get",),
    ("InstancesClient", "list"): ("compute.instances.list",),
    ("InstancesClient", "delete"): ("compute.instances.delete",),
    ("InstancesClient", "set_metadata"): ("compute.instances.setMetadata",),
    ("RegionInstanceTemplatesClient", "insert"): ("compute.instanceTemplates.create",),
    ("RegionInstanceTemplatesClient", "get"): ("compute.instanceTemplates.get",),
    ("RegionInstanceTemplatesClient", "list"): ("compute.instanceTemplates.list",),
    ("RegionInstanceTemplatesClient", "delete"): ("compute.instanceTemplates.delete",),
    ("InstanceTemplatesClient", "insert"): ("compute.instanceTemplates.create",),
    ("InstanceTemplatesClient", "get"): ("compute.instanceTemplates.get",),
    ("InstanceTemplatesClient", "list"): ("compute.instanceTemplates.list",),
    ("InstanceTemplatesClient", "delete"): ("compute.instanceTemplates.delete",),
    ("ResourcePoliciesClient", "insert"): ("compute.resourcePolicies.create",),
    ("ResourcePoliciesClient", "get"): ("compute.resourcePolicies.get",),
    ("ResourcePoliciesClient", "list"): ("compute.resourcePolicies.list",),
    ("ResourcePoliciesClient", "delete"): ("compute.resourcePolicies.delete",),
    ("InstanceGroupManagersClient", "insert"): (
        "compute.instanceGroupManagers.create",
        "compute.instanceTemplates.useReadOnly",  # the template it is made from
        "compute.resourcePolicies.use",  # the workload policy it names
        *_VM,
    ),
    ("InstanceGroupManagersClient", "get"): ("compute.instanceGroupManagers.get",),
    ("InstanceGroupManagersClient", "list"): ("compute.instanceGroupManagers.list",),
    ("InstanceGroupManagersClient", "list_managed_instances"): ("compute.instanceGroupManagers.get",),
    ("InstanceGroupManagersClient", "resize"): ("compute.instanceGroupManagers.update",),
    ("InstanceGroupManagersClient", "delete"): (
        "compute.instanceGroupManagers.delete",
        "compute.instanceGroups.delete",  # the MIG's instance group goes with it
    ),
    ("InstanceGroupManagerResizeRequestsClient", "insert"): ("compute.instanceGroupManagers.update",),
    ("InstanceGroupManagerResizeRequestsClient", "get"): ("compute.instanceGroupManagers.get",),
    ("InstanceGroupManagerResizeRequestsClient", "cancel"): ("compute.instanceGroupManagers.update",),
    ("InstanceGroupManagerResizeRequestsClient", "delete"): ("compute.instanceGroupManagers.update",),
    ("ZoneOperationsClient", "get"): ("compute.zoneOperations.get",),
    ("ZoneOperationsClient", "wait"): ("compute.zoneOperations.get",),
    ("RegionOperationsClient", "get"): ("compute.regionOperations.get",),
    ("RegionOperationsClient", "wait"): ("compute.regionOperations.get",),
    ("GlobalOperationsClient", "get"): ("compute.globalOperations.get",),
    ("GlobalOperationsClient", "wait"): ("compute.globalOperations.get",),
}
# The settings infra sets for Compute Engine, by variable, and their Settings fields.
COMPUTE_ENV = {
    "TPUJOBS_COMPUTE_BY_DEFAULT": "compute_by_default",
    "TPUJOBS_COMPUTE_IMAGE_PROJECT": "compute_image_project",
    "TPUJOBS_COMPUTE_IMAGE_FAMILIES": "compute_image_families",
}
BROAD_COMPUTE_ROLES = {"roles/compute.admin", "roles/compute.instanceAdmin", "roles/compute.instanceAdmin.v1"}


def client_calls(source: str) -> tuple[set[tuple[str, str]], set[str]]:
    """The (client class, method) pairs a module calls on google-cloud-compute clients, and every
    client class it names. A client is known by what holds it: a parameter, attribute or field
    annotated with `compute_v1.XClient`, a name or attribute assigned `compute_v1.XClient(...)`, or
    an attribute assigned such a parameter; a call is `holder.method(...)` or `self._holder.method(...)`."""
    tree = ast.parse(source)
    names = (
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.Name)
    )
    named = {name for name in names if name.endswith("Client") and hasattr(compute_v1, name)}
    holders: dict[str, str] = {}

    def client_of(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Call):
            node = node.func
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
            found = re.search(r"\b(\w+Client)\b", node.value)
            return found[1] if found and hasattr(compute_v1, found[1]) else None
        if isinstance(node, ast.Attribute | ast.Name):
            name = node.attr if isinstance(node, ast.Attribute) else node.id
            return name if name in named else holders.get(name)
        if isinstance(node, ast.BinOp):  # `compute_v1.XClient | None`
            return client_of(node.left) or client_of(node.right)
        if isinstance(node, ast.Subscript):  # `Optional[compute_v1.XClient]`
            return client_of(node.slice)
        return None

    def holder_name(target: ast.AST) -> str | None:
        return target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else None

    for _ in range(2):  # a second pass sees attributes assigned from annotated parameters
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and (client := client_of(node.annotation)):
                holders[node.arg] = client
            elif isinstance(node, ast.AnnAssign) and (name := holder_name(node.target)):
                if client := client_of(node.annotation) or client_of(node.value):
                    holders[name] = client
            elif isinstance(node, ast.Assign) and (client := client_of(node.value)):
                for target in node.targets:
                    if name := holder_name(target):
                        holders[name] = client
    calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            holder = holder_name(node.func.value)
            if holder in holders:
                calls.add((holders[holder], node.func.attr.removesuffix("_unary")))
    return calls, named


def _adapter_sources() -> dict[str, str]:
    """The adapter modules that use google-cloud-compute, by file name."""
    found = {}
    for path in sorted(ADAPTERS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*(from google\.cloud import .*\bcompute_v1\b|import google\.cloud\.compute_v1)", text, re.M):
            found[path.name] = text
    return found


def test_the_compute_role_holds_exactly_what_the_calls_need(tf: Terraform) -> None:
    """A custom role with the union of the table's permissions, each once, bound to the job-engine
    functions alone: the same ones as the TPU role."""
    declared = tf.locals["compute_permissions"]
    assert len(declared) == len(set(declared)), "a permission is listed twice"
    wanted = {permission for permissions in COMPUTE_CALLS.values() for permission in permissions}
    missing, unused = sorted(wanted - set(declared)), sorted(set(declared) - wanted)
    assert set(declared) == wanted, f"missing: {missing}, unused: {unused}"
    role = tf.resource("google_project_iam_custom_role", "compute")
    assert role["permissions"] == "${local.compute_permissions}"
    assert render(role["role_id"], {'replace(var.prefix, "-", "_")': "dev_"}) == "dev_tpujobsComputeSlices"
    binding = tf.resource("google_project_iam_member", "function_compute")
    assert binding["role"] == "${google_project_iam_custom_role.compute.id}"
    assert binding["member"] == "${google_service_account.function[each.key].member}"
    assert binding["for_each"] == tf.resource("google_project_iam_member", "function_tpu")["for_each"]
    assert binding["for_each"] == "${local.job_engine_functions}"


def test_every_permission_has_a_comment_naming_its_call() -> None:
    """Each line of local.compute_permissions says which call needs it."""
    text = (INFRA / "iam.tf").read_text(encoding="utf-8")
    body = text.split("compute_permissions = [", 1)[1].split("]", 1)[0]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    assert lines and all(re.fullmatch(r'"compute\.[\w.]+",\s+# \S.*', line) for line in lines), lines


def test_no_permission_is_one_google_does_not_have(tf: Terraform) -> None:
    """No compute.regionInstanceTemplates.* (regional templates are checked as
    compute.instanceTemplates.*) and no method name taken for a permission (listManagedInstances
    and resize are checked as compute.instanceGroupManagers.get and .update); a custom role naming
    one fails to apply."""
    for permission in tf.locals["compute_permissions"]:
        assert not permission.startswith("compute.regionInstanceTemplates."), permission
        assert permission.rsplit(".", 1)[1] not in {"listManagedInstances", "resize", "insert", "setScheduling"}


def test_every_call_in_the_table_is_a_method_of_its_client() -> None:
    """The table names real google-cloud-compute methods, so an adapter call can be matched to it."""
    for client, method in COMPUTE_CALLS:
        assert callable(getattr(getattr(compute_v1, client), method, None)), f"compute_v1.{client}.{method}"


def test_the_adapter_calls_only_what_the_role_covers() -> None:
    """Every google-cloud-compute call of the adapters is in the table (so in the role), and every
    client they name is seen called: a client held some other way fails here rather than passing
    unchecked."""
    sources = _adapter_sources()
    if not sources:
        pytest.skip("no module of shared/tpujobs/adapters imports google.cloud.compute_v1 yet")
    seen: set[str] = set()
    named_anywhere: set[str] = set()
    for name, source in sources.items():
        calls, named = client_calls(source)
        assert calls <= set(COMPUTE_CALLS), f"{name} calls {sorted(calls - set(COMPUTE_CALLS))}: add their permissions"
        seen |= {client for client, _ in calls}
        named_anywhere |= named
    # A client held in one module (the clients' holder) may be called in another (the operations').
    unseen = sorted(named_anywhere - seen)
    assert not unseen, f"the adapters name {unseen} but no call on them was found: teach client_calls"


def test_client_calls_finds_calls_however_the_client_is_held() -> None:
    """Annotated parameters kept on self, clients built in place, fields of a holder, `_unary`
    variants and string annotations are all followed; calls on anything else are not counted."""
    source = """
from dataclasses import dataclass
from google.cloud import compute_v1

@dataclass(frozen=True)
class Clients:
    migs: compute_v1.InstanceGroupManagersClient
    operations: "compute_v1.ZoneOperationsClient"

class Slices:
    def __init__(self, instances: compute_v1.InstancesClient, clients: Clients, cache: dict) -> None:
        self._instances = instances
        self._clients = clients
        self._policies = compute_v1.ResourcePoliciesClient()
        self._cache = cache

    def run(self) -> None:
        self._instances.set_metadata(project="p")
        self._clients.migs.resize(size=2)
        self._clients.operations.wait(operation="o")
        self._policies.insert_unary(resource_policy_resource=None)
        self._cache.get("k")
        templates = compute_v1.RegionInstanceTemplatesClient()
        templates.delete(instance_template="t")
"""
    calls, named = client_calls(source)
    assert calls == {
        ("InstancesClient", "set_metadata"),
        ("InstanceGroupManagersClient", "resize"),
        ("ZoneOperationsClient", "wait"),
        ("ResourcePoliciesClient", "insert"),
        ("RegionInstanceTemplatesClient", "delete"),
    }
    assert named == {
        "InstanceGroupManagersClient",
        "InstancesClient",
        "ResourcePoliciesClient",
        "RegionInstanceTemplatesClient",
    }  # a string annotation names no attribute: it is followed, not required


def test_the_job_engine_functions_may_act_as_every_job_account(tf: Terraform) -> None:
    """instances.insert and instanceTemplates.insert need iam.serviceAccounts.actAs on the VMs'
    account: the existing serviceAccountUser grants give it on tpu_vm and on each named account to
    exactly the functions that hold the Compute Engine role, so that role needs none."""
    default = tf.resource("google_service_account_iam_member", "function_acts_as_tpu_vm")
    named = tf.resource("google_service_account_iam_member", "function_acts_as_job_account")
    assert (default["role"], named["role"]) == ("roles/iam.serviceAccountUser", "roles/iam.serviceAccountUser")
    assert default["for_each"] == tf.resource("google_project_iam_member", "function_compute")["for_each"]
    assert named["for_each"] == "${local.job_engine_acts_as}"
    assert (
        "setproduct(keys(local.job_engine_functions), keys(var.job_service_accounts))"
        in tf.locals["job_engine_acts_as"]
    )
    assert not any(p.startswith("iam.") for p in tf.locals["compute_permissions"])


def test_no_binding_grants_a_broad_compute_role(tf: Terraform) -> None:
    """Nothing grants compute.admin or compute.instanceAdmin(.v1): they reach every VM of the project."""
    text = tf.text
    for role in BROAD_COMPUTE_ROLES:
        assert f'"{role}"' not in text, role


def test_the_compute_engine_api_is_enabled(tf: Terraform) -> None:
    """compute.googleapis.com is among the APIs apis.tf enables."""
    assert "compute.googleapis.com" in tf.locals["apis"]
    assert tf.resource("google_project_service", "api")["for_each"] == "${toset(local.apis)}"


def test_compute_settings_are_set_on_every_function_and_the_endpoint_never(tf: Terraform) -> None:
    """The three TPUJOBS_COMPUTE_* variables are in local.function_env, each TPUJOBS_<FIELD> of a
    Settings field; TPUJOBS_COMPUTE_ENDPOINT (the simulator's) is not."""
    env = tf.locals["function_env"]
    assert set(COMPUTE_ENV) <= set(env)
    assert "TPUJOBS_COMPUTE_ENDPOINT" not in env
    fields = set(Settings.__dataclass_fields__)
    for variable, field in COMPUTE_ENV.items():
        assert field in fields and variable == f"TPUJOBS_{field.upper()}", variable


def test_the_variables_allow_what_the_domain_serves(tf: Terraform) -> None:
    """compute_by_default allows exactly the generations both platforms serve; compute_image_families
    is keyed by exactly those Compute Engine serves; the defaults are [], the accelerator images'
    project and {}."""
    both = sorted(g for g, platforms in SERVED_BY.items() if platforms == {TPU_API, COMPUTE})
    by_default = tf.variables["compute_by_default"]
    assert by_default["default"] == [] and by_default["type"] == "${list(string)}"
    assert _listed(block(by_default, "validation")["condition"]) == both == ["v5p", "v6e"]
    families = tf.variables["compute_image_families"]
    assert families["default"] == {} and families["type"] == "${map(string)}"
    assert _listed(families["validation"][0]["condition"]) == sorted(COMPUTE_FAMILIES)
    assert tf.variables["compute_image_project"]["default"] == "ubuntu-os-accelerator-images"
    assert Settings().compute_image_project == "ubuntu-os-accelerator-images"


def _listed(condition: str) -> list[str]:
    """The string list literal inside a validation's `contains([...], x)`."""
    match = re.search(r"contains\(\[([^\]]*)\]", condition)
    assert match, condition
    return sorted(re.findall(r'"([^"]+)"', match[1]))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Console:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed: the variables' expressions cannot be evaluated")
    folder = tmp_path_factory.mktemp("compute")
    shutil.copy(INFRA / "compute.tf", folder / "compute.tf")
    return Console(terraform, folder)


class Console:
    """`terraform console` on infra/compute.tf alone (variables only: no provider, no init)."""

    def __init__(self, terraform: str, folder: Path) -> None:
        self.terraform = terraform
        self.folder = folder

    def run(self, expression: str, variables: dict[str, str]) -> subprocess.CompletedProcess[str]:
        args = [self.terraform, "console"] + [f"-var={name}={value}" for name, value in variables.items()]
        env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
        return subprocess.run(
            args, input=expression + "\n", capture_output=True, text=True, cwd=self.folder, env=env, timeout=60
        )

    def string(self, expression: str, variables: dict[str, str]) -> str:
        answer = self.run(expression, variables)
        assert answer.returncode == 0 and "Error" not in _plain(answer.stderr), answer.stderr
        value = answer.stdout.strip()
        assert value.startswith('"') and value.endswith('"'), value
        return value[1:-1]

    def refusal(self, variables: dict[str, str]) -> str:
        """The validation error the values get (empty when they are accepted)."""
        errors = _plain(self.run("1", variables).stderr)
        return errors if "Error" in errors else ""


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, ((), "ubuntu-os-accelerator-images", ())),
        (
            {
                "compute_by_default": '["v5p", "v6e"]',
                "compute_image_project": "my-images",
                "compute_image_families": '{v7x = "tpu7x-custom", v5p = "v5p-custom"}',
            },
            (("v5p", "v6e"), "my-images", ("v5p=v5p-custom", "v7x=tpu7x-custom")),
        ),
    ],
)
def test_what_terraform_sets_is_what_settings_read(
    tf: Terraform, console: Console, variables: dict[str, str], expected: tuple[object, ...]
) -> None:
    """The function_env expressions, evaluated by Terraform from the variables, read back through
    Settings.from_env as the fields the code uses: comma lists, `generation=family`."""
    env = tf.locals["function_env"]
    environ = {name: console.string(env[name].removeprefix("${").removesuffix("}"), variables) for name in COMPUTE_ENV}
    settings = Settings.from_env(environ)
    assert tuple(getattr(settings, field) for field in COMPUTE_ENV.values()) == expected


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"compute_by_default": '["v7x"]'}, 'compute_by_default holds only "v5p" and "v6e"'),
        ({"compute_by_default": '["v4"]'}, 'compute_by_default holds only "v5p" and "v6e"'),
        ({"compute_image_families": '{v4 = "x"}'}, "keyed by the generations Compute Engine serves"),
        ({"compute_image_families": '{v7x = "Bad_Family"}'}, "Each image family is 1 to 63"),
        ({"compute_image_project": "Not A Project"}, "compute_image_project is a project id"),
    ],
)
def test_the_variables_refuse_what_the_code_cannot_use(
    console: Console, variables: dict[str, str], message: str
) -> None:
    """A generation no longer served by both platforms, an unknown one, a bad family or project
    fails at plan, not in a function."""
    refusal = console.refusal(variables)
    assert message in " ".join(refusal.split()), refusal


def test_the_console_accepts_good_values(console: Console) -> None:
    """The check above can pass: every allowed value is accepted."""
    accepted = {
        "compute_by_default": '["v5p", "v6e"]',
        "compute_image_families": '{v5p = "a", v6e = "b-1", v7x = "ubuntu-accel-2404-amd64-tpu-tpu7x"}',
        "compute_image_project": "ubuntu-os-accelerator-images",
    }
    assert console.refusal(accepted) == ""
