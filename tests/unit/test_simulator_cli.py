"""`python -m tpujobs.local.simulator`: its options are SimulatorConfig's, with the same defaults."""

from __future__ import annotations

import dataclasses

from tpujobs.local.simulator import SimulatorConfig
from tpujobs.local.simulator.__main__ import config_from_args, parse_args


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
