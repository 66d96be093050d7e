"""Whether a Compute Engine resource named like a tpujobs holding is tpujobs' own.

Names prove nothing: anyone who may create MIGs can make one named `{pool}-c0-g1`. What tpujobs
makes carries its marker (`domain.ownership`): MIGs, instance templates and resource policies
have no labels in google-cloud-compute's types, so their description holds it (`compute_requests.description`:
the holding, the slice and tpujobs' labels; a shared template's or policy's says it is shared and
the hash its name ends with, `compute_requests.shared_description`); VMs have labels, and a
holding's VMs get theirs from its MIG's all-instances configuration (tpujobs' labels and
`tpujobs-slice`). The adapter adopts, writes into or deletes a resource only when its marker
names that holding (and slice), and uses or gives back a shared one only when its marker says so.
Facts: ../shared/design/compute-engine.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujobs.adapters.compute_requests import SLICE_LABEL, parse_description, parse_shared
from tpujobs.domain import ownership
from tpujobs.engine.errors import NotOurs

SERVICE = "Compute Engine"


def ours(description: str, holding: str, slice_index: int | None = None) -> bool:
    """Whether a MIG's, template's or policy's description is tpujobs' marker of `holding` (and,
    when given, of that slice)."""
    said = parse_description(description or "")
    if said is None or said.get("holding") != holding:
        return False
    return slice_index is None or said.get("slice") == slice_index


def vm_ours(labels: Mapping[str, str], holding: str, slice_index: int) -> bool:
    """Whether a VM's labels are tpujobs' marker of `holding`'s slice `slice_index`."""
    return ownership.marked(holding, labels) and labels.get(SLICE_LABEL) == str(slice_index)


def not_ours(what: str, holding: str) -> NotOurs:
    """The refusal to adopt, write into or delete `what`."""
    return NotOurs(f"{SERVICE}: {ownership.refusal(what, holding)}")


def check_adopted(kind: str, resource: Any, holding: str, slice_index: int) -> None:
    """A create found `resource` existing: adopt it only if tpujobs made it for this slice."""
    if not ours(resource.description, holding, slice_index):
        raise not_ours(f"the existing {kind} {resource.name}", holding)


def shared_ours(description: str, kind: str, name: str) -> bool:
    """Whether a shared template's or policy's description is tpujobs' marker of that kind, with
    the hash `name` ends with (so a template named like a shared one by anyone else is not)."""
    said = parse_shared(description or "")
    return said is not None and said["shared"] == kind and name.endswith("-h" + said["key"])


def check_shared(kind: str, resource: Any) -> None:
    """A shared template or policy found existing: used only if tpujobs made it (NotOurs else)."""
    if not shared_ours(resource.description, kind, resource.name):
        raise NotOurs(
            f"{SERVICE}: the existing {kind} {resource.name} is named like a tpujobs shared {kind} but does not "
            "carry tpujobs' marker: tpujobs did not make it, so its VMs are never made from it and it is never deleted"
        )
