"""A small evaluator of Cloud Logging's query language, and the entry Cloud Run makes of a line.

infra/ once counted its metrics with log-based filters; they are gone, since any holder of
logging.logEntries.create (every job account) could write entries they count, and the functions
now write their metrics to Cloud Monitoring (`engine.metrics`). What stays: `entry_from_line`, the
entry Cloud Logging makes of a function's stdout line (tests/unit/engine/test_metric_forgery.py shows a
job's copy is the same field for field), and the evaluator, for a query over such entries.
Anything outside the subset below is refused with `UnsupportedFilter`, so a query can never pass
a test by being misread:

- comparisons `FIELD = VALUE`, `FIELD =~ "RE2 regex"`, and `<`, `<=`, `>`, `>=` on numbers or
  on `severity`; a value set `FIELD = ("a" OR "b")`;
- `NOT`, parentheses, and `AND` / `OR` (or terms side by side, an implicit AND); `AND` and `OR`
  mixed at one level need parentheses, since the two precedences are easy to misremember;
- fields under `resource`, `severity`, `jsonPayload`, `textPayload`, `labels`, `logName`;
- extractors `EXTRACT(FIELD)`.
String equality ignores case, as in Cloud Logging; a regex matches anywhere in the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY")
FIELD_ROOTS = ("resource", "severity", "jsonPayload", "textPayload", "labels", "logName")
# What the logging agent of Cloud Run takes out of a JSON line into the entry itself.
_SPECIAL_KEYS = (
    "severity",
    "time",
    "timestamp",
    "logging.googleapis.com/labels",
    "logging.googleapis.com/trace",
    "logging.googleapis.com/spanId",
    "logging.googleapis.com/insertId",
    "logging.googleapis.com/sourceLocation",
)
_OPERATORS = ("=~", "!~", "!=", ">=", "<=", "=", ">", "<", ":")
_SUPPORTED_OPERATORS = ("=~", ">=", "<=", "=", ">", "<")
_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>=~|!~|!=|>=|<=|=|>|<|:)|(?P<paren>[()])"""
    r"""|(?P<word>[A-Za-z0-9_.\-/$]+)|(?P<other>\S))"""
)

Entry = Mapping[str, Any]
Predicate = Callable[[Entry], bool]


class UnsupportedFilter(ValueError):
    """The filter uses syntax outside the subset this evaluator reads (or is malformed)."""


@dataclass
class _Token:
    kind: str  # string, op, paren, word, end
    text: str


def _tokens(text: str) -> list[_Token]:
    found = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind is None:
            continue
        if kind == "other":
            raise UnsupportedFilter(f"character {match.group(kind)!r} is outside the supported subset in: {text}")
        found.append(_Token(kind, match.group(kind)))
    found.append(_Token("end", ""))
    return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.at = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.at += 1
        return token

    def fail(self, why: str) -> UnsupportedFilter:
        return UnsupportedFilter(f"{why} (filter: {self.text.strip()})")

    def expression(self) -> Predicate:
        terms = [self.term()]
        joins: set[str] = set()
        while self.peek().kind not in ("end",) and self.peek().text != ")":
            word = self.peek().text if self.peek().kind == "word" else ""
            if word in ("AND", "OR"):
                self.take()
                joins.add(word)
            else:
                joins.add("AND")  # side by side: an implicit AND
            terms.append(self.term())
        if len(joins) > 1:
            raise self.fail("AND and OR mixed without parentheses")
        if joins == {"OR"}:
            return lambda entry: any(term(entry) for term in terms)
        return lambda entry: all(term(entry) for term in terms)

    def term(self) -> Predicate:
        token = self.peek()
        if token.kind == "word" and token.text == "NOT":
            self.take()
            inner = self.term()
            return lambda entry: not inner(entry)
        if token.text == "(":
            self.take()
            inner = self.expression()
            if self.take().text != ")":
                raise self.fail("a parenthesis is not closed")
            return inner
        if token.kind == "word" and token.text.startswith("-"):
            raise self.fail(f"negation by '-' ({token.text}) is outside the subset: write NOT")
        return self.comparison()

    def comparison(self) -> Predicate:
        field = self.take()
        if field.kind != "word" or field.text in ("AND", "OR"):
            raise self.fail(f"expected a field, found {field.text or 'the end'!r}")
        if self.peek().text == "(":
            raise self.fail(f"function {field.text}(...) is outside the subset")
        path = field.text.split(".")
        if path[0] not in FIELD_ROOTS:
            raise self.fail(f"field {field.text!r} is not under {', '.join(FIELD_ROOTS)} (a global search?)")
        op = self.take()
        if op.kind != "op":
            raise self.fail(
                f"{field.text!r} is not compared with anything (global search terms are outside the subset)"
            )
        if op.text not in _SUPPORTED_OPERATORS:
            raise self.fail(f"operator {op.text!r} is outside the subset ({' '.join(_SUPPORTED_OPERATORS)}; NOT)")
        values = self.values()
        test = _comparison(path, op.text, values, self.fail)
        return lambda entry: any(test(_lookup(entry, path), value) for value in values)

    def values(self) -> list[str]:
        token = self.take()
        if token.text == "(":
            found = [self.value(self.take())]
            while self.peek().text != ")":
                if self.take().text != "OR":
                    raise self.fail('a value set is written ("a" OR "b")')
                found.append(self.value(self.take()))
            self.take()
            return found
        return [self.value(token)]

    def value(self, token: _Token) -> str:
        if token.kind == "string":
            return str(json.loads(token.text))
        if token.kind == "word" and token.text not in ("AND", "OR", "NOT"):
            if self.peek().text == "(":
                raise self.fail(f"function {token.text}(...) is outside the subset")
            return token.text
        raise self.fail(f"expected a value, found {token.text or 'the end'!r}")


