"""The local stack's push subscriptions have production's shape: infra/pubsub.tf, evaluated
for one deployment, builds the very Subscription that `tpujobs.local.wiring` creates in the
emulator, but for the minimum backoff (1 s locally, 10 s deployed).

Terraform is read as data (terraform_config); the few expressions the push subscription
uses are evaluated here for a made-up project, prefix and function URLs, and each must be
exactly the expression expected, so a change to infra/pubsub.tf that this file does not
know about fails instead of passing unnoticed.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from terraform_config import Terraform, block, render

from tpujobs.engine import topology
from tpujobs.local import wiring

PROJECT = "my-project"
PREFIX = "t1-"
CLOUDEVENT_ROUTES = [route for route in topology.FUNCTIONS if route.topic is not None]
# Cloud Run's `service_config[0].uri` of each function: https, no path, no trailing slash.
URLS = {
    route.target: f"https://{PREFIX}{route.target.replace('_', '-')}-abc123-uc.a.run.app"
    for route in topology.FUNCTIONS
}
URI = "${google_cloudfunctions2_function.function[each.key].service_config[0].uri}"
# Every argument the push subscription sets; one more (a filter, a BigQuery config) must be
# mirrored in wiring.route_subscription and evaluated below before this test passes.
KNOWN_ARGUMENTS = {
    "for_each",
    "name",
    "topic",
    "ack_deadline_seconds",
    "message_retention_duration",
    "push_config",
    "retry_policy",
    "dynamic",
    "expiration_policy",
}


def _seconds(text: str) -> timedelta:
    """A Terraform duration such as "10s" or "604800s"."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", text)
    assert match, f"not a duration in seconds: {text!r}"
    return timedelta(seconds=float(match[1]))


def _topic_id(tf: Terraform, base: str) -> str:
    """`google_pubsub_topic.topic[base].id`: projects/P/topics/NAME, NAME as infra names it."""
    name = render(tf.resource("google_pubsub_topic", "topic")["name"], {"var.prefix": PREFIX, "each.key": base})
    return f"projects/{PROJECT}/topics/{name}"


def _push_account(tf: Terraform) -> str:
    """`google_service_account.push.email`: the account id at the project's IAM domain."""
    account_id = render(tf.resource("google_service_account", "push")["account_id"], {"var.prefix": PREFIX})
    return f"{account_id}@{PROJECT}.iam.gserviceaccount.com"


def terraform_subscription(tf: Terraform, target: str) -> Any:
    """The google.pubsub_v1.Subscription infra/pubsub.tf declares for one function."""
    from google.pubsub_v1 import (
        DeadLetterPolicy,
        ExpirationPolicy,
        PushConfig,
        RetryPolicy,
        Subscription,
    )

    body = tf.resource("google_pubsub_subscription", "push")
    function = tf.locals["functions"][target]
    each = {"var.prefix": PREFIX, "each.value.topic": function["topic"], "each.key": target}

    assert body["topic"] == "${google_pubsub_topic.topic[each.value.topic].id}"
    deadline = re.fullmatch(r"\$\{min\(each\.value\.timeout, (\d+)\)\}", body["ack_deadline_seconds"])
    assert deadline, body["ack_deadline_seconds"]

    push = block(body, "push_config")
    assert set(push) == {"push_endpoint", "oidc_token"}, push
    assert push["push_endpoint"] == URI
    token = block(push, "oidc_token")
    assert token == {"service_account_email": "${google_service_account.push.email}", "audience": URI}

    retry = block(body, "retry_policy")
    assert retry == {"minimum_backoff": "${local.minimum_backoff}", "maximum_backoff": "${local.maximum_backoff}"}

    (dynamic,) = [d["dead_letter_policy"] for d in body["dynamic"] if "dead_letter_policy" in d]
    assert dynamic["for_each"] == "${each.value.topic == local.dead_letter_topic ? [] : [1]}"
    content = block(dynamic, "content")
    assert content == {
        "dead_letter_topic": "${google_pubsub_topic.topic[local.dead_letter_topic].id}",
        "max_delivery_attempts": "${local.max_delivery_attempts}",
    }
    dead_letters = function["topic"] != tf.locals["dead_letter_topic"]

    assert block(body, "expiration_policy") == {"ttl": ""}  # "" is never
    return Subscription(
        name=f"projects/{PROJECT}/subscriptions/{render(body['name'], each)}",
        topic=_topic_id(tf, function["topic"]),
        push_config=PushConfig(
            push_endpoint=URLS[target],
            oidc_token=PushConfig.OidcToken(service_account_email=_push_account(tf), audience=URLS[target]),
        ),
        ack_deadline_seconds=min(function["timeout"], int(deadline[1])),
        retry_policy=RetryPolicy(
            minimum_backoff=_seconds(tf.locals["minimum_backoff"]),
            maximum_backoff=_seconds(tf.locals["maximum_backoff"]),
        ),
        dead_letter_policy=(
            DeadLetterPolicy(
                dead_letter_topic=_topic_id(tf, tf.locals["dead_letter_topic"]),
                max_delivery_attempts=tf.locals["max_delivery_attempts"],
            )
            if dead_letters
            else None
        ),
        message_retention_duration=_seconds(body["message_retention_duration"]),
        expiration_policy=ExpirationPolicy(),
    )


