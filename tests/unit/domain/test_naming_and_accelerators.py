"""Deterministic resource names, accelerator shapes and the restart backoff."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpujobs.domain.accelerators import (
    FAMILIES,
    UnknownAcceleratorType,
    parse_accelerator_type,
)
from tpujobs.domain.naming import (
    MAX_TPU_RESOURCE_ID,
    node_id,
    parse_queued_resource_name,
    queued_resource_name,
)
from tpujobs.domain.restart_rules import BACKOFF_CAP_SECONDS, backoff_seconds, rule_on_loss
from tpujobs.domain.spec import ID_PATTERN
from tpujobs.domain.states import JobState

TPU_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LONGEST_JOB_ID = "j" + "-" * 37 + "z9"  # 40 chars, dashes as dense as the pattern allows
MAX_ATTEMPT = 101  # the first attempt plus max_restarts (at most 100) restarts

_INNER = "abcdefghijklmnopqrstuvwxyz0123456789-"
job_ids = st.builds(
    lambda first, middle, last: first + middle + last,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text(alphabet=_INNER, max_size=38),
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"),
)


def is_tpu_resource_id(name: str) -> bool:
    return len(name) <= MAX_TPU_RESOURCE_ID and TPU_RESOURCE_ID.fullmatch(name) is not None


# --- queued resource names ------------------------------------------------------------


def test_a_queued_resource_is_named_job_id_dash_a_attempt() -> None:
    """`{job_id}-a{attempt}`, one name per attempt of a job."""
    assert queued_resource_name("train-1", 1) == "train-1-a1"
    assert queued_resource_name("train-1", 12) == "train-1-a12"


def test_the_same_job_and_attempt_always_give_the_same_name() -> None:
    """Names are deterministic, so a retried create finds the first request."""
    assert queued_resource_name("train-1", 3) == queued_resource_name("train-1", 3)
    assert queued_resource_name("train-1", 3) != queued_resource_name("train-1", 4)


@pytest.mark.parametrize("attempt", [1, 2, 9, 10, 99, 100, MAX_ATTEMPT])
@pytest.mark.parametrize("job_id", ["ab", "train-1", "a-a1", "x-a9-a", LONGEST_JOB_ID, "a" * 40])
def test_a_queued_resource_name_parses_back_to_its_job_and_attempt(job_id: str, attempt: int) -> None:
    """parse_queued_resource_name inverts queued_resource_name, even for ids containing '-a<digits>'."""
    name = queued_resource_name(job_id, attempt)
    assert parse_queued_resource_name(name) == (job_id, attempt)


@settings(database=None, max_examples=300, deadline=None)
@given(job_id=job_ids, attempt=st.integers(min_value=1, max_value=MAX_ATTEMPT))
def test_every_valid_job_id_and_attempt_round_trip(job_id: str, attempt: int) -> None:
    """Any id matching the job_id pattern and any reachable attempt give a valid, parseable name."""
    assert re.fullmatch(ID_PATTERN, job_id)
    name = queued_resource_name(job_id, attempt)
    assert is_tpu_resource_id(name)
    assert parse_queued_resource_name(name) == (job_id, attempt)


def test_the_longest_job_id_at_attempt_101_is_a_valid_tpu_resource_id() -> None:
    """A 40-char job id and the last possible attempt still fit the TPU API's id rules."""
    assert len(LONGEST_JOB_ID) == 40 and re.fullmatch(ID_PATTERN, LONGEST_JOB_ID)
    name = queued_resource_name(LONGEST_JOB_ID, MAX_ATTEMPT)
    assert is_tpu_resource_id(name), name
    assert len(name) <= MAX_TPU_RESOURCE_ID


@pytest.mark.parametrize("slices", [2, 64])
def test_multislice_node_ids_of_the_longest_name_are_valid_tpu_resource_ids(slices: int) -> None:
    """Per-slice node ids of the longest queued resource still fit the TPU API's rules."""
    queued = queued_resource_name(LONGEST_JOB_ID, MAX_ATTEMPT)
    ids = [node_id(queued, index, slices) for index in range(slices)]
    assert all(is_tpu_resource_id(i) for i in ids)
    assert len(set(ids)) == slices


def test_a_single_slice_node_is_named_like_its_queued_resource() -> None:
    """With one slice the node id is the queued resource's name."""
    assert node_id("train-1-a2", 0, 1) == "train-1-a2"


@pytest.mark.parametrize("attempt", [0, -1])
def test_an_attempt_below_one_is_rejected(attempt: int) -> None:
    """Attempts count from 1."""
    with pytest.raises(ValueError, match="attempt"):
        queued_resource_name("train-1", attempt)


