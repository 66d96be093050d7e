"""The example's data: a corpus made from its seed, and batches that are a pure function of (seed, step).

Nothing here keeps a position: the batch of step N is the same whether the run got there in one
attempt or in five, so a resumed run consumes exactly the batches an uninterrupted one would. The
fingerprint of each batch goes on the `TPUJOBS_STEP` line, where `tpujobs drill` compares it.
"""

from __future__ import annotations

import hashlib

import numpy as np

VOCAB = 256  # bytes: no tokenizer to ship

_SUBJECTS = ("the model", "a worker", "the slice", "each host", "the scheduler", "a checkpoint", "the job")
_VERBS = ("resumes", "saves", "restores", "trains", "waits", "reports", "replays", "skips")
_OBJECTS = ("the newest step", "its batches", "the optimizer state", "every shard", "the loss", "a digest")
_ENDINGS = (".", " again.", " on time.", " after a preemption.", " before the notice ends.")


def _draw(seed: int, index: int, slot: str, bound: int) -> int:
    """A number below `bound` made by hashing, not by a random generator: the same on every version of
    Python and NumPy, so the data never changes under a resumed run."""
    digest = hashlib.sha256(f"{seed}:{index}:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % bound


def _pick(seed: int, index: int, slot: str, choices: tuple[str, ...]) -> str:
    return choices[_draw(seed, index, slot, len(choices))]


def corpus(seed: int, sentences: int = 2000) -> np.ndarray:
    """The training text as bytes (uint8): simple sentences, enough structure for the loss to fall."""
    text = " ".join(
        _pick(seed, i, "s", _SUBJECTS).capitalize()
        + f" {_pick(seed, i, 'v', _VERBS)} {_pick(seed, i, 'o', _OBJECTS)}{_pick(seed, i, 'e', _ENDINGS)}"
        for i in range(sentences)
    )
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8)


def batch_at(text: np.ndarray, seed: int, index: int, batch_size: int, length: int) -> np.ndarray:
    """Batch number `index`: `batch_size` windows of `length + 1` bytes (inputs and next-byte targets),
    at offsets drawn from (seed, index) alone."""
    starts = [_draw(seed, index, f"row{row}", len(text) - length - 1) for row in range(batch_size)]
    return np.stack([text[start : start + length + 1] for start in starts]).astype(np.int32)


def fingerprint(batch: np.ndarray) -> str:
    """A short digest of a batch's bytes: equal batches, equal fingerprints."""
    return hashlib.sha256(np.ascontiguousarray(batch).tobytes()).hexdigest()[:12]
