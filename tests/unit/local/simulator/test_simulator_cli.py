"""`python -m tpujobs.local.simulator`: its options are SimulatorConfig's, with the same defaults."""

from __future__ import annotations

import dataclasses

import pytest

from tpujobs.local.simulator import SimulatorConfig
from tpujobs.local.simulator.__main__ import config_from_args, main, parse_args


def test_no_options_give_the_default_config() -> None:
    """Every option's default is the config's own."""
    assert config_from_args(parse_args([])) == SimulatorConfig()


def test_every_number_of_the_config_is_an_option() -> None:
    """A config field becomes --field-name, parsed with its default's type; collections have their own."""
    numbers = [
        f.name for f in dataclasses.fields(SimulatorConfig) if f.name not in ("capacity", "api_error_codes", "quota")
    ]
    argv = [arg for name in numbers for arg in ("--" + name.replace("_", "-"), "7")]
    config = config_from_args(parse_args([*argv, "--api-error-rate", "0.5", "--capacity", "v4@us-central2-b=32"]))
    assert all(getattr(config, name) == 7 for name in numbers if name != "api_error_rate")
    assert config.api_error_rate == 0.5 and dict(config.capacity) == {"v4@us-central2-b": 32}
    assert config.api_error_codes == SimulatorConfig().api_error_codes
    assert config_from_args(parse_args(["--api-error-code", "UNAVAILABLE"])).api_error_codes == ("UNAVAILABLE",)


def test_quota_options_make_the_config_quotas_document() -> None:
    """--quota LOCATION/FAMILY[/TIER]=CHIPS (no tier: on-demand) and reservations/NAME=CHIPS."""
    argv = [
        "--quota",
        "us-east5/v5p/spot=512",
        "--quota",
        "us-central2-b/v4=64",
        "--quota",
        "us-east5-a/v5p/reserved=8",
    ]
    config = config_from_args(parse_args([*argv, "--quota", "reservations/team-a=256"]))
    assert config.quota == {
        "us-east5": {"v5p": {"spot": 512}},
        "us-central2-b": {"v4": {"on-demand": 64}},
        "us-east5-a": {"v5p": {"reserved": 8}},
        "reservations": {"team-a": 256},
    }


@pytest.mark.parametrize(
    "value", ["v4@us-central2-b=32", "us-central2-b=8", "us-central2-b/v4/spot/x=8", "reservations/a/b=8"]
)
def test_a_quota_option_of_another_shape_is_a_usage_error(value: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--quota", value])


def test_a_quota_the_document_cannot_hold_names_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    """main() exits 2 with the document's problems: an unknown family, a regional reservation."""
    assert main(["--quota", "us-east5/v9/spot=8", "--quota", "us-east5/v5p/reserved=8"]) == 2
    error = capsys.readouterr().err
    assert "us-east5.v9: no such TPU family" in error and "us-east5.v5p.reserved: reservations are zonal" in error
