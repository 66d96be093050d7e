"""infra/monitoring.tf's log-based metrics held to the lines the functions really write.

The stack runs with TPUJOBS_LOG_FORMAT=json (conftest), so its functions print what Cloud
Functions would ingest. The test drives a job stuck QUEUED past the reconciler's limit while every
TPU create fails (so its submit handler raises: a function error), then a success after a
preemption, a failure, a rejection and a dead letter; it reads the new lines of
`logs/function-*.log`, turns each into the entry Cloud Logging would make (`resource.type`
cloud_run_revision, the function as `service_name`), and runs every metric's filter and
extractors over them (`tpujobs.local.log_filters`, which refuses syntax it cannot read exactly).
A renamed event or field fails here, not silently in production.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tpujobs.domain.states import JobState
from tpujobs.engine import topology
from tpujobs.engine.settings import Settings
from tpujobs.local.log_filters import compile_filter, entry_from_line, extract
from tpujobs.local.simulator.errors import INJECTED
from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]  # alone, it starts the stack (about a minute) too

INFRA = Path(__file__).resolve().parents[2] / "infra"
# The stuck limit the stack keeps (conftest leaves it): a job QUEUED longer is `job_stuck`.
STUCK_AFTER_S = Settings().stuck_after_seconds
# Every TPU create fails until the stuck line is seen; far more calls than that wait makes.
FAILING_CREATES = 100_000


def load_metrics() -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Every log-based metric of infra/ (each for_each's instances), with infra's locals and variables' defaults."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
    from for_each import instances
    from terraform_config import Terraform

    tf = Terraform.load(INFRA)
    metrics = {
        name: body
        for resource in tf.of_kind("google_logging_metric")
        for name, body in instances(tf, "google_logging_metric", resource).items()
    }
    defaults = {name: body.get("default") for name, body in tf.variables.items()}
    return metrics, tf.locals, defaults


def resolve(text: str, local_values: dict[str, Any], variables: dict[str, Any]) -> str:
    """A Terraform string with `${local.X}` and `${var.X}` filled in; anything else is refused."""
    pattern = re.compile(r"\$\{(local|var)\.([A-Za-z0-9_]+)\}")
    for _ in range(10):
        replaced = pattern.sub(
            lambda m: str(local_values[m[2]] if m[1] == "local" else variables[m[2]]),
            text,
        )
        if replaced == text:
            break
        text = replaced
    assert "${" not in text, f"an interpolation the test cannot fill in: {text}"
    return text


def log_sizes(log_dir: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in log_dir.glob("function-*.log")}


def new_entries(log_dir: Path, since: dict[Path, int], prefix: str) -> list[dict[str, Any]]:
    """The entries Cloud Logging would make of every line the functions wrote since `since`."""
    entries = []
    for path in sorted(log_dir.glob("function-*.log")):
        target = path.stem.removeprefix("function-")
        resource = {
            "type": "cloud_run_revision",
            "labels": {"service_name": f"{prefix}tpujobs-{target.replace('_', '-')}"},
        }
        with path.open("rb") as file:
            file.seek(since.get(path, 0))
            text = file.read().decode("utf-8", errors="replace")
        entries += [entry_from_line(line, resource) for line in text.splitlines() if line.strip()]
    return entries


def stuck_while_creates_fail(env, submit_job, log_dir: Path, prefix: str) -> str:
    """A job that stays QUEUED past the stuck limit: every TPU create answers 503 until the
    reconciler has written its `job_stuck` line and its submit handler has raised (an ERROR
    entry, as Cloud Functions logs an uncaught exception); then creates work again, and the
    reconciler, converging the stuck job, gets it going. Its id."""
    since = log_sizes(log_dir)
    control = env["control"]
    control.plan_errors("create", 503, count=FAILING_CREATES)
    try:
        job_id = submit_job(prefix="metrics-stuck", command="true")

        def stuck_and_failed() -> bool:
            entries = new_entries(log_dir, since, prefix)
            stuck = any(e.get("jsonPayload", {}).get("job_id") == job_id for e in entries if _event(e) == "job_stuck")
            raised = any(
                e["severity"] == "ERROR" and INJECTED.strip() in str(e.get("jsonPayload", {}).get("message", ""))
                for e in entries
            )
            return stuck and raised

        stuck_and_failed.__doc__ = f"{job_id} logged stuck (after {STUCK_AFTER_S:.0f} s) and its handler's error"
        wait_for(stuck_and_failed, timeout=STUCK_AFTER_S + 150, interval=1.0)
        job = env["store"].get(job_id)
        assert job is not None and job.state is JobState.QUEUED, job
    finally:
        control.clear_faults()
    return job_id


def _event(entry: dict[str, Any]) -> str | None:
    return entry.get("jsonPayload", {}).get("event")


def ended(env, job_id: str):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} ended"
    return wait_for(probe, timeout=120)


def test_every_metric_filter_matches_the_lines_the_stack_writes(env, submit_job, local_stack):
    """Each metric in infra/monitoring.tf matches a line the functions wrote, and its extractors find their fields."""
    metrics, local_values, variables = load_metrics()
    prefix = local_stack.get("TPUJOBS_PREFIX", "")
    variables = {**variables, "prefix": prefix}
    log_dir = Path(os.environ["TPUJOBS_STATE_DIR"]) / "logs"
    since = log_sizes(log_dir)
    stuck = stuck_while_creates_fail(env, submit_job, log_dir, prefix)

    # A job preempted while attempt 1 waits, that succeeds at attempt 2; one that fails.
    recovered = submit_job(
        prefix="metrics-ok",
        command='test "$TPUJOBS_ATTEMPT" -ge 2 || exec sleep 600',
        on_preemption="rerun",
        max_restarts=2,
    )
    failed = submit_job(prefix="metrics-fail", command="exit 3", on_error="fail")

    def running_first_attempt():
        job = env["store"].get(recovered)
        return job if job and job.state is JobState.RUNNING and job.attempt == 1 else None

    job = wait_for(running_first_attempt, timeout=120)
    env["control"].call("POST", f"queuedResources/{env['zone']}/{job.queued_resource}:preempt", {})
    # A message no handler can use (rejected), and one that Pub/Sub gave up on (dead-lettered).
    env["publisher"].publish_bytes(topology.SUBMIT, b"{not json")
    env["publisher"].publish_bytes(
        topology.DEAD_LETTER,
        b'{"job_id": "never"}',
        {
            "CloudPubSubDeadLetterSourceSubscription": f"{topology.SUBMIT}--submit_job",
            "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        },
    )
    assert ended(env, recovered).state is JobState.SUCCEEDED
    assert ended(env, failed).state is JobState.FAILED
    assert ended(env, stuck).state is JobState.SUCCEEDED  # the reconciler converged it once creates worked
    mine = {recovered, failed, stuck}

    compiled = {
        name: compile_filter(resolve(body["filter"], local_values, variables)) for name, body in metrics.items()
    }
    assert set(compiled) >= {
        "jobs_submitted",
        "jobs_succeeded",
        "jobs_failed",
        "preemptions",
        "recovery_latency",
        "queue_wait",
        "chip_hours",
        "rejections",
        "dead_letters",
        "stuck_jobs",
        "function_errors",
    }

    def ours(entry: dict[str, Any]) -> bool:
        payload = entry.get("jsonPayload", {})
        return "job_id" not in payload or payload["job_id"] in mine

    def all_matched() -> dict[str, list[dict[str, Any]]] | None:
        entries = [e for e in new_entries(log_dir, since, prefix) if ours(e)]
        found = {name: [e for e in entries if test(e)] for name, test in compiled.items()}
        return found if all(found.values()) else None

    all_matched.__doc__ = "every driven metric matched a line the stack wrote"
    found = wait_for(all_matched, timeout=30)

    for name, body in metrics.items():
        matched = found[name]
        value_extractor = body.get("value_extractor")
        if value_extractor:
            values = [extract(value_extractor, e) for e in matched]
            assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), (name, values)
        for label, extractor in body.get("label_extractors", {}).items():
            values = [extract(extractor, e) for e in matched]
            assert all(v not in (None, "") for v in values), (name, label, values)
        declared = {entry["key"] for descriptor in body["metric_descriptor"] for entry in descriptor.get("labels", [])}
        assert declared == set(body.get("label_extractors", {})), f"{name}: labels declared and extracted differ"

    assert {e["jsonPayload"]["job_id"] for e in found["jobs_submitted"]} >= mine
    assert [e["jsonPayload"]["reason_class"] for e in found["jobs_failed"]] == ["command_failed"]
    assert {(e["jsonPayload"]["job_id"], e["jsonPayload"]["state"]) for e in found["stuck_jobs"]} == {(stuck, "QUEUED")}
    assert any(INJECTED.strip() in e["jsonPayload"]["message"] for e in found["function_errors"])
    (recovery,) = [extract("EXTRACT(jsonPayload.recovery_seconds)", e) for e in found["recovery_latency"]]
    assert recovery > 0
    assert all(e["severity"] == "WARNING" for e in found["rejections"] + found["dead_letters"])
