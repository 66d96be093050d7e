"""Contract section 1: every rule of a job spec, and the sentence a rejection gives.

A rejection's message is what the user reads in the `rejections` collection, so every
rejection test also checks that the message names the bad field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tpujobs.domain.spec import (
    ID_PATTERN,
    MAX_COMMAND_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ENV_VARS,
    MAX_LABELS,
    MAX_SPEC_BYTES,
    MAX_ZONES,
    JobSpec,
    SpecError,
    decode_spec,
    derive_job_id,
    parse_spec,
)

MESSAGE_ID = "4711000000000001"
_DROP = object()

MINIMAL: dict[str, Any] = {
    "name": "train",
    "owner": "alice@example.com",
    "accelerator_type": "v4-8",
    "command": "python train.py",
}

FULL: dict[str, Any] = {
    "job_id": "resnet-50-run-7",
    "name": "resnet-50",
    "owner": "alice@example.com",
    "accelerator_type": "v5litepod-16",
    "runtime_version": "v2-alpha-tpuv5-lite",
    "zones": ["us-west4-a", "us-east5-b"],
    "slices": 2,
    "capacity": "reserved",
    "reservation": "projects/p/reservations/r1",
    "priority": "high",
    "setup": "pip install -r requirements.txt",
    "command": "python train.py --epochs 3",
    "code_uri": "gs://my-bucket/code/resnet.tar.gz",
    "env": {"EPOCHS": "3", "WANDB_MODE": "offline", "EMPTY": ""},
    "on_preemption": "rerun",
    "on_error": "resume",
    "max_restarts": 7,
    "labels": {"team": "vision", "cost-center": "ml_42", "empty": ""},
}


def spec_with(**changes: Any) -> dict[str, Any]:
    """The minimal valid spec with some fields replaced; `_DROP` removes a field."""
    data = dict(MINIMAL)
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def rejection(data: Any, message_id: str | None = MESSAGE_ID) -> str:
    """The SpecError message parse_spec gives for `data`; fails the test if it accepts it."""
    with pytest.raises(SpecError) as info:
        parse_spec(data, message_id=message_id)
    return str(info.value)


def assert_names(message: str, field: str) -> None:
    assert field in message, f"the rejection {message!r} does not name {field!r}"


# --- required fields ------------------------------------------------------------------


@pytest.mark.parametrize("field", ["name", "owner", "accelerator_type", "command"])
def test_a_spec_without_a_required_field_is_rejected_naming_it(field: str) -> None:
    """name, owner, accelerator_type and command are required; the message names the missing one."""
    message = rejection(spec_with(**{field: _DROP}))
    assert_names(message, field)
    assert "required" in message


def test_the_minimal_spec_is_accepted_with_the_contract_defaults() -> None:
    """A spec of only the required fields gets every documented default."""
    spec = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    assert spec.runtime_version == "tpu-ubuntu2204-base"
    assert spec.zone is None and spec.zones is None
    assert spec.slices == 1
    assert spec.capacity == "on-demand"
    assert spec.priority == "medium"
    assert spec.setup is None and spec.code_uri is None
    assert spec.env == {} and spec.labels == {}
    assert spec.on_preemption == "resume"
    assert spec.on_error == "fail"
    assert spec.max_restarts == 5


def test_a_spec_without_job_id_and_without_a_message_id_is_rejected_naming_job_id() -> None:
    """With no message id to derive it from, job_id is required."""
    assert_names(rejection(MINIMAL, message_id=None), "job_id")


@pytest.mark.parametrize("field", ["name", "owner", "accelerator_type", "command", "slices"])
def test_a_required_or_typed_field_given_as_null_is_rejected_naming_it(field: str) -> None:
    """A JSON null is not a value for a field that has no null default."""
    assert_names(rejection(spec_with(**{field: None})), field)


# --- job_id and name ------------------------------------------------------------------

ACCEPTED_IDS = {
    "two_chars": "ab",
    "forty_chars": "a" * 40,
    "digits_and_dashes_inside": "a1-b2--c3",
    "ends_with_digit": "run7",
}
REJECTED_IDS = {
    "one_char": "a",
    "forty_one_chars": "a" * 41,
    "uppercase": "Train",
    "trailing_dash": "train-",
    "leading_digit": "7train",
    "leading_dash": "-train",
    "underscore": "tr_ain",
    "dot": "tr.ain",
    "empty": "",
    "trailing_newline": "train\n",
    "space": "tr ain",
}


@pytest.mark.parametrize("field", ["job_id", "name"])
@pytest.mark.parametrize("value", ACCEPTED_IDS.values(), ids=ACCEPTED_IDS.keys())
def test_an_id_matching_the_pattern_is_accepted(field: str, value: str) -> None:
    """job_id and name accept 2 to 40 lowercase letters, digits and inner dashes."""
    spec = parse_spec(spec_with(**{field: value}), message_id=MESSAGE_ID)
    assert getattr(spec, field) == value


@pytest.mark.parametrize("field", ["job_id", "name"])
@pytest.mark.parametrize("value", REJECTED_IDS.values(), ids=REJECTED_IDS.keys())
def test_an_id_not_matching_the_pattern_is_rejected_naming_the_field(field: str, value: str) -> None:
    """One char (the pattern needs a first and a last), 41 chars, uppercase, a trailing dash or a leading digit are
    rejected."""
    message = rejection(spec_with(**{field: value}))
    assert_names(message, field)
    assert ID_PATTERN in message


@pytest.mark.parametrize("field", ["job_id", "name"])
def test_an_id_that_is_not_a_string_is_rejected_naming_the_field(field: str) -> None:
    """A number is not an id, even though its digits would spell one."""
    assert_names(rejection(spec_with(**{field: 12345})), field)


# --- the derived job_id ---------------------------------------------------------------


def test_a_given_job_id_is_kept_whatever_the_message_id() -> None:
    """An explicit job_id is the idempotency key and is never replaced."""
    spec = parse_spec(spec_with(job_id="my-run"), message_id=MESSAGE_ID)
    assert spec.job_id == "my-run"


def test_a_derived_job_id_is_the_name_and_64_bits_of_a_hash_of_the_message_id() -> None:
    """Without job_id, it becomes `name-<16 hex>` from the message id: two never meet by chance."""
    spec = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    assert spec.job_id is not None
    assert re.fullmatch(r"train-[0-9a-f]{16}", spec.job_id)


def test_a_derived_job_id_of_the_longest_name_is_still_a_valid_job_id() -> None:
    """A 40-character name is cut so that the name, a dash and 16 hex digits fit in 40."""
    spec = parse_spec({**MINIMAL, "name": "a" * 40}, message_id=MESSAGE_ID)
    assert spec.job_id is not None and len(spec.job_id) == 40
    assert re.fullmatch(ID_PATTERN, spec.job_id)


def test_a_derived_job_id_is_stable_for_the_same_message_id() -> None:
    """A redelivered message derives the same job_id, so it is the same job."""
    first = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    again = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    assert first.job_id == again.job_id == derive_job_id("train", MESSAGE_ID)


def test_a_derived_job_id_differs_for_another_message_id() -> None:
    """Two submissions of the same spec are two jobs."""
    first = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    other = parse_spec(MINIMAL, message_id="4711000000000002")
    assert first.job_id != other.job_id


LONG_NAMES = {
    "forty_letters": "a" * 40,
    "dash_at_the_cut": "a" * 32 + "-" + "b" * 7,
    "dashes_before_the_cut": "a" + "-" * 38 + "b",
    "digits": "x" + "9" * 39,
    "two_chars": "ab",
}


@pytest.mark.parametrize("name", LONG_NAMES.values(), ids=LONG_NAMES.keys())
@pytest.mark.parametrize("message_id", ["1", MESSAGE_ID, "x" * 200, "ünïcode-id"])
def test_a_derived_job_id_always_matches_the_id_pattern(name: str, message_id: str) -> None:
    """Even a 40-char name, or one cut at a dash, derives a job_id of at most 40 valid chars."""
    spec = parse_spec(spec_with(name=name), message_id=message_id)
    assert spec.job_id is not None
    assert re.fullmatch(ID_PATTERN, spec.job_id), spec.job_id
    assert len(spec.job_id) <= 40


# --- accelerator_type -----------------------------------------------------------------


@pytest.mark.parametrize("accelerator_type", ["v4-8", "v5litepod-16", "v6e-8", "v2-8", "v3-32", "v5p-8", "v4-4096"])
def test_a_known_accelerator_type_is_accepted(accelerator_type: str) -> None:
    """Types the TPU API offers are accepted as given."""
    spec = parse_spec(spec_with(accelerator_type=accelerator_type), message_id=MESSAGE_ID)
    assert spec.accelerator_type == accelerator_type


REJECTED_ACCELERATORS = {
    "unknown_family": "v9-8",
    "other_family": "tpu-8",
    "gpu": "a100-8",
    "bad_size": "v4-7",
    "size_not_offered": "v5litepod-2",
    "zero_size": "v4-0",
    "leading_zero": "v4-08",
    "no_size": "v4",
    "uppercase": "V4-8",
    "garbage": "!!garbage!!",
    "empty": "",
}


@pytest.mark.parametrize("accelerator_type", REJECTED_ACCELERATORS.values(), ids=REJECTED_ACCELERATORS.keys())
def test_an_unknown_accelerator_type_is_rejected_naming_the_field(accelerator_type: str) -> None:
    """Unknown families, sizes not offered and garbage are rejected."""
    assert_names(rejection(spec_with(accelerator_type=accelerator_type)), "accelerator_type")


def test_an_accelerator_type_that_is_not_a_string_is_rejected_naming_the_field() -> None:
    """A number is not an accelerator type."""
    assert_names(rejection(spec_with(accelerator_type=8)), "accelerator_type")


def test_an_accelerator_type_with_a_trailing_newline_is_rejected() -> None:
    """'v4-8\\n' is not of the form FAMILY-SIZE; the TPU API would refuse it after acceptance."""
    assert_names(rejection(spec_with(accelerator_type="v4-8\n")), "accelerator_type")


# --- zone and zones -------------------------------------------------------------------


def test_one_zone_is_accepted_and_preferred() -> None:
    """`zone` names the one zone to use."""
    spec = parse_spec(spec_with(zone="us-central2-b"), message_id=MESSAGE_ID)
    assert spec.preferred_zones == ("us-central2-b",)


def test_zones_are_accepted_in_order_of_preference() -> None:
    """`zones` keeps the order the user gave."""
    spec = parse_spec(spec_with(zones=["us-east5-b", "us-west4-a"]), message_id=MESSAGE_ID)
    assert spec.preferred_zones == ("us-east5-b", "us-west4-a")


def test_both_zone_and_zones_are_rejected_naming_both() -> None:
    """Either one zone or a list, not both."""
    message = rejection(spec_with(zone="us-central2-b", zones=["us-east5-b"]))
    assert_names(message, "zone")
    assert_names(message, "zones")


def test_zones_listing_a_zone_twice_are_rejected_naming_zones() -> None:
    """Duplicate zones are an error, not silently merged."""
    assert_names(rejection(spec_with(zones=["us-east5-b", "us-east5-b"])), "zones")


@pytest.mark.parametrize(
    "zones",
    [[], [f"us-east{i}-a" for i in range(1, MAX_ZONES + 2)], ["us-east5"], "us-east5-b"],
    ids=["empty", "too_many", "malformed_entry", "not_a_list"],
)
def test_a_bad_zones_list_is_rejected_naming_zones(zones: Any) -> None:
    """zones is a non-empty list of at most MAX_ZONES well-formed zones."""
    assert_names(rejection(spec_with(zones=zones)), "zones")


@pytest.mark.parametrize("zone", ["us-central2", "US-CENTRAL2-B", "", 5])
def test_a_malformed_zone_is_rejected_naming_zone(zone: Any) -> None:
    """zone must look like region-zone, such as us-central2-b."""
    assert_names(rejection(spec_with(zone=zone)), "zone")


# --- slices ---------------------------------------------------------------------------


@pytest.mark.parametrize("slices", [1, 2, 64])
def test_slices_from_1_to_64_are_accepted(slices: int) -> None:
    """1 is a single slice; up to 64 is a multislice request."""
    assert parse_spec(spec_with(slices=slices), message_id=MESSAGE_ID).slices == slices


@pytest.mark.parametrize(
    "slices",
    [0, -1, 65, True, False, "2", 2.0, [2]],
    ids=["zero", "negative", "sixty_five", "true", "false", "string", "float", "list"],
)
def test_slices_out_of_range_or_not_an_integer_are_rejected_naming_slices(slices: Any) -> None:
    """Strict types: a bool, "2" or 2.0 is not a slice count."""
    assert_names(rejection(spec_with(slices=slices)), "slices")


# --- capacity, reservation and priority -----------------------------------------------


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_on_demand_and_spot_capacity_are_accepted_without_a_reservation(capacity: str) -> None:
    """Only reserved capacity needs a reservation."""
    assert parse_spec(spec_with(capacity=capacity), message_id=MESSAGE_ID).capacity == capacity


def test_reserved_capacity_with_a_reservation_is_accepted() -> None:
    """capacity reserved names the reservation to draw from."""
    spec = parse_spec(spec_with(capacity="reserved", reservation="r1"), message_id=MESSAGE_ID)
    assert (spec.capacity, spec.reservation) == ("reserved", "r1")


@pytest.mark.parametrize("capacity", ["preemptible", "Spot", "", 1])
def test_an_unknown_capacity_is_rejected_naming_capacity(capacity: Any) -> None:
    """capacity is one of on-demand, spot, reserved."""
    assert_names(rejection(spec_with(capacity=capacity)), "capacity")


def test_reserved_capacity_without_a_reservation_is_accepted_as_any_reservation() -> None:
    """capacity reserved alone means any matching reservation of the project (gcloud's --reserved)."""
    spec = parse_spec(spec_with(capacity="reserved"), message_id=MESSAGE_ID)
    assert (spec.capacity, spec.reservation) == ("reserved", None)


@pytest.mark.parametrize("capacity", ["on-demand", "spot", _DROP])
def test_a_reservation_without_reserved_capacity_is_rejected_naming_reservation(
    capacity: Any,
) -> None:
    """A reservation is only meaningful with capacity reserved."""
    assert_names(rejection(spec_with(capacity=capacity, reservation="r1")), "reservation")


@pytest.mark.parametrize("reservation", ["", "-r1", "r 1"])
def test_a_malformed_reservation_is_rejected_naming_reservation(reservation: str) -> None:
    """A reservation name must be a plain resource name."""
    message = rejection(spec_with(capacity="reserved", reservation=reservation))
    assert_names(message, "reservation")


@pytest.mark.parametrize("priority", ["very-low", "low", "medium", "high", "very-high"])
def test_every_priority_of_the_enum_is_accepted(priority: str) -> None:
    """priority is one of five levels."""
    assert parse_spec(spec_with(priority=priority), message_id=MESSAGE_ID).priority == priority


@pytest.mark.parametrize("priority", ["urgent", "HIGH", "very_high", "", 3])
def test_an_unknown_priority_is_rejected_naming_priority(priority: Any) -> None:
    """Anything outside the five levels is rejected."""
    assert_names(rejection(spec_with(priority=priority)), "priority")


# --- command, setup, code_uri, owner, runtime_version ---------------------------------


@pytest.mark.parametrize(
    "command",
    ["", "   \n", "python\x00train.py", "x" * (MAX_COMMAND_CHARS + 1), ["python", "train.py"]],
    ids=["empty", "blank", "nul", "too_long", "list"],
)
def test_a_bad_command_is_rejected_naming_command(command: Any) -> None:
    """command is a non-blank string without NUL, at most MAX_COMMAND_CHARS."""
    assert_names(rejection(spec_with(command=command)), "command")


@pytest.mark.parametrize(
    "setup",
    ["pip install\x00x", "x" * (MAX_COMMAND_CHARS + 1), 1],
    ids=["nul", "too_long", "number"],
)
def test_a_bad_setup_is_rejected_naming_setup(setup: Any) -> None:
    """setup follows the same text rules as command."""
    assert_names(rejection(spec_with(setup=setup)), "setup")


@pytest.mark.parametrize(
    "code_uri",
    ["https://example.com/code.tar.gz", "gs://", "/local/dir", "gs://Bucket/x", "gs://b/\x01"],
)
def test_a_code_uri_that_is_not_a_gs_uri_is_rejected_naming_code_uri(code_uri: str) -> None:
    """code_uri is a gs:// tarball or prefix."""
    assert_names(rejection(spec_with(code_uri=code_uri)), "code_uri")


@pytest.mark.parametrize("owner", ["", " alice", "alice smith", "a" * 129, 42])
def test_a_malformed_owner_is_rejected_naming_owner(owner: Any) -> None:
    """owner is a plain identity such as an email or user name."""
    assert_names(rejection(spec_with(owner=owner)), "owner")


@pytest.mark.parametrize("runtime_version", ["", "Tpu-Ubuntu", "tpu ubuntu", "a" * 64])
def test_a_malformed_runtime_version_is_rejected_naming_it(runtime_version: str) -> None:
    """runtime_version is a TPU software version name."""
    assert_names(rejection(spec_with(runtime_version=runtime_version)), "runtime_version")


# --- env ------------------------------------------------------------------------------


def test_env_names_and_string_values_are_accepted() -> None:
    """Names ^[A-Z_][A-Z0-9_]*$ with string values, empty ones included."""
    env = {"EPOCHS": "3", "_PRIVATE": "", "A1_B2": "x=y z", "JAX_FLAGS": "--x 'q'"}
    assert parse_spec(spec_with(env=env), message_id=MESSAGE_ID).env == env


REJECTED_ENVS = {
    "reserved_prefix": {"TPUJOBS_JOB_ID": "mine"},
    "reserved_prefix_alone": {"TPUJOBS_": "x"},
    "lowercase_name": {"epochs": "3"},
    "leading_digit": {"1EPOCH": "3"},
    "dash_in_name": {"MY-VAR": "3"},
    "empty_name": {"": "3"},
    "space_in_name": {"MY VAR": "3"},
    "non_string_value": {"EPOCHS": 3},
    "null_value": {"EPOCHS": None},
    "nul_in_value": {"EPOCHS": "3\x00; rm -rf /"},
    "value_too_long": {"BIG": "x" * (MAX_ENV_VALUE_CHARS + 1)},
    "too_many_variables": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)},
    "not_a_map": ["EPOCHS=3"],
}


