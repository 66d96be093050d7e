"""tell_hosts on Compute Engine: read, merge tpujobs' keys only, write with the fingerprint, retry a 412;
never into a MIG or VM that does not carry tpujobs' marker of the holding."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1

from tpujobs.adapters.compute import METADATA_TRIES, ComputeClients, ComputeEngine
from tpujobs.engine.errors import NotOurs, PermanentError, TransientError

ZONE = "us-central1-c"
# What tpujobs stamps on the MIG (its description) and on the VMs (their template's labels) of `train-c1`.
MARKED_MIG = (
    'tpujobs {"holding":"train-c1","labels":{"tpujobs-attempt":"1","tpujobs-job":"train"},"slice":0,"zone":"z"}'
)
MARKED_VM = {"tpujobs-job": "train", "tpujobs-attempt": "1", "tpujobs-slice": "0"}


class Instances:
    """One VM's metadata behind instances.get / setMetadata, with a fingerprint that changes on
    every write; `conflicts` writes are answered 412 first (someone else wrote meanwhile)."""

    def __init__(self, conflicts: int = 0, labels: dict[str, str] | None = None) -> None:
        self.labels = MARKED_VM if labels is None else labels
        self.items = {"ssh-keys": "ada:ssh-ed25519 AAAA", "tpujobs-assignment": "old", "startup-script": "boot"}
        self.fingerprint = 1
        self.conflicts = conflicts
        self.writes: list[str] = []

    def get(self, **call: Any) -> compute_v1.Instance:
        items = [compute_v1.Items(key=k, value=v) for k, v in self.items.items()]
        metadata = compute_v1.Metadata(fingerprint=str(self.fingerprint), items=items)
        return compute_v1.Instance(labels=self.labels, metadata=metadata)

    def set_metadata_unary(self, *, metadata_resource: compute_v1.Metadata, **call: Any) -> compute_v1.Operation:
        self.writes.append(metadata_resource.fingerprint)
        if self.conflicts:
            self.conflicts -= 1
            self.fingerprint += 1  # another writer
            raise api_exceptions.PreconditionFailed("Supplied fingerprint does not match current metadata fingerprint.")
        if metadata_resource.fingerprint != str(self.fingerprint):
            raise AssertionError("wrote with a stale fingerprint")
        self.items = {item.key: item.value for item in metadata_resource.items}
        self.fingerprint += 1
        return compute_v1.Operation(name="op", status="DONE", zone=f"zones/{ZONE}")


class Groups:
    def __init__(self, status: str = "RUNNING", description: str = MARKED_MIG) -> None:
        self.status = status
        self.description = description

    def get(self, *, instance_group_manager: str, **call: Any) -> compute_v1.InstanceGroupManager:
        return compute_v1.InstanceGroupManager(name=instance_group_manager, description=self.description)

    def list_managed_instances(self, **call: Any) -> list[compute_v1.ManagedInstance]:
        return [compute_v1.ManagedInstance(name="train-c1-ab12", instance_status=self.status, current_action="NONE")]


def engine(instances: Instances, groups: Groups | None = None) -> tuple[ComputeEngine, list[float]]:
    slept: list[float] = []
    clients = ComputeClients(instances, groups or Groups(), None, None, None, None)  # type: ignore[arg-type]
    return ComputeEngine(clients, "p", sleep=slept.append), slept


def test_only_tpujobs_keys_change_and_the_others_are_kept() -> None:
    """The new key is written, a stale value of ours replaced; ssh-keys and the boot untouched."""
    vm = Instances()
    compute, _ = engine(vm)
    compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})
    assert vm.items == {"ssh-keys": "ada:ssh-ed25519 AAAA", "tpujobs-assignment": "job-9", "startup-script": "boot"}
    assert vm.writes == ["1"]


def test_a_fingerprint_conflict_is_read_again_and_written_with_backoff() -> None:
    """Two 412s: read again each time, write with the new fingerprint, sleeping longer each time."""
    vm = Instances(conflicts=2)
    compute, slept = engine(vm)
    compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})
    assert vm.writes == ["1", "2", "3"] and vm.items["tpujobs-assignment"] == "job-9"
    assert len(slept) == 2 and slept[1] > slept[0]


def test_conflicts_that_never_end_are_transient() -> None:
    """Every write answered 412: TransientError after the tries, so the message is retried."""
    compute, _ = engine(Instances(conflicts=METADATA_TRIES))
    with pytest.raises(TransientError, match="kept changing"):
        compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})


def test_a_host_not_running_is_refused() -> None:
    """A VM not RUNNING cannot take an assignment: PermanentError, nothing written."""
    vm = Instances()
    compute, _ = engine(vm, Groups(status="STAGING"))
    with pytest.raises(PermanentError, match="not RUNNING"):
        compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})
    assert vm.writes == []


@pytest.mark.parametrize(
    "description",
    ["", "made by hand", MARKED_MIG.replace('"holding":"train-c1"', '"holding":"other-c1"')],
    ids=["no description", "another's words", "another holding's marker"],
)
def test_a_mig_named_like_the_holding_without_its_marker_is_never_written(description: str) -> None:
    """A MIG of the holding's name that tpujobs did not make for it: NotOurs, no VM read or written."""
    vm = Instances()
    compute, _ = engine(vm, Groups(description=description))
    with pytest.raises(NotOurs, match="train-c1"):
        compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})
    assert vm.writes == [] and vm.items["tpujobs-assignment"] == "old"


def test_a_vm_without_the_holdings_labels_is_never_written() -> None:
    """A VM in a marked MIG whose labels are not tpujobs' marker of the slice: NotOurs, nothing written."""
    vm = Instances(labels={"team": "other", "tpujobs-slice": "0"})
    compute, _ = engine(vm)
    with pytest.raises(NotOurs, match="VM train-c1-ab12"):
        compute.tell_hosts(ZONE, "train-c1", 1, {"tpujobs-assignment": "job-9"})
    assert vm.writes == []
