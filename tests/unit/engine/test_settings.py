"""Settings.from_env: each field read once, from its variable, by pydantic-settings."""

from __future__ import annotations

import dataclasses

import pytest

from tpujobs.domain.vm_defaults import VmDefaults
from tpujobs.engine.settings import Settings

# A value of each field's type, as the environment spells it, and what it reads as.
TEXT = {str: ("text", "text"), bool: ("1", True), float: ("2.5", 2.5), int: ("7", 7), tuple: ("a, b", ("a", "b"))}
ELSEWHERE = {"project": "GOOGLE_CLOUD_PROJECT", "api_audiences": "TPUJOBS_API_AUDIENCE"}


def test_no_variable_set_gives_the_dataclass_defaults() -> None:
    """Unset and blank both mean the default; the logs bucket is named after the project."""
    expected = dataclasses.replace(Settings(), logs_bucket="tpujobs-local-tpujobs-logs")
    assert Settings.from_env({}) == expected
    assert Settings.from_env({"TPUJOBS_DEFAULT_ZONE": "  ", "TPUJOBS_HEARTBEAT_SECONDS": ""}) == expected


@pytest.mark.parametrize(
    "field", [f for f in dataclasses.fields(Settings) if f.name != "vm_defaults"], ids=lambda f: f.name
)
def test_every_field_is_read_from_its_variable(field: dataclasses.Field) -> None:
    """TPUJOBS_<FIELD> (or the variable Google's tools set) sets the field, typed."""
    kind = Settings.__annotations__[field.name]
    text, value = next(pair for name, pair in TEXT.items() if kind.startswith(name.__name__))
    variable = ELSEWHERE.get(field.name, f"TPUJOBS_{field.name.upper()}")
    assert getattr(Settings.from_env({variable: text}), field.name) == value


def test_the_report_key_is_never_in_the_repr() -> None:
    """The signing master key is read, and printing the settings does not show it."""
    settings = Settings.from_env({"TPUJOBS_REPORT_KEY": "k3y-never-printed"})
    assert settings.report_key == "k3y-never-printed" and "k3y" not in repr(settings)


@pytest.mark.parametrize(
    ("variable", "text", "expected"),
    [
        ("TPUJOBS_RECONCILE_SHARD_SIZE", "0", "must be a whole number, at least 1, got '0'"),
        ("TPUJOBS_RECORD_RETENTION_DAYS", "1.5", "must be a whole number of days, at least 1, got '1.5'"),
        ("TPUJOBS_PEER_SECONDS", "fast", "must be a number, got 'fast'"),
        ("TPUJOBS_LOCAL_STACK", "maybe", "must be true or false, got 'maybe'"),
        ("TPUJOBS_DEFAULT_INTERNAL_IPS", "2", "must be true or false, got '2'"),
    ],
)
def test_a_bad_value_names_its_variable_and_what_it_must_be(variable: str, text: str, expected: str) -> None:
    """A typo in a deployment variable stops the settings, with a message a person can act on."""
    with pytest.raises(ValueError, match=f"^{variable} {expected}$"):
        Settings.from_env({variable: text})


def test_gcloud_project_is_read_when_google_cloud_project_is_not_set() -> None:
    """GOOGLE_CLOUD_PROJECT wins; GCLOUD_PROJECT is the fallback, as before."""
    assert Settings.from_env({"GCLOUD_PROJECT": "p2"}).project == "p2"
    assert Settings.from_env({"GCLOUD_PROJECT": "p2", "GOOGLE_CLOUD_PROJECT": "p1"}).project == "p1"


def test_vm_defaults_come_from_their_own_variables() -> None:
    """TPUJOBS_DEFAULT_<FIELD> fills vm_defaults; a data disk is read-only unless it says otherwise."""
    settings = Settings.from_env({"TPUJOBS_DEFAULT_TAGS": "a,b", "TPUJOBS_DEFAULT_DATA_DISKS": "d1, d2:read-write"})
    assert settings.vm_defaults == VmDefaults(tags=("a", "b"), data_disks=(("d1", "read-only"), ("d2", "read-write")))