@pytest.mark.parametrize("env", REJECTED_ENVS.values(), ids=REJECTED_ENVS.keys())
def test_a_bad_env_is_rejected_naming_env(env: Any) -> None:
    """The reserved TPUJOBS_ prefix, bad names, non-strings and NUL in values are rejected."""
    assert_names(rejection(spec_with(env=env)), "env")


def test_an_env_name_with_a_trailing_newline_is_rejected() -> None:
    """'EPOCHS\\n' does not match ^[A-Z_][A-Z0-9_]*$ and must not reach a worker's environment."""
    assert_names(rejection(spec_with(env={"EPOCHS\n": "3"})), "env")


# --- labels ---------------------------------------------------------------------------


def test_gcp_style_labels_are_accepted() -> None:
    """Lowercase keys starting with a letter; lowercase values, possibly empty."""
    labels = {"team": "vision", "cost-center": "ml_42", "k" * 63: "v" * 63, "empty": ""}
    assert parse_spec(spec_with(labels=labels), message_id=MESSAGE_ID).labels == labels


REJECTED_LABELS = {
    "uppercase_key": {"Team": "x"},
    "key_leading_digit": {"1team": "x"},
    "key_leading_dash": {"-team": "x"},
    "empty_key": {"": "x"},
    "key_too_long": {"k" * 64: "x"},
    "reserved_key_prefix": {"tpujobs-job": "x"},
    "reserved_key_exact": {"tpujobs": "x"},
    "uppercase_value": {"team": "Vision"},
    "value_with_dot": {"team": "a.b"},
    "value_too_long": {"team": "v" * 64},
    "non_string_value": {"team": 1},
    "too_many_labels": {f"k{i}": "" for i in range(MAX_LABELS + 1)},
    "not_a_map": ["team=x"],
}


