"""The QueuedResource the adapter asks for: capacity tier and the TPU VMs' service account."""

from __future__ import annotations

from datetime import datetime, timezone

from google.cloud import tpu_v2

from tpujobs.adapters.tpu import CLOUD_PLATFORM_SCOPE, queued_resource_for
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec


def a_job(**changes):
    spec = parse_spec(
        {"job_id": "req-1", "name": "req", "owner": "ada", "accelerator_type": "v4-8", "command": "x", **changes}
    )
    job, _ = new_job(spec, "us-central2-b", datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def test_the_vms_run_as_the_configured_account_and_only_then() -> None:
    resource = queued_resource_for(a_job(), "proj", "#!/bin/bash", "tpu-vm@proj.iam.gserviceaccount.com")
    node = resource.tpu.node_spec[0].node
    assert node.service_account.email == "tpu-vm@proj.iam.gserviceaccount.com"
    assert list(node.service_account.scope) == [CLOUD_PLATFORM_SCOPE]
    bare = queued_resource_for(a_job(), "proj", "#!/bin/bash").tpu.node_spec[0].node
    assert not tpu_v2.Node.pb(bare).HasField("service_account")


def test_a_spot_job_switched_to_on_demand_asks_for_on_demand() -> None:
    spot = a_job(capacity="spot", on_demand_after_preemptions=2)
    assert tpu_v2.QueuedResource.pb(queued_resource_for(spot, "p", "s")).HasField("spot")
    switched = queued_resource_for(spot.evolve(on_demand=True), "p", "s")
    assert not tpu_v2.QueuedResource.pb(switched).HasField("spot")
    assert not switched.tpu.node_spec[0].node.scheduling_config.spot
