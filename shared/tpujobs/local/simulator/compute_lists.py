"""Compute Engine's list calls: `filter` on the name and pages of `maxResults` with an opaque
`pageToken`, as every aggregated and zonal list of the v1 API takes them."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from tpujobs.local.simulator.compute_errors import invalid, invalid_field
from tpujobs.local.simulator.messages import query_str

T = TypeVar("T")
MAX_RESULTS = 500  # Compute Engine's default and its largest page
# `name eq "RE2"`, `name ne "RE2"` (a regular expression matching the whole name), `name = "x"` and
# `name != "x"` (the name itself); in parentheses or not. Anything else is refused: the simulator
# would rather fail a filter it does not understand than answer with the wrong resources.
_FILTER = re.compile(
    r'\s*\(?\s*(?P<field>[A-Za-z][A-Za-z0-9.]*)\s*(?P<op>eq|ne|!=|=)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s()"]+)\s*\)?\s*'
)


def name_filter(text: str) -> Callable[[str], bool]:
    """What a list's `filter` keeps, as a test of the name; 400 for a filter it cannot read."""
    if not text.strip():
        return lambda name: True
    match = _FILTER.fullmatch(text)
    if match is None or match["field"] != "name":
        raise invalid_field("filter", text, 'The tpujobs simulator filters on name only: name eq "RE2" or name = "x".')
    value = match["value"]
    if value.startswith('"'):
        value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if match["op"] in ("=", "!="):
        same = match["op"] == "="
        return lambda name: (name == value) == same
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise invalid_field("filter", text, f"Invalid regular expression: {exc}.") from None
    keep = match["op"] == "eq"
    return lambda name: (pattern.fullmatch(name) is not None) == keep


def page_of(items: Iterable[T], name: Callable[[T], str], max_results: int, page_token: str) -> tuple[list[T], str]:
    """One page ordered by name, and the token of the next ("" when none): the last name shown."""
    if not 0 <= max_results <= MAX_RESULTS:
        raise invalid_field("maxResults", max_results, f"It must be within 0..{MAX_RESULTS}.")
    ordered = sorted(items, key=name)
    if page_token:
        try:
            after = base64.urlsafe_b64decode(page_token.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            raise invalid(f"Invalid value for field 'pageToken': '{page_token}'.") from None
        ordered = [item for item in ordered if name(item) > after]
    size = max_results or MAX_RESULTS
    if len(ordered) <= size:
        return ordered, ""
    shown = ordered[:size]
    return shown, base64.urlsafe_b64encode(name(shown[-1]).encode("utf-8")).decode("ascii")


def query_whole(query: Mapping[str, list[str]], name: str, default: int = 0) -> int:
    """A whole-number query parameter (`maxResults`, `size`, `port`, `start`); absent: `default`."""
    raw = query_str(query, name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise invalid_field(name, raw, "It must be a whole number.") from None
