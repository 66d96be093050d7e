# Every topic tpujobs uses (tpujobs.engine.topology.ALL_TOPICS) and one push subscription per
# cloudevent function, wired as `tpujobs dev up` wires the emulator (tpujobs.local.wiring).
locals {
  topics = [
    "tpujobs-submit",
    "tpujobs-control",
    "tpujobs-converge",
    "tpujobs-qr-state",
    "tpujobs-preemption",
    "tpujobs-worker-events",
    "tpujobs-reconcile",
    "tpujobs-log-export",
    "tpujobs-status",
    "tpujobs-dead-letter",
  ]
  dead_letter_topic = "tpujobs-dead-letter"

  # Handlers raise only for transient trouble; 5 deliveries 10 s, 20 s, 40 s, 60 s apart span
  # a few minutes of it, then the message is kept as a dead letter (record_dead_letter).
  # Pub/Sub backs off exponentially from minimum to maximum, per message, best effort.
  # For tpujobs-reconcile the numbers are chosen too: there a failure is most often Cloud Run
  # refusing a request over max instances x concurrency (429, after holding it a few seconds),
  # which Pub/Sub counts as a delivery attempt. Lanes keep a tick's shards within that
  # (functions.tf, local.reconcile_env), so only a rare excess is refused: a duplicate
  # delivery, or a shard much slower than the one before it. 10 s first is about one shard's
  # run, so the retry finds an instance free instead of hammering a busy function; 60 s at most,
  # because a shard retried later than that is redone by the next tick anyway. The 5 attempts
  # span about 130 s of backoff, plus Cloud Run's holds.
  max_delivery_attempts = 5
  minimum_backoff       = "10s"
  maximum_backoff       = "60s"

  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

resource "google_pubsub_topic" "topic" {
  #checkov:skip=CKV_GCP_83:Google-managed encryption at rest. The messages are job specs, reports and status changes, never secrets; a customer-managed key would add a KMS key ring to run and pay for with nothing to protect beyond what IAM already does.
  for_each = toset(local.topics)

  name                       = "${var.prefix}${each.key}"
  message_retention_duration = "86400s" # a day of messages to replay after a bad deploy
  depends_on                 = [google_project_service.api]
}

# The identity Pub/Sub signs its push requests with (an OIDC token for the function URL).
resource "google_service_account" "push" {
  account_id   = "${var.prefix}tpujobs-push"
  display_name = "tpujobs Pub/Sub push"
  description  = "Pub/Sub pushes messages to the tpujobs functions as this account."
}

resource "google_pubsub_subscription" "push" {
  for_each = local.cloudevent_functions

  name  = "${var.prefix}${each.value.topic}--${each.key}"
  topic = google_pubsub_topic.topic[each.value.topic].id

  # Pub/Sub waits this long for the function to answer before it counts a failure.
  ack_deadline_seconds       = min(each.value.timeout, 600)
  message_retention_duration = "604800s"

  push_config {
    push_endpoint = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    oidc_token {
      service_account_email = google_service_account.push.email
      audience              = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = local.minimum_backoff
    maximum_backoff = local.maximum_backoff
  }

  # The dead-letter topic's own subscription retries but never dead-letters: into itself.
  dynamic "dead_letter_policy" {
    for_each = each.value.topic == local.dead_letter_topic ? [] : [1]
    content {
      dead_letter_topic     = google_pubsub_topic.topic[local.dead_letter_topic].id
      max_delivery_attempts = local.max_delivery_attempts
    }
  }

  expiration_policy {
    ttl = "" # never: a quiet month must not delete the wiring
  }
}

# Pub/Sub moves a message to the dead-letter topic as its service agent: it must be able to
# publish there and to acknowledge the original on the source subscription.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  topic  = google_pubsub_topic.topic[local.dead_letter_topic].id
  role   = "roles/pubsub.publisher"
  member = local.pubsub_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each = { for target, f in local.cloudevent_functions : target => f if f.topic != local.dead_letter_topic }

  subscription = google_pubsub_subscription.push[each.key].id
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
}

# Pub/Sub mints the push OIDC tokens as its service agent, for this one account only.
resource "google_service_account_iam_member" "push_token_creator" {
  service_account_id = google_service_account.push.id
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_agent
}

# The users of the jobs API may also submit: `tpujobs submit` and `gcloud pubsub topics publish`.
resource "google_pubsub_topic_iam_member" "submitters" {
  for_each = toset(var.invokers)

  topic  = google_pubsub_topic.topic["tpujobs-submit"].id
  role   = "roles/pubsub.publisher"
  member = each.key
}

# tpujobs-control's `owner` is a claim nobody checks, so only admins may publish there (the CLI
# without TPUJOBS_API_URL); users cancel, restart and manage pools through the jobs API. Even an
# admin's message acts only on what a claim owns unless config/policies sets trust_topic_owners.
# No function, invoker or VM account publishes to it. var.admins are e-mails (TPUJOBS_ADMINS).
resource "google_pubsub_topic_iam_member" "control_publishers" {
  for_each = toset(var.admins)

  topic  = google_pubsub_topic.topic["tpujobs-control"].id
  role   = "roles/pubsub.publisher"
  member = endswith(each.key, ".gserviceaccount.com") ? "serviceAccount:${each.key}" : "user:${each.key}"
}
