"""Cloud Storage through google-cloud-storage (the emulator when STORAGE_EMULATOR_HOST is set).

Its errors go through the one table (adapters/google_errors.py): TransientError or
PermanentError, saying which object failed.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated

if TYPE_CHECKING:
    from google.cloud import storage

SERVICE = "Cloud Storage"  # how errors name the service: "Cloud Storage failed to ..."


def build_client(project: str) -> storage.Client:
    """A Storage client; anonymous against the emulator, default credentials otherwise."""
    import os

    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project, credentials=AnonymousCredentials())
    return storage.Client(project=project)


def pack_directory(directory: Path) -> bytes:
    """A gzip tarball of `directory`'s files, the same bytes for the same content.

    Names are relative, owners and times are zeroed, and the order is sorted, so the
    upload's name (its hash) changes only when the code does.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(directory)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def upload_code_dir(client: storage.Client, bucket: str, directory: Path) -> tuple[str, str]:
    """Upload a job's code directory once per content: its gs:// URI (for `code_uri`) and the
    tarball's SHA-256 (for `code_sha256`, which the agent checks before it unpacks).

    An object already under that name is kept only if it holds exactly these bytes: anything
    else there (planted, or cut short) is replaced.
    """
    import base64

    data = pack_directory(directory)
    digest = hashlib.sha256(data).hexdigest()
    name = f"code/{digest[:16]}.tar.gz"
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode("ascii")  # what Storage reports
    with translated(SERVICE, f"upload gs://{bucket}/{name}"):
        blob = client.bucket(bucket).get_blob(name)
        if blob is None or blob.md5_hash != md5:
            client.bucket(bucket).blob(name).upload_from_string(data, content_type="application/gzip")
    return f"gs://{bucket}/{name}", digest