@pytest.mark.parametrize("labels", REJECTED_LABELS.values(), ids=REJECTED_LABELS.keys())
def test_a_bad_label_is_rejected_naming_labels(labels: Any) -> None:
    """Labels follow GCP's rules, and the tpujobs key prefix is reserved."""
    assert_names(rejection(spec_with(labels=labels)), "labels")


@pytest.mark.parametrize(
    "labels",
    [{"team\n": "x"}, {"team": "x\n"}],
    ids=["key_trailing_newline", "value_trailing_newline"],
)
def test_a_label_with_a_trailing_newline_is_rejected(labels: dict[str, str]) -> None:
    """A trailing newline is not a lowercase letter, digit, _ or -; GCP would refuse the label later."""
    assert_names(rejection(spec_with(labels=labels)), "labels")


# --- on_preemption, on_error, max_restarts --------------------------------------------


@pytest.mark.parametrize("field", ["on_preemption", "on_error"])
@pytest.mark.parametrize("rule", ["resume", "rerun", "fail"])
def test_every_recovery_rule_is_accepted(field: str, rule: str) -> None:
    """on_preemption and on_error take resume, rerun or fail."""
    assert getattr(parse_spec(spec_with(**{field: rule}), message_id=MESSAGE_ID), field) == rule


@pytest.mark.parametrize("field", ["on_preemption", "on_error"])
@pytest.mark.parametrize("rule", ["retry", "Resume", "", None, 1])
def test_an_unknown_recovery_rule_is_rejected_naming_the_field(field: str, rule: Any) -> None:
    """Anything but resume, rerun or fail is rejected."""
    assert_names(rejection(spec_with(**{field: rule})), field)


