"""infra/ lets only the intended publishers reach the topics whose handlers take unsigned
messages (issue 37): the audit-log sink alone publishes to tpujobs-qr-state, the functions that
publish status, log exports and reconcile shards alone publish those, and no job's VM account
may publish anywhere but to the two topics whose messages must carry its attempt's signature.
Every publisher grant is resolved to the topics it reaches; a grant this test cannot resolve
fails it, so a new one is looked at before it lands."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from terraform_config import Terraform

from tpujobs.engine import topology

# The handlers that check a signature (an attempt's key) before they read anything: a job's VM
# accounts publish there. Every other topic's handler takes what arrives unsigned.
SIGNED = {topology.WORKER_EVENTS, topology.PREEMPTION}
UNSIGNED = set(topology.ALL_TOPICS) - SIGNED
# Who may publish to each unsigned topic, by grant (`function:<target>` for the function grants).
# Cloud Scheduler publishes the reconcile tick as its service agent, by the role Google gives it.
FIXED = {
    topology.SUBMIT: {"submitters"},  # var.invokers: the owner they claim is marked unverified
    topology.CONTROL: {"control_publishers"},  # var.admins (test_control_topic)
    topology.QR_STATE: {"qr_state_sink_publisher"},  # the audit-log sink's writer identity
    topology.DEAD_LETTER: {"dead_letter_publisher"},  # Pub/Sub's service agent
}
TOPIC = re.compile(r'^\$\{google_pubsub_topic\.topic\["(?P<topic>[a-z-]+)"\]\.id\}$')
# Roles that hold pubsub.topics.publish on every topic when granted on the project.
PUBLISHING_ROLES = re.compile(r"^roles/(pubsub\.(publisher|editor|admin)|editor|owner)$")
PROJECT_GRANTS = ("google_project_iam_member", "google_project_iam_binding", "google_project_iam_policy")


def _publishers(tf: Terraform) -> dict[str, set[str]]:
    """Every topic -> the grants that let someone publish to it."""
    functions = tf.locals["functions"]
    found: dict[str, set[str]] = defaultdict(set)
    for name, grant in tf.of_kind("google_pubsub_topic_iam_member").items():
        assert grant["role"] == "roles/pubsub.publisher", f"{name}: a topic role other than publisher"
        literal = TOPIC.fullmatch(grant["topic"])
        each = grant.get("for_each")
        if literal is not None:
            found[literal["topic"]].add(name)
        elif (each, grant["topic"]) == (
            "${local.function_publishes}",
            "${google_pubsub_topic.topic[each.value.topic].id}",
        ):
            assert grant["member"] == "${google_service_account.function[each.value.target].member}", name
            assert "for topic in f.publishes" in tf.locals["function_publishes"], name
            for target, function in functions.items():
                for topic in function["publishes"]:
                    found[topic].add(f"function:{target}")
        elif each == "${toset(local.tpu_vm_publishes)}":
            assert grant["topic"] == "${google_pubsub_topic.topic[each.key].id}", name
            for topic in tf.locals["tpu_vm_publishes"]:
                found[topic].add(name)
        elif each == "${local.job_account_publishes}":
            assert grant["topic"] == "${google_pubsub_topic.topic[each.value.topic].id}", name
            pairs = tf.locals["job_account_publishes"]
            assert "setproduct(keys(var.job_service_accounts), local.tpu_vm_publishes)" in pairs, name
            for topic in tf.locals["tpu_vm_publishes"]:
                found[topic].add(name)
        elif grant["topic"] == "${google_pubsub_topic.topic[local.dead_letter_topic].id}":
            found[tf.locals["dead_letter_topic"]].add(name)
        else:
            raise AssertionError(f"publisher grant {name} reaches topics this test cannot tell: {grant['topic']}")
    return found


def _project_roles(tf: Terraform, grant: dict[str, Any]) -> list[str]:
    """Every role a project-level grant may give, as far as infra/ says it."""
    role = grant.get("role", "")
    custom = re.fullmatch(r"\$\{google_project_iam_custom_role\.(?P<name>[a-z_]+)\.id\}", role)
    if custom is not None:
        permissions = tf.resource("google_project_iam_custom_role", custom["name"])["permissions"]
        local = re.fullmatch(r"\$\{local\.(?P<name>[a-z_]+)\}", permissions) if isinstance(permissions, str) else None
        listed = tf.locals[local["name"]] if local is not None else permissions
        assert isinstance(listed, list), f"custom role {custom['name']}: permissions this test cannot read"
        return [f"permission:{p}" for p in listed]
    if role == "${each.value.firestore}":
        return [f["firestore"] for f in tf.locals["functions"].values()]
    if role == "${each.key}" and grant.get("for_each") == "${toset(local.build_roles)}":
        return list(tf.locals["build_roles"])
    assert not role.startswith("${"), f"a project role this test cannot tell: {role}"
    return [role]


def test_only_their_publishers_may_publish_to_the_topics_whose_handlers_take_unsigned_messages(tf: Terraform) -> None:
    """For each unsigned topic, the publisher grants are exactly the intended ones: the sink's
    writer on qr-state, the functions that publish status, log exports and shards, the users on
    submit, the admins on control, Pub/Sub's agent on dead letters; no VM account on any."""
    publishers = _publishers(tf)
    functions = tf.locals["functions"]
    for topic in sorted(UNSIGNED):
        publishing = {f"function:{t}" for t, f in functions.items() if topic in f["publishes"]}
        wanted = FIXED.get(topic, set()) | publishing
        assert publishers.get(topic, set()) == wanted, topic
        assert not publishers.get(topic, set()) & {"tpu_vm_publisher", "job_account_publisher"}, topic
    for topic in FIXED:  # no function publishes what only its grant's holders may say
        assert not any(topic in f["publishes"] for f in functions.values()), topic
    assert {t for t, f in functions.items() if topology.RECONCILE in f["publishes"]} == {"reconcile"}
    sink = tf.resource("google_pubsub_topic_iam_member", "qr_state_sink_publisher")
    assert sink["member"] == "${google_logging_project_sink.qr_state.writer_identity}"
    dead = tf.resource("google_pubsub_topic_iam_member", "dead_letter_publisher")
    assert dead["member"] == "${local.pubsub_agent}" and "@gcp-sa-pubsub.iam" in tf.locals["pubsub_agent"]
    submit = tf.resource("google_pubsub_topic_iam_member", "submitters")
    assert (submit["for_each"], submit["member"]) == ("${toset(var.invokers)}", "${each.key}")


def test_the_vm_accounts_publish_only_to_the_signed_topics(tf: Terraform) -> None:
    """The default job account and each named one reach worker-events and preemption, nothing else."""
    publishers = _publishers(tf)
    for grant in ("tpu_vm_publisher", "job_account_publisher"):
        assert {t for t, names in publishers.items() if grant in names} == SIGNED, grant


def test_no_project_level_grant_lets_anyone_publish_to_every_topic(tf: Terraform) -> None:
    """No project role in infra/ holds pubsub.topics.publish (job accounts get logWriter and
    secret access there, functions Firestore and their custom roles): topic grants decide alone."""
    assert not tf.of_kind("google_pubsub_topic_iam_binding") and not tf.of_kind("google_pubsub_topic_iam_policy")
    for kind in PROJECT_GRANTS:
        for name, grant in tf.of_kind(kind).items():
            for role in _project_roles(tf, grant):
                assert not PUBLISHING_ROLES.fullmatch(role), f"{kind}.{name} grants {role}"
                assert not role.startswith("permission:pubsub."), f"{kind}.{name}'s custom role holds {role}"
