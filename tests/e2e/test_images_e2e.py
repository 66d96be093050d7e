"""Jobs in container images, end to end on the local stack, driven through the CLI.

A tiny image is built here (a static busybox root filesystem: no registry outside this
machine is reachable), pushed to the stack's registry (`TPUJOBS_REGISTRY`) and removed from
the local engine, so the simulated hosts really pull it. Where Docker cannot run, these tests
fail with the sentence saying what to install: they never pass without having run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.local import containers
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"
AS_OWNER = {"TPUJOBS_OWNER": OWNER}


def tpujobs(*args: str) -> str:
    """`tpujobs ARGS` as the jobs' owner; its output, the command checked to have succeeded."""
    result = CliRunner().invoke(app, list(args), env=AS_OWNER, terminal_width=200)
    assert result.exit_code == 0, f"tpujobs {' '.join(args)}: {result.output}"
    return result.output


def described(job_id: str) -> dict[str, Any]:
    """`tpujobs describe JOB -o json`: {"job", "events", "attempts"}."""
    return dict(json.loads(tpujobs("describe", job_id, "-o", "json")))


def submitted(tmp_path: Path, **spec: Any) -> str:
    """`tpujobs submit` of a spec file with `spec`'s fields; the job's id."""
    job_id = f"img-{uuid.uuid4().hex[:6]}"
    path = tmp_path / f"{job_id}.json"
    path.write_text(json.dumps({"job_id": job_id, "name": "img", "owner": OWNER, "capacity": "spot", **spec}))
    assert job_id in tpujobs("submit", str(path))
    return job_id


def job_where(env, job_id: str, wanted, what: str, timeout: float = 90.0):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and wanted(job) else None

    probe.__doc__ = f"{job_id}: {what}"
    try:
        return wait_for(probe, timeout=timeout)
    except AssertionError:
        job = env["store"].get(job_id)
        where = "absent" if job is None else f"{job.state.value} at attempt {job.attempt}: {job.state_reason}"
        raise AssertionError(f"{job_id} never {what} ({where})") from None


def worker_output(job_id: str, attempt: int, worker: int, text: str) -> str:
    """`tpujobs logs` of one worker of one attempt, once it holds `text`."""

    def probe():
        result = CliRunner().invoke(
            app, ["logs", job_id, "--attempt", str(attempt), "--worker", str(worker)], env=AS_OWNER
        )
        return result.output if result.exit_code == 0 and text in result.output else None

    probe.__doc__ = f"worker {worker} of {job_id} attempt {attempt} to print {text!r}"
    return wait_for(probe, timeout=90)


@pytest.fixture(scope="module")
def registry(local_stack) -> str:
    """The stack's registry, with a Docker Engine that answers; a failure saying why if not."""
    problem = containers.docker_problem()
    if problem is not None:
        pytest.fail(f"jobs with an image need Docker Engine: {problem}")
    address = local_stack.get("TPUJOBS_REGISTRY")
    if not address:
        pytest.fail(f"the local stack exports no TPUJOBS_REGISTRY: {containers.INSTALL_HINT}")
    return address


@pytest.fixture
def cancelled_after(env) -> Iterator[list[str]]:
    """Job ids to cancel after the test, so a failed test leaves no job sleeping."""
    made: list[str] = []
    yield made
    for job_id in made:
        CliRunner().invoke(app, ["cancel", job_id, "--owner", OWNER], env=AS_OWNER)


def test_a_two_worker_job_runs_in_its_image_is_preempted_and_resumes_inside_it(
    env, registry, tmp_path, cancelled_after
):
    """Both hosts pull the image; preempted after a checkpoint, attempt 2 resumes inside the same
    image and SUCCEEDS; `describe` names the image and the digest each attempt ran."""
    unique = uuid.uuid4().hex[:10]
    image = f"{registry}/tpujobs-e2e/trainer:{unique}"
    marker = f"trainer image {unique}"
    digest = containers.build_tiny_image(image, {"/etc/trainer-image": marker + "\n"})
    containers.remove_local_image(image)  # the hosts must pull it from the registry
    command = (
        'echo "inside: $(cat /etc/trainer-image)"; '
        'echo "attempt=$TPUJOBS_ATTEMPT resume=$TPUJOBS_RESUME"; '
        'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then echo "TPUJOBS_CHECKPOINT step=7"; sleep 600; fi'
    )
    job_id = submitted(
        tmp_path,
        accelerator_type="v4-16",  # two worker hosts
        image=image,
        command=command,
        on_preemption="resume",
        max_restarts=3,
    )
    cancelled_after.append(job_id)

    job_where(env, job_id, lambda j: j.attempt == 1 and j.usage and j.usage[0].last_checkpoint_at, "checkpointed")
    for worker in (0, 1):
        worker_output(job_id, 1, worker, f"inside: {marker}")
    assert "preempted" in tpujobs("dev", "preempt", job_id)

    job = job_where(env, job_id, lambda j: j.state.is_terminal, "ended")
    assert (job.state.value, job.attempt) == ("SUCCEEDED", 2), job.state_reason
    for worker in (0, 1):
        text = worker_output(job_id, 2, worker, "attempt=2")
        assert f"inside: {marker}" in text and "attempt=2 resume=1" in text

    document = described(job_id)["job"]
    assert document["spec"]["image"] == image
    assert [u["image_digest"] for u in document["usage"]] == [digest, digest]
    assert all(u["other_image_digest"] is None for u in document["usage"])
    page = tpujobs("describe", job_id)
    assert f"{image} (pull if-missing)" in page
    for attempt in (1, 2):
        row = next(line for line in page.splitlines() if f"image, attempt {attempt}" in line)
        assert digest in row


def test_an_image_that_cannot_be_pulled_fails_the_job_naming_the_image(env, registry, tmp_path, cancelled_after):
    """A tag never pushed: the pull fails, an error under on_error=fail, and the reason names the image."""
    image = f"{registry}/tpujobs-e2e/never-pushed:{uuid.uuid4().hex[:10]}"
    job_id = submitted(tmp_path, accelerator_type="v4-8", image=image, command="echo never", on_error="fail")
    cancelled_after.append(job_id)

    job_where(env, job_id, lambda j: j.state.is_terminal, "ended")

    document = described(job_id)["job"]
    assert document["state"] == "FAILED", document["state_reason"]
    assert image in document["state_reason"] and "rule is 'fail'" in document["state_reason"]
    assert all(u["image_digest"] is None for u in document["usage"])
