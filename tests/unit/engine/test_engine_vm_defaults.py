"""The deployment's VM defaults (network, subnetwork, internal IPs, tags) through the real submit
path, on the fakes and the TPU simulator: filled in where a spec gives none, kept where it does,
and a rejection where they cannot fit. Every VM option's way into the TPU API, and the
simulator's refusals, are tests/emulator/test_vm_options.py.
"""

from __future__ import annotations

from engine_harness import PROJECT

from tpujobs.domain.spec import VmDefaults

NETWORK = "projects/net-host/global/networks/training"
SUBNET = "projects/net-host/regions/us-central2/subnetworks/tpu-us-central2"


def test_a_submission_without_vm_options_gets_the_deployments_defaults_stored_and_requested(engine, tpu_client):
    """A team sets its network once: a spec that names none is stored and requested with the defaults,
    while a field the author gave (tags) is kept as given."""
    defaults = VmDefaults(network=NETWORK, subnetwork=SUBNET, internal_ips=True, tags=("team-a",))
    jobs = engine(vm_defaults=defaults)
    spec = {"job_id": "vm-defaults", "name": "vm", "owner": "ada@example.com", "command": "true", "tags": ["mine"]}
    spec["accelerator_type"] = "v4-8"
    outcome = jobs.submit(spec, "701")
    assert outcome.job_id == "vm-defaults", outcome
    stored = jobs.job("vm-defaults")
    assert (stored.spec.network, stored.spec.subnetwork, stored.spec.internal_ips) == (NETWORK, SUBNET, True)
    assert list(stored.spec.tags) == ["mine"]
    name = f"projects/{PROJECT}/locations/{stored.zone}/queuedResources/{stored.queued_resource}"
    node = tpu_client.get_queued_resource(name=name).tpu.node_spec[0].node
    assert node.network_config.network == NETWORK
    assert node.network_config.enable_external_ips is False
    assert list(node.tags) == ["mine"]


def test_defaults_that_do_not_fit_the_spec_are_a_rejection_naming_them(engine):
    """A default subnetwork in another region than the job's zone cannot be used: a rejection, no job."""
    jobs = engine(vm_defaults=VmDefaults(network=NETWORK, subnetwork=SUBNET))
    spec = {"job_id": "vm-far", "name": "vm", "owner": "ada@example.com", "command": "true", "zone": "europe-west4-a"}
    spec["accelerator_type"] = "v4-8"
    outcome = jobs.submit(spec, "702")
    assert outcome.kind == "rejected"
    assert "subnetwork" in outcome.reason and "default" in outcome.reason, outcome.reason
    assert jobs.store.get("vm-far") is None
    assert [r.message_id for r in jobs.rejections()] == ["702"]
