"""What a Compute Engine TPU VM's metadata server answers beyond a TPU node's: its own instance
metadata (template items and setMetadata's), the TPU keys Compute Engine still fills in
(`accelerator-type`, `tpu-env` with TOPOLOGY, `agent-worker-number`, `worker-network-endpoints`),
`instance/preempted` per VM, `instance/upcoming-maintenance`, and `instance/maintenance-event`
always NONE (Google fills it only for VMs that live-migrate or have GPUs; TPU VMs do neither).
Formats: ../shared/design/compute-engine.md, sections 3 and 4.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tpujobs.local.simulator.compute_vms import HostInstance
from tpujobs.local.simulator.errors import project_number
from tpujobs.local.simulator.metadata import HostOverlay, attributes, tpu_env, upcoming_maintenance
from tpujobs.local.simulator.model import NodeRecord, Simulator

TPU_KEYS = ("accelerator-type", "agent-worker-number", "tpu-env", "worker-network-endpoints")


def host_overlay(node: NodeRecord, worker: int, host: HostInstance) -> HostOverlay:
    """The answers of worker *worker* of a Compute slice's node, whose VM is *host*."""
    vm = host.record
    named = dataclasses.replace(node, node_id=vm.group or vm.name)
    env = tpu_env(named, worker)
    if vm.topology:
        lines = sorted([*env.splitlines(), f"TOPOLOGY: '{vm.topology}'"])
        env = "".join(f"{line}\n" for line in lines)
    tpu = {key: value for key, value in attributes(named, worker).items() if key in TPU_KEYS}
    maintenance, maintenance_json = upcoming_maintenance(vm.upcoming_maintenance)
    machine_type = str(vm.body.get("machineType", "")).rsplit("/", 1)[-1]
    return HostOverlay(
        attributes={**dict(vm.metadata), **tpu, "tpu-env": env},
        values={
            "instance/preempted": "TRUE" if host.preempted else "FALSE",
            "instance/hostname": f"{vm.name}.{vm.zone}.c.{vm.project}.internal",
            "instance/name": vm.name,
            "instance/id": str(vm.number),
            "instance/machine-type": f"projects/{project_number(vm.project)}/machineTypes/{machine_type}",
            "instance/upcoming-maintenance": maintenance,
            # Filled only for MIGRATE VMs and GPU VMs [getting-live-migration-notice]: never for a TPU VM.
            "instance/maintenance-event": "NONE",
        },
        json_values={"instance/upcoming-maintenance": maintenance_json},
        vm=(vm.name, str(vm.number), vm.create_time),
    )


def overlay_of(simulator: Simulator) -> Callable[[NodeRecord, int], HostOverlay | None]:
    """The metadata server's overlay: a Compute VM's answers, None for a TPU API node's hosts."""

    def overlay(node: NodeRecord, worker: int) -> HostOverlay | None:
        host = simulator.compute.vms.host_instance(node, worker)
        return None if host is None else host_overlay(node, worker, host)

    return overlay