def _comparison(
    path: list[str], op: str, values: list[str], fail: Callable[[str], UnsupportedFilter]
) -> Callable[[Any, str], bool]:
    """How one field is compared with one value, checked once when the filter is parsed."""
    severity = path == ["severity"]
    if severity:
        unknown = [v for v in values if v.upper() not in SEVERITIES]
        if unknown:
            raise fail(f"{unknown} is not a severity ({', '.join(SEVERITIES)})")
    if op == "=~":
        patterns = {v: re.compile(v) for v in values}
        return lambda found, value: found is not None and patterns[value].search(_text(found)) is not None
    if op == "=":
        return lambda found, value: found is not None and _equal(found, value)
    if not severity and any(_number(v) is None for v in values):
        raise fail(f"{op} compares numbers or severities only, not {values}")
    compare = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}[op]

    def ordered(found: Any, value: str) -> bool:
        if severity:
            rank = SEVERITIES.index(str(found or "DEFAULT").upper()) if found else 0
            return bool(compare(float(rank), float(SEVERITIES.index(value.upper()))))
        number = _number(found)
        target = _number(value)
        return number is not None and target is not None and bool(compare(number, target))

    return ordered


def _lookup(entry: Entry, path: list[str]) -> Any:
    found: Any = entry
    for part in path:
        if not isinstance(found, Mapping) or part not in found:
            return None
        found = found[part]
    return found


def _text(found: Any) -> str:
    return json.dumps(found) if isinstance(found, bool) else str(found)


def _number(found: Any) -> float | None:
    if isinstance(found, bool):
        return None
    try:
        return float(found)
    except (TypeError, ValueError):
        return None


def _equal(found: Any, value: str) -> bool:
    number, target = _number(found), _number(value)
    if number is not None and target is not None:
        return number == target
    return _text(found).lower() == value.lower()


def compile_filter(text: str) -> Predicate:
    """The filter as a predicate over entries; UnsupportedFilter if any of it is outside the subset."""
    parser = _Parser(text)
    if parser.peek().kind == "end":
        raise UnsupportedFilter("an empty filter matches every entry: say what it counts")
    predicate = parser.expression()
    if parser.peek().kind != "end":
        raise parser.fail(f"unexpected {parser.peek().text!r}")
    return predicate


def matches(text: str, entry: Entry) -> bool:
    return compile_filter(text)(entry)


_EXTRACT = re.compile(r"^\s*EXTRACT\(\s*(?P<field>[A-Za-z0-9_.]+)\s*\)\s*$")


def extract(extractor: str, entry: Entry) -> Any:
    """What `EXTRACT(field)` finds in the entry (None if absent); other extractors are refused."""
    match = _EXTRACT.match(extractor)
    if match is None:
        raise UnsupportedFilter(f"extractor {extractor!r} is outside the subset: EXTRACT(field) only")
    path = match["field"].split(".")
    if path[0] not in FIELD_ROOTS:
        raise UnsupportedFilter(f"extractor field {match['field']!r} is not under {', '.join(FIELD_ROOTS)}")
    return _lookup(entry, path)


def entry_from_line(line: str, resource: Mapping[str, Any]) -> dict[str, Any]:
    """The entry Cloud Run's logging agent makes of one stdout line: a JSON object's special
    keys become the entry's severity, labels and trace, the rest its jsonPayload; any other
    line is a textPayload of severity DEFAULT."""
    entry: dict[str, Any] = {"resource": dict(resource), "severity": "DEFAULT"}
    try:
        parsed = json.loads(line)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        entry["textPayload"] = line.rstrip("\n")
        return entry
    severity = str(parsed.get("severity", "DEFAULT")).upper()
    entry["severity"] = severity if severity in SEVERITIES else "DEFAULT"
    labels = parsed.get("logging.googleapis.com/labels")
    if isinstance(labels, dict):
        entry["labels"] = {str(k): str(v) for k, v in labels.items()}
    if "logging.googleapis.com/trace" in parsed:
        entry["trace"] = parsed["logging.googleapis.com/trace"]
    entry["jsonPayload"] = {k: v for k, v in parsed.items() if k not in _SPECIAL_KEYS}
    return entry


def counts(filters: Mapping[str, str], entries: list[Entry]) -> dict[str, int]:
    """How many of `entries` each filter (name -> filter) matches, whoever wrote them (a filter
    sees only the entry): what a log-based metric would count."""
    compiled = {name: compile_filter(text) for name, text in filters.items()}
    return {name: sum(1 for entry in entries if test(entry)) for name, test in compiled.items()}
