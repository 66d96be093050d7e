"""A job's `env` values reach its hosts with the attempt's key, never through metadata.

Node and instance metadata is readable by anyone with `tpu.nodes.get` or `compute.instances.get`,
while the jobs API shows env values to the owner and admins only. The nodes are read back from the
simulator as the TPU API shows them, every startup script's config block decoded.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.engine.jobs_api.attempt_keys import AttemptKeys
from tpujobs.engine.jobs_api.requests import AttemptKeyRequest
from tpujobs.engine.startup_script import CONFIG_DELIMITER, STARTUP_SCRIPT_KEY, assignment_text, host_boot
from tpujobs.local.testing import ManualClock

KEY_URL = "https://us-central1-test-project.cloudfunctions.net/attempt-key"
VALUE = "lr-0.123-f00dfeed"  # found nowhere else


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, key_url=KEY_URL)


def submitted(jobs: Engine) -> Any:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        "env": {"LEARNING_RATE": VALUE},
    }
    assert jobs.submit(spec).kind == "provisioning"
    job = jobs.store.get("train-1")
    assert job is not None
    return job


def readable(metadata: dict[str, str]) -> str:
    """Every metadata value as text, each startup script's base64 config block decoded."""
    parts = []
    for name, value in metadata.items():
        parts.append(value)
        if name == STARTUP_SCRIPT_KEY:
            block = re.search(rf"<<'{CONFIG_DELIMITER}'\n(.*?)\n{CONFIG_DELIMITER}\n", value, re.S)
            assert block is not None, "the script carries its config"
            parts.append(base64.b64decode(block.group(1)).decode("utf-8"))
    return "\n".join(parts)


def test_no_env_value_is_in_the_metadata_of_a_jobs_nodes(jobs, tpu_client):
    """The node template of a job with env, as the TPU API shows its queued resource to a viewer, holds
    the value nowhere (the startup script's config decoded too); the boot metadata of either platform
    has none either."""
    job = submitted(jobs)
    shown = list(tpu_client.list_queued_resources(parent=f"projects/{jobs.settings.project}/locations/{ZONE}"))
    templates = [spec.node for resource in shown for spec in resource.tpu.node_spec]
    assert templates
    for node in templates:
        assert VALUE not in readable(dict(node.metadata))
    assert VALUE not in readable(dict(host_boot(job, jobs.settings).metadata))


def test_no_env_value_is_in_a_pool_units_assignment(jobs):
    """The `tpujobs-assignment` a unit's node metadata gets for the job names no env value."""
    job = submitted(jobs)
    assert VALUE not in assignment_text(job, jobs.settings, 3, "team-u0-g1")


def test_the_attempt_key_answer_carries_the_jobs_env_to_its_host(jobs, clock):
    """The VM that gets the attempt's key gets the spec's env values with it, and the agent sets them."""
    submitted(jobs)
    made = int(clock().timestamp())
    claims = {
        "email": jobs.settings.tpu_service_account,
        "email_verified": True,
        "google": {
            "compute_engine": {
                "project_id": jobs.settings.project,
                "zone": ZONE,
                "instance_id": "1001",
                "instance_name": "t1v-n-0a1b2c3d-w-0",
                "instance_creation_timestamp": made,
            }
        },
    }
    keys = AttemptKeys(jobs.store, jobs.api_settings, lambda token, audiences: claims, jobs.service.clock)
    request = AttemptKeyRequest(job_id="train-1", attempt=1, slice_id=0, worker_id=0, identity="token")
    answer = keys.grant(jobs.settings.tpu_service_account, request)
    assert answer.status == 200, answer.body
    assert answer.body["env"] == {"LEARNING_RATE": VALUE}
