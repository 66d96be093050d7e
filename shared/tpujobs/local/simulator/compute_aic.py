"""A MIG's all-instances configuration (`allInstancesConfig.properties`: metadata and labels, as
maps) on the simulated Compute Engine: checked at the MIG's insert as Compute Engine checks a VM's
metadata and labels, and given to the VMs the MIG creates over its template's, its values winning
("If you set the same property using both the MIG's instance template and its all-instances
configuration, the MIG prioritizes the value from the all-instances configuration";
https://cloud.google.com/compute/docs/instance-groups/set-mig-aic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujobs.local.simulator.checks import check_labels
from tpujobs.local.simulator.compute_checks import metadata_items
from tpujobs.local.simulator.compute_errors import invalid_field

_PATH = "resource.allInstancesConfig.properties"


def _patch(group_body: Mapping[str, Any]) -> Mapping[str, Any]:
    return (group_body.get("allInstancesConfig") or {}).get("properties") or {}


def check_all_instances_config(group_body: Mapping[str, Any]) -> None:
    """Metadata and labels as maps of strings, within Compute Engine's limits for a VM's."""
    patch = _patch(group_body)
    metadata = patch.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise invalid_field(f"{_PATH}.metadata", metadata, "It must be a map of strings to strings.")
    metadata_items({"items": [{"key": k, "value": v} for k, v in metadata.items()]}, f"{_PATH}.metadata")
    if "labels" in patch:
        check_labels(dict(patch["labels"] or {}), f"{_PATH}.labels")


def vm_properties(
    template: Mapping[str, Any], group_body: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """A new member's properties and metadata items: its template's, with the all-instances
    configuration's labels and metadata over them."""
    patch = _patch(group_body)
    body = dict(template)
    labels = patch.get("labels") or {}
    if labels:
        body["labels"] = {**(template.get("labels") or {}), **labels}
    items = dict(metadata_items(template.get("metadata") or {}, "properties.metadata"))
    items.update({str(k): str(v) for k, v in (patch.get("metadata") or {}).items()})
    return body, tuple(items.items())