@pytest.mark.parametrize("max_restarts", [0, 5, 100])
def test_max_restarts_from_0_to_100_are_accepted(max_restarts: int) -> None:
    """0 means never restart; 100 is the most."""
    spec = parse_spec(spec_with(max_restarts=max_restarts), message_id=MESSAGE_ID)
    assert spec.max_restarts == max_restarts


@pytest.mark.parametrize(
    "max_restarts",
    [-1, 101, True, "5", 5.0],
    ids=["negative", "hundred_one", "bool", "string", "float"],
)
def test_max_restarts_out_of_range_or_not_an_integer_are_rejected(max_restarts: Any) -> None:
    """max_restarts is a strict integer from 0 to 100."""
    assert_names(rejection(spec_with(max_restarts=max_restarts)), "max_restarts")


# --- unknown fields -------------------------------------------------------------------


@pytest.mark.parametrize("field", ["gpu_count", "Name", "code_dir", "jobId"])
def test_an_unknown_field_is_rejected_naming_it(field: str) -> None:
    """Unknown fields are an error, not ignored (a typo must not be silently dropped)."""
    message = rejection(spec_with(**{field: "x"}))
    assert_names(message, repr(field))
    assert "not part of a job spec" in message


def test_several_bad_fields_are_all_named_in_one_message() -> None:
    """The user sees every problem at once, not one per resubmission."""
    message = rejection(spec_with(slices=0, priority="urgent", owner=_DROP))
    for field in ("slices", "priority", "owner"):
        assert_names(message, field)


