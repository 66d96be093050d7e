"""A job's `code_dir`, packed as the hosts will unpack it: the files a team means to ship, and
nothing else, in a tarball whose bytes depend only on those files.

Which files: never `.git` or `__pycache__`; in a git checkout, what `git ls-files --cached --others
--exclude-standard` lists; outside one, the same `.gitignore` rules through `pathspec`; then
`.tpujobsignore` removes more. A link leading outside is refused, and the size limit is checked before
anything is read. The rules and their reasons: docs/spec.md#packing-code_dir.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

IGNORE_FILE = ".tpujobsignore"
NEVER_PACKED = frozenset({".git", "__pycache__"})  # by name, at any depth
MAX_CODE_MB_SETTING = "TPUJOBS_MAX_CODE_MB"
DEFAULT_MAX_CODE_MB = 512
BIGGEST_SHOWN = 5  # files named when the limit is passed
GIT_TIMEOUT_SECONDS = 60
# Repository-chosen programs git could run while listing (a file-system monitor): off.
GIT = ("git", "-c", "core.fsmonitor=false")


class CodeDirError(ValueError):
    """The directory cannot be packed as it is; the message is a sentence saying why and what to do."""


@dataclass(frozen=True)
class CodePackage:
    """A packed code_dir: the tarball, its SHA-256, and where it came from in git, if anywhere."""

    data: bytes
    sha256: str
    files: tuple[str, ...]  # relative POSIX names, sorted, as packed
    git_commit: str | None = None  # HEAD of the checkout holding the directory
    git_dirty: bool | None = None  # uncommitted changes (or untracked files) under the directory


def max_code_bytes(environ: Mapping[str, str]) -> int:
    """The size limit: TPUJOBS_MAX_CODE_MB (a whole number of MiB, 1 or more), else 512 MiB."""
    raw = environ.get(MAX_CODE_MB_SETTING, "").strip()
    if not raw:
        return DEFAULT_MAX_CODE_MB * 1024 * 1024
    if not raw.isdigit() or int(raw) < 1:
        raise CodeDirError(f"{MAX_CODE_MB_SETTING} must be a whole number of MiB, 1 or more, got {raw!r}.")
    return int(raw) * 1024 * 1024


def pack(directory: Path, max_bytes: int = DEFAULT_MAX_CODE_MB * 1024 * 1024) -> CodePackage:
    """Select, check and pack `directory` (the module docstring has the rules)."""
    root = directory.resolve()
    if not root.is_dir():
        raise CodeDirError(f"code_dir {directory} is not a directory.")
    files = select_files(root)
    if not files:
        raise CodeDirError(
            f"code_dir {directory} has no file to pack: everything in it is ignored "
            f"(.gitignore, {IGNORE_FILE}) or it is empty."
        )
    check_links(root, files)
    check_size(root, files, max_bytes)
    data = tarball(root, files)
    if len(data) > max_bytes:
        raise CodeDirError(
            f"code_dir {directory} packs to {_size(len(data))}, over the {_size(max_bytes)} limit "
            f"({MAX_CODE_MB_SETTING}); leave out what jobs do not need with {IGNORE_FILE} or .gitignore."
        )
    commit, dirty = git_state(root)
    return CodePackage(data, hashlib.sha256(data).hexdigest(), tuple(files), commit, dirty)


# --- which files ---------------------------------------------------------------------------


def select_files(root: Path) -> list[str]:
    """The relative POSIX names of every file to pack, sorted."""
    candidates = _git_files(root)
    if candidates is None:
        candidates = _walk(root)
    ignore = _spec(root / IGNORE_FILE)
    return sorted(name for name in set(candidates) if not (ignore and _ignored_by(ignore, name)))


def _run_git(directory: Path, *args: str) -> bytes | None:
    """git's output in `directory`, or None when git is missing or says no (not a checkout).
    GIT_* variables are dropped: a hook's GIT_DIR must not point git at another repository."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    try:
        answer = subprocess.run(
            [*GIT, *args],
            cwd=directory,
            env=env,
            capture_output=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout if answer.returncode == 0 else None


def _in_checkout(directory: Path) -> bool:
    return _run_git(directory, "rev-parse", "--is-inside-work-tree") == b"true\n"


def _git_files(directory: Path, prefix: str = "") -> list[str] | None:
    """What git lists under `directory` (None outside a checkout); a submodule or nested
    repository, listed as a directory, is asked for its own files."""
    if not _in_checkout(directory):
        return None
    listed = _run_git(directory, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    if listed is None:
        return None
    found: list[str] = []
    for raw in sorted(set(listed.split(b"\0")) - {b""}):
        name = os.fsdecode(raw).rstrip("/")
        if NEVER_PACKED.intersection(name.split("/")):
            continue
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            nested = _git_files(path, f"{prefix}{name}/")
            found += _walk(path, f"{prefix}{name}/") if nested is None else nested
        elif path.is_symlink() or path.is_file():  # a file deleted but not yet staged is gone
            found.append(f"{prefix}{name}")
    return found


def _spec(path: Path) -> GitIgnoreSpec | None:
    """The patterns of one ignore file, or None when there is none."""
    if not path.is_file():
        return None
    return GitIgnoreSpec.from_lines(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines())


def _decides(spec: GitIgnoreSpec, name: str) -> bool | None:
    """True: the last matching pattern ignores `name` (a directory's ends with '/'); False: it
    re-includes it (`!`); None: no pattern matches."""
    return spec.check_file(name).include


def _ignored_by(spec: GitIgnoreSpec, name: str) -> bool:
    """Whether one root-level spec removes `name`: itself or any directory above it ignored."""
    parts = name.split("/")
    for depth in range(1, len(parts)):
        if _decides(spec, "/".join(parts[:depth]) + "/"):
            return True
    return bool(_decides(spec, name))


def _walk(root: Path, prefix: str = "") -> list[str]:
    """Every file under `root` that its .gitignore files keep, without git."""
    found: list[str] = []

    def ignored(levels: list[tuple[str, GitIgnoreSpec]], name: str) -> bool:
        for base, spec in reversed(levels):  # the deepest .gitignore that has a say decides
            verdict = _decides(spec, name[len(base) :])
            if verdict is not None:
                return verdict
        return False

    def visit(relative: str, levels: list[tuple[str, GitIgnoreSpec]]) -> None:
        here = root / relative
        spec = _spec(here / ".gitignore")
        if spec is not None:
            levels = [*levels, (relative, spec)]
        for entry in sorted(os.scandir(here), key=lambda e: e.name):
            if entry.name in NEVER_PACKED:
                continue
            name = relative + entry.name
            if entry.is_dir(follow_symlinks=False):
                if not ignored(levels, name + "/"):
                    visit(name + "/", levels)
            elif (entry.is_file(follow_symlinks=False) or entry.is_symlink()) and not ignored(levels, name):
                found.append(prefix + name)

    visit("", [])
    return found


# --- checks --------------------------------------------------------------------------------


def check_links(root: Path, files: list[str]) -> None:
    """Refuse a symbolic link whose target lies outside the directory (the hosts refuse it too)."""
    for name in files:
        path = root / name
        if not path.is_symlink():
            continue
        target = os.readlink(path)
        resolved = os.path.normpath(os.path.join(os.path.dirname(name), target))
        if os.path.isabs(target) or resolved == ".." or resolved.startswith("../"):
            raise CodeDirError(
                f"code_dir {root} holds the symbolic link {name} -> {target}, which leads outside it "
                f"and which the hosts would refuse; copy what it points to into the directory, or "
                f"leave it out with {IGNORE_FILE}."
            )


def check_size(root: Path, files: list[str], max_bytes: int) -> None:
    """Refuse, before packing, files that add up to more than the limit, naming the biggest."""
    sizes = {name: (root / name).lstat().st_size for name in files}
    total = sum(sizes.values())
    if total <= max_bytes:
        return
    biggest = sorted(sizes, key=lambda name: (-sizes[name], name))[:BIGGEST_SHOWN]
    shown = ", ".join(f"{name} ({_size(sizes[name])})" for name in biggest)
    raise CodeDirError(
        f"code_dir {root} holds {_size(total)} to pack, over the {_size(max_bytes)} limit "
        f"({MAX_CODE_MB_SETTING}); the biggest files: {shown}. Leave out what jobs do not need "
        f"with {IGNORE_FILE} or .gitignore, or raise the limit."
    )


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


# --- the tarball ---------------------------------------------------------------------------


def tarball(root: Path, files: list[str]) -> bytes:
    """The files as a gzip tarball whose bytes depend on their names, contents, links and
    executable bits only."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(files):
            path = root / name
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                info.mode = 0o777
                tar.addfile(info)
                continue
            info.mode = 0o755 if mode & 0o111 else 0o644
            info.size = path.stat().st_size
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


# --- where it came from --------------------------------------------------------------------


def git_state(directory: Path) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether anything under `directory` differs from it: changed, staged or
    untracked files that are not ignored); (None, None) outside a checkout or before a commit."""
    if not _in_checkout(directory):
        return None, None
    head = _run_git(directory, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head is None:
        return None, None
    status = _run_git(directory, "status", "--porcelain", "-z", "--untracked-files=normal", "--", ".")
    return head.decode("ascii").strip(), None if status is None else bool(status)
