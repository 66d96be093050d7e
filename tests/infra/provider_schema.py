"""The Google provider's schema, from the npm package @cdktf/provider-google.

Terraform providers cannot be downloaded here, so `terraform validate` is out of reach; the
CDKTF bindings, generated from the provider's own schema, are on the npm registry. Their `.jsii`
file describes every resource and data source: a `...Config` struct per type whose properties
are its arguments and nested blocks (a property that is not optional is required), the Terraform
name of each in its documentation link. It is about 100 MB, so it is reduced to names and
required flags once, and that is kept in the repository (tests/data/provider-google/, 86 KB
gzipped): the tests read it and need neither npm nor a network. To pin a new release, set
PACKAGE_VERSION and run `python tests/infra/provider_schema.py`, which fetches it with `npm pack`
and writes the reduced file.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGE = "@cdktf/provider-google"
# The newest release of the bindings whose provider is in the range infra/versions.tf allowed
# (">= 6.0, < 8.0"): 16.12.1 is provider 6.50.0, the last the bindings were published for.
PACKAGE_VERSION = "16.12.1"
KEPT = Path(__file__).resolve().parents[1] / "data" / "provider-google"

# npm's error codes for "the registry could not be reached": only these make the test skip.
UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "EHOSTUNREACH")

# "{@link https://.../docs/resources/pubsub_subscription google_pubsub_subscription}"
_TYPE_LINK = re.compile(r"/docs/(resources|data-sources)/[a-z0-9_]+ (google_[a-z0-9_]+)\}")
# "{@link https://.../pubsub_subscription#ack_deadline_seconds PubsubSubscription#ack_deadline_seconds}"
_NAME_LINK = re.compile(r"#([a-z0-9_]+) [A-Za-z0-9]+#\1\}")


class RegistryUnreachable(Exception):
    """npm could not reach its registry (only when refreshing the kept schema)."""


def kept_path(version: str = PACKAGE_VERSION) -> Path:
    """Where the reduced schema of `version` is kept in the repository."""
    return KEPT / f"{version}.json.gz"


def load(version: str = PACKAGE_VERSION) -> dict[str, Any]:
    """The reduced schema of `version`, as kept in the repository."""
    kept = kept_path(version)
    if not kept.exists():
        raise FileNotFoundError(f"no schema kept for {PACKAGE}@{version}: run `python {__file__}` to fetch it")
    with gzip.open(kept, "rt", encoding="utf-8") as file:
        schema: dict[str, Any] = json.load(file)
    return schema


def refresh(version: str = PACKAGE_VERSION) -> Path:
    """Fetch `version` with npm, reduce it, and keep it (gzip without a timestamp: the same bytes each time)."""
    with tempfile.TemporaryDirectory() as folder:
        tarball = _pack(version, Path(folder))
        schema = _reduce(tarball)
    kept = kept_path(version)
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(kept, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as file:
        file.write(json.dumps(schema, sort_keys=True).encode("utf-8"))
    return kept


def _pack(version: str, folder: Path) -> Path:
    """`npm pack` of the package into folder, from whatever registry npm is configured with."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm is missing: install Node.js and npm (the Debian package npm) to check infra/ against the provider"
        )
    answer = subprocess.run(
        [npm, "pack", f"{PACKAGE}@{version}", "--json", "--pack-destination", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=600,
        check=False,
    )
    if answer.returncode != 0:
        lines = [line for line in answer.stderr.splitlines() if any(code in line for code in UNREACHABLE)]
        if lines:
            raise RegistryUnreachable(f"npm could not reach its registry: {lines[0].strip()}")
        raise RuntimeError(f"npm pack {PACKAGE}@{version} failed: {answer.stderr.strip()[-2000:]}")
    filename = json.loads(answer.stdout)[0]["filename"]
    return folder / filename


def _reduce(tarball: Path) -> dict[str, Any]:
    """Every resource's and data source's arguments and blocks, by Terraform name."""
    with tarfile.open(tarball, "r:gz") as archive:
        package = json.load(_member(archive, "package/package.json"))
        types = json.load(_member(archive, "package/.jsii"))["types"]
    schema: dict[str, Any] = {
        "package": package["version"],
        "provider": package["cdktf"]["provider"]["version"],
        "resource": {},
        "data": {},
    }
    for kind in types.values():
        base = kind.get("base")
        if kind.get("kind") != "class" or base not in ("cdktf.TerraformResource", "cdktf.TerraformDataSource"):
            continue
        found = _TYPE_LINK.search(kind["docs"].get("summary", ""))
        assert found, f"no Terraform type named in the docs of {kind['fqn']}"
        section = "resource" if found.group(1) == "resources" else "data"
        config = next(p["type"]["fqn"] for p in kind["initializer"]["parameters"] if p["name"] == "config")
        schema[section][found.group(2)] = _struct(types, config, ())
    return schema


def _member(archive: tarfile.TarFile, name: str) -> Any:
    file = archive.extractfile(name)
    assert file is not None, f"{name} is not a file in the package"
    return file


def _struct(types: dict[str, Any], fqn: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """{"arguments": {name: required}, "blocks": {name: {"required", "single", ...nested}}}."""
    node: dict[str, Any] = {"arguments": {}, "blocks": {}}
    if fqn in seen:  # a recursive schema: its depth is cut where it repeats
        return node
    for prop in types[fqn].get("properties", []):
        name = _terraform_name(prop)
        required = not prop.get("optional", False)
        nested = next(_struct_types(types, prop["type"]), None)
        if nested is None:
            node["arguments"][name] = required
        else:
            # A block typed as one struct, not a list of them, is one the provider allows once.
            single = "fqn" in prop["type"]
            node["blocks"][name] = {"required": required, "single": single, **_struct(types, nested, (*seen, fqn))}
    return node


def _struct_types(types: dict[str, Any], reference: dict[str, Any]) -> Iterator[str]:
    """The provider's own structs a property's type holds (a block, or a list or set of them)."""
    if "fqn" in reference:
        target = types.get(reference["fqn"])
        if target is not None and target.get("datatype"):
            yield reference["fqn"]
    elif "union" in reference:
        for option in reference["union"]["types"]:
            yield from _struct_types(types, option)
    elif "collection" in reference:
        yield from _struct_types(types, reference["collection"]["elementtype"])


def _terraform_name(prop: dict[str, Any]) -> str:
    """The name in the property's documentation link; else its camelCase name in snake_case."""
    docs = prop.get("docs", {})
    found = _NAME_LINK.search(docs.get("remarks", "") + " " + docs.get("summary", ""))
    if found:
        return found.group(1)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", prop["name"]).lower()


if __name__ == "__main__":
    print(f"kept {refresh()}")