# --- the message bytes ----------------------------------------------------------------


def test_a_spec_of_exactly_the_size_limit_is_accepted() -> None:
    """MAX_SPEC_BYTES is inclusive."""
    raw = json.dumps(MINIMAL).encode()
    raw = raw[:-1] + b" " * (MAX_SPEC_BYTES - len(raw)) + b"}"
    assert len(raw) == MAX_SPEC_BYTES
    assert decode_spec(raw, message_id=MESSAGE_ID).name == "train"


def test_an_oversize_message_is_rejected_naming_the_size() -> None:
    """A message over MAX_SPEC_BYTES is rejected before it is parsed."""
    raw = json.dumps(spec_with(setup="x" * MAX_SPEC_BYTES)).encode()
    with pytest.raises(SpecError) as info:
        decode_spec(raw, message_id=MESSAGE_ID)
    assert str(len(raw)) in str(info.value)
    assert str(MAX_SPEC_BYTES) in str(info.value)


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b'{"name": "tr\xe9in"}', b'{"a": "\xed\xa0\x80"}'])
def test_a_message_that_is_not_utf8_is_rejected_saying_so(raw: bytes) -> None:
    """Latin-1 bytes, a BOM-like prefix or an encoded surrogate are not UTF-8."""
    with pytest.raises(SpecError, match="UTF-8"):
        decode_spec(raw, message_id=MESSAGE_ID)


