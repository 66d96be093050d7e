"""The agent's configuration, identity and the job's environment (`agent/config.py`), and its small pure pieces."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    BUCKET,
    FAST,
    SETTINGS,
    FakeMetadata,
    GoogleStub,
    a_config,
    a_job,
    run_script,
)

from tpujobs.agent.basics import AgentError, exit_status, rfc3339
from tpujobs.agent.config import (
    discover_identity,
    job_environment,
    load_config,
    megascale_environment,
    parse_tpu_env,
    slice_id_from_node_id,
)
from tpujobs.agent.output import parse_checkpoint
from tpujobs.agent.rest import Metadata
from tpujobs.engine.startup_script import render_startup_script

# --- identity -------------------------------------------------------------------------


def test_tpu_env_is_read_as_key_value_lines_with_quotes_removed() -> None:
    """`KEY: 'value'`, `KEY: "value"` and `KEY: value` lines all give value; junk lines are skipped."""
    text = "NODE_ID: 'train-1-a2-1'\nWORKER_ID: \"3\"\nZONE: us-central2-b\nnot a pair\n\n"
    assert parse_tpu_env(text) == {
        "NODE_ID": "train-1-a2-1",
        "WORKER_ID": "3",
        "ZONE": "us-central2-b",
    }


@pytest.mark.parametrize(
    ("node_id", "queued_resource", "slice_id"),
    [
        ("train-1-a2-1", "train-1-a2", 1),
        ("train-1-a2-0", "train-1-a2", 0),
        ("train-1-a2-17", "train-1-a2", 17),
        ("x-9-a12-3", "x-9-a12", 3),
        ("other-name-5", "train-1-a2", 5),
    ],
)
def test_the_slice_id_is_the_number_after_the_queued_resource_name(
    node_id: str, queued_resource: str, slice_id: int
) -> None:
    """NODE_ID {queued_resource}-{n} is slice n; a node named otherwise gives its trailing number."""
    assert slice_id_from_node_id(node_id, queued_resource) == slice_id


def test_a_node_id_without_a_number_names_no_slice() -> None:
    """NODE_ID with no trailing number is an error, not a silent slice 0."""
    with pytest.raises(AgentError, match="NODE_ID"):
        slice_id_from_node_id("train-1-a2", "train-1-a2")


def test_a_single_slice_job_is_slice_zero_whatever_its_node_is_called() -> None:
    """With num_slices 1 the slice id is 0, even when the node id ends in a number."""
    with FakeMetadata(worker=2, node_id="train-1-a2") as server:
        identity = discover_identity(Metadata(server.base), {"num_slices": 1, "queued_resource": "train-1-a2"})
    assert identity == (2, 0)


def test_a_multislice_worker_reads_its_worker_number_and_slice_from_the_metadata() -> None:
    """agent-worker-number is the worker id; NODE_ID's suffix after the queued resource is the slice."""
    with FakeMetadata(worker=3, node_id="train-1-a2-1") as server:
        identity = discover_identity(Metadata(server.base), {"num_slices": 2, "queued_resource": "train-1-a2"})
    assert identity == (3, 1)


def test_the_metadata_is_asked_with_the_metadata_flavor_header() -> None:
    """The fake answers 403 without Metadata-Flavor: Google, so a successful read proves the header."""
    with FakeMetadata(worker=5) as server:
        assert Metadata(server.base).get("instance/attributes/agent-worker-number") == "5"
        assert Metadata(server.base).get_optional("instance/attributes/nothing") is None


# --- small pure pieces ----------------------------------------------------------------


def test_timestamps_are_rfc3339_utc_with_milliseconds() -> None:
    """rfc3339 gives 2025-03-01T12:00:00.123Z for that instant."""
    instant = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc).timestamp()
    assert rfc3339(instant) == "2025-03-01T12:00:00.123Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rfc3339())


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-15, 143), (-9, 137)])
def test_a_death_by_signal_is_reported_as_128_plus_the_signal(returncode: int, code: int) -> None:
    """Negative return codes (killed by signal N) become 128 + N, as a shell reports them."""
    assert exit_status(returncode) == code


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (b"TPUJOBS_CHECKPOINT step=123", (123, "")),
        (b"TPUJOBS_CHECKPOINT step=5 saved to gs://b/ckpt/5\r\n", (5, "saved to gs://b/ckpt/5")),
        (b"  TPUJOBS_CHECKPOINT step=7", (7, "")),
        (b"TPUJOBS_CHECKPOINT step=x", None),
        (b"echo TPUJOBS_CHECKPOINT step=1", None),
        (b"TPUJOBS_CHECKPOINTS step=1", None),
    ],
)
def test_checkpoint_lines_are_recognised_with_their_step_and_detail(line: bytes, found: tuple[int, str] | None) -> None:
    """`TPUJOBS_CHECKPOINT step=N rest` gives (N, rest); anything else is not a checkpoint."""
    assert parse_checkpoint(line) == found


def test_a_checkpoint_detail_is_cut_to_what_the_control_plane_accepts() -> None:
    """A detail longer than 1024 characters is truncated."""
    found = parse_checkpoint(b"TPUJOBS_CHECKPOINT step=1 " + b"x" * 5000)
    assert found is not None and len(found[1]) == 1024


