"""What admins allow, read from three documents they edit in the Firestore console.

- `config/policies`: `high_priority`, `reserved_capacity` and `pools` (who may create warm
  pools) (lists of e-mails or `group:NAME`), and `trust_topic_owners` (bool, default false).
- `config/groups`: NAME -> list of e-mails.
- `config/service_accounts`: e-mail or `group:NAME` -> list of service accounts its jobs may
  run as.

A document that is absent is empty; a field of the wrong type is ignored (and logged), so a
typo in the console never allows more than was meant.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.domain.access import AccessPolicies

if TYPE_CHECKING:
    from google.cloud import firestore

log = logging.getLogger(__name__)

CONFIG = "config"
POLICIES, GROUPS, SERVICE_ACCOUNTS = "policies", "groups", "service_accounts"


class FirestoreAccessPolicies:
    """The AccessPolicyReader port on Firestore: three document reads in one round trip."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def policies(self) -> AccessPolicies:
        refs = [self._db.collection(CONFIG).document(name) for name in (POLICIES, GROUPS, SERVICE_ACCOUNTS)]
        with transient_on_failure("read config/policies, groups and service_accounts"):
            found = {snapshot.id: snapshot.to_dict() or {} for snapshot in self._db.get_all(refs)}
        return policies_from_documents(found)


def policies_from_documents(found: Mapping[str, Mapping[str, Any]]) -> AccessPolicies:
    """What the three documents allow (`found`: document id -> its fields; an absent one is
    empty), a field of the wrong type ignored. Pure: the in-memory fake reads with it too."""
    policies = found.get(POLICIES, {})
    trust = policies.get("trust_topic_owners", False)
    return AccessPolicies(
        high_priority=_names(policies.get("high_priority"), "config/policies.high_priority"),
        reserved_capacity=_names(policies.get("reserved_capacity"), "config/policies.reserved_capacity"),
        pools=_names(policies.get("pools"), "config/policies.pools"),
        trust_topic_owners=trust is True,
        groups=_lists(found.get(GROUPS, {}), "config/groups"),
        service_accounts=_lists(found.get(SERVICE_ACCOUNTS, {}), "config/service_accounts"),
    )


def _names(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        log.warning("%s is not a list of strings: ignored", where)
        return ()
    return tuple(value)


def _lists(document: Mapping[str, Any], where: str) -> dict[str, tuple[str, ...]]:
    return {key: _names(value, f"{where}.{key}") for key, value in document.items()}