@pytest.mark.parametrize("raw", [b"", b"name: train", b"{'name': 'train'}", b'{"name": "train",}'])
def test_a_message_that_is_not_json_is_rejected_saying_so(raw: bytes) -> None:
    """YAML, Python literals and trailing commas are not JSON."""
    with pytest.raises(SpecError, match="not JSON"):
        decode_spec(raw, message_id=MESSAGE_ID)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"[]", "list"),
        (b'["train"]', "list"),
        (b'"train"', "str"),
        (b"42", "int"),
        (b"4.2", "float"),
        (b"null", "NoneType"),
        (b"true", "bool"),
    ],
)
def test_a_json_value_that_is_not_an_object_is_rejected_saying_so(raw: bytes, kind: str) -> None:
    """A list, string, number or null is not a job spec; the message says what it got."""
    with pytest.raises(SpecError) as info:
        decode_spec(raw, message_id=MESSAGE_ID)
    assert "JSON object" in str(info.value)
    assert kind in str(info.value)


def test_deeply_nested_json_is_rejected_as_a_spec_error_not_a_crash() -> None:
    """A small but deeply nested message is a rejection, not a RecursionError that fails every delivery."""
    raw = b'{"name": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    assert len(raw) <= MAX_SPEC_BYTES
    with pytest.raises(SpecError):
        decode_spec(raw, message_id=MESSAGE_ID)


