"""The contract of `ports.AccessPolicyReader`: what admins wrote in the three `config` documents."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tpujobs.domain.access import AccessPolicies
from tpujobs.local.fakes import InMemoryAccessPolicies

Documents = Mapping[str, Mapping[str, Any]]


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def read(request: pytest.FixtureRequest) -> Callable[[Documents], AccessPolicies]:
    """`read(documents)`: the policies a reader finds once admins wrote `documents`."""
    if request.param == "memory":
        return lambda documents: InMemoryAccessPolicies.from_documents(documents).policies()
    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies

    client = request.getfixturevalue("firestore_client")

    def written(documents: Documents) -> AccessPolicies:
        for name, fields in documents.items():
            client.collection("config").document(name).set(dict(fields))
        return FirestoreAccessPolicies(client).policies()

    return written


def test_nothing_written_allows_nothing(read):
    """Absent documents are empty: no privileges, topic owners not trusted."""
    assert read({}) == AccessPolicies()


def test_the_three_documents_are_read_as_written(read):
    """Lists of e-mails and groups, the groups' members, and the accounts each may run jobs as."""
    documents = {
        "policies": {
            "high_priority": ["ada@example.com", "group:leads"],
            "reserved_capacity": ["group:leads"],
            "pools": ["root@example.com"],
            "trust_topic_owners": True,
        },
        "groups": {"leads": ["bob@example.com"]},
        "service_accounts": {"group:leads": ["trainer@p.iam.gserviceaccount.com"]},
    }
    assert read(documents) == AccessPolicies(
        high_priority=("ada@example.com", "group:leads"),
        reserved_capacity=("group:leads",),
        pools=("root@example.com",),
        trust_topic_owners=True,
        groups={"leads": ("bob@example.com",)},
        service_accounts={"group:leads": ("trainer@p.iam.gserviceaccount.com",)},
    )


def test_a_field_of_the_wrong_type_allows_nothing_more(read):
    """A string where a list belongs, and a trust flag that is not exactly true, are ignored."""
    documents = {
        "policies": {"high_priority": "ada@example.com", "trust_topic_owners": "yes"},
        "groups": {"leads": "bob@example.com"},
    }
    assert read(documents) == AccessPolicies(groups={"leads": ()})
