"""One contract per store port, run against the in-memory fake and the real adapter.

`backend` is parametrized: `memory` (the fakes of `tpujobs.local.fakes`, no emulator) and
`firestore` (the adapters on the Firestore emulator, marked `emulator`, each test in a project
of its own). A test asks for the ports it checks; both answer alike or the test fails on one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tpujobs.local.fakes import InMemoryDeadLetters, InMemoryJobStore, InMemoryPools, InMemoryWarmPools


@dataclass
class Backend:
    """The store ports of one backend, sharing one database."""

    name: str
    jobs: Any  # ports.JobStore and ports.JobDocuments
    pools: Any  # ports.Pools, with set_quota
    warm_pools: Any  # ports.WarmPoolStore
    dead_letters: Any  # ports.DeadLetterStore


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        store = InMemoryJobStore()
        return Backend("memory", store, InMemoryPools(store), InMemoryWarmPools(store), InMemoryDeadLetters())
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools

    client = request.getfixturevalue("firestore_client")
    return Backend(
        "firestore",
        FirestoreJobStore(client),
        FirestorePools(client),
        FirestoreWarmPools(client),
        FirestoreDeadLetters(client),
    )