# --- round trip -----------------------------------------------------------------------


def test_a_full_spec_round_trips_through_its_document() -> None:
    """decode_spec -> to_document -> parse_spec gives an equal spec, every field kept."""
    spec = decode_spec(json.dumps(FULL).encode(), message_id=MESSAGE_ID)
    document = spec.to_document()
    assert set(document) == set(JobSpec.model_fields)
    assert {key: document[key] for key in FULL} == FULL
    again = parse_spec(document)
    assert again == spec
    assert decode_spec(json.dumps(document).encode()) == spec


def test_a_minimal_spec_round_trips_with_its_derived_job_id_and_defaults() -> None:
    """The stored document of a minimal spec parses back to the same spec, job_id included."""
    spec = decode_spec(json.dumps(MINIMAL).encode(), message_id=MESSAGE_ID)
    document = spec.to_document()
    assert document["job_id"] == spec.job_id
    assert parse_spec(document) == spec


def test_a_spec_is_immutable() -> None:
    """An accepted spec cannot be changed in place."""
    spec = parse_spec(MINIMAL, message_id=MESSAGE_ID)
    with pytest.raises(ValueError):
        spec.slices = 2  # type: ignore[misc]


# --- issue 11: secrets, service accounts, code digests, names Firestore cannot keep --------


