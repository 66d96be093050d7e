"""Access policies in memory: what admins allowed, as `FirestoreAccessPolicies` reads it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujobs.adapters.firestore_config import policies_from_documents
from tpujobs.domain.access import AccessPolicies


class InMemoryAccessPolicies:
    """`ports.AccessPolicyReader` holding one `AccessPolicies`; `allowed` replaces it."""

    def __init__(self, policies: AccessPolicies | None = None) -> None:
        self.allowed = policies or AccessPolicies()

    @classmethod
    def from_documents(cls, documents: Mapping[str, Mapping[str, Any]]) -> InMemoryAccessPolicies:
        """As admins wrote `config/policies`, `config/groups` and `config/service_accounts`
        (document id -> fields), read by the adapter's own rules."""
        return cls(policies_from_documents(documents))

    def policies(self) -> AccessPolicies:
        return self.allowed
