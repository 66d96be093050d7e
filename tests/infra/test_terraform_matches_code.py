"""infra/ deploys exactly what the code expects: functions, topics, subscriptions, indexes, settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from terraform_config import Terraform, block, render

from tpujobs.adapters.indexes import INDEXES
from tpujobs.engine import topology
from tpujobs.engine.dead_letters import source_topic
from tpujobs.engine.settings import Settings
from tpujobs.local import wiring

ROUTES = {route.target: route for route in topology.FUNCTIONS}
PREFIX = "dev-"  # any valid prefix: names must come out as the code builds them


def _functions(tf: Terraform) -> dict[str, dict[str, Any]]:
    return tf.locals["functions"]


def test_every_function_target_is_declared_and_no_other(tf: Terraform) -> None:
    """infra declares one function per route of topology.FUNCTIONS, and none the code lacks."""
    assert set(_functions(tf)) == set(ROUTES)


def test_each_function_has_its_routes_signature_and_topic(tf: Terraform) -> None:
    """Signature and triggering topic in infra are topology's (None: an HTTP function)."""
    for target, function in _functions(tf).items():
        route = ROUTES[target]
        assert (function["signature"], function["topic"]) == (route.signature, route.topic), target


def test_entry_points_and_signatures_are_those_main_py_registers(
    tf: Terraform, deployed_entry_points: dict[str, Any]
) -> None:
    """Each function's entry point is its target, decorated in the bundle's main.py with its signature."""
    resource = tf.resource("google_cloudfunctions2_function", "function")
    assert resource["for_each"] == "${local.functions}"
    assert block(resource, "build_config")["entry_point"] == "${each.key}"
    registered = deployed_entry_points["registry"]
    assert {target: f["signature"] for target, f in _functions(tf).items()} == registered


def test_every_topic_of_the_contract_is_declared_with_its_prefixed_name(tf: Terraform) -> None:
    """infra's topics are topology.ALL_TOPICS, once each, named `{prefix}{topic}`."""
    assert sorted(tf.locals["topics"]) == sorted(topology.ALL_TOPICS)
    topic = tf.resource("google_pubsub_topic", "topic")
    assert topic["for_each"] == "${toset(local.topics)}"
    for base in topology.ALL_TOPICS:
        assert render(topic["name"], {"var.prefix": PREFIX, "each.key": base}) == topology.topic_name(base, PREFIX)


def test_push_subscriptions_are_named_as_dead_letters_read_them(tf: Terraform) -> None:
    """One subscription per cloudevent route, named push_subscription_name, from which
    record_dead_letter reads the original topic back."""
    subscription = tf.resource("google_pubsub_subscription", "push")
    assert subscription["for_each"] == "${local.cloudevent_functions}"
    assert tf.locals["cloudevent_functions"] == (
        "${{for target, f in local.functions : target => f if f.topic != null}}"
    )
    assert subscription["topic"] == "${google_pubsub_topic.topic[each.value.topic].id}"
    for route in topology.FUNCTIONS:
        if route.topic is None:
            continue
        values = {"var.prefix": PREFIX, "each.value.topic": route.topic, "each.key": route.target}
        name = render(subscription["name"], values)
        assert name == topology.push_subscription_name(route, PREFIX)
        assert source_topic(name, PREFIX) == route.topic


def test_push_goes_to_the_routes_own_function_with_a_signed_token(tf: Terraform) -> None:
    """Each subscription pushes to its own function's URL with an OIDC token for that URL."""
    push = block(tf.resource("google_pubsub_subscription", "push"), "push_config")
    url = "${google_cloudfunctions2_function.function[each.key].service_config[0].uri}"
    assert push["push_endpoint"] == url
    assert block(push, "oidc_token")["audience"] == url


def test_nothing_in_infra_is_unknown_to_the_code(tf: Terraform) -> None:
    """Topics, subscriptions and functions are declared only through the tables checked above."""
    assert set(tf.of_kind("google_pubsub_topic")) == {"topic"}
    assert set(tf.of_kind("google_pubsub_subscription")) == {"push"}
    assert set(tf.of_kind("google_cloudfunctions2_function")) == {"function"}
    assert set(tf.of_kind("google_cloudfunctions_function")) == set()
    assert set(tf.of_kind("google_eventarc_trigger")) == set()


