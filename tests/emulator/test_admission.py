"""Admission's compare-and-set on the pool document under real contention, on the Firestore
emulator: what only Firestore can show. The rules of admission (quotas, queue order, eviction,
zone failover, the on-demand fallback, tiers and regions) are tests/unit/engine/test_engine_admission.py
and test_engine_quota_tiers.py; here also what the adapter writes: `config/quotas` edits, pool documents.
"""

from __future__ import annotations

import threading

import pytest

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.states import JobState
from tpujobs.engine.services import Engine
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.testing import OffsetClock, local_settings
from tpujobs.local.testing import inbound as message

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"


@pytest.fixture
def simulator() -> SimulatorServer:
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1)
    with SimulatorServer(config, run_workers=False) as server:
        yield server


@pytest.fixture
def pools(firestore_client) -> FirestorePools:
    return FirestorePools(firestore_client)


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def service(firestore_client, project_id, simulator, pools, clock) -> Engine:
    settings = local_settings(
        project=project_id, default_zone=ZONE, tpu_endpoint=simulator.url, logs_bucket="logs", zone_wait_seconds=0.5
    )
    tpu = CloudTpu(build_client(simulator.url), project_id)
    return Engine(FirestoreJobStore(firestore_client), tpu, settings, clock, lambda _: None, pools=pools)


def submit(service: Engine, job_id: str, **changes) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",  # 4 chips
        "command": "python train.py",
        **changes,
    }
    service.submission.submit(message("tpujobs-submit", spec))
    return job_id


def state(service: Engine, job_id: str) -> JobState:
    return service.store.get(job_id).state


def test_concurrent_admissions_never_hand_out_a_chip_twice(service, pools):
    """Twelve submissions at once against a quota of four jobs: exactly four are admitted,
    and the compare-and-set on the pool document sees no lock timeout."""
    pools.set_quota(ZONE, "v4", "on-demand", 16)
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            submit(service, f"c-{n}")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    states = [state(service, f"c-{n}") for n in range(12)]
    assert states.count(JobState.PROVISIONING) == 4
    assert states.count(JobState.QUEUED) == 8
    assert sum(h.chips for h in pools.view("v4@us-central2").holders) == 16


def test_a_quota_edit_keeps_what_an_admin_wrote_in_the_console(pools, firestore_client):
    """A bare number (on-demand) stays bare when on-demand changes, and keeps its chips when spot
    joins it; an entry the edit does not touch is left as written."""
    quotas = firestore_client.collection("config").document("quotas")
    quotas.set({ZONE: {"v4": 64, "v5p": 8}, "us-east5": {"v5p": {"spot": 512}}})
    pools.set_quota(ZONE, "v4", "on-demand", 32)
    assert quotas.get().to_dict()[ZONE] == {"v4": 32, "v5p": 8}
    pools.set_quota(ZONE, "v4", "spot", 128)
    pools.set_reservation("team-a", 16)
    assert quotas.get().to_dict() == {
        ZONE: {"v4": {"on-demand": 32, "spot": 128}, "v5p": 8},
        "us-east5": {"v5p": {"spot": 512}},
        "reservations": {"team-a": 16},
    }
    pools.set_quota(ZONE, "v5p", "on-demand", None)
    assert quotas.get().to_dict()[ZONE] == {"v4": {"on-demand": 32, "spot": 128}}


def test_a_pool_document_says_what_it_counts_and_where_each_holder_is(service, pools, firestore_client):
    """`quota_pools/v4@us-central2:spot`: family, tier, region, and each holder's zone, for a
    reader in the console."""
    pools.set_quota(ZONE, "v4", "spot", 8)
    submit(service, "spot-1", capacity="spot")
    document = firestore_client.collection("quota_pools").document("v4@us-central2:spot").get().to_dict()
    assert {k: document[k] for k in ("family", "tier", "region", "reservation", "chips_held")} == {
        "family": "v4",
        "tier": "spot",
        "region": "us-central2",
        "reservation": "",
        "chips_held": 4,
    }
    assert document["holders"]["spot-1"]["zone"] == ZONE
