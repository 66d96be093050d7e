"""What a holding of capacity is doing, in tpujobs' own words, whichever platform holds it.

A holding is the capacity asked for one job attempt or one warm-pool unit: a queued resource on
the TPU API, a set of MIGs on Compute Engine. Each capacity adapter maps its platform's states
to `HoldingState` in one table (`adapters.tpu.QUEUED_RESOURCE_STATES`,
`adapters.compute_states.INSTANCE_STATUSES`); the engine and the domain reason only in these.
The value is what Firestore keeps in a job's or a unit's `capacity_state` and what users see.
"""

from __future__ import annotations

from enum import Enum


class HoldingState(str, Enum):
    """Where a holding is, as the engine acts on it."""

    WAITING = "WAITING"
    """Asked for; Google has no capacity for it yet (or has not accepted it yet)."""
    PROVISIONING = "PROVISIONING"
    """Capacity granted; its hosts are being made or started."""
    ACTIVE = "ACTIVE"
    """Every host is up (and, on Compute Engine, every slice's interconnect): a command can run."""
    LOSING = "LOSING"
    """Google is taking it back (a preemption): its hosts are within their shutdown grace, saving."""
    LOST = "LOST"
    """Google took it back: its hosts are gone; the holding is left (holding quota) until released."""
    FAILED = "FAILED"
    """Google could not make it, or it broke (a failed create, a failed interconnect): no host runs."""
    RELEASING = "RELEASING"
    """Being deleted (tpujobs released it, or someone did): never ACTIVE again."""
    GONE = "GONE"
    """No longer exists at all. No adapter says it: the engine's word for a holding it cannot find."""
    UNKNOWN = "UNKNOWN"
    """A state the adapter's table does not know (a newer API's, or none said): nothing is done on it."""

    def __str__(self) -> str:
        return self.value  # in messages and f-strings, the word users see


HOLDING_PENDING = frozenset({HoldingState.WAITING, HoldingState.PROVISIONING, HoldingState.ACTIVE})
"""States of a holding on its way up, or up: the job or unit holding it waits for it or runs on it."""
HOLDING_LOST = frozenset({HoldingState.LOSING, HoldingState.LOST, HoldingState.FAILED, HoldingState.GONE})
"""States of a holding whose hosts are gone or going: the attempt on it is over."""
HOSTS_GONE = frozenset({HoldingState.LOST, HoldingState.FAILED, HoldingState.GONE})
"""States of a holding none of whose hosts is left, so nothing on it can still be saving."""


def holding_state(value: str | None) -> HoldingState:
    """A stored or reported `capacity_state` as a state; UNKNOWN for a word this table lacks
    (a document written before these words, a hostile message)."""
    try:
        return HoldingState(value)
    except ValueError:
        return HoldingState.UNKNOWN
