"""The rounds of a queue read under contention, shared by admission and the warm pools.

Both read the head of a queue (`QUEUE_PEEK` jobs: the head, and claims still being finished),
try one compare-and-set, and read again when they lost a race; a burst of handlers spreads its
retries with a small random wait that grows with each round.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

QUEUE_PEEK = 5  # queued jobs read per round: the head, and claims still being finished


def jittered_rounds(rounds: int, sleep: Callable[[float], None]) -> Iterator[int]:
    """0 .. rounds-1, sleeping a jittered moment before each round after the first."""
    for round_number in range(rounds):
        if round_number:  # the last round lost a race or moved its head on
            sleep(random.uniform(0, 0.005 * min(round_number, 10)))  # spread the retries of a burst
        yield round_number