def test_secrets_map_env_names_to_secret_references() -> None:
    """Short names, name@version and full resource names are all accepted."""
    spec = parse_spec(
        {
            **MINIMAL,
            "secrets": {
                "HF_TOKEN": "hf-token",
                "WANDB_API_KEY": "wandb@3",
                "OTHER": "projects/p/secrets/s/versions/latest",
            },
        },
        message_id=MESSAGE_ID,
    )
    assert spec.secrets["WANDB_API_KEY"] == "wandb@3"


@pytest.mark.parametrize(
    ("secrets", "fragment"),
    [
        ({"HF_TOKEN": "bad name!"}, "secret of HF_TOKEN"),
        ({"lower": "hf-token"}, "secrets name 'lower'"),
        ({"TPUJOBS_X": "hf-token"}, "reserved prefix"),
    ],
)
def test_a_bad_secret_reference_or_name_is_refused_naming_it(secrets: dict[str, str], fragment: str) -> None:
    """The sentence names the env name or the reference that is wrong."""
    with pytest.raises(SpecError, match=fragment):
        parse_spec({**MINIMAL, "secrets": secrets}, message_id=MESSAGE_ID)


def test_a_name_in_both_env_and_secrets_is_refused() -> None:
    """One variable, one source: which would win is never guessed."""
    with pytest.raises(SpecError, match="HF_TOKEN is in both env and secrets"):
        parse_spec({**MINIMAL, "env": {"HF_TOKEN": "x"}, "secrets": {"HF_TOKEN": "hf"}}, message_id=MESSAGE_ID)


@pytest.mark.parametrize(
    "account",
    ["123456789-compute@developer.gserviceaccount.com", "ada@example.com", "x@p.iam.gserviceaccount.com"],
)
def test_a_service_account_must_be_a_user_managed_account(account: str) -> None:
    """The Compute default, a person, or a too-short id is refused."""
    with pytest.raises(SpecError, match="service_account"):
        parse_spec({**MINIMAL, "service_account": account}, message_id=MESSAGE_ID)


def test_a_code_digest_needs_code_and_must_be_sha256_hex() -> None:
    """code_sha256 without code_uri, or not 64 lowercase hex digits, is refused."""
    digest = "a" * 64
    with pytest.raises(SpecError, match="code_sha256"):
        parse_spec({**MINIMAL, "code_sha256": digest}, message_id=MESSAGE_ID)
    with pytest.raises(SpecError, match="code_sha256"):
        parse_spec(
            {**MINIMAL, "code_uri": "gs://bucket-1/code/c.tar.gz", "code_sha256": "A" * 64}, message_id=MESSAGE_ID
        )
    spec = parse_spec(
        {**MINIMAL, "code_uri": "gs://bucket-1/code/c.tar.gz", "code_sha256": digest}, message_id=MESSAGE_ID
    )
    assert spec.code_sha256 == digest


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("__SECRET__", "reserved by Firestore"), ("A" * 1501, "over 1500 bytes")],
)
def test_env_names_firestore_cannot_keep_are_refused(name: str, fragment: str) -> None:
    """`__X__` map keys are Firestore's own, and a key may be at most 1,500 bytes."""
    with pytest.raises(SpecError, match=fragment):
        parse_spec({**MINIMAL, "env": {name: "1"}}, message_id=MESSAGE_ID)


def test_a_json_object_naming_a_key_twice_is_refused() -> None:
    """`{"command": "a", "command": "b"}` is refused: which one was meant cannot be known."""
    raw = b'{"name": "train", "owner": "ada", "accelerator_type": "v4-8", "command": "a", "command": "b"}'
    with pytest.raises(SpecError, match="names 'command' twice"):
        decode_spec(raw, message_id=MESSAGE_ID)
