"""Uploading a packed code_dir to the storage emulator: once per content under its account's
code prefix, with a custom time the code lifecycle rule counts from, and the spec fields the CLI submits."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpujobs.cli.code_packer import pack
from tpujobs.cli.code_upload import stored_tarball_sha256, upload_code_package
from tpujobs.cli.commands import pinned_code, upload_code
from tpujobs.engine.settings import Settings

pytestmark = pytest.mark.emulator

UPLOADED = datetime(2025, 3, 1, tzinfo=timezone.utc)


def code(root: Path, text: str = "print('train')\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(text, encoding="utf-8")
    return root


def test_a_new_tarball_is_uploaded_under_code_with_its_custom_time(tmp_path: Path, bucket) -> None:
    """code/jobs/{first 16 hex of its SHA-256}.tar.gz (the default account), the packed bytes,
    custom time = now."""
    package = pack(code(tmp_path / "code"))
    uri = upload_code_package(bucket.client, bucket.name, package, UPLOADED)
    name = f"code/jobs/{package.sha256[:16]}.tar.gz"
    assert uri == f"gs://{bucket.name}/{name}"
    blob = bucket.get_blob(name)
    assert blob.download_as_bytes() == package.data and blob.custom_time == UPLOADED


def test_submitting_the_same_code_again_moves_its_custom_time_forward_only(tmp_path: Path, bucket) -> None:
    """The same digest: no new upload (same generation), custom time moved to the later now;
    an earlier now leaves it."""
    package = pack(code(tmp_path / "code"))
    upload_code_package(bucket.client, bucket.name, package, UPLOADED)
    name = f"code/jobs/{package.sha256[:16]}.tar.gz"
    generation = bucket.get_blob(name).generation
    later = datetime(2025, 5, 1, tzinfo=timezone.utc)
    upload_code_package(bucket.client, bucket.name, package, later)
    upload_code_package(bucket.client, bucket.name, package, UPLOADED)
    blob = bucket.get_blob(name)
    assert (blob.generation, blob.custom_time) == (generation, later)


def test_a_planted_object_under_the_name_is_replaced(tmp_path: Path, bucket) -> None:
    """Other bytes under the digest's name are overwritten with the real tarball."""
    package = pack(code(tmp_path / "code"))
    bucket.blob(f"code/jobs/{package.sha256[:16]}.tar.gz").upload_from_string(b"planted")
    upload_code_package(bucket.client, bucket.name, package, UPLOADED)
    assert bucket.get_blob(f"code/jobs/{package.sha256[:16]}.tar.gz").download_as_bytes() == package.data


def test_the_cli_submits_the_code_fields_and_the_checkout_it_came_from(
    tmp_path: Path, bucket, storage_url: str, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upload_code: code_uri and code_sha256 always; code_git_commit and code_git_dirty from a
    checkout, dirty once a file under code_dir changes."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    settings = Settings(project=project_id, logs_bucket=bucket.name)
    plain = upload_code(settings, code(tmp_path / "plain"))
    assert set(plain) == {"code_uri", "code_sha256"}

    repo = code(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", *argv], cwd=repo, env=env, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
    clean = upload_code(settings, repo)
    assert (clean["code_git_commit"], clean["code_git_dirty"]) == (head.stdout.strip(), False)
    assert clean["code_sha256"] == plain["code_sha256"]  # the same tree, the same tarball
    code(repo, "print('changed')\n")
    assert upload_code(settings, repo)["code_git_dirty"] is True


def test_the_cli_refuses_code_over_the_limit_before_uploading(
    tmp_path: Path, bucket, storage_url: str, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TPUJOBS_MAX_CODE_MB=1 and 2 MiB of files: exit 2 with the sentence, nothing under code/."""
    from tpujobs.cli.common import Stop

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    monkeypatch.setenv("TPUJOBS_MAX_CODE_MB", "1")
    root = code(tmp_path / "code")
    (root / "weights.bin").write_bytes(b"\0" * (2 << 20))
    with pytest.raises(Stop) as refused:
        upload_code(Settings(project=project_id, logs_bucket=bucket.name), root)
    assert refused.value.code == 2 and "over the 1.0 MiB limit" in refused.value.message
    assert "weights.bin (2.0 MiB)" in refused.value.message
    assert list(bucket.list_blobs(prefix="code/")) == []


TEAM_A = "tpujobs-team-a@proj-1.iam.gserviceaccount.com"


def test_a_job_on_its_own_account_gets_its_code_under_that_accounts_prefix(
    tmp_path: Path, bucket, storage_url: str, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upload_code with the spec's service_account: code/accounts/{email}/..., nothing under
    the default account's code/jobs/, so team-a's code is out of every other account's reach."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    fields = upload_code(Settings(project=project_id, logs_bucket=bucket.name), code(tmp_path / "code"), TEAM_A)
    name = f"code/accounts/{TEAM_A}/{fields['code_sha256'][:16]}.tar.gz"
    assert fields["code_uri"] == f"gs://{bucket.name}/{name}"
    assert bucket.get_blob(name) is not None
    assert list(bucket.list_blobs(prefix="code/jobs/")) == []


def test_the_cli_records_the_digest_of_a_gs_tarball_the_user_named(
    tmp_path: Path, bucket, storage_url: str, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code_uri of the user's own without code_sha256: the CLI reads the object and records
    its SHA-256; a missing object records nothing; a given code_sha256 is kept as it is."""
    import hashlib

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    settings = Settings(project=project_id, logs_bucket=bucket.name)
    bucket.blob("code/jobs/mine.tar.gz").upload_from_string(b"tarball bytes")
    uri = f"gs://{bucket.name}/code/jobs/mine.tar.gz"
    expected = hashlib.sha256(b"tarball bytes").hexdigest()
    assert stored_tarball_sha256(bucket.client, uri) == expected
    assert pinned_code(settings, {"code_uri": uri}) == {"code_sha256": expected}
    assert pinned_code(settings, {"code_uri": uri, "code_sha256": "0" * 64}) == {}
    assert stored_tarball_sha256(bucket.client, f"gs://{bucket.name}/code/jobs/absent.tar.gz") is None
    assert pinned_code(settings, {"code_uri": f"gs://{bucket.name}/code/jobs/absent.tar.gz"}) == {}


def test_the_cli_refuses_code_under_another_accounts_prefix_before_submitting(
    bucket, project_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default-account job naming team-a's tarball in the deployment's bucket: exit 2 with
    the reason, before anything is read or published."""
    from tpujobs.cli.common import Stop

    settings = Settings(project=project_id, logs_bucket=bucket.name)
    with pytest.raises(Stop) as refused:
        pinned_code(settings, {"code_uri": f"gs://{bucket.name}/code/accounts/{TEAM_A}/0123456789abcdef.tar.gz"})
    assert refused.value.code == 2
    assert f"not under gs://{bucket.name}/code/jobs/" in refused.value.message