@pytest.mark.parametrize("job_id", ["Train", "train_1", "1train", "x" * 62])
def test_a_name_that_is_no_valid_tpu_resource_id_is_rejected(job_id: str) -> None:
    """queued_resource_name refuses to make a name the TPU API would refuse."""
    with pytest.raises(ValueError):
        queued_resource_name(job_id, 1)


@pytest.mark.parametrize(
    "name",
    ["train-1", "train-1-a0", "train-1-a", "-a1", "a1", "Train-a1", "train-a01", "my-tpu-vm", ""],
)
def test_a_name_tpujobs_did_not_make_parses_to_none(name: str) -> None:
    """Anyone else's queued resource is not mistaken for a job's."""
    assert parse_queued_resource_name(name) is None


# --- accelerator shapes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator_type", "chips", "hosts"),
    [
        ("v4-8", 4, 1),
        ("v4-16", 8, 2),
        ("v4-32", 16, 4),
        ("v5litepod-1", 1, 1),
        ("v5litepod-4", 4, 1),
        ("v5litepod-8", 8, 1),
        ("v5litepod-16", 16, 4),
        ("v6e-8", 8, 1),
        ("v6e-256", 256, 64),
        ("v2-8", 4, 1),
        ("v2-32", 16, 4),
        ("v3-8", 4, 1),
        ("v5p-8", 4, 1),
        ("v5p-16", 8, 2),
    ],
)
def test_an_accelerator_type_has_its_chips_and_worker_hosts(accelerator_type: str, chips: int, hosts: int) -> None:
    """Cores count for v2-v5p (two per chip), chips for v5e/v6e; four chips per multi-host host."""
    shape = parse_accelerator_type(accelerator_type)
    assert (shape.chips, shape.hosts) == (chips, hosts)
    assert shape.chips_per_host * shape.hosts == shape.chips
    assert shape.family == accelerator_type.split("-")[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_offered_size_splits_evenly_into_hosts(family: str) -> None:
    """No shape leaves a host with a fraction of a chip or more than 8 chips."""
    for size in FAMILIES[family].sizes:
        shape = parse_accelerator_type(f"{family}-{size}")
        assert shape.hosts >= 1
        assert shape.chips == shape.chips_per_host * shape.hosts
        assert shape.chips_per_host <= 8


@pytest.mark.parametrize(
    ("accelerator_type", "why"),
    [
        ("v9-8", "unknown TPU family"),
        ("v4-7", "not offered with size 7"),
        ("v5litepod-2", "not offered with size 2"),
        ("garbage", "not of the form"),
        ("", "not of the form"),
        ("v4-", "not of the form"),
    ],
)
def test_an_unknown_accelerator_type_says_why(accelerator_type: str, why: str) -> None:
    """Each rejection is a sentence naming accelerator_type and the reason."""
    with pytest.raises(UnknownAcceleratorType, match=why) as info:
        parse_accelerator_type(accelerator_type)
    assert "accelerator_type" in str(info.value)


# --- restart rules and backoff --------------------------------------------------------


def test_backoff_is_zero_before_any_restart_and_for_the_first() -> None:
    """The first attempt does not wait, nor does the first restart: preemption is not the job's fault."""
    assert backoff_seconds(0) == 0.0
    assert backoff_seconds(1) == 0.0


def test_backoff_doubles_from_one_second() -> None:
    """Then 1 s, 2 s, 4 s, 8 s, ..."""
    assert [backoff_seconds(n) for n in range(1, 7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_backoff_is_monotone_and_capped_at_half_a_minute() -> None:
    """Never shrinks with more restarts, never exceeds the cap, and reaches it."""
    delays = [backoff_seconds(n) for n in range(0, MAX_ATTEMPT + 1)]
    assert delays == sorted(delays)
    assert max(delays) == BACKOFF_CAP_SECONDS == 30.0
    assert all(0.0 <= d <= BACKOFF_CAP_SECONDS for d in delays)


@pytest.mark.parametrize(
    ("rule", "restarts", "max_restarts", "to_state", "resume"),
    [
        ("fail", 0, 5, JobState.FAILED, False),
        ("resume", 0, 5, JobState.RECOVERING, True),
        ("rerun", 4, 5, JobState.RECOVERING, False),
        ("resume", 5, 5, JobState.FAILED, False),
        ("rerun", 0, 0, JobState.FAILED, False),
    ],
)
def test_the_restart_rule_decides_between_recovering_and_failed(
    rule: str, restarts: int, max_restarts: int, to_state: JobState, resume: bool
) -> None:
    """fail always fails; resume and rerun recover while restarts are left."""
    ruling = rule_on_loss(rule, restarts, max_restarts, "The capacity was lost")
    assert (ruling.to_state, ruling.resume) == (to_state, resume)
    assert ruling.reason.startswith("The capacity was lost")
