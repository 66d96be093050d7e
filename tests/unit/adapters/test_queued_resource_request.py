"""The QueuedResource the adapter asks for: capacity tier and the TPU VMs' service account."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from google.cloud import tpu_v2

from tpujobs.adapters.tpu import CLOUD_PLATFORM_SCOPE, queued_resource_for
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import HostBoot
from tpujobs.engine.startup_script import host_boot
from tpujobs.local.testing import local_settings

SA = "tpu-vm@p.iam.gserviceaccount.com"


def a_job(**changes):
    spec = parse_spec(
        {"job_id": "req-1", "name": "req", "owner": "ada", "accelerator_type": "v4-8", "command": "x", **changes}
    )
    job, _ = new_job(spec, "us-central2-b", datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def test_the_vms_run_as_the_deployments_account_when_the_job_names_none() -> None:
    """A job without service_account runs as the deployment's TPU VM account, with its metadata."""
    metadata = {"startup-script": "#!/bin/bash", "tpujobs-report-key": "tpujobs-key-v1:abc"}
    resource = queued_resource_for(a_job(), "proj", HostBoot("tpu-vm@proj.iam.gserviceaccount.com", metadata))
    node = resource.tpu.node_spec[0].node
    assert node.service_account.email == "tpu-vm@proj.iam.gserviceaccount.com"
    assert list(node.service_account.scope) == [CLOUD_PLATFORM_SCOPE]
    assert dict(node.metadata) == metadata


def test_the_vms_run_as_the_jobs_own_account_when_it_names_one() -> None:
    """The spec's service_account wins over the deployment's."""
    job = a_job(service_account="team-a@proj.iam.gserviceaccount.com")
    settings = local_settings(project="proj", tpu_service_account="tpu-vm@proj.iam.gserviceaccount.com")
    node = queued_resource_for(job, "proj", host_boot(job, settings)).tpu.node_spec[0].node
    assert node.service_account.email == "team-a@proj.iam.gserviceaccount.com"
    assert set(node.metadata) == {"startup-script"}, "no key, nor anything it derives from, where a viewer reads"
    assert not any("tpujobs-key-v1:" in value for value in node.metadata.values())


def test_without_any_account_nothing_is_requested_rather_than_the_compute_default() -> None:
    """No account at all is a permanent error naming the setting: never the Compute default."""
    with pytest.raises(PermanentError, match="TPUJOBS_TPU_SERVICE_ACCOUNT"):
        queued_resource_for(a_job(), "proj", HostBoot("", {"startup-script": "x"}))


def test_a_spot_job_switched_to_on_demand_asks_for_on_demand() -> None:
    spot = a_job(capacity="spot", on_demand_after_preemptions=2)
    assert tpu_v2.QueuedResource.pb(queued_resource_for(spot, "p", HostBoot(SA, {}))).HasField("spot")
    switched = queued_resource_for(spot.evolve(on_demand=True), "p", HostBoot(SA, {}))
    assert not tpu_v2.QueuedResource.pb(switched).HasField("spot")
    assert not switched.tpu.node_spec[0].node.scheduling_config.spot
