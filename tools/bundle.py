"""Build the deployable function source: dist/function/ and dist/function.zip.

Cloud Functions builds from a directory with `main.py` and `requirements.txt` at its root.
Ours is functions/main.py, the layers of the tpujobs package that the functions import beside
it (so `from tpujobs import ...` needs no install step), and functions/requirements.txt, the
exact pins the tests ran with. The user's terminal (`cli/`) and the local stand-ins (`local/`)
never deploy.

The zip is reproducible: sorted entries, fixed timestamps and modes. Terraform names the
uploaded object by the zip's MD5, so an unchanged tree redeploys nothing and a changed one
redeploys every function. Standard library only: it runs in a bare Python image in CI.

    python tools/bundle.py [--out dist]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
SKIPPED = ("__pycache__", ".pyc", ".pyo")
DEPLOYED = ("agent", "domain", "engine", "adapters", "runtime")  # the layers below local/ and cli/


def _wanted(path: Path) -> bool:
    return not any(part == "__pycache__" for part in path.parts) and path.suffix not in SKIPPED


def _sources(root: Path) -> dict[str, Path]:
    """Bundle path -> source file: main.py, requirements.txt and every file of the deployed layers."""
    files = {
        "main.py": root / "functions" / "main.py",
        "requirements.txt": root / "functions" / "requirements.txt",
    }
    package = root / "shared" / "tpujobs"
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        deployed = len(relative.parts) == 1 or relative.parts[0] in DEPLOYED
        if path.is_file() and deployed and _wanted(relative):
            files[f"tpujobs/{relative.as_posix()}"] = path
    return files


def write_zip(directory: Path, archive: Path) -> None:
    """Every file under `directory`, sorted, with fixed times and modes: same tree, same bytes."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(directory).as_posix(), FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, path.read_bytes())


def build(out: Path, root: Path = ROOT) -> Path:
    """Write out/function/ afresh and out/function.zip from it; the zip's path."""
    directory = out / "function"
    if directory.exists():
        shutil.rmtree(directory)
    for name, source in _sources(root).items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    archive = out / "function.zip"
    write_zip(directory, archive)
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output folder (default: dist)")
    args = parser.parse_args(argv)
    archive = build(args.out)
    digest = hashlib.md5(archive.read_bytes()).hexdigest()
    files = sum(1 for p in (args.out / "function").rglob("*") if p.is_file())
    print(f"{archive} ({files} files, {archive.stat().st_size // 1024} KiB, md5 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
