"""The job's code: tarballs unpacked safely, prefixes downloaded, digests checked (`agent/code_fetch.py`)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from pathlib import Path

import pytest
from agent_stubs import (
    BUCKET,
    FAST,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    assert_all_signed,
    run_script,
)

from tpujobs.agent.basics import AGENT_FAILED, AgentError, Refused
from tpujobs.agent.code_fetch import fetch_code, safe_extract
from tpujobs.agent.rest import GoogleApi, Storage
from tpujobs.engine.startup_script import render_startup_script

# --- tarballs -------------------------------------------------------------------------


def make_tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """A .tar.gz of (kind, name, content-or-link-target) members: kind file, dir, sym, lnk, fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = value.encode()
                info.size = len(data)
                info.mode = 0o755 if name.endswith(".sh") else 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
            elif kind == "lnk":
                info.type, info.linkname = tarfile.LNKTYPE, value
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.mark.parametrize("standard_filter", [True, False], ids=["with-filter", "own-checks-only"])
def test_a_safe_tarball_unpacks_files_dirs_inner_links_and_modes(tmp_path: Path, standard_filter: bool) -> None:
    """Files, nested directories, a link inside the tree and the executable bit all arrive."""
    archive = make_tar(
        tmp_path / "code.tar.gz",
        [
            ("dir", "pkg", ""),
            ("file", "pkg/train.py", "print('hi')\n"),
            ("file", "run.sh", "#!/bin/sh\necho run\n"),
            ("sym", "pkg/link.py", "train.py"),
            ("lnk", "hard.py", "pkg/train.py"),
        ],
    )
    dest = tmp_path / "code"
    safe_extract(str(archive), str(dest), standard_filter=standard_filter)
    assert (dest / "pkg" / "train.py").read_text() == "print('hi')\n"
    assert (dest / "pkg" / "link.py").read_text() == "print('hi')\n"
    assert (dest / "hard.py").read_text() == "print('hi')\n"
    assert os.access(dest / "run.sh", os.X_OK)


HOSTILE_TARS = {
    "absolute_path": [("file", "/tmp/evil-{n}", "x")],
    "dot_dot": [("file", "../evil-{n}", "x")],
    "dot_dot_inside": [("file", "a/../../evil-{n}", "x")],
    "symlink_absolute": [("sym", "link", "/tmp")],
    "symlink_climbing": [("sym", "link", "../..")],
    "file_through_symlink": [("sym", "out", ".."), ("file", "out/evil-{n}", "x")],
    "symlink_chain": [("dir", "a", ""), ("sym", "a/b", ".."), ("sym", "a/c", "b/..")],
    "hardlink_absolute": [("lnk", "passwd", "/etc/passwd")],
    "hardlink_climbing": [("lnk", "passwd", "../../etc/passwd")],
    "fifo": [("fifo", "pipe", "")],
}


@pytest.mark.parametrize("standard_filter", [True, False], ids=["with-filter", "own-checks-only"])
@pytest.mark.parametrize("members", HOSTILE_TARS.values(), ids=HOSTILE_TARS.keys())
def test_a_hostile_tarball_is_refused_and_writes_nothing_outside(
    tmp_path: Path, members: list[tuple[str, str, str]], standard_filter: bool
) -> None:
    """Absolute paths, `..`, links leading out and special files raise AgentError; nothing escapes."""
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    members = [(k, n.replace("{n}", marker), v) for k, n, v in members]
    archive = make_tar(tmp_path / "bad.tar.gz", members)
    dest = tmp_path / "deep" / "code"
    with pytest.raises(AgentError):
        safe_extract(str(archive), str(dest), standard_filter=standard_filter)
    assert not list(tmp_path.rglob(f"evil-{marker}"))
    assert not Path(f"/tmp/evil-{marker}").exists()


def test_a_code_prefix_is_downloaded_whole_and_folder_placeholders_are_skipped(
    google: GoogleStub, tmp_path: Path
) -> None:
    """gs://b/code/ gives every object under it at its relative path."""
    google.objects[(BUCKET, "code/train.py")] = b"print(1)\n"
    google.objects[(BUCKET, "code/pkg/util.py")] = b"X = 1\n"
    google.objects[(BUCKET, "code/pkg/")] = b""
    google.objects[(BUCKET, "other/skip.py")] = b""
    storage = Storage(GoogleApi(google.url, None))
    fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "code"))
    found = sorted(str(p.relative_to(tmp_path / "code")) for p in (tmp_path / "code").rglob("*") if p.is_file())
    assert found == ["pkg/util.py", "train.py"]


