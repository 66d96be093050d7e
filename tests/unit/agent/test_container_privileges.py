"""A job's container runs unprivileged, with the TPU devices passed in, unless its spec asks for
`container.privileged` (and the host allows it)."""

from __future__ import annotations

import pytest
from agent_stubs import SETTINGS, a_job

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import check_config
from tpujobs.agent.containers import PRIVILEGED_VARIABLE, container_privileged, docker_run_argv
from tpujobs.domain.spec import SpecError
from tpujobs.engine.startup_script import agent_config

IMAGE = "us-docker.pkg.dev/p/repo/trainer:1"


def test_a_container_is_unprivileged_unless_the_spec_asks_and_the_host_allows() -> None:
    """No `privileged` in the config: never --privileged on a VM; asked: privileged, except on a simulated host."""
    assert container_privileged({}, {}) is False
    assert container_privileged({"privileged": False}, {}) is False
    assert container_privileged({"privileged": True}, {}) is True
    assert container_privileged({"privileged": True}, {PRIVILEGED_VARIABLE: "0"}) is False


def test_an_unprivileged_container_gets_the_tpu_devices_and_a_privileged_one_everything() -> None:
    """Unprivileged: a --device per TPU device node and no --privileged; privileged: --privileged alone."""
    devices = ["/dev/accel0", "/dev/vfio/0"]
    plain = docker_run_argv("docker", IMAGE, "n", [], [], None, "true", devices=devices)
    assert "--privileged" not in plain
    assert plain[plain.index("/dev/accel0") - 1] == "--device" and plain[plain.index("/dev/vfio/0") - 1] == "--device"
    asked = docker_run_argv("docker", IMAGE, "n", [], [], None, "true", privileged=True, devices=devices)
    assert "--privileged" in asked and "--device" not in asked


def test_the_spec_asks_for_a_privileged_container_with_an_image_only() -> None:
    """`container.privileged` reaches the agent's config (false by default); without an image it is refused."""
    assert agent_config(a_job(image=IMAGE), SETTINGS)["privileged"] is False
    asked = a_job(image=IMAGE, container={"privileged": True})
    assert agent_config(asked, SETTINGS)["privileged"] is True
    with pytest.raises(SpecError, match="container is only allowed with an image"):
        a_job(container={"privileged": True})


def test_the_agent_refuses_a_config_whose_privileged_is_not_a_boolean() -> None:
    """`privileged: "yes"` is no boolean: the config is unusable, not read as true."""
    config = agent_config(a_job(image=IMAGE), SETTINGS)
    assert check_config(dict(config))["privileged"] is False
    with pytest.raises(AgentError, match="'privileged' must be true or false"):
        check_config({**config, "privileged": "yes"})
