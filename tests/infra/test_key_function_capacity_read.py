"""The attempt_key function reads capacity and changes none (issue 38 items 2 and 3): a key waits
for its slice to be ACTIVE, read with the capacity port's `status`, so the function's account
holds a custom role of exactly the read permissions `status` needs, and no other function holds it.

The calls `status` makes are found in the adapters' source (the methods it reaches through
`self`), and each one's permission is looked up in the tables test_compute_iam.py and iam.tf keep.
"""

from __future__ import annotations

import ast
import re

from terraform_config import INFRA, ROOT, Terraform, render
from test_compute_iam import COMPUTE_CALLS

ADAPTERS = ROOT / "shared" / "tpujobs" / "adapters"
COMPUTE_CLIENTS = {  # adapters.compute.ComputeClients' fields, by client class
    "instances": "InstancesClient",
    "groups": "InstanceGroupManagersClient",
    "templates": "RegionInstanceTemplatesClient",
    "policies": "ResourcePoliciesClient",
    "zone_operations": "ZoneOperationsClient",
    "region_operations": "RegionOperationsClient",
}
TPU_READS = {"get_queued_resource": "tpu.nodes.get", "get_node": "tpu.nodes.get", "list_nodes": "tpu.nodes.list"}
READER = "${google_project_iam_custom_role.capacity_reader.id}"


def calls_of_status(module: str, cls: str, holders: set[str]) -> set[tuple[str, str]]:
    """(holder, method) of every `...holder.method(...)` in `cls.status` and the methods of `cls`
    it reaches through `self`, where holder is one of `holders` (a client's field or attribute)."""
    tree = ast.parse((ADAPTERS / module).read_text(encoding="utf-8"))
    found = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    methods = {n.name: n for n in found.body if isinstance(n, ast.FunctionDef)}
    seen, todo, calls = set(), ["status"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(methods[name]):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            target = node.func.value
            if isinstance(target, ast.Name) and target.id == "self" and node.func.attr in methods:
                todo.append(node.func.attr)
            elif isinstance(target, ast.Attribute) and target.attr in holders:
                calls.add((target.attr, node.func.attr))
    return calls


def test_the_reader_role_holds_exactly_the_permissions_of_the_status_reads(tf: Terraform) -> None:
    """Every call `status` makes on Compute Engine and the TPU API needs a permission of the
    role, and the role holds no other; each is a get or a list."""
    compute = calls_of_status("compute.py", "ComputeEngine", set(COMPUTE_CLIENTS))
    tpu = calls_of_status("tpu.py", "CloudTpu", {"_client"})
    assert compute and tpu
    wanted = {p for holder, method in compute for p in COMPUTE_CALLS[(COMPUTE_CLIENTS[holder], method)]}
    wanted |= {TPU_READS[method] for _, method in tpu}
    declared = tf.locals["capacity_read_permissions"]
    assert len(declared) == len(set(declared)), "a permission is listed twice"
    assert set(declared) == wanted, (
        f"missing: {sorted(wanted - set(declared))}, unused: {sorted(set(declared) - wanted)}"
    )
    assert all(re.fullmatch(r"(compute|tpu)\.\w+\.(get|list)", p) for p in declared), declared
    role = tf.resource("google_project_iam_custom_role", "capacity_reader")
    assert role["permissions"] == "${local.capacity_read_permissions}"
    assert render(role["role_id"], {'replace(var.prefix, "-", "_")': "dev_"}) == "dev_tpujobsCapacityReader"


def test_only_the_attempt_key_function_holds_the_reader_role(tf: Terraform) -> None:
    """One grant, to attempt_key's account: jobs and the dashboard hold no capacity role, and the
    job engine needs none (it holds the TPU and Compute Engine roles)."""
    grants = {key: body for key, body in tf.resources.items() if body.get("role") == READER}
    assert list(grants) == [("google_project_iam_member", "attempt_key_capacity_reader")]
    grant = grants[("google_project_iam_member", "attempt_key_capacity_reader")]
    assert grant["member"] == '${google_service_account.function["attempt_key"].member}'
    assert "for_each" not in grant


def test_each_read_permission_says_which_call_needs_it() -> None:
    """Each line of local.capacity_read_permissions names its call."""
    text = (INFRA / "iam.tf").read_text(encoding="utf-8")
    body = text.split("capacity_read_permissions = [", 1)[1].split("]", 1)[0]
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    assert lines and all(re.fullmatch(r'"(compute|tpu)\.[\w.]+",\s+# \S.*', line) for line in lines), lines
