"""What the control plane writes on a warm pool unit's nodes: the pool-mode startup script and
the `tpujobs-assignment` entry (see test_pool_agent.py for the agent that reads them)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from agent_stubs import ACCOUNT, BUCKET, FAST, PROJECT, a_job

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import check_config
from tpujobs.agent.pool import load_pool_config, parse_assignment
from tpujobs.domain import signing
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import (
    CONFIG_DELIMITER,
    STARTUP_SCRIPT_KEY,
    agent_config,
    assignment_text,
    idle_assignment_text,
    pool_agent_config,
    render_startup_script,
    render_unit_startup_script,
    unit_metadata,
)

SETTINGS = Settings(
    project=PROJECT, prefix="t-", logs_bucket=BUCKET, tpu_service_account=ACCOUNT, report_key="pool-tests-" + "k" * 40
)
UNIT = "demo-u2-g3"


def embedded_config(script: str) -> dict[str, object]:
    """The config JSON the script decodes, read back from its base64 heredoc."""
    body = script.split(f"> config.json <<'{CONFIG_DELIMITER}'\n", 1)[1].split(f"\n{CONFIG_DELIMITER}\n", 1)[0]
    return dict(json.loads(base64.b64decode(body.replace("\n", ""))))


def test_a_units_agent_config_has_exactly_the_designs_keys_from_the_pools_shape() -> None:
    """mode, pool, unit, its queued resource, the shape's slices, hosts and image, where to report, the timings."""
    shape = a_job(accelerator_type="v4-32", slices=2, image="registry.example/team/trainer:1").spec
    config = pool_agent_config("demo", 2, UNIT, shape, SETTINGS, FAST)
    assert config == {
        "mode": "pool",
        "pool": "demo",
        "unit": 2,
        "queued_resource": UNIT,
        "project": PROJECT,
        "num_slices": 2,
        "hosts_per_slice": 4,
        "image": "registry.example/team/trainer:1",
        "image_pull_policy": "if-missing",
        "worker_events_topic": "t-tpujobs-worker-events",
        "preemption_topic": "t-tpujobs-preemption",
        "heartbeat_seconds": FAST.heartbeat_seconds,
        "grace_seconds": FAST.grace_seconds,
        "chunk_seconds": FAST.chunk_seconds,
    }
    assert pool_agent_config("demo", 0, UNIT, a_job().spec, SETTINGS)["image"] is None


@pytest.mark.parametrize(
    ("pool", "unit", "field"),
    [("Demo", 0, "pool"), ("x; touch pwned", 0, "pool"), ("a" * 41, 0, "pool"), ("demo", -1, "unit_index")],
)
def test_a_bad_pool_name_or_unit_index_is_refused_naming_it(pool: str, unit: int, field: str) -> None:
    """Neither reaches a script: a name that is not a pool name, or a negative index, is one sentence naming it."""
    with pytest.raises(ValueError, match=f"^{field}: "):
        render_unit_startup_script(pool, unit, UNIT, a_job().spec, SETTINGS)


def test_the_unit_startup_script_runs_the_pool_agent_in_the_pool_directory() -> None:
    """Default /var/lib/tpujobs/pool (or $TPUJOBS_WORKDIR); ends `exec python3 agent.pyz --pool config.json`; the
    config read back is the pool config, which the agent accepts; a job's script is unchanged by it."""
    script = render_unit_startup_script("demo", 2, UNIT, a_job().spec, SETTINGS, timings=FAST)
    assert "default_workdir=/var/lib/tpujobs/pool\n" in script
    assert 'workdir="${TPUJOBS_WORKDIR:-$default_workdir}"\n' in script
    assert script.endswith("chmod 600 config.json\n" + 'echo "tpujobs: starting the worker agent in $workdir"\n'
                           "exec python3 agent.pyz --pool config.json\n")  # fmt: skip
    assert embedded_config(script) == pool_agent_config("demo", 2, UNIT, a_job().spec, SETTINGS, FAST)
    assert render_startup_script(a_job(), SETTINGS).endswith("exec python3 agent.pyz config.json\n")


def test_the_pool_agent_accepts_the_config_the_script_writes(tmp_path: Path) -> None:
    """load_pool_config reads it back with the pull policy and timings as written; a non-pool config is refused."""
    config = pool_agent_config("demo", 0, UNIT, a_job(image="registry.example/t:latest").spec, SETTINGS, FAST)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert load_pool_config(str(path)) == config
    path.write_text(json.dumps({**config, "mode": "job"}))
    with pytest.raises(AgentError, match="'mode'"):
        load_pool_config(str(path))


def test_an_assignment_carries_the_attempts_config_on_the_unit_and_no_key() -> None:
    """seq, job_id, attempt and agent_config with the unit's queued resource; no key (its hosts fetch
    it with their identity token); the agent parses and accepts it."""
    job = a_job(3, command="python train.py", env={"A": "b"})
    text = assignment_text(job, SETTINGS, 8, UNIT, timings=FAST)
    assignment = json.loads(text)
    assert set(assignment) == {"seq", "job_id", "attempt", "config"}
    assert (assignment["seq"], assignment["job_id"], assignment["attempt"]) == (8, "train-1", 3)
    assert assignment["config"] == {**agent_config(job, SETTINGS, FAST), "queued_resource": UNIT}
    assert parse_assignment(text) == assignment
    check_config(dict(assignment["config"]))


def test_an_idle_assignment_is_the_seq_alone_and_a_bad_seq_is_refused() -> None:
    """{"seq": N}; a negative seq is one sentence naming it."""
    assert idle_assignment_text(7) == '{"seq": 7}'
    with pytest.raises(ValueError, match=r"^seq: "):
        idle_assignment_text(-1)
    with pytest.raises(ValueError, match=r"^seq: "):
        assignment_text(a_job(), SETTINGS, -2, UNIT)


def test_a_unit_nodes_metadata_is_both_entries_and_no_key_of_any_attempt() -> None:
    """UpdateNode replaces the whole map: the startup script and the assignment, always together;
    neither holds the attempt's key nor anything it derives from but what a viewer may know."""
    job = a_job()
    assert job.created_at is not None
    script = render_unit_startup_script("demo", 0, UNIT, job.spec, SETTINGS)
    assignment = assignment_text(job, SETTINGS, 1, UNIT)
    metadata = unit_metadata(script, assignment)
    assert metadata == {STARTUP_SCRIPT_KEY: script, "tpujobs-assignment": assignment}
    key = signing.key_text(signing.attempt_key(SETTINGS.report_key, job.job_id, job.created_at, job.attempt))
    assert all(key not in value and signing.KEY_PREFIX not in value for value in metadata.values())
