"""Orbax checkpoints at the job's checkpoint location: a gs:// prefix (TPUJOBS_CHECKPOINT_URI) or a directory.

Orbax writes arrays with TensorStore and walks paths with etils.epath, which reaches gs:// through
gcsfs; on a TPU VM both use the VM's service account. On the local stack the job's environment has
STORAGE_EMULATOR_HOST: gcsfs honours it as it is, and `use_storage_emulator` points TensorStore's
GCS driver at the same emulator (TENSORSTORE_GCS_HTTP_URL) with a placeholder token (the emulator
checks none), so the very same orbax calls write to the emulator's bucket.

Each checkpoint records the attempt that wrote it, so that an attempt resumes from the newest
checkpoint of an earlier attempt, never from one its own writer has just made while a slower host
was still starting.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def use_storage_emulator(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Point TensorStore at the Storage emulator when STORAGE_EMULATOR_HOST names one (before any I/O)."""
    host = environ.get("STORAGE_EMULATOR_HOST", "")
    if not host:
        return False
    url = host if host.startswith(("http://", "https://")) else f"http://{host}"
    environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url.rstrip("/"))
    environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "storage-emulator")  # not a secret: the emulator checks none
    logging.getLogger("gcsfs").setLevel(logging.ERROR)  # it says at every call that it found no credentials
    return True


def open_manager(location: str, keep: int, writes: bool) -> ocp.CheckpointManager:
    """A manager that keeps the newest `keep` checkpoints, in orbax's default layout (one TensorStore
    OCDBT database per process); a reader's (writes=False) can neither save nor delete, nor create
    the location."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=writes,
        read_only=not writes,
        enable_async_checkpointing=True,  # training goes on while a checkpoint is written
    )
    return ocp.CheckpointManager(location, options=options, item_handlers=ocp.StandardCheckpointHandler())


def written_by(manager: ocp.CheckpointManager, step: int) -> int | None:
    """The attempt that wrote checkpoint `step`, where it says."""
    try:
        attempt = (manager.metadata(step).custom_metadata or {}).get("attempt")
    except Exception:  # an orbax without step metadata, or a checkpoint written without it
        return None
    return attempt if isinstance(attempt, int) else None


def newest_step(manager: ocp.CheckpointManager, attempt: int | None) -> int | None:
    """The newest checkpoint written before attempt `attempt` (any, when the attempt is not known)."""
    for step in sorted(manager.all_steps(), reverse=True):
        writer = written_by(manager, step)
        if attempt is None or writer is None or writer < attempt:
            return step
    return None


def restore(manager: ocp.CheckpointManager, step: int, template: Any) -> Any:
    """Checkpoint `step`, laid out as `template` (shapes, dtypes and shardings of the live state)."""
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
    return manager.restore(step, args=ocp.args.StandardRestore(abstract))


def save(manager: ocp.CheckpointManager, step: int, state: Any, attempt: int | None) -> bool:
    """Start saving `state` as checkpoint `step` unless a checkpoint as new exists; True when a save
    started (it finishes in the background: `manager.wait_until_finished()`). The caller says when a
    save is due: orbax's own policy would also save the first step of every attempt."""
    newest = manager.latest_step()
    if newest is not None and step <= newest:
        return False
    if attempt is None:
        return bool(manager.save(step, args=ocp.args.StandardSave(state), force=True))
    try:
        saved = manager.save(step, args=ocp.args.StandardSave(state), force=True, custom_metadata={"attempt": attempt})
    except TypeError:  # an orbax older than custom_metadata (0.11): the attempt goes unrecorded
        saved = manager.save(step, args=ocp.args.StandardSave(state), force=True)
    return bool(saved)


def saving(manager: ocp.CheckpointManager) -> bool:
    """Whether a save is still being written (an orbax without the question: assume so)."""
    in_progress = getattr(manager, "is_saving_in_progress", None)
    return True if in_progress is None else bool(in_progress())


def discard_all(manager: ocp.CheckpointManager) -> list[int]:
    """Delete every checkpoint (a run that starts over must not later resume from another run's)."""
    steps = list(manager.all_steps())
    for step in steps:
        manager.delete(step)
    return steps
