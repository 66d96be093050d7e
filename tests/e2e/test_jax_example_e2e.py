"""examples/jax_lm through tpujobs on the local stack, preempted once: every host of the next attempt
starts from the newest checkpoint, one host wrote the checkpoints, and the result equals an
uninterrupted run's, bit for bit. Orbax writes to the Storage emulator's gs:// bucket here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from stack_reads import worker_output

from support.jax_lm import Run, run_example
from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("jax", "flax", "optax", "orbax", "gcsfs")),
        reason="the jax extra is not installed (pip install -e '.[jax]'; make test installs it)",
    ),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_lm"
STEPS, EVERY = 60, 10
# Attempt 1 paces its steps (1 s each): the preemption, sent once its first checkpoint is reported (a save
# to the Storage emulator takes seconds, tens on a loaded machine), lands with many steps still to go.
# Pacing changes no result; attempt 2 runs flat out. `exec`: SIGTERM goes to the trainer, not to a shell
# whose exit would end the command before the trainer's save on SIGTERM is done.
COMMAND = (
    'PACE=1; [ "$TPUJOBS_RESUME" = 1 ] && PACE=0; '
    f'exec python3 train.py --steps {STEPS} --checkpoint-every {EVERY} --keep 10 --step-seconds "$PACE"'
)
# The stack's hosts run on this machine: they reuse the programs the uninterrupted run compiled.
CACHE = "JAX_COMPILATION_CACHE_DIR={} JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 "


def outputs(env, job_id: str, attempt: int) -> dict[str, Run]:
    """Each worker's output in `attempt` ("slice-worker" -> its lines), as its agent shipped it."""
    return {worker: Run(0, worker_output(env, job_id, attempt, worker)) for worker in ("0-0", "0-1")}


@pytest.mark.timeout(600)
def test_the_jax_example_preempted_once_resumes_from_its_newest_checkpoint_with_the_same_result(
    env, submit_job, tmp_path: Path
) -> None:
    """A v4-16 (two hosts) spot job preempted after its first checkpoint: attempt 2 starts on both
    hosts from the newest checkpoint attempt 1 reported, worker 0-0 alone wrote them, the batches after
    the resume are the uninterrupted run's, and so is the final digest. The job SUCCEEDS."""
    from tpujobs.cli.code_upload import upload_code_dir

    cache = tmp_path / "jax-cache"
    reference = run_example(
        EXAMPLE, tmp_path / "uninterrupted", steps=STEPS, extra_args=("--checkpoint-every", str(EVERY)), cache_dir=cache
    )
    assert reference.returncode == 0 and reference.result, reference.output[-3000:]

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="jaxlm",
        code_uri=code_uri,
        code_sha256=digest,
        command=COMMAND.replace("exec python3", "exec env " + CACHE.format(cache) + "python3"),
        on_preemption="resume",
        max_restarts=2,
    )

    def running_with_a_checkpoint():
        job = env["store"].get(job_id)
        if job is None or job.state is not JobState.RUNNING or job.attempt != 1:
            return None
        return job if "TPUJOBS_CHECKPOINT step=" in worker_output(env, job_id, 1) else None

    running_with_a_checkpoint.__doc__ = f"{job_id} RUNNING at attempt 1 with a checkpoint reported"
    job = wait_for(running_with_a_checkpoint, timeout=240, interval=1.0)  # each look lists the output chunks
    env["control"].preempt(env["zone"], job.queued_resource)

    def ended():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    ended.__doc__ = f"{job_id} ended"
    job = wait_for(ended, timeout=300, interval=0.5)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (2, 1)

    first = outputs(env, job_id, 1)
    second = wait_for(lambda: (o := outputs(env, job_id, 2))["0-0"].result and o, 60, 1.0, "attempt 2's RESULT shipped")
    newest = max(first["0-0"].checkpoints)
    assert first["0-0"].start == first["0-1"].start == 0
    assert 0 < newest < STEPS and first["0-0"].result is None, first["0-0"].output[-3000:]
    assert second["0-0"].start == second["0-1"].start == newest  # every host, from the newest checkpoint
    assert first["0-1"].checkpoints == second["0-1"].checkpoints == []  # one writer: worker 0 of slice 0
    assert not first["0-1"].steps  # and one reporter of steps
    assert sorted(second["0-0"].steps) == list(range(newest + 1, STEPS + 1))
    for step, words in second["0-0"].steps.items():
        assert words == reference.steps[step], f"step {step}"  # the same batch, the same loss
    assert second["0-0"].result == reference.result
