"""A job's code directory to Cloud Storage, from the user's terminal: packed once per content."""

from __future__ import annotations

import base64
import contextlib
import hashlib
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated
from tpujobs.adapters.storage import SERVICE
from tpujobs.domain.naming import code_object

if TYPE_CHECKING:
    from google.cloud import storage

    from tpujobs.cli.code_packer import CodePackage


def upload_code_dir(
    client: storage.Client, bucket: str, directory: Path, service_account: str | None = None
) -> tuple[str, str]:
    """Pack and upload a job's code directory: its gs:// URI (for `code_uri`) and the tarball's
    SHA-256 (for `code_sha256`, which the agent checks before it unpacks)."""
    from tpujobs.cli import code_packer

    package = code_packer.pack(directory)
    now = datetime.now(timezone.utc)
    return upload_code_package(client, bucket, package, now, service_account), package.sha256


def upload_code_package(
    client: storage.Client, bucket: str, package: CodePackage, now: datetime, service_account: str | None = None
) -> str:
    """Upload a packed code directory once per content, under the code prefix of the account
    the job runs as (`naming.code_object`: `code/jobs/` for the default account,
    `code/accounts/{email}/` for its own), the only one that account may read; its gs:// URI.

    An object already under that name is kept only if it holds exactly these bytes: anything
    else there (planted, or cut short) is replaced. Either way its custom time becomes `now`:
    the bucket deletes code `code_retention_days` after its custom time (infra/storage.tf), so
    a tarball submitted again is kept as long as a fresh one. Storage refuses to move a custom
    time back, so one already later stays.
    """
    from google.api_core.exceptions import PreconditionFailed

    data = package.data
    name = code_object(package.sha256, service_account)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode("ascii")  # what Storage reports
    with translated(SERVICE, f"upload gs://{bucket}/{name}"):
        blob = client.bucket(bucket).get_blob(name)
        if blob is None or blob.md5_hash != md5:
            fresh = client.bucket(bucket).blob(name)
            fresh.custom_time = now
            fresh.upload_from_string(data, content_type="application/gzip")
        elif blob.custom_time is None or blob.custom_time < now:
            blob.custom_time = now
            # Changed meanwhile: by another submission of the same code, which set its time.
            with contextlib.suppress(PreconditionFailed):
                blob.patch(if_metageneration_match=blob.metageneration)
    return f"gs://{bucket}/{name}"


def stored_tarball_sha256(client: storage.Client, code_uri: str) -> str | None:
    """The SHA-256 of a gs:// tarball a user named in `code_uri`, read now, so the job records
    what it was at submission and the agent refuses it if it changes; None when this terminal
    cannot read it (the user may give `code_sha256` themselves). A prefix has no one digest."""
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    bucket, _, name = code_uri.removeprefix("gs://").partition("/")
    if not name or name.endswith("/"):
        return None
    digest = hashlib.sha256()
    try:
        with client.bucket(bucket).blob(name).open("rb") as handle:
            for block in iter(lambda: handle.read(1024 * 1024), b""):
                digest.update(block)
    except (GoogleAPIError, GoogleAuthError, OSError, ValueError):
        return None
    return digest.hexdigest()
