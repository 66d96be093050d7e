"""infra/ lets only admins publish to tpujobs-control (issue 26): its `owner` is a claim nobody
checks, so no invoker, function or VM account may publish there; users go through the jobs API."""

from __future__ import annotations

from terraform_config import Terraform

from tpujobs.engine import topology

CONTROL_TOPIC = f'${{google_pubsub_topic.topic["{topology.CONTROL}"].id}}'
# The publisher grants whose topic is an expression, and where that expression's topics come from.
DYNAMIC_TOPICS = {
    "function_publisher": "function publishes",
    "tpu_vm_publisher": "tpu_vm_publishes",
    "job_account_publisher": "tpu_vm_publishes",
    "dead_letter_publisher": "the dead-letter topic",
}


def test_only_admins_are_granted_publishing_on_the_control_topic(tf: Terraform) -> None:
    """One grant names tpujobs-control: publisher, for each of var.admins, as a user or service account."""
    grants = tf.of_kind("google_pubsub_topic_iam_member")
    on_control = {name for name, body in grants.items() if body["topic"] == CONTROL_TOPIC}
    assert on_control == {"control_publishers"}
    grant = grants["control_publishers"]
    assert grant["for_each"] == "${toset(var.admins)}" and grant["role"] == "roles/pubsub.publisher"
    assert '"serviceAccount:${each.key}"' in grant["member"] and '"user:${each.key}"' in grant["member"]
    assert not tf.of_kind("google_pubsub_topic_iam_binding") and not tf.of_kind("google_pubsub_topic_iam_policy")


def test_no_function_or_vm_account_publishes_to_the_control_topic(tf: Terraform) -> None:
    """The grants whose topic is computed reach only the topics their lists name, none of them control."""
    grants = tf.of_kind("google_pubsub_topic_iam_member")
    literal = {name for name, body in grants.items() if '["tpujobs-' in body["topic"]}
    assert set(grants) - literal == set(DYNAMIC_TOPICS)
    assert all(topology.CONTROL not in f["publishes"] for f in tf.locals["functions"].values())
    assert topology.CONTROL not in tf.locals["tpu_vm_publishes"]
    assert tf.locals["dead_letter_topic"] != topology.CONTROL