def test_a_config_gets_its_defaults(tmp_path: Path) -> None:
    """heartbeat 10 s, grace 30 s, chunks 2 s, no setup, no code, empty env when absent."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config()))
    config = load_config(str(path))
    assert (config["heartbeat_seconds"], config["grace_seconds"], config["chunk_seconds"]) == (
        10,
        30,
        2,
    )
    assert (config["setup"], config["code_uri"], config["env"]) == (None, None, {})
    assert (config["secrets"], config["code_sha256"]) == ({}, None)


@pytest.mark.parametrize(
    "changes",
    [
        {"attempt": "2"},
        {"attempt": True},
        {"resume": 1},
        {"command": None},
        {"env": {"A": 1}},
        {"grace_seconds": 0},
        {"secrets": {"HF_TOKEN": "hf-token"}},
        {"secrets": {"HF_TOKEN": "projects/p/secrets/s"}},
        {"secrets": {"TPUJOBS_X": "projects/p/secrets/s/versions/1"}},
        {"secrets": ["HF_TOKEN"]},
        {"code_sha256": "abc"},
        {"code_sha256": 7},
    ],
)
def test_a_config_with_a_wrong_type_is_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    """Wrong types are an AgentError naming the key, not a crash later."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(**changes)))
    with pytest.raises(AgentError, match=next(iter(changes))):
        load_config(str(path))


def test_the_job_environment_is_the_host_env_then_the_spec_env_then_tpujobs_variables() -> None:
    """Contract section 2: the TPUJOBS_ variables, the spec's env, the host's env minus its TPUJOBS_."""
    env = job_environment(
        {"PATH": "/bin", "SHARED": "host", "TPUJOBS_WORKDIR": "/w", "TPUJOBS_SLICE_ID": "9"},
        a_config(env={"SHARED": "spec", "LR": "0.1"}),
        3,
        1,
    )
    assert env == {
        "PATH": "/bin",
        "SHARED": "spec",
        "LR": "0.1",
        "TPUJOBS_JOB_ID": "train-1",
        "TPUJOBS_ATTEMPT": "2",
        "TPUJOBS_RESUME": "1",
        "TPUJOBS_CHECKPOINT_URI": f"gs://{BUCKET}/checkpoints/jobs/train-1/",
        "TPUJOBS_WORKER_ID": "3",
        "TPUJOBS_NUM_WORKERS": "4",
        "TPUJOBS_SLICE_ID": "1",
        "TPUJOBS_NUM_SLICES": "2",
    }


# --- multislice environment -----------------------------------------------------------


def test_every_megascale_key_of_tpu_env_is_kept_unchanged_and_nothing_else() -> None:
    """MEGASCALE_* keys pass as the metadata gives them; other tpu-env keys do not; none is invented."""
    tpu_env = parse_tpu_env(
        "NODE_ID: 'train-1-a2-1'\nWORKER_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
        "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_PORT: '8080'\nMEGASCALE_SLICE_ID: '1'\nMEGASCALE_FUTURE_KEY: 'x y'\n"
    )
    assert megascale_environment(tpu_env) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_PORT": "8080",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_FUTURE_KEY": "x y",
    }
    assert megascale_environment(parse_tpu_env("NODE_ID: 'n'\nWORKER_ID: '0'\n")) == {}


def test_the_megascale_values_join_the_job_environment_under_the_spec_env() -> None:
    """The host's MEGASCALE_* values are in the job's environment; the spec's env may still set one."""
    megascale = {"MEGASCALE_SLICE_ID": "1", "MEGASCALE_PORT": "8080"}
    env = job_environment({}, a_config(env={"MEGASCALE_PORT": "9000"}), 0, 1, {}, megascale)
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_PORT"]) == ("1", "9000")


def test_a_multislice_host_passes_the_megascale_keys_to_setup_and_command(tmp_path: Path, google: GoogleStub) -> None:
    """Through the startup script: tpu-env's MEGASCALE_* values are what setup and command see."""
    tpu_env = (
        "NODE_ID: 'train-1-a1-1'\nWORKER_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
        "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_PORT: '8080'\nMEGASCALE_SLICE_ID: '1'\n"
    )
    job = a_job(
        accelerator_type="v5litepod-16",
        slices=2,
        setup="echo setup $MEGASCALE_SLICE_ID",
        command="env | grep ^MEGASCALE_ | sort",
    )
    with FakeMetadata(node_id="train-1-a1-1", **{"instance/attributes/tpu-env": tpu_env}) as metadata:
        code, _, stderr = run_script(
            render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
        )
    assert code == 0, stderr
    prefix = next(n for (_, n) in google.objects if n.endswith("/000000.log")).rsplit("/", 1)[0]
    assert google.output(prefix) == (
        b"setup 1\nMEGASCALE_COORDINATOR_ADDRESS=10.0.0.2:8080\nMEGASCALE_NUM_SLICES=2\n"
        b"MEGASCALE_PORT=8080\nMEGASCALE_SLICE_ID=1\n"
    )
