"""The example specs in examples/ are valid: loaded as the CLI loads them (YAML, code_dir, --set),
then checked by parse_spec, as the submit function checks them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpujobs.cli.commands import checked_spec
from tpujobs.cli.common import Stop
from tpujobs.domain.accelerators import parse_accelerator_type
from tpujobs.domain.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MAXTEXT = EXAMPLES / "maxtext-multislice.yaml"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_loads_and_validates(path: Path) -> None:
    """Every examples/*.yaml passes the CLI's check (the same errors as submit)."""
    spec, _ = checked_spec(path, [])
    assert spec["name"] and spec["command"]


def test_the_maxtext_example_is_a_private_network_multislice_job_in_an_image() -> None:
    """The MaxText example asks for what a real team's multislice job needs, each field valid."""
    data, code_dir = checked_spec(MAXTEXT, [])
    assert code_dir is None  # the code is in the image
    spec = parse_spec(data, message_id="example")
    assert spec.slices == 2 and spec.hosts_per_slice == parse_accelerator_type("v5p-128").hosts == 16
    assert spec.image == "us-docker.pkg.dev/my-project/training/maxtext:2026-11" and spec.pull_policy == "if-missing"
    assert spec.internal_ips is True
    assert spec.network == "projects/my-project/global/networks/training"
    assert spec.subnetwork is not None and "/regions/us-east5/" in spec.subnetwork
    assert spec.zones == ["us-east5-a", "us-east5-c"] and spec.tags == ["tpu-training"]
    assert spec.topology == "4x4x4"
    assert set(spec.secrets) == {"HF_TOKEN", "WANDB_API_KEY"}
    assert spec.on_preemption == "resume"
    assert 'base_output_directory="$TPUJOBS_CHECKPOINT_URI"' in spec.command
    assert 'run_name="$TPUJOBS_JOB_ID"' in spec.command and "\n" not in spec.command


def test_the_cli_reports_a_broken_example_with_the_specs_sentence(tmp_path: Path) -> None:
    """The same loader refuses the example with a subnetwork of another region, naming it."""
    text = MAXTEXT.read_text(encoding="utf-8").replace("regions/us-east5/", "regions/us-central1/")
    broken = tmp_path / "broken.yaml"
    broken.write_text(text, encoding="utf-8")
    with pytest.raises(Stop) as stopped:
        checked_spec(broken, [])
    assert "subnetwork" in str(stopped.value) and "region us-central1" in str(stopped.value)


def test_set_gives_vm_options_their_yaml_types() -> None:
    """`--set internal_ips=true` is a boolean and `--set tags=[a,b]` a list, as in the file."""
    spec, _ = checked_spec(
        EXAMPLES / "hello.yaml", ["network=training", "internal_ips=true", "tags=[tpu-training, allow-ssh]"]
    )
    assert (spec["network"], spec["internal_ips"], spec["tags"]) == ("training", True, ["tpu-training", "allow-ssh"])