def test_retry_and_dead_letter_policies_are_the_local_stacks_with_production_backoff(tf: Terraform) -> None:
    """Every subscription retries 10 s..60 s and dead-letters after 5 deliveries, but the
    dead-letter topic's own, which would dead-letter into itself."""
    assert tf.locals["minimum_backoff"] == f"{wiring.PRODUCTION_MINIMUM_BACKOFF_S:g}s" == "10s"
    assert tf.locals["maximum_backoff"] == f"{wiring.MAXIMUM_BACKOFF_S:g}s" == "60s"
    assert tf.locals["max_delivery_attempts"] == wiring.MAX_DELIVERY_ATTEMPTS == 5
    assert tf.locals["dead_letter_topic"] == topology.DEAD_LETTER
    for name, subscription in tf.of_kind("google_pubsub_subscription").items():
        retry = block(subscription, "retry_policy")
        assert retry == {
            "minimum_backoff": "${local.minimum_backoff}",
            "maximum_backoff": "${local.maximum_backoff}",
        }, name
        policies = [d["dead_letter_policy"] for d in subscription.get("dynamic", []) if "dead_letter_policy" in d]
        assert len(policies) == 1, f"{name} has no dead_letter_policy"
        assert policies[0]["for_each"] == "${each.value.topic == local.dead_letter_topic ? [] : [1]}"
        content = block(policies[0], "content")
        assert content["dead_letter_topic"] == "${google_pubsub_topic.topic[local.dead_letter_topic].id}"
        assert content["max_delivery_attempts"] == "${local.max_delivery_attempts}"
        assert block(subscription, "expiration_policy") == {"ttl": ""}, f"{name} would expire when idle"


def test_pubsub_service_agent_may_dead_letter(tf: Terraform) -> None:
    """Pub/Sub's service agent publishes to the dead-letter topic and subscribes to every
    subscription that dead-letters."""
    agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
    assert tf.locals["pubsub_agent"] == agent
    publisher = tf.resource("google_pubsub_topic_iam_member", "dead_letter_publisher")
    assert publisher["topic"] == "${google_pubsub_topic.topic[local.dead_letter_topic].id}"
    assert (publisher["role"], publisher["member"]) == ("roles/pubsub.publisher", "${local.pubsub_agent}")
    subscriber = tf.resource("google_pubsub_subscription_iam_member", "dead_letter_subscriber")
    assert subscriber["subscription"] == "${google_pubsub_subscription.push[each.key].id}"
    assert (subscriber["role"], subscriber["member"]) == ("roles/pubsub.subscriber", "${local.pubsub_agent}")
    assert subscriber["for_each"] == (
        "${{for target, f in local.cloudevent_functions : target => f if f.topic != local.dead_letter_topic}}"
    )


def test_every_index_the_queries_need_is_declared_and_no_other(tf: Terraform) -> None:
    """infra/firestore.tf declares exactly tpujobs.adapters.indexes.INDEXES."""
    declared = {
        (index["collection"], index["scope"], tuple((f["path"], f["order"]) for f in index["fields"]))
        for index in tf.locals["firestore_indexes"].values()
    }
    wanted = {(index.collection, index.scope, index.fields) for index in INDEXES}
    missing = "\n".join(f"  {index}" for index in sorted(wanted - declared))
    unknown = "\n".join(f"  {index}" for index in sorted(declared - wanted))
    assert declared == wanted, f"missing in infra/firestore.tf:\n{missing}\nnot in indexes.py:\n{unknown}"
    resource = tf.resource("google_firestore_index", "index")
    assert resource["for_each"] == "${local.firestore_indexes}"
    assert (resource["collection"], resource["query_scope"]) == ("${each.value.collection}", "${each.value.scope}")
    fields = resource["dynamic"][0]["fields"]
    assert fields["for_each"] == "${each.value.fields}"
    assert block(fields, "content") == {
        "field_path": "${fields.value.path}",
        "order": '${fields.value.order == "CONTAINS" ? null : fields.value.order}',
        "array_config": '${fields.value.order == "CONTAINS" ? "CONTAINS" : null}',
    }


def test_the_firestore_database_is_the_default_native_one(tf: Terraform) -> None:
    """The code opens firestore.Client(project): the (default) database, in native mode."""
    database = tf.resource("google_firestore_database", "default")
    assert (database["name"], database["type"]) == ("(default)", "FIRESTORE_NATIVE")


