"""The job's code: a gs:// tarball checked against the job's SHA-256 and unpacked safely, or
every object under a gs:// prefix.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
from typing import Any

from .basics import AgentError, Refused
from .rest import Storage, split_gs_uri


def _relative_parts(name: str, what: str) -> list[str]:
    """The parts of a relative archive or object path; absolute paths and `..` are refused."""
    if name.startswith("/") or name.startswith("\\") or "\\" in name:
        raise AgentError(f"{what} {name!r} is absolute or uses backslashes")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise AgentError(f"{what} {name!r} climbs out with '..'")
    return parts


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def safe_extract(archive: str, destination: str, standard_filter: bool = True) -> None:
    """Unpack a tarball into destination; refuse absolute paths, `..`, escaping links, devices.

    The checks here suffice on their own (Python 3.8 has no extraction filters); where the
    standard "data" filter exists it is applied as well.
    """
    os.makedirs(destination, exist_ok=True)
    root = os.path.realpath(destination)
    extra: dict[str, Any] = {}
    if standard_filter and hasattr(tarfile, "data_filter"):
        extra["filter"] = "data"
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            parts = _relative_parts(member.name, "archive member")
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                raise AgentError(f"archive member {member.name!r} is not a file, directory or link")
            if member.issym():
                if member.linkname.startswith("/"):
                    raise AgentError(f"symlink {member.name!r} points to an absolute path")
                target = os.path.normpath(os.path.join(root, *parts[:-1], member.linkname))
                if not (target == root or target.startswith(root + os.sep)):
                    raise AgentError(f"symlink {member.name!r} points outside the code directory")
            if member.islnk():
                _relative_parts(member.linkname, f"hard link target of {member.name!r}")
        for member in members:
            parts = _relative_parts(member.name, "archive member")
            if not parts:
                continue
            path = os.path.join(root, *parts)
            # Links already unpacked must not lead anywhere else: check where writing would land.
            if not _inside(root, os.path.dirname(path)) or (
                not member.isdir() and os.path.lexists(path) and not _inside(root, path)
            ):
                raise AgentError(f"archive member {member.name!r} would land outside the code directory")
            if member.islnk() and not _inside(root, os.path.join(root, member.linkname)):
                raise AgentError(f"hard link {member.name!r} points outside the code directory")
            try:
                tar.extract(member, root, **extra)
            except tarfile.TarError as error:  # the standard "data" filter refused it
                raise AgentError(f"archive member {member.name!r} refused: {error}") from None
            if member.issym() and not _inside(root, path):
                os.unlink(path)
                raise AgentError(f"symlink {member.name!r} resolves outside the code directory")


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_code(storage: Storage, code_uri: str, destination: str, sha256: str | None = None) -> None:
    """A gs:// tarball unpacked into destination, or every object under a gs:// prefix.

    With `sha256` (the digest recorded with the job) the downloaded tarball must have it
    before anything is unpacked; otherwise it is `Refused`. A prefix has no one digest.
    """
    bucket, name = split_gs_uri(code_uri)
    os.makedirs(destination, exist_ok=True)
    if name and not name.endswith("/"):
        fd, archive = tempfile.mkstemp(prefix="code-", suffix=".tar", dir=os.path.dirname(destination))
        os.close(fd)
        try:
            storage.download(bucket, name, archive)
            if sha256 is not None:
                found = file_sha256(archive)
                if found != sha256.lower():
                    raise Refused(
                        f"the code tarball {code_uri} has SHA-256 {found}, not {sha256.lower()} "
                        "recorded with the job: refused (it was replaced or planted after submission)"
                    )
            safe_extract(archive, destination)
        finally:
            os.unlink(archive)
        return
    if sha256 is not None:
        raise Refused(
            f"the job records the SHA-256 of a code tarball, but its code {code_uri} is a prefix: "
            "a prefix's objects have no one digest to check, so the code is refused"
        )
    names = storage.list_names(bucket, name)
    if not names:
        raise AgentError(f"no objects under {code_uri}")
    for object_name in names:
        relative = object_name[len(name) :]
        if not relative or relative.endswith("/"):
            continue  # a "folder" placeholder
        parts = _relative_parts(relative, "object")
        path = os.path.join(destination, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not _inside(destination, os.path.dirname(path)):
            raise AgentError(f"object {object_name!r} would land outside the code directory")
        storage.download(bucket, object_name, path)
