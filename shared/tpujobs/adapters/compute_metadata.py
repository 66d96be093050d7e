"""Writing tpujobs' keys into the metadata of a holding's VMs on Compute Engine (a warm-pool
unit's assignment), only once each MIG and VM is shown to be tpujobs' own (`compute_ownership`).

setMetadata replaces the whole map, so each VM is read, merged (every other key, such as
`ssh-keys` and the MIG's `created-by`, kept) and written with the fingerprint read; a 412 (someone
wrote meanwhile) is read and written again. Facts: ../shared/design/compute-engine.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.compute_ownership import SERVICE, not_ours, ours, vm_ours
from tpujobs.adapters.google_errors import translated
from tpujobs.domain import naming
from tpujobs.engine.errors import PermanentError, TransientError

if TYPE_CHECKING:
    from google.cloud import compute_v1

METADATA_TRIES = 5  # setMetadata answered 412 (another writer's fingerprint): read and write again
METADATA_BACKOFF_S = 0.5


class HostMetadata:
    """setMetadata on the VMs of tpujobs' own MIGs, and nothing else."""

    def __init__(
        self,
        instances: compute_v1.InstancesClient,
        groups: compute_v1.InstanceGroupManagersClient,
        project: str,
        call: Callable[[], dict[str, Any]],
        follow: Callable[[compute_v1.Operation, str], str],
        sleep: Callable[[float], None],
    ) -> None:
        """`call` gives each call's retry and timeout; `follow` waits for an operation (raising
        its failure, translated); `sleep` paces the 412 retries."""
        self._instances = instances
        self._groups = groups
        self._project = project
        self._call = call
        self._follow = follow
        self._sleep = sleep

    def write(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        """Set `metadata`'s keys on every VM of the holding `name`. Each slice's MIG must carry
        tpujobs' marker of that slice (NotOurs before anything is written, else), and each VM
        that of the holding (its labels, checked at each read before its write). A missing MIG,
        a slice without VMs or a VM not RUNNING raises PermanentError. Each write is waited for."""
        hosts: list[tuple[str, int]] = []
        for index in range(slices):
            mig = naming.node_id(name, index, slices)
            self._check_mig(zone, mig, name, index)
            managed = self._managed(zone, mig)
            if not managed:
                raise PermanentError(f"{SERVICE}: MIG {mig} has no VMs to write the metadata of")
            for host in managed:
                if host.instance_status != "RUNNING":
                    raise PermanentError(
                        f"{SERVICE}: VM {host.name} of {mig} is not RUNNING ({host.instance_status or 'none'})"
                    )
                hosts.append((host.name, index))
        for host_name, index in hosts:
            self._merge(zone, host_name, name, index, metadata)

    def _check_mig(self, zone: str, mig: str, holding: str, index: int) -> None:
        try:
            with translated(SERVICE, f"read MIG {mig}"):
                found = self._groups.get(project=self._project, zone=zone, instance_group_manager=mig, **self._call())
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                raise PermanentError(f"{SERVICE}: MIG {mig} does not exist; no VMs to write the metadata of") from error
            raise
        if not ours(found.description, holding, index):
            raise not_ours(f"MIG {mig}", holding)

    def _managed(self, zone: str, mig: str) -> list[compute_v1.ManagedInstance]:
        with translated(SERVICE, f"list the VMs of MIG {mig}"):
            return list(
                self._groups.list_managed_instances(
                    project=self._project, zone=zone, instance_group_manager=mig, **self._call()
                )
            )

    def _merge(self, zone: str, instance: str, holding: str, index: int, metadata: Mapping[str, str]) -> None:
        """Read the VM (refused unless its labels are tpujobs' marker of the slice), merge, write."""
        from google.cloud import compute_v1

        for attempt in range(METADATA_TRIES):
            with translated(SERVICE, f"read the metadata of VM {instance}"):
                vm = self._instances.get(project=self._project, zone=zone, instance=instance, **self._call())
            if not vm_ours(dict(vm.labels), holding, index):
                raise not_ours(f"VM {instance}", holding)
            current = vm.metadata
            items = {item.key: item.value for item in current.items if item.key not in metadata}
            items.update(metadata)
            written = compute_v1.Metadata(
                fingerprint=current.fingerprint,
                items=[compute_v1.Items(key=k, value=v) for k, v in sorted(items.items())],
            )
            try:
                with translated(SERVICE, f"write the metadata of VM {instance}"):
                    operation = self._instances.set_metadata_unary(
                        project=self._project, zone=zone, instance=instance, metadata_resource=written, **self._call()
                    )
                self._follow(operation, f"write the metadata of VM {instance}")
                return
            except PermanentError as error:
                if not isinstance(error.__cause__, api_exceptions.PreconditionFailed):
                    raise
            self._sleep(METADATA_BACKOFF_S * 2**attempt)
        raise TransientError(f"{SERVICE}: the metadata of VM {instance} kept changing under {METADATA_TRIES} writes")
