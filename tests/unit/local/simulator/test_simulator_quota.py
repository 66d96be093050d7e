"""The simulator counts quota as Google does, with admission's own model (domain.quotas): spot and
on-demand apart, regional quotas shared by their zones, reservations by their size; Compute
Engine's QUOTA_EXCEEDED and the TPU API's quota errors name the metric and where."""

from __future__ import annotations

import dataclasses
import random
from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.domain.admission import Holder, blocked_by
from tpujobs.domain.quotas import PoolKey, QuotaBook, pool_key
from tpujobs.local.simulator import (
    Fault,
    QrState,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SliceRequest,
)
from tpujobs.local.simulator.model import project_number
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
REGION = "us-central2"
ZONE_B, ZONE_A = "us-central2-b", "us-central2-a"
RUNTIME = "tpu-ubuntu2204-base"
QUICK = SimulatorConfig(
    accept_seconds=0.0, waiting_seconds=1.0, provisioning_seconds=2.0, suspending_seconds=1.0, deleting_seconds=1.0
)
SETTLED = 5.0  # past waiting_seconds and provisioning_seconds: a QR that may run is ACTIVE by then


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def simulator(clock: SecondsClock, quota: dict[str, Any]) -> Simulator:
    return Simulator(dataclasses.replace(QUICK, quota=quota), clock=clock, wall_clock=lambda: 1_700_000_000.0)


def request(node_id: str, accelerator_type: str = "v4-8", **tier: Any) -> QueuedResourceRequest:
    """One slice; *tier*: spot=True, or guaranteed={} with reservation_name for reserved."""
    return QueuedResourceRequest(
        slices=(SliceRequest(accelerator_type=accelerator_type, runtime_version=RUNTIME, node_id=node_id),), **tier
    )


def state(sim: Simulator, qr_id: str, zone: str = ZONE_B) -> QrState:
    return sim.queued_resources.get_queued_resource(PROJECT, zone, qr_id).state


def test_spot_and_on_demand_quotas_do_not_hold_each_other_back(clock: SecondsClock) -> None:
    """A full on-demand quota leaves a spot QR to run on the spot quota, and the other way round."""
    sim = simulator(clock, {ZONE_B: {"v4": {"on-demand": 4, "spot": 4}}})
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "od-1", request("a"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "od-2", request("b"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "spot-1", request("c", spot=True))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "spot-2", request("d", spot=True))
    clock.tick(SETTLED)
    assert [state(sim, q) for q in ("od-1", "od-2", "spot-1", "spot-2")] == [
        QrState.ACTIVE,
        QrState.WAITING_FOR_RESOURCES,
        QrState.ACTIVE,
        QrState.WAITING_FOR_RESOURCES,
    ]


def test_a_regional_quota_holds_back_a_second_zone_of_its_region_only(clock: SecondsClock) -> None:
    """4 chips for us-central2: a QR in -b takes them, one in -a waits, one in us-east5 runs."""
    sim = simulator(clock, {REGION: {"v4": 4}})
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "first", request("a"))
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_A, "second-zone", request("b"))
    sim.queued_resources.create_queued_resource(PROJECT, "us-east5-a", "other-region", request("c"))
    clock.tick(SETTLED)
    assert state(sim, "first") is QrState.ACTIVE
    assert state(sim, "second-zone", ZONE_A) is QrState.WAITING_FOR_RESOURCES
    assert state(sim, "other-region", "us-east5-a") is QrState.ACTIVE
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE_B, "first", force=True)
    clock.tick(SETTLED)
    assert state(sim, "second-zone", ZONE_A) is QrState.ACTIVE


def test_a_zones_quota_lets_later_zones_pass_and_a_regions_quota_stops_the_queue(clock: SecondsClock) -> None:
    """As admission's queue: held back by its zone's quota, a QR lets a later one of another zone
    run; held back by the region's, it holds back every later one of the region."""
    sim = simulator(clock, {REGION: {"v4": 12}, ZONE_B: {"v4": 4}})
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "b-1", request("a"))  # 4 chips
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "b-2", request("b"))  # zone -b full
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(
        PROJECT, ZONE_A, "a-big", request("c", "v4-32")
    )  # 16 chips: region full
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(
        PROJECT, ZONE_A, "a-small", request("d")
    )  # would fit, but queues behind
    clock.tick(SETTLED)
    assert state(sim, "b-1") is QrState.ACTIVE
    assert state(sim, "b-2") is QrState.WAITING_FOR_RESOURCES
    assert state(sim, "a-big", ZONE_A) is QrState.WAITING_FOR_RESOURCES
    assert state(sim, "a-small", ZONE_A) is QrState.WAITING_FOR_RESOURCES
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE_A, "a-big")
    clock.tick(SETTLED)
    assert state(sim, "a-small", ZONE_A) is QrState.ACTIVE  # the zone's quota of -b is no limit in -a
    assert state(sim, "b-2") is QrState.WAITING_FOR_RESOURCES


def test_a_named_reservation_is_counted_against_its_size_not_the_quota(clock: SecondsClock) -> None:
    """An 8-chip reservation takes two v4-8 QRs that name it, and a third waits; the on-demand
    quota (0: paused) does not count them, nor do they count against it."""
    sim = simulator(clock, {ZONE_B: {"v4": 0}, "reservations": {"team": 8}})
    path = f"projects/{PROJECT}/locations/{ZONE_B}/reservations/team"
    for name in ("r-1", "r-2", "r-3"):
        sim.queued_resources.create_queued_resource(
            PROJECT, ZONE_B, name, request(name, guaranteed={}, reservation_name=path)
        )
        clock.tick(0.1)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, "on-demand", request("od"))
    clock.tick(SETTLED)
    assert [state(sim, q) for q in ("r-1", "r-2", "r-3", "on-demand")] == [
        QrState.ACTIVE,
        QrState.ACTIVE,
        QrState.WAITING_FOR_RESOURCES,
        QrState.WAITING_FOR_RESOURCES,
    ]


