"""code_dir packing (tpujobs.cli.code_packer) on real directories and real git repositories:
which files go, the git commit and dirty flag, the size limit, and a tarball that is the same
bytes for the same tree."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tpujobs.cli import code_packer as code_dir
from tpujobs.cli.code_packer import CodeDirError, max_code_bytes, pack, select_files

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

# A tree with .gitignore files at three levels, a re-include, a directory pattern, an anchored
# pattern, and files each of them decides.
TREE = {
    ".gitignore": "*.log\n/build/\nsecret.txt\n",
    "train.py": "print('train')\n",
    "run.log": "ignored at the root\n",
    "build/out.bin": "ignored directory\n",
    "src/build/keep.py": "not /build/: anchored to the root\n",
    "src/.gitignore": "!keep.log\ndata/\n",
    "src/keep.log": "re-included one level down\n",
    "src/model.py": "model\n",
    "src/data/big.bin": "ignored directory one level down\n",
    "src/deep/.gitignore": "*.py\n!main.py\n",
    "src/deep/main.py": "re-included by the deepest file\n",
    "src/deep/helper.py": "ignored by the deepest file\n",
    "src/deep/secret.txt": "ignored by the root file, at any depth\n",
    "notes/a.md": "kept\n",
}
KEPT = [
    ".gitignore",
    "notes/a.md",
    "src/.gitignore",
    "src/build/keep.py",
    "src/deep/.gitignore",
    "src/deep/main.py",
    "src/keep.log",
    "src/model.py",
    "train.py",
]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    answer = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return answer.stdout.strip()


def repo(root: Path, files: dict[str, str], commit: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    write(root, files)
    if commit:
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "first")
    return root


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getnames()


# --- which files ---------------------------------------------------------------------------


def test_outside_a_checkout_every_gitignore_level_decides_as_git_does(tmp_path: Path) -> None:
    """Root patterns at any depth, anchored ones at the root only, `!` one level down, the
    deepest file last; an ignored directory is not entered."""
    root = write(tmp_path / "code", TREE)
    assert select_files(root) == KEPT


def test_outside_a_checkout_the_selection_is_the_one_git_makes_of_the_same_tree(tmp_path: Path) -> None:
    """The same tree, untracked in a fresh repository: git's own answer equals pathspec's."""
    plain = write(tmp_path / "plain", TREE)
    checked_out = repo(tmp_path / "repo", TREE, commit=False)
    assert select_files(checked_out) == select_files(plain) == KEPT


def test_git_is_never_packed_not_even_a_stray_git_file_outside_a_checkout(tmp_path: Path) -> None:
    """A `.git` file or directory at any depth, and __pycache__, stay out."""
    root = write(tmp_path / "code", {"a.py": "a", "sub/.git": "gitdir: elsewhere", "sub/b.py": "b"})
    (root / ".git").mkdir()  # not a repository: no HEAD, no objects
    (root / ".git" / "config").write_text("[core]\n")
    write(root, {"__pycache__/a.cpython-311.pyc": "x", "sub/__pycache__/b.pyc": "x"})
    assert select_files(root) == ["a.py", "sub/b.py"]


def test_in_a_checkout_git_lists_tracked_untracked_and_honours_ignores(tmp_path: Path) -> None:
    """Tracked and untracked files go, ignored untracked ones do not, a tracked file goes even
    where a pattern ignores it, and .git never."""
    root = repo(tmp_path / "repo", {".gitignore": "*.tmp\n", "train.py": "t", "forced.tmp": "tracked"}, commit=False)
    git(root, "add", "-f", "forced.tmp")
    git(root, "add", ".gitignore", "train.py")
    git(root, "commit", "-q", "-m", "first")
    write(root, {"new.py": "untracked", "scratch.tmp": "ignored", "sub/x.tmp": "ignored"})
    assert select_files(root) == [".gitignore", "forced.tmp", "new.py", "train.py"]


def test_a_code_dir_inside_a_checkout_follows_the_repositorys_ignores_above_it(tmp_path: Path) -> None:
    """code_dir is a subdirectory: the root's .gitignore and .git/info/exclude reach into it;
    names are relative to code_dir; files beside it are not packed."""
    root = repo(tmp_path / "repo", {".gitignore": "*.ckpt\n", "README.md": "r", "trainer/train.py": "t"})
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("local-notes.txt\n")
    write(root, {"trainer/model.ckpt": "big", "trainer/local-notes.txt": "mine", "trainer/util.py": "u"})
    assert select_files(root / "trainer") == ["train.py", "util.py"]


def test_a_deleted_but_tracked_file_is_not_packed_and_a_submodule_brings_its_files(tmp_path: Path) -> None:
    """Files deleted from the work tree (still in the index) are skipped; a nested repository's
    own files are listed through its own git."""
    root = repo(tmp_path / "repo", {"a.py": "a", "gone.py": "g"})
    (root / "gone.py").unlink()
    repo(root / "vendor" / "lib", {".gitignore": "*.o\n", "lib.py": "l"})
    write(root, {"vendor/lib/lib.o": "object"})
    assert select_files(root) == ["a.py", "vendor/lib/.gitignore", "vendor/lib/lib.py"]


@pytest.mark.parametrize("checkout", [False, True], ids=["plain", "git"])
def test_tpujobsignore_removes_more_and_its_excluded_directories_stay_excluded(tmp_path: Path, checkout: bool) -> None:
    """.tpujobsignore at the root removes files and whole directories (tracked ones too); a `!`
    under a directory it ignores brings nothing back."""
    files = {
        ".tpujobsignore": "notebooks/\n*.csv\n!notebooks/keep.py\n/top-only.txt\n",
        "train.py": "t",
        "notebooks/explore.ipynb": "n",
        "notebooks/keep.py": "k",
        "data/sample.csv": "c",
        "top-only.txt": "x",
        "sub/top-only.txt": "kept: anchored to the root",
    }
    root = repo(tmp_path / "repo", files) if checkout else write(tmp_path / "code", files)
    assert select_files(root) == [".tpujobsignore", "sub/top-only.txt", "train.py"]


def test_a_directory_with_nothing_to_pack_is_refused_with_a_sentence(tmp_path: Path) -> None:
    """Everything ignored: a CodeDirError naming the directory and why."""
    root = write(tmp_path / "code", {".tpujobsignore": "*\n", "a.py": "a"})
    with pytest.raises(CodeDirError, match=r"code_dir .*code has no file to pack"):
        pack(root)
    with pytest.raises(CodeDirError, match="is not a directory"):
        pack(root / "a.py")


def test_links_inside_go_as_links_and_links_leading_outside_are_refused(tmp_path: Path) -> None:
    """A relative link within the tree is packed as a link; one leaving it is a CodeDirError."""
    root = write(tmp_path / "code", {"real/config.yaml": "c"})
    (root / "config.yaml").symlink_to("real/config.yaml")
    with tarfile.open(fileobj=io.BytesIO(pack(root).data), mode="r:gz") as tar:
        link = tar.getmember("config.yaml")
    assert link.issym() and link.linkname == "real/config.yaml"
    (root / "escape").symlink_to("../../etc/passwd")
    with pytest.raises(CodeDirError, match=r"symbolic link escape -> \.\./\.\./etc/passwd"):
        pack(root)


# --- where it came from --------------------------------------------------------------------


def test_a_clean_checkout_records_its_commit_and_not_dirty(tmp_path: Path) -> None:
    """git_commit is HEAD; git_dirty False when nothing under code_dir changed."""
    root = repo(tmp_path / "repo", {"trainer/train.py": "t", "other/x.py": "x"})
    package = pack(root / "trainer")
    assert (package.git_commit, package.git_dirty) == (git(root, "rev-parse", "HEAD"), False)


@pytest.mark.parametrize(
    ("change", "dirty"),
    [
        ({"trainer/train.py": "changed"}, True),  # a tracked file under code_dir
        ({"trainer/new.py": "untracked"}, True),  # packed, but in no commit
        ({"other/x.py": "changed"}, False),  # outside code_dir
        ({"trainer/run.log": "ignored"}, False),  # ignored: not packed either
    ],
    ids=["modified", "untracked", "outside", "ignored"],
)
def test_dirty_means_changes_under_code_dir_that_are_not_ignored(
    tmp_path: Path, change: dict[str, str], dirty: bool
) -> None:
    """Modified or untracked files under code_dir make it dirty; changes elsewhere or ignored do not."""
    root = repo(tmp_path / "repo", {".gitignore": "*.log\n", "trainer/train.py": "t", "other/x.py": "x"})
    write(root, change)
    assert pack(root / "trainer").git_dirty is dirty


def test_no_checkout_or_no_commit_records_nothing(tmp_path: Path) -> None:
    """Outside git, and in a repository without a commit: no commit, no dirty flag."""
    assert (pack(write(tmp_path / "plain", {"a.py": "a"})).git_commit, pack(tmp_path / "plain").git_dirty) == (
        None,
        None,
    )
    fresh = repo(tmp_path / "fresh", {"a.py": "a"}, commit=False)
    assert (pack(fresh).git_commit, pack(fresh).git_dirty) == (None, None)


# --- the size limit ------------------------------------------------------------------------


def test_over_the_limit_is_refused_before_packing_naming_size_limit_and_biggest_files(tmp_path: Path) -> None:
    """3 MiB of files against 2 MiB: one sentence with the total, the limit, the biggest first."""
    root = write(tmp_path / "code", {"small.py": "s"})
    (root / "weights.bin").write_bytes(b"\0" * (2 << 20))
    (root / "data").mkdir()
    (root / "data" / "sample.bin").write_bytes(b"\0" * (1 << 20))
    with pytest.raises(CodeDirError) as refused:
        pack(root, max_bytes=2 << 20)
    message = str(refused.value)
    assert "holds 3.0 MiB to pack, over the 2.0 MiB limit (TPUJOBS_MAX_CODE_MB)" in message
    assert "the biggest files: weights.bin (2.0 MiB), data/sample.bin (1.0 MiB), small.py (1 bytes)" in message


def test_ignored_files_do_not_count_towards_the_limit(tmp_path: Path) -> None:
    """The same big file, ignored in .tpujobsignore: packed within the limit."""
    root = write(tmp_path / "code", {"train.py": "t", ".tpujobsignore": "*.bin\n"})
    (root / "weights.bin").write_bytes(b"\0" * (2 << 20))
    assert names(pack(root, max_bytes=1 << 20).data) == [".tpujobsignore", "train.py"]


@pytest.mark.parametrize(("value", "limit"), [(None, 512 << 20), ("", 512 << 20), ("2", 2 << 20), (" 64 ", 64 << 20)])
def test_the_limit_is_tpujobs_max_code_mb_or_512_mib(value: str | None, limit: int) -> None:
    """Unset or empty: 512 MiB; a whole number: that many MiB."""
    environ = {} if value is None else {"TPUJOBS_MAX_CODE_MB": value}
    assert max_code_bytes(environ) == limit


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "lots"])
def test_a_bad_limit_setting_is_a_sentence_naming_it(value: str) -> None:
    with pytest.raises(CodeDirError, match="TPUJOBS_MAX_CODE_MB must be a whole number of MiB"):
        max_code_bytes({"TPUJOBS_MAX_CODE_MB": value})


# --- the tarball ---------------------------------------------------------------------------


def test_the_same_tree_gives_the_same_bytes_whatever_its_times_owners_and_umask(tmp_path: Path) -> None:
    """Two copies with different mtimes and group/other permission bits: the same digest;
    entries sorted, times and owners zeroed, no time in the gzip header."""
    first = write(tmp_path / "a", {"z.py": "z", "a/b.py": "b", "run.sh": "#!/bin/sh\n"})
    (first / "run.sh").chmod(0o700)
    second = tmp_path / "b"
    shutil.copytree(first, second)
    os.utime(second / "z.py", (1_000_000_000, 1_000_000_000))
    (second / "a" / "b.py").chmod(0o600)
    (second / "run.sh").chmod(0o775)
    one, two = pack(first), pack(second)
    assert one.data == two.data and one.sha256 == two.sha256 == hashlib.sha256(one.data).hexdigest()
    assert one.data[4:8] == b"\0\0\0\0"  # gzip MTIME
    with tarfile.open(fileobj=io.BytesIO(one.data), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a/b.py", "run.sh", "z.py"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.name: m.mode for m in members} == {"a/b.py": 0o644, "run.sh": 0o755, "z.py": 0o644}


def test_a_changed_byte_changes_the_digest(tmp_path: Path) -> None:
    root = write(tmp_path / "code", {"train.py": "lr = 0.1\n"})
    before = pack(root).sha256
    write(root, {"train.py": "lr = 0.2\n"})
    assert pack(root).sha256 != before


def test_the_archive_unpacks_to_the_selected_files(tmp_path: Path) -> None:
    """What goes in comes out, byte for byte (the agent unpacks with tarfile too)."""
    root = write(tmp_path / "code", TREE)
    with tarfile.open(fileobj=io.BytesIO(pack(root).data), mode="r:gz") as tar:
        unpacked = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert unpacked == {name: TREE[name] for name in KEPT}


def test_git_is_asked_with_an_argv_list_in_the_directory_and_without_a_foreign_git_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIT_DIR pointing at another repository (as in a hook) does not change what is packed."""
    other = repo(tmp_path / "other", {"theirs.py": "x"})
    root = repo(tmp_path / "mine", {"mine.py": "m"})
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    assert select_files(root) == ["mine.py"]
    assert code_dir.git_state(root)[0] == git(root, "rev-parse", "HEAD")