def test_the_push_subscription_sets_only_arguments_this_test_evaluates(tf: Terraform) -> None:
    """A new argument in infra/pubsub.tf must be added to the local wiring (and here) too."""
    assert set(tf.resource("google_pubsub_subscription", "push")) == KNOWN_ARGUMENTS


def test_terraform_and_the_local_stack_wire_the_same_functions(tf: Terraform) -> None:
    """One push subscription per cloudevent route, in both: the same targets, topics and deadlines."""
    declared = {target: f for target, f in tf.locals["functions"].items() if f["topic"] is not None}
    assert {target: (f["topic"], f["timeout"]) for target, f in declared.items()} == {
        route.target: (route.topic, route.timeout_s) for route in CLOUDEVENT_ROUTES
    }


@pytest.mark.parametrize("route", CLOUDEVENT_ROUTES, ids=lambda route: route.target)
def test_each_push_subscription_is_the_one_terraform_declares(tf: Terraform, route: topology.FunctionRoute) -> None:
    """Name, topic, bare-URL endpoint, OIDC account and audience, ack deadline, retention,
    expiry, retry and dead-letter policies: field for field, with production's backoff."""
    local = wiring.route_subscription(
        route, PROJECT, PREFIX, URLS[route.target], minimum_backoff_s=wiring.PRODUCTION_MINIMUM_BACKOFF_S
    )
    deployed = terraform_subscription(tf, route.target)
    assert type(local).to_dict(local) == type(deployed).to_dict(deployed)
    assert local == deployed


@pytest.mark.parametrize("route", CLOUDEVENT_ROUTES, ids=lambda route: route.target)
def test_the_local_stack_differs_only_in_its_minimum_backoff(tf: Terraform, route: topology.FunctionRoute) -> None:
    """What `tpujobs dev up` creates is production's subscription with a 1 s minimum backoff,
    pushing to the function's local URL as it is: no topic path added."""
    local_url = "http://127.0.0.1:8123/"  # as the stack names its functions
    local = wiring.route_subscription(route, PROJECT, PREFIX, local_url)
    deployed = terraform_subscription(tf, route.target)
    assert local.retry_policy.minimum_backoff == timedelta(seconds=wiring.LOCAL_MINIMUM_BACKOFF_S)
    assert local.push_config.push_endpoint == local.push_config.oidc_token.audience == local_url
    deployed.retry_policy.minimum_backoff = local.retry_policy.minimum_backoff
    deployed.push_config.push_endpoint = deployed.push_config.oidc_token.audience = local_url
    assert local == deployed


def test_the_push_subscription_name_gives_the_topic_back(tf: Terraform) -> None:
    """Every name Terraform gives is one the functions read their topic from, in this
    deployment only: the bare-URL push carries nothing else that names the topic."""
    for route in CLOUDEVENT_ROUTES:
        name = terraform_subscription(tf, route.target).name
        assert topology.route_of_subscription(name, PREFIX) == route
        assert topology.route_of_subscription(name, "") is None
        assert topology.route_of_subscription(name, "t2-") is None
