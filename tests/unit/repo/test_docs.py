"""The README stays short and points at the docs site; the site's pages are all reachable.

Fast checks of the text only: `make docs` runs the strict mkdocs build (broken links and
anchors inside docs/ fail there).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:shared|tests|bench|infra|examples|functions|tools|docs)/[\w./-]*[\w/])`")
PACKAGE_PATH = re.compile(r"`((?:domain|engine|adapters|runtime|cli|local|agent)/[\w/]+\.py)`")
MODULE = re.compile(r"`(tpujobs(?:\.\w+)+)")
LAYERS = {"domain", "engine", "adapters", "runtime", "cli", "local", "agent"}
# "docs/page.md#section" in the code, and where the code lives.
DOCS_POINTER = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
CODE_FOLDERS = ("shared", "functions", "infra", "bench", "tools", "examples")
CODE_SUFFIXES = {".py", ".tf", ".md", ".yaml", ".yml", ".sh", ".html", ".js"}
# Paths the docs name that a user creates and git never holds.
USERS_OWN = {"infra/terraform.tfvars"}


def nav_pages(entries: list[Any]) -> Iterator[str]:
    """Every page file named in mkdocs.yml's nav, however deeply nested."""
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            if isinstance(value, list):
                yield from nav_pages(value)
            else:
                yield value


def anchors(page: Path) -> set[str]:
    """The heading ids mkdocs gives a page (Python-Markdown's toc slugs, code and emphasis marks dropped)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in headings}


def module_depth(parts: list[str]) -> int:
    """How many leading parts of a dotted name are packages or modules under shared/."""
    depth, base = 0, ROOT / "shared"
    for part in parts:
        if (base / part).is_dir():
            depth, base = depth + 1, base / part
        else:
            return depth + (base / f"{part}.py").is_file()
    return depth


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@pytest.fixture(scope="module")
def nav() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return list(nav_pages(config["nav"]))


def readme_links() -> list[str]:
    return [target for target in LINK.findall(README.read_text(encoding="utf-8")) if "://" not in target]


def test_the_readme_is_at_most_250_lines() -> None:
    """The README says what tpujobs is, the two commands, a first job and the numbers; the rest is in docs/."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move sections to a page of docs/"


def test_the_readme_names_make_test_as_the_test_command() -> None:
    """CI runs `.ci/run`, which runs `make test`: the README must say so, and show `make demo` too."""
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make demo" in text


def test_the_readme_links_only_to_files_and_headings_that_exist() -> None:
    """A link from the README to a page or a section that is gone fails here, not on a reader."""
    for target in readme_links():
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), f"README.md links to {path}, which does not exist"
        if anchor and path.endswith(".md"):
            assert anchor in anchors(ROOT / path), f"README.md links to {target}, but {path} has no such heading"


def test_the_readme_links_to_every_page_of_the_docs(nav: list[str]) -> None:
    """A page no one can find from the README's table is a page no one reads."""
    linked = {target.partition("#")[0] for target in readme_links()}
    missing = [page for page in nav if f"docs/{page}" not in linked and page != "index.md"]
    assert not missing, f"README.md does not link to {missing}"


def test_the_docs_home_page_links_to_every_page_of_the_nav(nav: list[str]) -> None:
    """docs/index.md is the site's table of contents: a page added to the nav is added there too."""
    linked = {target.partition("#")[0] for target in LINK.findall((DOCS / "index.md").read_text(encoding="utf-8"))}
    missing = [page for page in nav if page not in linked and page != "index.md"]
    assert not missing, f"docs/index.md does not link to {missing}"


def test_every_section_the_code_points_at_exists() -> None:
    """Comments and docstrings say "see docs/security.md#attempt-keys": mkdocs checks the links of
    docs/ only, so a heading renamed under such a pointer fails here."""
    sources = [path for folder in CODE_FOLDERS for path in (ROOT / folder).rglob("*") if path.suffix in CODE_SUFFIXES]
    stale = [
        f"{path.relative_to(ROOT)}: docs/{page}#{anchor}"
        for path in sources
        for page, anchor in DOCS_POINTER.findall(path.read_text(encoding="utf-8", errors="replace"))
        if not (DOCS / page).is_file() or anchor not in anchors(DOCS / page)
    ]
    assert not stale, f"pointers to sections that do not exist: {stale}"


def test_every_page_is_in_the_nav_once_and_every_nav_entry_is_a_page(nav: list[str]) -> None:
    """mkdocs.yml's nav lists exactly the pages of docs/, each once."""
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


def test_the_scale_page_includes_the_readmes_numbers_table() -> None:
    """The numbers are written once, in the README, and the scale page includes them (pymdownx.snippets)."""
    readme = README.read_text(encoding="utf-8")
    start, end = "<!-- --8<-- [start:numbers] -->", "<!-- --8<-- [end:numbers] -->"
    assert start in readme and end in readme
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table.count("\n| ") >= 10, "the numbers table between the markers is empty"
    assert '--8<-- "README.md:numbers"' in (DOCS / "scale.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("document", documents(), ids=lambda path: path.name)
def test_every_file_and_module_the_docs_name_exists(document: Path) -> None:
    """A renamed or deleted module makes the page that names it fail, so the docs cannot go stale."""
    text = document.read_text(encoding="utf-8")
    stale = [
        path
        for path in REPO_PATH.findall(text)
        if "{" not in path and path not in USERS_OWN and not (ROOT / path).exists()
    ]
    stale += [path for path in PACKAGE_PATH.findall(text) if not (ROOT / "shared" / "tpujobs" / path).exists()]
    for name in MODULE.findall(text):
        parts = name.split(".")
        if parts[1] in LAYERS and len(parts) - module_depth(parts) > 1:  # at most one attribute after the module
            stale.append(name)
    assert not stale, f"{document.name} names what does not exist: {stale}"


def test_the_platform_pages_state_table_is_the_codes() -> None:
    """docs/platforms.md shows every instance status and MIG action with the state and verdict
    `adapters/compute_states.py` gives it: the one table, said twice, never apart."""
    from tpujobs.adapters.compute_states import CURRENT_ACTIONS, INSTANCE_STATUSES

    text = (DOCS / "platforms.md").read_text().split("## Capacity states", 1)[1].split("\n## ", 1)[0]
    rows = {
        m["name"]: (m["state"], m["host"])
        for m in re.finditer(r"^\| `(?P<name>\w+)` \| (?P<state>[^|]+?) \| (?P<host>[^|]+?) \|", text, re.M)
    }
    assert set(rows) == set(INSTANCE_STATUSES) | set(CURRENT_ACTIONS)
    for name, meaning in INSTANCE_STATUSES.items():
        assert rows[name] == (meaning.state, meaning.verdict), name
    for name, action in CURRENT_ACTIONS.items():
        assert rows[name] == ((action.state, action.verdict) if action else ("(the instance status decides)", "-")), (
            name
        )
