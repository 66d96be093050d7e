"""When a Compute Engine VM stops on its own, besides a Spot preemption, and how: pure rules that
compute_faults applies.

- Its `scheduling.maxRunDuration` runs out (flex-start VMs always have one). Compute Engine sets the
  VM's `terminationTimestamp` when it enters RUNNING and performs its instanceTerminationAction
  (DELETE or STOP) then; in a MIG the VM is deleted.
- Host maintenance of an `onHostMaintenance: TERMINATE` VM whose `automaticRestart` is false:
  the VM is shut down (ACPI soft-off) and stays TERMINATED; a DO_NOTHING MIG does not repair it.
  Its `instance/maintenance-event` stays NONE (Google fills it only for MIGRATE VMs and GPU VMs).

Google's words, with the sources: docs/local-stack.md#compute-engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_records import InstanceRecord

# The operation types a VM's own end leaves in zoneOperations (and the audit log's methodName).
MAINTENANCE_OPERATION = "compute.instances.terminateOnHostMaintenance"
SIMULATE_OPERATION = "simulateMaintenanceEvent"


def run_seconds(vm: InstanceRecord) -> float | None:
    """Its maxRunDuration in seconds (JSON writes int64 seconds as a string), or None: no limit."""
    duration = vm.scheduling.get("maxRunDuration")
    if not isinstance(duration, Mapping):
        return None
    try:
        seconds = float(duration.get("seconds") or 0) + float(duration.get("nanos") or 0) / 1e9
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def check_maintainable(vm: InstanceRecord, status: str | None) -> None:
    """A VM host maintenance can terminate now: RUNNING, `onHostMaintenance: TERMINATE` (a TPU VM
    cannot live-migrate) with `automaticRestart: false`, which is all the simulator serves."""
    if status != "RUNNING":
        raise ComputeError(
            400,
            "conditionNotMet",
            f"{vm.path} is {status or 'not created yet'}; host maintenance terminates only a RUNNING VM",
        )
    scheduling = vm.scheduling
    if scheduling.get("onHostMaintenance") != "TERMINATE" or scheduling.get("automaticRestart") is not False:
        raise ComputeError(
            400,
            "conditionNotMet",
            f"{vm.path} has onHostMaintenance {scheduling.get('onHostMaintenance') or 'MIGRATE'} and "
            f"automaticRestart {scheduling.get('automaticRestart', True)}; the tpujobs simulator serves host "
            "maintenance only to TERMINATE VMs with automaticRestart false, as TPU VMs are made",
        )
