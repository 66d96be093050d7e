"""The startup script a TPU VM runs at boot: nothing from a spec ever reaches the shell.

Spec validation forbids most hostile values, so the hostile jobs here are built with
`Job.evolve` and `model_copy` directly: the script must be safe even if validation were
bypassed. Hostile scripts are run for real, with a fake metadata server and the recording
Pub/Sub and Storage stand-in of agent_stubs.py, and must create no file but the
agent's own, and carry every value through to the agent literally.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    BUCKET,
    FAST,
    KEY_URL_PLACEHOLDER,
    PROJECT,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    run_script,
)

from tpujobs.agent.config import load_config
from tpujobs.domain.job import Job
from tpujobs.domain.naming import job_prefix
from tpujobs.engine import startup_script as startup
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import (
    AGENT_DELIMITER,
    AgentTimings,
    agent_blob,
    agent_config,
    agent_zipapp,
    render_startup_script,
)

BASH = shutil.which("bash")


def chunk_prefix(job_id: str = "train-1") -> str:
    """Where the script's agent uploads worker 0's output of attempt 1 (startup's log_prefix)."""
    return f"{job_prefix(job_id)}attempt-1/chunks/slice-0-worker-0/"


pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

SETTINGS = Settings(project=PROJECT, prefix="t-", logs_bucket=BUCKET, key_url=KEY_URL_PLACEHOLDER)

HOSTILE = {
    "quote_break": "x'; touch pwned; '",
    "quote_break_absolute": "x'; touch {tmp}/pwned-abs; '",
    "command_substitution": "$(touch pwned)",
    "backticks": "`touch pwned`",
    "variable_expansion": "${HOME:+$(touch pwned)}",
    "double_quotes": '"; touch pwned; "',
    "newline": "x\ntouch pwned",
    "heredoc_delimiter": "x\nTPUJOBS_CONFIG_EOF\ntouch pwned\nTPUJOBS_AGENT_EOF\ntouch pwned",
    "semicolon": "x; touch pwned",
    "ampersand": "x & touch pwned &",
    "pipe": "x | touch pwned",
    "redirect": "x > pwned",
    "backslash": "x\\'; touch pwned; \\'",
    "glob": "*",
    "dash_option": "-n -e",
    "empty": "",
}


@pytest.fixture
def metadata():
    with FakeMetadata(node_id="x") as server:
        yield server


@pytest.fixture
def google():
    with GoogleStub() as server:
        yield server


def embedded_config(script: str) -> dict[str, Any]:
    """The config JSON the script carries, decoded the way the script decodes it."""
    match = re.search(r"<<'TPUJOBS_CONFIG_EOF'\n(.*?)\nTPUJOBS_CONFIG_EOF\n", script, re.S)
    assert match is not None
    return json.loads(base64.b64decode(match.group(1)))


def no_pwned_files(tmp_path: Path) -> list[Path]:
    return [p for p in tmp_path.rglob("*") if p.name.startswith("pwned")]


# --- rendering ------------------------------------------------------------------------


def test_the_config_carries_the_attempt_the_spec_and_where_things_go() -> None:
    """agent_config names the job, attempt, spec fields (no env values), shape, URIs, project, topics, timings."""
    job = a_job(
        2,
        accelerator_type="v5litepod-16",
        slices=2,
        setup="pip install -r requirements.txt",
        code_uri="gs://code-bucket/train.tar.gz",
        env={"LR": "0.1"},
    ).evolve(resume_next=True)
    assert agent_config(job, SETTINGS) == {
        "job_id": "train-1",
        "attempt": 2,
        "key_url": KEY_URL_PLACEHOLDER,
        "resume": True,
        "command": "echo hello",
        "setup": "pip install -r requirements.txt",
        "code_uri": "gs://code-bucket/train.tar.gz",
        "secrets": {},
        "code_sha256": None,
        "image": None,
        "image_pull_policy": None,
        "privileged": False,
        "num_slices": 2,
        "hosts_per_slice": 4,
        "queued_resource": "train-1-a2",
        "checkpoint_uri": f"gs://{BUCKET}/checkpoints/jobs/train-1/",
        "log_prefix": f"gs://{BUCKET}/logs/jobs/train-1/attempt-2/",
        "project": PROJECT,
        "worker_events_topic": "t-tpujobs-worker-events",
        "preemption_topic": "t-tpujobs-preemption",
        "heartbeat_seconds": 10,
        "heartbeat_sparse_seconds": 30,
        "heartbeat_fast_window_seconds": 300,
        "peer_seconds": 2,
        "peer_timeout_seconds": 10,
        "grace_seconds": 30,
        "chunk_seconds": 2,
        "preemption_grace_seconds": 20,
        "preemption_window_seconds": 30,
        "retry_output": [],
        "time_limit_at": None,
        "time_limit_seconds": None,
        "attempt_time_limit_seconds": None,
        "cloud_logging": None,  # the deployment has not turned Cloud Logging on
    }


def test_secrets_become_full_version_names_in_the_namespace_of_the_vms_account() -> None:
    """NAME and NAME@V resolve under the job's service_account (else the deployment's); full names pass."""
    secrets = {
        "HF_TOKEN": "hf-token",
        "WANDB_API_KEY": "wandb@3",
        "SHARED": "projects/other/secrets/shared",
        "PINNED": "projects/other/secrets/pinned/versions/2",
    }
    settings = Settings(
        project=PROJECT,
        prefix="t-",
        logs_bucket=BUCKET,
        tpu_service_account=f"tpujobs-tpu-vm@{PROJECT}.iam.gserviceaccount.com",
    )
    default = agent_config(a_job(secrets=secrets), settings)["secrets"]
    assert default == {
        "HF_TOKEN": f"projects/{PROJECT}/secrets/t-tpujobs_tpujobs-tpu-vm_hf-token/versions/latest",
        "PINNED": "projects/other/secrets/pinned/versions/2",
        "SHARED": "projects/other/secrets/shared/versions/latest",
        "WANDB_API_KEY": f"projects/{PROJECT}/secrets/t-tpujobs_tpujobs-tpu-vm_wandb/versions/3",
    }
    own = a_job(secrets={"HF_TOKEN": "hf-token"}, service_account=f"team-a@{PROJECT}.iam.gserviceaccount.com")
    assert agent_config(own, settings)["secrets"] == {
        "HF_TOKEN": f"projects/{PROJECT}/secrets/t-tpujobs_team-a_hf-token/versions/latest"
    }


def test_the_code_digest_recorded_with_the_job_reaches_the_agent() -> None:
    """code_sha256 is passed through as the spec holds it; the agent's load_config accepts it."""
    digest = "ab" * 32
    job = a_job(code_uri="gs://code-bucket/train.tar.gz", code_sha256=digest)
    assert agent_config(job, SETTINGS)["code_sha256"] == digest


def test_the_rendered_config_passes_the_agents_own_checks(tmp_path: Path) -> None:
    """What agent_config writes, secrets and digest included, is what load_config accepts."""

    settings = Settings(
        project=PROJECT, logs_bucket=BUCKET, tpu_service_account=f"vm-acct@{PROJECT}.iam.gserviceaccount.com"
    )
    job = a_job(secrets={"HF_TOKEN": "hf-token"}, code_uri="gs://code-bucket/c.tar.gz", code_sha256="0" * 64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(agent_config(job, settings)))
    loaded = load_config(str(path))
    assert loaded["secrets"] == agent_config(job, settings)["secrets"]
    assert loaded["code_sha256"] == "0" * 64


def test_the_first_attempt_never_resumes() -> None:
    """Attempt 1 has no checkpoint to continue from, whatever resume_next says."""
    assert agent_config(a_job(1).evolve(resume_next=True), SETTINGS)["resume"] is False
    assert agent_config(a_job(3).evolve(resume_next=False), SETTINGS)["resume"] is False


def test_without_a_logs_bucket_the_deployment_default_is_used() -> None:
    """An empty logs_bucket means {project}-tpujobs-logs, as Settings.from_env makes it."""
    config = agent_config(a_job(), Settings(project="p1"))
    assert config["log_prefix"] == "gs://p1-tpujobs-logs/logs/jobs/train-1/attempt-1/"
    assert config["worker_events_topic"] == "tpujobs-worker-events"


def test_logs_and_checkpoints_of_a_job_on_its_own_account_are_under_that_account_apart() -> None:
    """An own account: logs under logs/accounts/{email}/jobs/{id}/, checkpoints under
    checkpoints/accounts/{email}/jobs/{id}/; neither prefix lies inside the other."""
    email = f"team-a@{PROJECT}.iam.gserviceaccount.com"
    config = agent_config(a_job(3, service_account=email), SETTINGS)
    assert config["log_prefix"] == f"gs://{BUCKET}/logs/accounts/{email}/jobs/train-1/attempt-3/"
    assert config["checkpoint_uri"] == f"gs://{BUCKET}/checkpoints/accounts/{email}/jobs/train-1/"


def test_timings_can_be_shortened_for_the_local_stack() -> None:
    """AgentTimings sets the heartbeat, grace and chunk periods in the config."""
    config = agent_config(a_job(), SETTINGS, AgentTimings(1, 2, 0.5))
    assert (config["heartbeat_seconds"], config["grace_seconds"], config["chunk_seconds"]) == (
        1,
        2,
        0.5,
    )


def test_the_script_starts_with_a_bash_shebang_and_strict_mode_and_execs_the_agent() -> None:
    """A VM runs it with bash, failing on the first error; the agent replaces the shell."""
    script = render_startup_script(a_job(), SETTINGS)
    assert script.startswith("#!/bin/bash\n")
    assert "\nset -euo pipefail\n" in script
    assert script.endswith("\nexec python3 agent.pyz config.json\n")


def test_the_script_of_a_valid_job_passes_bash_syntax_check(tmp_path: Path) -> None:
    """`bash -n` accepts the script."""
    path = tmp_path / "startup.sh"
    path.write_text(render_startup_script(a_job(setup="make", env={"A": "b"}), SETTINGS))
    result = subprocess.run([BASH or "bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_the_script_embeds_the_agent_zipapp_and_the_config_verbatim() -> None:
    """The agent's heredoc holds the zipapp's blob whole; the config's base64 block decodes to agent_config."""
    job = a_job(env={"X": "1"})
    script = render_startup_script(job, SETTINGS)
    assert f"<<'{AGENT_DELIMITER}'\n{agent_blob()}\n{AGENT_DELIMITER}\n" in script
    assert embedded_config(script) == agent_config(job, SETTINGS)


def test_the_default_work_directory_is_per_job_and_attempt_and_file_name_safe() -> None:
    """/var/lib/tpujobs/{job}/attempt-{n}; a job id that is not a safe segment is made one."""
    assert startup.default_workdir(a_job(3)) == "/var/lib/tpujobs/train-1/attempt-3"
    hostile = a_job().evolve(job_id="../../etc x")
    assert startup.default_workdir(hostile) == "/var/lib/tpujobs/______etc_x/attempt-1"


def test_a_largest_spec_still_fits_in_a_metadata_value() -> None:
    """A 64 KiB spec (the submission limit) gives a script under GCE's 256 KiB per metadata value."""
    big = "x" * 8000
    spec = a_job().spec.model_copy(
        update={
            "command": "y" * 20000,
            "setup": "z" * 10000,
            "env": {f"V{i}": big for i in range(4)},
        }
    )
    script = render_startup_script(a_job().evolve(spec=spec), SETTINGS)
    assert len(script.encode()) < 256 * 1024


# --- hostile values, run for real -----------------------------------------------------


def run_hostile(job: Job, tmp_path: Path, metadata: FakeMetadata, google: GoogleStub):
    """Render, check syntax, run the script; (exit code, the config the agent got)."""
    script = render_startup_script(job, SETTINGS, timings=FAST)
    syntax = subprocess.run([BASH or "bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    workdir = tmp_path / "work"
    code, _, stderr = run_script(script, workdir, metadata, google)
    config = json.loads((workdir / "config.json").read_text())
    assert config == agent_config(job, SETTINGS, FAST), stderr
    return code, stderr


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_job_id_runs_nothing_and_reaches_the_agent_literally(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, value: str
) -> None:
    """Quotes, $(), backticks, newlines, heredoc delimiters in a job id create no file; reports carry it."""
    value = value.replace("{tmp}", str(tmp_path))
    job = a_job(command="echo ok").evolve(job_id=value, name=value, owner=value, queued_resource=value)
    code, stderr = run_hostile(job, tmp_path, metadata, google)
    assert code == 0, stderr
    assert no_pwned_files(tmp_path) == []
    started = [p for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "started"]
    assert [p["job_id"] for p in started] == [value]
    assert google.output(chunk_prefix(job_id=value)) == b"ok\n"


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_env_value_is_seen_by_the_command_exactly_as_written(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, value: str
) -> None:
    """An env value is data: it comes with the attempt's key, the command prints it back unchanged and nothing runs."""
    value = value.replace("{tmp}", str(tmp_path))
    job = a_job(command="printf '%s' \"$HOSTILE\"", env={"HOSTILE": value})
    assert google.key_answer is not None
    google.key_answer = {**google.key_answer, "env": {"HOSTILE": value}}  # as `attempt-key` answers it
    code, stderr = run_hostile(job, tmp_path, metadata, google)
    assert code == 0, stderr
    assert no_pwned_files(tmp_path) == []
    assert google.output(chunk_prefix()) == value.encode()


@pytest.mark.parametrize(
    "value",
    [HOSTILE["quote_break"], HOSTILE["quote_break_absolute"], HOSTILE["double_quotes"]],
    ids=["quote_break", "quote_break_absolute", "double_quotes"],
)
@pytest.mark.parametrize("field", ["command", "setup"])
def test_a_command_or_setup_runs_as_one_bash_program_exactly_as_written(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, value: str, field: str
) -> None:
    """Text that would break out of shell quoting stays one quoted word for `bash -c`: nothing is touched."""
    value = value.replace("{tmp}", str(tmp_path))
    changes = {"command": "echo ok", field: value}
    spec = a_job().spec.model_copy(update=changes)
    code, stderr = run_hostile(a_job().evolve(spec=spec), tmp_path, metadata, google)
    assert code == 127, stderr  # bash -c looked for a program named like the whole text
    assert no_pwned_files(tmp_path) == []


def test_the_literal_hostile_value_from_the_brief_touches_nothing_in_tmp(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """x'; touch /tmp/pwned; ' as job id, env value and setup leaves /tmp/pwned as it was."""
    value = "x'; touch /tmp/pwned; '"
    marker = Path("/tmp/pwned")
    existed_before = marker.exists()
    spec = a_job().spec.model_copy(update={"env": {"V": value}, "setup": value})
    code, stderr = run_hostile(a_job().evolve(job_id=value, spec=spec), tmp_path, metadata, google)
    assert code == 127, stderr
    if not existed_before:
        assert not marker.exists()


def test_the_script_writes_only_the_agent_its_config_and_the_code_directory(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """The work dir holds agent.pyz, config.json (private) and code/; agent.pyz is the zipapp."""
    run_hostile(a_job(), tmp_path, metadata, google)
    workdir = tmp_path / "work"
    assert sorted(p.name for p in workdir.iterdir()) == ["agent.pyz", "code", "config.json"]
    assert (workdir / "agent.pyz").read_bytes() == agent_zipapp()
    assert oct(os.stat(workdir / "config.json").st_mode & 0o777) == "0o600"
