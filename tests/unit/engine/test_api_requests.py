"""The jobs API's request models: each action's body fits its model, or a 400 names the field."""

from __future__ import annotations

import json

import pytest

from tpujobs.engine.jobs_api.answers import ApiError
from tpujobs.engine.jobs_api.requests import (
    REQUESTS,
    ListRequest,
    PoolCreateRequest,
    RestartRequest,
    parse_body,
    validated,
)


def refusal(body: dict) -> str:
    """The 400's sentence for a body that must be refused."""
    data = parse_body(json.dumps(body).encode())
    with pytest.raises(ApiError) as refused:
        validated(data.pop("action"), data)
    assert refused.value.status == 400
    return refused.value.message


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ({"action": "list", "state": "DONE"}, "'state' must be one of QUEUED, PROVISIONING"),
        ({"action": "list", "limit": True}, "'limit' must be a whole number from 1 to 1000."),
        ({"action": "list", "limit": "5"}, "'limit' must be a whole number from 1 to 1000."),
        ({"action": "list", "owner": ""}, "'owner' must be a non-empty string."),
        ({"action": "list", "sort": "age"}, "Unknown field 'sort' for list: it takes labels, limit, name_prefix"),
        ({"action": "describe"}, "'job_id' is required: the job's id as a string."),
        ({"action": "cancel", "job_id": 7}, "'job_id' is required"),
        ({"action": "cancel", "job_id": "a", "owner": "b"}, "The caller is never taken from the body"),
        ({"action": "label", "job_id": "a"}, "'labels' or 'remove' is required: what to change."),
        ({"action": "label", "job_id": "a", "remove": "x"}, "'remove' must be a list of label names."),
        ({"action": "resume", "job_id": "a", "request_id": "a b"}, "'request_id' must be 1 to 128 letters"),
        ({"action": "rerun", "job_id": "a", "overrides": [1]}, "'overrides' must be an object of fields"),
        ({"action": "quotas", "zone": "x"}, "Unknown field 'zone' for quotas: it takes nothing."),
        ({"action": "dead_letters", "topic": ""}, "'topic' must be a topic name such as tpujobs-submit."),
        ({"action": "pool-create", "owner": "x"}, "remove 'owner'; the caller owns the pool."),
        ({"action": "pool-create", "colour": "red"}, "Unknown field 'colour' for pool-create"),
        ({"action": "pool-describe"}, "'name' is required: the pool's name as a string."),
        ({"action": "pool-resize", "name": "demo", "count": True}, "'count' is required: the number of units"),
    ],
)
def test_a_body_that_does_not_fit_its_action_is_a_400_naming_the_field(body, sentence):
    """One sentence, naming the field; an unknown field is named before a bad one."""
    assert sentence in refusal(body)


def test_list_takes_any_case_states_and_defaults_what_is_missing():
    """States are upper-cased without repeats; a null `labels` is none; the limit defaults to 100."""
    request = validated("list", {"state": ["provisioning", "QUEUED", "Queued"], "labels": None})
    assert request == ListRequest(state=("PROVISIONING", "QUEUED"), labels={})
    assert request.limit == 100


def test_an_empty_request_id_or_overrides_is_none_as_before():
    """A retry key of "" is no key (the API makes one); null overrides change nothing."""
    assert validated("resume", {"job_id": "a", "request_id": "", "overrides": None}) == RestartRequest(job_id="a")


def test_pool_create_passes_only_the_fields_given_to_the_pools_rules():
    """The pool's values are checked by its own rules (the service's), so only the names are checked here."""
    request = validated("pool-create", {"name": "demo", "count": 0})
    assert isinstance(request, PoolCreateRequest)
    assert request.model_dump(exclude_unset=True) == {"name": "demo", "count": 0}


def test_submit_is_a_job_spec_left_to_the_spec_rules():
    """submit has no request model: its body is a job spec, returned as it came."""
    assert REQUESTS["submit"] is None
    assert validated("submit", {"name": "x", "owner": "y"}) == {"name": "x", "owner": "y"}
