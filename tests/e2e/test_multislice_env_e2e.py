"""The multislice environment, end to end on the local stack, driven through the CLI.

On a multislice request every TPU VM's `tpu-env` metadata carries the MEGASCALE_* values the
runtime joins the slices with (coordinator, slice id, number of slices). The agent passes them
to the command unchanged; this test compares what each host's command saw with what the
simulator's metadata server gave that very host, so nothing here is a value tpujobs invented.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tpujobs.agent.config import parse_tpu_env
from tpujobs.cli import app
from tpujobs.local.simulator import metadata_url
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"
AS_OWNER = {"TPUJOBS_OWNER": OWNER}
HOSTS_PER_SLICE = 2  # v4-16
SLICES = 2


def tpujobs(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=AS_OWNER, terminal_width=200)
    assert result.exit_code == 0, f"tpujobs {' '.join(args)}: {result.output}"
    return result.output


def tpu_env_of(env, node: str, worker: int) -> dict[str, str]:
    """What the simulator's metadata server tells that host in instance/attributes/tpu-env."""
    base = metadata_url(env["simulator"], env["project"], env["zone"], node, worker)
    request = urllib.request.Request(f"{base}/instance/attributes/tpu-env", headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as answer:
        return parse_tpu_env(answer.read().decode("utf-8"))


def megascale(values: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in values.items() if name.startswith("MEGASCALE_")}


def printed_megascale(job_id: str, worker: int) -> dict[str, str]:
    """The MEGASCALE_* lines worker K's command printed (`tpujobs logs --worker K`)."""

    def probe():
        result = CliRunner().invoke(app, ["logs", job_id, "--worker", str(worker)], env=AS_OWNER)
        return result.output if result.exit_code == 0 and "printed" in result.output else None

    probe.__doc__ = f"worker {worker} of {job_id} to print its environment"
    lines = wait_for(probe, timeout=90).splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("MEGASCALE_"))


def test_every_host_of_a_two_slice_job_sees_the_multislice_environment_its_metadata_gives(env, tmp_path: Path) -> None:
    """Four hosts (2 slices x v4-16): each sees MEGASCALE_NUM_SLICES=2, its own slice id and one
    coordinator, exactly as the simulator's tpu-env gave that host."""
    flag = tmp_path / "go"
    job_id = f"ms-{uuid.uuid4().hex[:6]}"
    spec = {
        "job_id": job_id,
        "name": "multislice",
        "owner": OWNER,
        "accelerator_type": "v4-16",
        "slices": SLICES,
        "command": f"env | grep '^MEGASCALE_' | sort; echo printed; while [ ! -e {flag} ]; do sleep 0.2; done",
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    assert job_id in tpujobs("submit", str(path))
    try:
        job = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.value == "RUNNING" and j, timeout=90)
        hosts = wait_for(
            lambda: (w := env["control"].workers(env["zone"], job.queued_resource)) and len(w) == 4 and w,
            what=f"the four hosts of {job.queued_resource}",
        )
        given = {
            host["slice"] * HOSTS_PER_SLICE + host["worker"]: megascale(tpu_env_of(env, host["node"], host["worker"]))
            for host in hosts
        }
    finally:
        flag.touch()

    assert sorted(given) == [0, 1, 2, 3]
    coordinators = {values["MEGASCALE_COORDINATOR_ADDRESS"] for values in given.values()}
    assert len(coordinators) == 1 and all(coordinators)
    for worker, values in given.items():
        assert values["MEGASCALE_NUM_SLICES"] == str(SLICES)
        assert values["MEGASCALE_SLICE_ID"] == str(worker // HOSTS_PER_SLICE)
        assert printed_megascale(job_id, worker) == values, f"worker {worker}"

    ended = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=90)
    assert ended.state.value == "SUCCEEDED", ended.state_reason