def test_a_code_prefix_with_a_climbing_object_name_is_refused(google: GoogleStub, tmp_path: Path) -> None:
    """An object named code/../../evil does not land outside the code directory."""
    google.objects[(BUCKET, "code/../../evil")] = b"x"
    storage = Storage(GoogleApi(google.url, None))
    with pytest.raises(AgentError, match=r"\.\."):
        fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "a" / "code"))
    assert not list(tmp_path.rglob("evil"))


def test_a_code_tarball_is_downloaded_and_unpacked(google: GoogleStub, tmp_path: Path) -> None:
    """gs://b/code.tar.gz is unpacked into the code directory."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "print(2)\n")])
    google.objects[(BUCKET, "code.tar.gz")] = archive.read_bytes()
    storage = Storage(GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    fetch_code(storage, f"gs://{BUCKET}/code.tar.gz", str(tmp_path / "w" / "code"))
    assert (tmp_path / "w" / "code" / "train.py").read_text() == "print(2)\n"
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["code"]  # the download is gone


# --- code digest ----------------------------------------------------------------------


def test_a_code_tarball_with_the_recorded_digest_is_unpacked(google: GoogleStub, tmp_path: Path) -> None:
    """code_sha256 equal to the tarball's SHA-256 (either case): unpacked as usual."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "print(2)\n")])
    google.objects[(BUCKET, "code.tar.gz")] = archive.read_bytes()
    digest = hashlib.sha256(archive.read_bytes()).hexdigest().upper()
    storage = Storage(GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    fetch_code(storage, f"gs://{BUCKET}/code.tar.gz", str(tmp_path / "w" / "code"), digest)
    assert (tmp_path / "w" / "code" / "train.py").read_text() == "print(2)\n"


def test_a_code_tarball_with_another_digest_is_refused_before_unpacking(google: GoogleStub, tmp_path: Path) -> None:
    """A planted tarball: Refused with both digests, nothing unpacked, the download removed."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "planted\n")])
    google.objects[(BUCKET, "code/x.tar.gz")] = archive.read_bytes()
    found = hashlib.sha256(archive.read_bytes()).hexdigest()
    recorded = "d" * 64
    storage = Storage(GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    with pytest.raises(Refused) as refused:
        fetch_code(storage, f"gs://{BUCKET}/code/x.tar.gz", str(tmp_path / "w" / "code"), recorded)
    assert str(refused.value) == (
        f"the code tarball gs://{BUCKET}/code/x.tar.gz has SHA-256 {found}, not {recorded} "
        "recorded with the job: refused (it was replaced or planted after submission)"
    )
    assert [p.name for p in (tmp_path / "w").rglob("*")] == ["code"]


def test_a_digest_with_a_code_prefix_is_refused_before_anything_is_fetched(google: GoogleStub, tmp_path: Path) -> None:
    """code_sha256 with gs://b/code/: there is no one digest to check, so nothing is downloaded."""
    google.objects[(BUCKET, "code/train.py")] = b"print(1)\n"
    storage = Storage(GoogleApi(google.url, None))
    with pytest.raises(Refused, match="is a prefix"):
        fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "code"), "a" * 64)
    assert google.requests == []


def test_a_planted_tarball_aborts_the_attempt_and_runs_nothing(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A tarball replaced after submission: one `aborted` report naming both digests; no command."""
    submitted = make_tar(tmp_path / "good.tar.gz", [("file", "run.sh", "echo good\n")])
    planted = make_tar(tmp_path / "bad.tar.gz", [("file", "run.sh", f"touch {tmp_path}/ran\n")])
    google.objects[(BUCKET, "code/x.tar.gz")] = planted.read_bytes()
    job = a_job(
        code_uri=f"gs://{BUCKET}/code/x.tar.gz",
        code_sha256=hashlib.sha256(submitted.read_bytes()).hexdigest(),
        command="bash run.sh",
    )
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == AGENT_FAILED, stderr
    messages = google.messages(WORKER_EVENTS)
    assert [p["kind"] for p, _ in messages] == ["aborted"]
    assert "has SHA-256 " + hashlib.sha256(planted.read_bytes()).hexdigest() in messages[0][0]["detail"]
    assert_all_signed(google, WORKER_EVENTS)
    assert not (tmp_path / "ran").exists()
    assert list((tmp_path / "w" / "code").iterdir()) == []
