"""Who may do what to a job: one rule, shared by the HTTP API and the tpujobs-control topic.

Pure on purpose: the caller's identity is established at the edge (a verified ID token,
the local stack's header, a control message's `owner`), and only then compared here.
"""

from __future__ import annotations

from collections.abc import Collection


def may_cancel(owner: str, caller: str, admins: Collection[str]) -> bool:
    """Whether `caller` may cancel a job of `owner`: its owner, or a configured admin.

    Exact comparison, as the contract stores `owner`; an empty caller is nobody, even
    for a job whose owner is empty.
    """
    if not caller:
        return False
    return caller == owner or caller in admins
