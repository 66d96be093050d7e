"""Compare-and-set on one Firestore document, written once for every store that needs it.

Read the document, decide what to write, and write with a precondition on what was read
(its update time, or that it does not exist yet). A write by anyone else in between makes
the precondition fail, and the change is decided again on a fresh read. No read-write
transaction: those take locks, and two handlers of one document holding read locks wait
on each other until "Transaction lock timeout".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.google_errors import translated
from tpujobs.engine.errors import TransientError

if TYPE_CHECKING:
    from typing import TypeAlias

    from google.cloud import firestore

    Snapshot: TypeAlias = firestore.DocumentSnapshot[firestore.DocumentReference]  # what a transaction reads

FIRESTORE = "Firestore"
CAS_ATTEMPTS = 20
# A failed update-time precondition, or a create (of the document, or of an event beside it)
# that found one already there: someone else wrote first.
LOST_RACE: tuple[type[Exception], ...] = (api_exceptions.FailedPrecondition, api_exceptions.AlreadyExists)

T = TypeVar("T")
Write = Callable[[], object]


def compare_and_set(
    ref: firestore.DocumentReference,
    change: Callable[[Snapshot], tuple[T, Write | None]],
    *,
    what: str,
    doing: str,
    lost: tuple[type[Exception], ...] = LOST_RACE,
) -> T:
    """Run `change` on a fresh read of `ref` until its write commits; its result.

    `change(snapshot)` returns (result, write): `write` is None when there is nothing to
    write, else a call that writes with a precondition on `snapshot`. It may run many times,
    so it only decides; the write happens here. After CAS_ATTEMPTS lost races the message is
    worth another delivery: TransientError "{what} changed under 20 attempts to {doing}".
    """
    for attempt in range(CAS_ATTEMPTS):
        with translated(FIRESTORE, f"read {what}"):
            snapshot = ref.get()
        result, write = change(snapshot)
        if write is None or wrote(write, f"{doing} ({what})", lost):
            return result
        time.sleep(random.uniform(0, 0.01 * (attempt + 1)))  # spread the retries of a burst
    raise TransientError(f"{what} changed under {CAS_ATTEMPTS} attempts to {doing}")


def wrote(write: Write, doing: str, lost: tuple[type[Exception], ...] = LOST_RACE) -> bool:
    """Make one conditional write: True when it committed, False when someone wrote first.

    The race is caught inside the translation, since over REST a lost create is a bare 409
    that the table calls permanent; every other failure is translated as usual.
    """
    with translated(FIRESTORE, doing):
        try:
            write()
        except lost:
            return False
    return True
