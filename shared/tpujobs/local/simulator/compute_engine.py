"""The simulated Compute Engine, one part of the simulator made of its own parts: operations,
policies and templates (compute_model), the TPU model's queued resources under each slice
(compute_backing), VMs (compute_vms), MIGs (compute_groups), what the cloud does to a MIG's hosts
(compute_faults) and to its slice (compute_slices). Each is given the parts it calls; the
clockwork's events and the handlers a part registers carry the rest."""

from __future__ import annotations

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.compute_backing import Backings
from tpujobs.local.simulator.compute_faults import ComputeFaults
from tpujobs.local.simulator.compute_groups import ComputeGroups
from tpujobs.local.simulator.compute_model import ComputeOperations
from tpujobs.local.simulator.compute_slices import ComputeSlices
from tpujobs.local.simulator.compute_vms import ComputeVms
from tpujobs.local.simulator.fault_plan import FaultPlan
from tpujobs.local.simulator.world import World


class ComputeEngine:
    """Compute Engine's TPU VMs and MIGs, on the TPU model's capacity and hosts."""

    def __init__(self, world: World, clockwork: Clockwork, faults: FaultPlan) -> None:
        self.operations = ComputeOperations(world, clockwork)
        self.backings = Backings(world, clockwork, faults)
        self.vms = ComputeVms(world, clockwork, self.operations, self.backings)
        self.groups = ComputeGroups(world, clockwork, self.operations, self.vms, self.backings)
        self.faults = ComputeFaults(world, clockwork, self.operations, self.vms, self.groups)
        self.slices = ComputeSlices(world, clockwork, self.operations, self.vms, self.groups)
