"""MEGASCALE_* where no `tpu-env` names a coordinator (a multislice on Compute Engine): slice 0's
worker 0 gives its address with its key request, every other host asks until it learns it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from agent_stubs import FakeMetadata

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import discover_identity
from tpujobs.agent.megascale import COORDINATOR_WAIT_SECONDS, key_with_slices
from tpujobs.agent.rest import Metadata

MULTISLICE = {"num_slices": 2, "queued_resource": "train-1-c1"}
SLICE_0 = {"instance/attributes/tpujobs-slice-id": "0"}
SLICE_1 = {"instance/attributes/tpujobs-slice-id": "1"}


@dataclass(frozen=True)
class Key:
    coordinator: str | None


class Control:
    """The control plane's key answers: the coordinator once `known`, and every address it was given."""

    def __init__(self, known_after: int = 0) -> None:
        self.asked: list[str | None] = []
        self.known_after = known_after

    def __call__(self, address: str | None) -> Key:
        self.asked.append(address)
        return Key("10.0.0.5" if len(self.asked) > self.known_after else None)


def test_slice_0_worker_0_gives_its_address_and_every_host_gets_the_slices_variables():
    with FakeMetadata(worker=0, **{"instance/network-interfaces/0/ip": "10.0.0.5", **SLICE_0}) as server:
        control = Control()
        key, env = key_with_slices(control, Metadata(server.base), MULTISLICE, 0, 0, {})
    assert control.asked == ["10.0.0.5"] and key.coordinator == "10.0.0.5"
    assert env == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.5:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_PORT": "8080",
        "MEGASCALE_SLICE_ID": "0",
    }


def test_another_host_asks_again_until_the_coordinator_is_known():
    slept: list[float] = []
    control = Control(known_after=3)
    with FakeMetadata(worker=1, **SLICE_1) as server:
        _, env = key_with_slices(control, Metadata(server.base), MULTISLICE, 1, 1, {}, sleep=slept.append)
    assert control.asked == [None] * 4 and len(slept) == 3
    assert env["MEGASCALE_SLICE_ID"] == "1" and env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.5:8080"


def test_a_coordinator_that_never_comes_stops_the_host_with_the_reason():
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with FakeMetadata(worker=1, **SLICE_1) as server, pytest.raises(AgentError, match="slice 0's worker 0 never asked"):
        key_with_slices(Control(known_after=10**6), Metadata(server.base), MULTISLICE, 1, 0, {}, sleep=sleep,
                        clock=lambda: now[0])  # fmt: skip
    assert now[0] >= COORDINATOR_WAIT_SECONDS


def test_a_single_slice_a_tpu_env_that_names_the_coordinator_or_a_tpu_api_node_asks_once_as_before():
    """Only a slice tpujobs names (`tpujobs-slice-id`, Compute Engine) waits for a coordinator."""
    given = {"MEGASCALE_COORDINATOR_ADDRESS": "10.1.1.1:8080", "MEGASCALE_SLICE_ID": "1"}
    with FakeMetadata(worker=0, **SLICE_0) as server, FakeMetadata(worker=0) as tpu_node:
        for config, megascale in (({"num_slices": 1}, {}), (MULTISLICE, given)):
            control = Control(known_after=10**6)
            _, env = key_with_slices(control, Metadata(server.base), config, 0, 0, megascale)
            assert control.asked == [None] and env == megascale
        for config, megascale in ((MULTISLICE, {}),):
            control = Control(known_after=10**6)
            _, env = key_with_slices(control, Metadata(tpu_node.base), config, 0, 0, megascale)
            assert control.asked == [None] and env == megascale


def test_a_compute_engine_slice_is_named_by_its_templates_metadata():
    extra = {"instance/attributes/tpujobs-slice-id": "3"}
    with FakeMetadata(worker=2, node_id="ignored", **extra) as server:
        assert discover_identity(Metadata(server.base), MULTISLICE) == (2, 3)