class _Recording(dict):
    """An environment that remembers every name Settings.from_env asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)


def test_function_environment_is_what_settings_read_and_never_local_only(tf: Terraform) -> None:
    """Every variable set on the functions is read by Settings.from_env; the deployment's
    project, zone, prefix, bucket and admins are set; the local stack's switches are not."""
    environ = _Recording()
    Settings.from_env(environ)
    env = tf.locals["function_env"]
    assert set(env) <= environ.asked, f"not read by Settings.from_env: {set(env) - environ.asked}"
    required = {
        "GOOGLE_CLOUD_PROJECT",
        "TPUJOBS_DEFAULT_ZONE",
        "TPUJOBS_PREFIX",
        "TPUJOBS_LOGS_BUCKET",
        "TPUJOBS_ADMINS",
    }
    assert required <= set(env)
    # TPUJOBS_LOCAL_STACK=1 trusts a caller header instead of the ID token; the endpoint is the simulator.
    assert {"TPUJOBS_LOCAL_STACK", "TPUJOBS_TPU_ENDPOINT"}.isdisjoint(env)
    assert env["TPUJOBS_DEFAULT_ZONE"] == "${var.zones[0]}"
    assert env["TPUJOBS_PREFIX"] == "${var.prefix}"
    function = tf.resource("google_cloudfunctions2_function", "function")
    common = block(function, "service_config")["environment_variables"]
    assert common.startswith("${merge(local.function_env, "), "every function gets local.function_env"


def test_the_scheduler_ticks_every_minute_on_the_reconcile_topic(tf: Terraform) -> None:
    """Cloud Scheduler publishes to tpujobs-reconcile once a minute."""
    job = tf.resource("google_cloud_scheduler_job", "reconcile")
    assert job["schedule"] == "${var.reconcile_schedule}"
    assert tf.variables["reconcile_schedule"]["default"] == "* * * * *"
    assert block(job, "pubsub_target")["topic_name"] == f'${{google_pubsub_topic.topic["{topology.RECONCILE}"].id}}'


def test_the_audit_log_sink_sends_finished_queued_resource_changes_to_qr_state(tf: Terraform) -> None:
    """TPU create/delete of queued resources, last operation entry, to tpujobs-qr-state, whose
    publisher the sink's writer identity is."""
    sink = tf.resource("google_logging_project_sink", "qr_state")
    for part in (
        'protoPayload.serviceName=\\"tpu.googleapis.com\\"',
        "(Create|Delete)QueuedResource$",
        "operation.last=true",
    ):
        assert part in sink["filter"], part
    topic = f'google_pubsub_topic.topic["{topology.QR_STATE}"].id'
    assert sink["destination"] == f"pubsub.googleapis.com/${{{topic}}}"
    grant = tf.resource("google_pubsub_topic_iam_member", "qr_state_sink_publisher")
    assert grant["topic"] == f"${{{topic}}}"
    assert grant["member"] == "${google_logging_project_sink.qr_state.writer_identity}"


def test_the_functions_deploy_the_bundle_that_make_bundle_builds(tf: Terraform) -> None:
    """The uploaded object is dist/function.zip, named by content so a change redeploys."""
    assert tf.variables["function_zip"]["default"] == "../dist/function.zip"
    assert (
        Path(__file__).parents[2] / "infra" / tf.variables["function_zip"]["default"]
    ).resolve().parent.name == "dist"
    bundle = tf.resource("google_storage_bucket_object", "bundle")
    assert bundle["name"] == "function-${filemd5(var.function_zip)}.zip"
    assert bundle["source"] == "${var.function_zip}"


def test_the_reconcile_fan_out_is_capped_by_the_numbers_its_function_scales_by(tf: Terraform) -> None:
    """TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT is the reconcile function's own max instances (as
    var.max_instances may change them) x its concurrency, less one request for the tick, at
    least 1; with the defaults it is Settings' default, so the local stack fans out alike."""
    env = tf.locals["reconcile_env"]
    assert env == {
        "TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT": '${tostring(max(1, lookup(var.max_instances, "reconcile", '
        "local.functions.reconcile.max) * local.functions.reconcile.concurrent - 1))}"
    }
    config = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert config["max_instance_count"] == "${lookup(var.max_instances, each.key, each.value.max)}"
    assert config["max_instance_request_concurrency"] == "${each.value.concurrent}"
    reconcile = tf.locals["functions"]["reconcile"]
    assert reconcile["max"] * reconcile["concurrent"] - 1 == Settings().reconcile_shards_in_flight == 19
