"""A warm pool unit's metadata shared with gcloud, on the simulator: a real pool agent, the real
adapter writing assignments, and a gcloud-style `tpu-vm ssh` that adds its key to `ssh-keys` by a
read-modify-write of the whole map (mask `metadata`), ignoring a 409 as gcloud does.

No key that gcloud wrote is lost, and an older assignment that gcloud's write brings back never
runs, in the boot that saw the newer one or after a reboot."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.api_core import exceptions as api_exceptions
from google.api_core.operation import Operation
from google.cloud import tpu_v2
from google.protobuf import field_mask_pb2

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "agent"))  # the agent tests' stand-ins
from agent_stubs import ACCOUNT, FAST, PROJECT, GoogleStub, a_job
from test_pool_agent import BASH, SETTINGS, UNIT, UnitHost, attempt_key

from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain import signing
from tpujobs.domain.job import Job
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.engine.startup_script import assignment_text, idle_assignment_text
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.metadata import metadata_url
from tpujobs.local.testing import wait_for

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(BASH is None or not os.path.exists("/proc/self/stat"), reason="needs bash and /proc"),
]

ZONE = "us-central2-b"
NODE = f"projects/{PROJECT}/locations/{ZONE}/nodes/{UNIT}"
# An update runs a second, as Google's take seconds; the adapter follows it for a few.
CONFIG = SimulatorConfig(
    waiting_seconds=0.02,
    provisioning_seconds=0.05,
    tick_seconds=0.01,
    update_node_seconds=1.0,
    metadata_propagation_seconds=0.3,
)


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(CONFIG, run_workers=False) as running:
        yield running


@pytest.fixture
def google() -> Iterator[GoogleStub]:
    with GoogleStub() as stub:
        yield stub


def assign(tpu: CloudTpu, google: GoogleStub, seq: int, job: Job) -> None:
    """What `tell` does for a busy unit: the job's assignment written into the unit's nodes; the
    key server answers the attempt's key, as the jobs function would to the unit's hosts."""
    assert job.created_at is not None
    created = str(signing.created_micros(job.created_at))
    google.key_answer = {"key": signing.key_text(attempt_key(job)), "key_version": "1", "job_created": created}
    tpu.tell_hosts(ZONE, UNIT, 1, {"tpujobs-assignment": assignment_text(job, SETTINGS, seq, UNIT, timings=FAST)})


def gcloud_writes(client: tpu_v2.TpuClient, read: tpu_v2.Node, key: str) -> Operation | None:
    """gcloud's AddSSHKeyIfNeeded: the map it read, with `key` added to `ssh-keys`, written whole;
    a 409 ("already an UpdateNode call in flight") is ignored. Its operation, or None on a 409."""
    metadata = dict(read.metadata)
    metadata["ssh-keys"] = metadata.get("ssh-keys", "") + "\n" + key
    try:
        return client.update_node(
            node=tpu_v2.Node(name=NODE, metadata=metadata), update_mask=field_mask_pb2.FieldMask(paths=["metadata"])
        )
    except api_exceptions.Conflict:
        return None


def test_gcloud_ssh_keys_and_assignments_share_the_node(
    tmp_path: Path, server: SimulatorServer, google: GoogleStub
) -> None:
    """gcloud brings back seq 2 after seq 3 ran: ignored, and again after a reboot. gcloud's update
    in flight when seq 4 is written: tpujobs waits its turn and keeps both keys; seq 4 runs."""
    client = build_client(server.url)
    tpu = CloudTpu(client, PROJECT)
    shape = a_job().spec
    tpu.request_unit(UnitRequest(UNIT, ZONE, shape, {"tpujobs-pool": "demo"}), HostBoot(ACCOUNT, {
        "tpujobs-assignment": idle_assignment_text(1)}))  # fmt: skip
    wait_for(lambda: (s := tpu.status(ZONE, UNIT)) is not None and s.state == "ACTIVE")
    host = UnitHost(tmp_path, SimpleNamespace(base=metadata_url(server.url, PROJECT, ZONE, UNIT, 0)), google)  # type: ignore[arg-type]
    runs = tmp_path / "runs"
    jobs = {name: a_job(job_id=f"{name}-1", command=f"echo {name} >> {runs}") for name in ("a", "b", "c")}
    try:
        first = host.start()
        assign(tpu, google, 2, jobs["a"])
        wait_for(lambda: host.said("job a-1 attempt 1: ended"))
        read_at_seq_2 = client.get_node(name=NODE)
        assign(tpu, google, 3, jobs["b"])
        wait_for(lambda: host.said("job b-1 attempt 1: ended"))

        stale = gcloud_writes(client, read_at_seq_2, "ada:ssh-ed25519 AAAA-ada")
        assert stale is not None
        stale.result(timeout=30)
        wait_for(lambda: host.said("assignment seq 2 ignored: seq 3 was seen already"))
        os.kill(first.pid, signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        host.start()  # the VM rebooted: the metadata still says seq 2
        wait_for(lambda: host.said("assignment seq 2 ignored: seq 3 was seen already"))

        in_flight = gcloud_writes(client, client.get_node(name=NODE), "bob:ssh-ed25519 AAAA-bob")
        assert in_flight is not None
        assign(tpu, google, 4, jobs["c"])  # 409 until gcloud's update is done, then merged
        wait_for(lambda: host.said("job c-1 attempt 1: ended"))
    finally:
        host.stop()
    keys = client.get_node(name=NODE).metadata["ssh-keys"]
    assert "AAAA-ada" in keys and "AAAA-bob" in keys
    assert runs.read_text() == "a\nb\nc\n"