def test_the_nodes_scheduling_config_picks_the_tier_as_the_queued_resources_does(clock: SecondsClock) -> None:
    """schedulingConfig.spot is spot capacity, schedulingConfig.reserved without a reservation's
    name is the zone's reserved tier: each counted there, not in on-demand (0: paused)."""
    sim = simulator(clock, {ZONE_B: {"v4": {"on-demand": 0, "spot": 4, "reserved": 4}}})
    for name, flag in (("spot-1", "spot"), ("spot-2", "spot"), ("res-1", "reserved"), ("res-2", "reserved")):
        template = {"schedulingConfig": {flag: True}}
        node = SliceRequest(accelerator_type="v4-8", runtime_version=RUNTIME, node_id=name, template=template)
        sim.queued_resources.create_queued_resource(PROJECT, ZONE_B, name, QueuedResourceRequest(slices=(node,)))
        clock.tick(0.1)
    clock.tick(SETTLED)
    assert [state(sim, q) for q in ("spot-1", "spot-2", "res-1", "res-2")] == [
        QrState.ACTIVE,
        QrState.WAITING_FOR_RESOURCES,
        QrState.ACTIVE,
        QrState.WAITING_FOR_RESOURCES,
    ]


def test_the_simulators_verdict_is_admissions_for_random_quotas_and_requests() -> None:
    """The same model: for random documents and requests, a QR runs exactly when admission's
    `blocked_by` lets the same chips in next to the same holders (one waiting QR at a time, so
    the queue's order plays no part)."""
    zones = (ZONE_A, ZONE_B, "us-central2-c")
    for seed in range(6):
        dice = random.Random(seed)
        document: dict[str, Any] = {}
        for location in (REGION, *zones):
            if dice.random() < 0.6:
                tiers = {t: dice.choice((0, 4, 8, 12, 16, 32)) for t in ("on-demand", "spot") if dice.random() < 0.7}
                document[location] = {"v4": tiers}
        clock = SecondsClock()
        sim = simulator(clock, document)
        book = QuotaBook(document)
        holders: dict[PoolKey, list[Holder]] = {}
        since = datetime(2026, 1, 1, tzinfo=timezone.utc)
        for n in range(14):
            zone, spot = dice.choice(zones), dice.random() < 0.5
            accelerator = dice.choice(("v4-8", "v4-16", "v4-32"))
            chips = {"v4-8": 4, "v4-16": 8, "v4-32": 16}[accelerator]
            pool = pool_key("v4", "spot" if spot else "on-demand", zone)
            expected = blocked_by(book.limits(pool), holders.get(pool, []), zone, chips)
            qr_id = f"qr-{n}"
            sim.queued_resources.create_queued_resource(PROJECT, zone, qr_id, request(qr_id, accelerator, spot=spot))
            clock.tick(SETTLED)
            ran = state(sim, qr_id, zone) is QrState.ACTIVE
            assert ran == (expected is None), (seed, n, document, pool.id, zone, chips, expected)
            if ran:
                holders.setdefault(pool, []).append(Holder(qr_id, chips, 1, "normal", since, zone=zone))
            else:
                sim.queued_resources.delete_queued_resource(PROJECT, zone, qr_id)
                clock.tick(SETTLED)


def test_a_quota_document_with_problems_is_refused_naming_them() -> None:
    """Firestore skips what it cannot read; the simulator refuses it, saying what is wrong."""
    with pytest.raises(ValueError, match=r"v4@us-central2-b.*neither a zone"):
        SimulatorConfig(quota={"v4@us-central2-b": 8})
    with pytest.raises(ValueError, match=r"us-central2\.v4\.reserved: reservations are zonal"):
        SimulatorConfig(quota={REGION: {"v4": {"reserved": 8}}})
    changed = SimulatorConfig().updated({"quota": {ZONE_B: {"v4": {"spot": 8}}, "reservations": {"r": 4}}})
    assert changed.quota == {ZONE_B: {"v4": {"spot": 8}}, "reservations": {"r": 4}}
    assert changed.to_json()["quota"] == changed.quota


@pytest.mark.parametrize(
    ("location", "pool", "quota_id", "dimensions"),
    [
        ("us-east5", PoolKey("v6e", "spot", "us-east5"), "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "region"),
        (ZONE_B, PoolKey("v4", "spot", REGION), "TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI", "zone"),
        (ZONE_B, PoolKey("v4", "on-demand", REGION), "TPUV4sPodPerProjectPerZoneForTPUAPI", "zone"),
    ],
)
def test_a_quota_refusal_names_the_zonal_or_regional_preemptible_or_not_quota(
    location: str, pool: PoolKey, quota_id: str, dimensions: str
) -> None:
    """nodes.create's 429 as Google sends it: the quota id, its limit and where, in the message,
    the QuotaFailure and the ErrorInfo."""
    error = Fault.parse(429, quota=True).error(PROJECT, location, pool, 0).to_json()["error"]
    assert error["message"].startswith(f"Quota limit '{quota_id}' has been exceeded. Limit: 0 in {dimensions} ")
    info, failure = error["details"]
    assert info["metadata"]["quota_limit"] == quota_id and info["metadata"]["quota_location"] == location
    assert info["metadata"]["consumer"] == f"projects/{project_number(PROJECT)}"
    (violation,) = failure["violations"]
    assert violation["quotaId"] == quota_id and violation["quotaDimensions"] == {dimensions: location}
