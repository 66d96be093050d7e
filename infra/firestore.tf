# The default database (the code uses firestore.Client(project)) and the composite indexes
# its queries need. The list mirrors shared/tpujobs/adapters/indexes.py, the single source of
# truth; tests/infra fails when the two differ.
resource "google_firestore_database" "default" {
  name                              = "(default)"
  location_id                       = var.firestore_location
  type                              = "FIRESTORE_NATIVE"
  delete_protection_state           = "DELETE_PROTECTION_ENABLED"
  point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"
  deletion_policy                   = "ABANDON"
  depends_on                        = [google_project_service.api]
}

locals {
  firestore_indexes = {
    # The reconciler's silent workers: live == true and silent_after < now, across jobs.
    workers_live_silent_after = {
      collection = "workers"
      scope      = "COLLECTION_GROUP"
      fields = [
        { path = "live", order = "ASCENDING" },
        { path = "silent_after", order = "ASCENDING" },
      ]
    }
    # The reconciler's failed announcements: announced == false and at < t, across jobs.
    events_announced_at = {
      collection = "events"
      scope      = "COLLECTION_GROUP"
      fields = [
        { path = "announced", order = "ASCENDING" },
        { path = "at", order = "ASCENDING" },
      ]
    }
    # tpujobs dead-letters --topic: topic == x, newest first.
    dead_letters_topic_at = {
      collection = "dead_letters"
      scope      = "COLLECTION"
      fields = [
        { path = "topic", order = "ASCENDING" },
        { path = "at", order = "DESCENDING" },
      ]
    }
    # Admission: a pool's QUEUED jobs, highest priority first, then oldest first.
    jobs_pool_state_priority_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "pool", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
        { path = "priority_rank", order = "DESCENDING" },
        { path = "created_at", order = "ASCENDING" },
      ]
    }
    # A warm pool's queue: its QUEUED jobs, highest priority then oldest first.
    jobs_warm_pool_state_priority_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "warm_pool", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
        { path = "priority_rank", order = "DESCENDING" },
        { path = "created_at", order = "ASCENDING" },
      ]
    }
    # A reconcile shard: the active jobs of one zone in a range of ids (zone ==, state in, __name__ range).
    jobs_zone_state = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "zone", order = "ASCENDING" },
        { path = "state", order = "ASCENDING" },
      ]
    }
    # tpujobs list / the jobs API: by state, by owner, or both; newest first.
    jobs_state_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    jobs_owner_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "owner", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    jobs_state_owner_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "owner", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    # tpujobs list's filters (FirestoreJobStore.list_jobs): a label is array-contains on label_pairs
    # (order CONTAINS below becomes array_config), the name prefix a range on name, sorted last.
    # label_pairs, newest first.
    jobs_list_contains_labels_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    # state and label_pairs, newest first.
    jobs_list_state_contains_labels_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    # owner and label_pairs, newest first.
    jobs_list_owner_contains_labels_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "owner", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    # state and owner and label_pairs, newest first.
    jobs_list_state_owner_contains_labels_created = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "owner", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
      ]
    }
    # name prefix, newest first.
    jobs_list_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # state and name prefix, newest first.
    jobs_list_state_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # owner and name prefix, newest first.
    jobs_list_owner_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "owner", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # state and owner and name prefix, newest first.
    jobs_list_state_owner_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "owner", order = "ASCENDING" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # label_pairs and name prefix, newest first.
    jobs_list_contains_labels_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # state and label_pairs and name prefix, newest first.
    jobs_list_state_contains_labels_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # owner and label_pairs and name prefix, newest first.
    jobs_list_owner_contains_labels_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "owner", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
    # state and owner and label_pairs and name prefix, newest first.
    jobs_list_state_owner_contains_labels_created_name = {
      collection = "jobs"
      scope      = "COLLECTION"
      fields = [
        { path = "state", order = "ASCENDING" },
        { path = "owner", order = "ASCENDING" },
        { path = "label_pairs", order = "CONTAINS" },
        { path = "created_at", order = "DESCENDING" },
        { path = "name", order = "ASCENDING" },
      ]
    }
  }
}

resource "google_firestore_index" "index" {
  for_each = local.firestore_indexes

  database    = google_firestore_database.default.name
  collection  = each.value.collection
  query_scope = each.value.scope

  dynamic "fields" {
    for_each = each.value.fields
    content {
      field_path   = fields.value.path
      order        = fields.value.order == "CONTAINS" ? null : fields.value.order
      array_config = fields.value.order == "CONTAINS" ? "CONTAINS" : null
    }
  }
}

# Signed reports already acted on (reports_seen/{digest}, tpujobs.adapters.firestore_store):
# kept 8 days (longer than Pub/Sub keeps a message), then Firestore's TTL deletes each one at
# its expire_at. Nothing queries expire_at, so it has no single-field index (an index on an
# ever-growing timestamp is a write hotspot, and costs a write per report).
resource "google_firestore_field" "reports_seen_expire_at" {
  database   = google_firestore_database.default.name
  collection = "reports_seen"
  field      = "expire_at"

  ttl_config {}
  index_config {}
}

# Records that end: a job's document (tpujobs.domain.transitions sets expire_at when the job
# ends: TPUJOBS_RECORD_RETENTION_DAYS after, 180 by default, and clears it if the job is resumed),
# a rejection and a dead letter (TPUJOBS_REJECTION_RETENTION_DAYS, TPUJOBS_DEAD_LETTER_RETENTION_DAYS,
# 30 by default, after they were recorded). Firestore's TTL deletes each at its expire_at, within
# about a day. TTL deletes a job's document only, never its events, workers and attempts: the
# reconciler's tick deletes expired jobs with them first (FirestoreJobStore.prune_expired_jobs),
# which queries jobs' expire_at, so that one keeps Firestore's default single-field index (written
# once per job, when it ends: no hotspot). Rejections and dead letters have no subcollections and
# nothing queries them by expire_at: not indexed, for the reason above.
resource "google_firestore_field" "job_expire_at" {
  database   = google_firestore_database.default.name
  collection = "jobs"
  field      = "expire_at"

  ttl_config {}
}

resource "google_firestore_field" "expire_at" {
  for_each   = toset(["rejections", "dead_letters"])
  database   = google_firestore_database.default.name
  collection = each.key
  field      = "expire_at"

  ttl_config {}
  index_config {}
}
