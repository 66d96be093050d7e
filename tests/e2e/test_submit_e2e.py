"""Submission end to end: Pub/Sub emulator push -> submit_job under functions-framework ->
Firestore emulator -> TPU simulator, checked through the real clients."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpujobs.engine.topology import SUBMIT
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

PROJECT = "tpujobs-e2e"  # the project of the e2e conftest's stack


@pytest.fixture(scope="module")
def clients(local_stack):
    from google.cloud import firestore

    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.tpu import build_client

    return (
        Publisher.build(PROJECT),
        firestore.Client(project=PROJECT),
        build_client(local_stack["TPUJOBS_TPU_ENDPOINT"]),
    )


def a_spec(job_id: str, **changes):
    spec = {
        "job_id": job_id,
        "name": "e2e",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "true",
        "capacity": "spot",
    }
    spec.update(changes)
    return spec


def job_doc(db, job_id: str):
    snapshot = db.collection("jobs").document(job_id).get()
    return snapshot.to_dict() if snapshot.exists else None


def qr_path(zone: str, name: str) -> str:
    return f"projects/{PROJECT}/locations/{zone}/queuedResources/{name}"


def test_a_published_spec_becomes_a_job_and_a_queued_resource(clients, local_stack):
    """One message: a PROVISIONING job in Firestore and its queued resource in the simulator."""
    publisher, db, tpu = clients
    job_id = f"e2e-{uuid.uuid4().hex[:8]}"
    publisher.publish_json(SUBMIT, a_spec(job_id))
    doc = wait_for(lambda: (d := job_doc(db, job_id)) and d["state"] == "PROVISIONING" and d)
    assert doc["queued_resource"] == f"{job_id}-a1"
    assert doc["capacity_state"]
    zone = local_stack["TPUJOBS_DEFAULT_ZONE"]
    resource = tpu.get_queued_resource(name=qr_path(zone, f"{job_id}-a1"))
    assert resource.tpu.node_spec[0].node.labels["tpujobs-job"] == job_id
    wait_for(lambda: tpu.get_queued_resource(name=qr_path(zone, f"{job_id}-a1")).state.state.name == "ACTIVE")
    node = tpu.get_node(name=f"projects/{PROJECT}/locations/{zone}/nodes/{job_id}-a1")
    assert len(node.network_endpoints) == 2  # v4-16: two worker hosts


def test_the_same_spec_published_three_times_is_one_job_one_resource_no_extra_events(clients, local_stack):
    """Three messages with one job_id: one job, one queued resource, no transition twice."""
    publisher, db, _ = clients
    job_id = f"e2e-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        publisher.publish_json(SUBMIT, a_spec(job_id))
    wait_for(lambda: (d := job_doc(db, job_id)) and d["state"] == "PROVISIONING")
    time.sleep(2.0)  # let the other two deliveries land
    events = [e.to_dict() for e in db.collection("jobs").document(job_id).collection("events").stream()]
    moves = [(e["from_state"], e["to_state"]) for e in events]
    assert moves.count((None, "QUEUED")) == 1
    assert moves.count(("QUEUED", "PROVISIONING")) == 1
    assert len(moves) == len(set(moves))  # the job then runs `true`; nothing happens twice
    # The job may already have finished and released its capacity: count the creates the
    # TPU API accepted (a duplicate request is refused with ALREADY_EXISTS and makes none).
    operations = SimulatorControl(local_stack["TPUJOBS_TPU_ENDPOINT"]).state()["operations"]
    created = [
        op["metadata"]["target"].rsplit("/", 1)[-1]
        for op in operations
        if op["metadata"]["verb"] == "create" and f"/queuedResources/{job_id}-" in op["metadata"]["target"]
    ]
    assert created == [f"{job_id}-a1"]


MALFORMED = [
    (b"{not json", "not JSON"),
    (b"\xc3\x28 invalid utf-8", "UTF-8"),
    (b'"a string"', "JSON object"),
    (json.dumps(a_spec("bad-slices", slices=0)).encode(), "slices"),
    (json.dumps(a_spec("bad-field", gpus=8)).encode(), "gpus"),
]
QUIET_S = 2.5  # the emulator redelivers a failed push about every second


@pytest.fixture(scope="module")
def malformed(clients) -> dict[bytes, str]:
    """Every MALFORMED payload published at once, up front: payload -> message id. So the
    quiet time each test waits out after its rejection runs for all of them together."""
    publisher, _, _ = clients
    return {payload: publisher.publish_bytes(SUBMIT, payload) for payload, _ in MALFORMED}


@pytest.mark.parametrize(("payload", "words"), MALFORMED)
def test_each_malformed_message_gives_one_rejection_and_no_redelivery(clients, malformed, payload, words):
    """A bad message is recorded with its reason once, acknowledged, and not delivered again."""
    _, db, _ = clients
    rejection = db.collection("rejections").document(malformed[payload])
    doc = wait_for(lambda: (s := rejection.get()).exists and s.to_dict())
    assert words in doc["reason"]
    assert doc["topic"] == SUBMIT
    quiet_until = doc["at"] + timedelta(seconds=QUIET_S)  # `at`: when its (only) delivery was rejected
    time.sleep(max(0.0, (quiet_until - datetime.now(timezone.utc)).total_seconds()))
    assert rejection.get().to_dict()["deliveries"] == 1


def test_the_cli_submits_and_describes_a_job(clients, tmp_path: Path):
    """`tpujobs submit` publishes the YAML; `tpujobs describe` shows the fields and the timeline."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    _, db, _ = clients
    job_id = f"cli-{uuid.uuid4().hex[:8]}"
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        "name: cli\nowner: ada@example.com\naccelerator_type: v4-8\ncommand: python train.py\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    result = runner.invoke(app, ["submit", str(spec_file), "--set", f"job_id={job_id}", "--set", "slices=2"])
    assert result.exit_code == 0, result.output
    assert job_id in result.output
    wait_for(lambda: (d := job_doc(db, job_id)) and d["state"] == "PROVISIONING")
    described = runner.invoke(app, ["describe", job_id], terminal_width=200)
    assert described.exit_code == 0, described.output
    assert "Timeline" in described.output
    assert "QUEUED" in described.output and "PROVISIONING" in described.output
    assert "2 x v4-8" in described.output
    listed = runner.invoke(app, ["list", "--owner", "ada@example.com"], terminal_width=200)
    assert job_id in listed.output


def test_the_cli_refuses_an_invalid_spec_before_publishing(clients, tmp_path: Path):
    """An obviously bad spec is reported by the CLI with the field's name, and nothing is sent."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: cli\nowner: ada\naccelerator_type: v4-9\ncommand: x\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["submit", str(spec_file)])
    assert result.exit_code == 2
    assert "accelerator_type" in result.output
