"""MEGASCALE_* where no `tpu-env` names them (a multislice on Compute Engine): slice 0's worker 0
gives its address with its key request; every host learns it from its key answer."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from .basics import AgentError
from .config import SLICE_ID_METADATA
from .rest import Metadata, with_retries

COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_PORT = 8080  # as a TPU API multislice's tpu-env names it
ADDRESS_METADATA = "instance/network-interfaces/0/ip"
COORDINATOR_WAIT_SECONDS = 600.0  # slice 0 may come up this much later than another slice
ASK_EVERY_SECONDS = 5.0


class CoordinatedKey(Protocol):
    @property
    def coordinator(self) -> str | None: ...


K = TypeVar("K", bound=CoordinatedKey)


def needs_coordinator(config: Mapping[str, Any], megascale: Mapping[str, str], metadata: Metadata) -> bool:
    """A multislice whose slices tpujobs names in their metadata (`tpujobs-slice-id`: Compute
    Engine's) and whose `tpu-env` names no coordinator."""
    if int(config["num_slices"]) <= 1 or COORDINATOR in megascale:
        return False
    return metadata.get_optional(SLICE_ID_METADATA) is not None


def slices_environment(coordinator: str, num_slices: int, slice_id: int) -> dict[str, str]:
    host = f"[{coordinator}]" if ipaddress.ip_address(coordinator).version == 6 else coordinator
    return {
        COORDINATOR: f"{host}:{MEGASCALE_PORT}",
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_PORT": str(MEGASCALE_PORT),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }


def key_with_slices(
    ask: Callable[[str | None], K],
    metadata: Metadata,
    config: Mapping[str, Any],
    slice_id: int,
    worker_id: int,
    megascale: Mapping[str, str],
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[K, dict[str, str]]:
    """The key (`ask(address)`) and the command's MEGASCALE_*; others ask until the coordinator is known."""
    if not needs_coordinator(config, megascale, metadata):
        return ask(None), dict(megascale)
    first = (slice_id, worker_id) == (0, 0)
    address = str(with_retries(lambda: metadata.get(ADDRESS_METADATA))).strip() if first else None
    deadline = clock() + COORDINATOR_WAIT_SECONDS
    key = ask(address)
    while key.coordinator is None:
        if clock() > deadline:
            raise AgentError(f"no coordinator after {COORDINATOR_WAIT_SECONDS:.0f} s: slice 0's worker 0 never asked")
        sleep(ASK_EVERY_SECONDS)
        key = ask(address)
    return key, {**megascale, **slices_environment(key.coordinator, int(config["num_slices"]), slice_id)}
