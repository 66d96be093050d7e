"""The Firestore composite indexes tpujobs' queries need: the single source of truth.

The emulator serves any query without indexes; production Firestore refuses one whose
composite index is missing (FAILED_PRECONDITION), so a query added without its index works
in every test here and fails only after deployment. Hence this list: add one `Index` next to
every new query that filters on more than one field (equality on several fields alone needs
none: Firestore merges single-field indexes) or that filters a collection group. Terraform
declares each one in `infra/firestore.tf` (`local.firestore_indexes`), and
`tests/infra/test_terraform_matches_code.py` fails while the two lists differ.

Plain data, no Google imports: Terraform's shape is mirrored field for field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["COLLECTION", "COLLECTION_GROUP"]
Order = Literal["ASCENDING", "DESCENDING", "CONTAINS"]  # CONTAINS: an array field (array-contains)

COLLECTION: Scope = "COLLECTION"  # the query names one collection: db.collection("x")
COLLECTION_GROUP: Scope = "COLLECTION_GROUP"  # every collection of that id: db.collection_group("x")
ASCENDING: Order = "ASCENDING"
DESCENDING: Order = "DESCENDING"
CONTAINS: Order = "CONTAINS"


@dataclass(frozen=True)
class Index:
    """One composite index: the collection id, its scope, and the fields in query order."""

    collection: str
    scope: Scope
    fields: tuple[tuple[str, Order], ...]  # (field path, order or CONTAINS), as the query filters then sorts
    query: str = ""  # where the query is, for the reader


INDEXES: tuple[Index, ...] = (
    Index(
        "workers",
        COLLECTION_GROUP,
        (("live", ASCENDING), ("silent_after", ASCENDING)),
        query="FirestoreJobStore.silent_workers: live == true, silent_after < now",
    ),
    Index(
        "events",
        COLLECTION_GROUP,
        (("announced", ASCENDING), ("at", ASCENDING)),
        query="FirestoreJobStore.unannounced_events: announced == false, at < t",
    ),
    Index(
        "dead_letters",
        COLLECTION,
        (("topic", ASCENDING), ("at", DESCENDING)),
        query="FirestoreDeadLetters.list_dead_letters(topic=...): topic == x, newest first",
    ),
    Index(
        "jobs",
        COLLECTION,
        (("pool", ASCENDING), ("state", ASCENDING), ("priority_rank", DESCENDING), ("created_at", ASCENDING)),
        query="FirestorePools.queue: pool == p, state == QUEUED, highest priority then oldest first",
    ),
    Index(
        "jobs",
        COLLECTION,
        (("warm_pool", ASCENDING), ("state", ASCENDING), ("priority_rank", DESCENDING), ("created_at", ASCENDING)),
        query="FirestoreWarmPools.queue: warm_pool == p, state == QUEUED, highest priority then oldest first",
    ),
    Index(
        "jobs",
        COLLECTION,
        (("zone", ASCENDING), ("state", ASCENDING)),
        query="FirestoreJobStore.active_in_shard: zone == z, state IN active, a range of document ids",
    ),
)


def _list_filter_indexes() -> tuple[Index, ...]:
    """`FirestoreJobStore.list_jobs` with its filters (`tpujobs list`, the API's list): every
    non-empty combination of state (== or IN), owner, one label (array-contains on
    `label_pairs`) and the name prefix (a range on `name`), newest first. Equality fields come
    first, then the sort, then the range field, as Firestore orders a query with a range on
    another field. Several labels need none: equalities alone, ordered by id (`_with_labels`)."""
    equalities = (("state", ASCENDING), ("owner", ASCENDING), ("label_pairs", CONTAINS))
    found = []
    for mask in range(1, 16):  # bits 0-2: the equalities above; bit 3: the name prefix
        chosen = tuple(field for bit, field in enumerate(equalities) if mask & (1 << bit))
        by_name = bool(mask & 8)
        fields = (*chosen, ("created_at", DESCENDING), *((("name", ASCENDING),) if by_name else ()))
        what = " and ".join([name for name, _ in chosen] + (["name prefix"] if by_name else []))
        found.append(Index("jobs", COLLECTION, fields, query=f"FirestoreJobStore.list_jobs: {what}, newest first"))
    return tuple(found)


INDEXES += _list_filter_indexes()
