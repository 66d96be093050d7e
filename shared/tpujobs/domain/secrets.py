"""Where a job's secrets live in Secret Manager: one namespace of secret ids per service account.

IAM grants each TPU VM account `secretAccessor` only on the ids that start `{prefix}tpujobs_{account_id}_`,
so a job names a secret by a short NAME, kept as `{prefix}tpujobs_{account_id}_{NAME}`, and a job that runs
as another account cannot read it. A full resource name (`projects/P/secrets/S[/versions/V]`) is passed
through: IAM alone decides. An account id holds no `_`, so `parse_secret_id` can split the id again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME_PATTERN = r"[a-zA-Z0-9_-]{1,200}"
SECRET_ID_PATTERN = r"[a-zA-Z0-9_-]{1,255}"  # Secret Manager's rule for a secret id
VERSION_PATTERN = r"[1-9][0-9]{0,18}|latest"
NAMESPACE_MARK = "tpujobs_"
LATEST = "latest"

_NAME = re.compile(NAME_PATTERN)
_SECRET_ID = re.compile(SECRET_ID_PATTERN)
_SHORT_REF = re.compile(rf"(?P<name>{NAME_PATTERN})(?:@(?P<version>{VERSION_PATTERN}))?")
_FULL_REF = re.compile(
    r"projects/(?P<project>[a-z0-9][a-z0-9.:-]{0,99})"
    rf"/secrets/(?P<secret>{SECRET_ID_PATTERN})"
    rf"(?:/versions/(?P<version>{VERSION_PATTERN}))?"
)
_ACCOUNT_ID = re.compile(r"[a-zA-Z0-9-]{1,64}")
_PREFIX = re.compile(r"[a-zA-Z0-9_-]{0,40}")
MAX_REF_CHARS = 400


@dataclass(frozen=True)
class SecretRef:
    """A parsed secret reference: a short `name` in the account's namespace, or a full `secret`."""

    name: str = ""  # NAME, resolved in the job's account's namespace
    resource: str = ""  # projects/P/secrets/S, used as given
    version: str = LATEST


def parse_secret_ref(ref: str) -> SecretRef:
    """`NAME`, `NAME@VERSION`, `projects/P/secrets/S` or `projects/P/secrets/S/versions/V`.

    Raises ValueError with a sentence when `ref` is none of these.
    """
    if not isinstance(ref, str) or not ref:
        raise ValueError("a secret reference must be a non-empty string")
    if len(ref) > MAX_REF_CHARS:
        raise ValueError(f"secret reference {ref[:64]!r}... is over {MAX_REF_CHARS} characters")
    if ref.startswith("projects/"):
        full = _FULL_REF.fullmatch(ref)
        if full is None:
            raise ValueError(
                f"secret {ref[:120]!r} is not a resource name projects/PROJECT/secrets/SECRET "
                "or projects/PROJECT/secrets/SECRET/versions/VERSION (VERSION a number or latest)"
            )
        return SecretRef(
            resource=f"projects/{full['project']}/secrets/{full['secret']}",
            version=full["version"] or LATEST,
        )
    short = _SHORT_REF.fullmatch(ref)
    if short is None:
        name, at, _ = ref.partition("@")
        if at and _NAME.fullmatch(name):
            raise ValueError(f"secret {ref[:120]!r}: the version after @ must be a positive number or latest")
        raise ValueError(
            f"secret {ref[:120]!r} must be NAME or NAME@VERSION, with NAME of 1 to 200 letters, "
            "digits, _ or -, or a full resource name projects/PROJECT/secrets/SECRET"
        )
    return SecretRef(name=short["name"], version=short["version"] or LATEST)


def check_secret_ref(ref: str) -> None:
    """Raise ValueError with a sentence unless `ref` is a secret reference a spec may hold."""
    parse_secret_ref(ref)


def check_secret_name(name: str) -> None:
    """Raise ValueError with a sentence unless `name` is a NAME (`tpujobs secret set NAME`)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"secret name {str(name)[:64]!r} must be 1 to 200 letters, digits, _ or - "
            "(no @ and no /: the version and project are not part of the name)"
        )


def account_id(account_email: str) -> str:
    """The local part of a service account's email: its id within the project."""
    local, at, domain = (account_email or "").partition("@")
    if not at or not domain or not _ACCOUNT_ID.fullmatch(local):
        raise ValueError(
            f"{account_email!r} is not a service account email such as tpujobs-tpu-vm@PROJECT.iam.gserviceaccount.com"
        )
    return local


def namespace(prefix: str, account_email: str) -> str:
    """`{prefix}tpujobs_{account_id}_`: the start of every secret id the account may read."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r} cannot start a secret id: at most 40 letters, digits, _ or -")
    return f"{prefix}{NAMESPACE_MARK}{account_id(account_email)}_"


def secret_id(name: str, prefix: str, account_email: str) -> str:
    """The id of secret NAME in the account's namespace."""
    check_secret_name(name)
    result = namespace(prefix, account_email) + name
    if not _SECRET_ID.fullmatch(result):
        raise ValueError(
            f"secret id {result[:64]!r}... is longer than Secret Manager's 255 characters: use a shorter name"
        )
    return result


def parse_secret_id(secret: str, prefix: str) -> tuple[str, str] | None:
    """(account_id, NAME) of a secret id in some account's namespace, or None."""
    head = prefix + NAMESPACE_MARK
    if not secret.startswith(head):
        return None
    account, sep, name = secret[len(head) :].partition("_")
    if not sep or not _ACCOUNT_ID.fullmatch(account) or not _NAME.fullmatch(name):
        return None
    return account, name


def secret_version_name(ref: str, project: str, prefix: str, account_email: str) -> str:
    """The version resource a job's host reads for `ref` when it runs as `account_email`.

    `NAME` -> projects/{project}/secrets/{prefix}tpujobs_{account_id}_{NAME}/versions/latest;
    `NAME@7` -> .../versions/7; a full name passes through, with /versions/latest added
    when it names no version.
    """
    parsed = parse_secret_ref(ref)
    if parsed.resource:
        return f"{parsed.resource}/versions/{parsed.version}"
    if not project:
        raise ValueError(f"secret {ref!r}: no project to look it up in")
    return f"projects/{project}/secrets/{secret_id(parsed.name, prefix, account_email)}/versions/{parsed.version}"
