"""Partial responses, as strict as Google's frontends: the ``X-Goog-FieldMask`` header and the
``fields`` (or ``$fields``) system parameter.

Strict, because a misspelt path is a 400 INVALID_ARGUMENT from the real API, while a lenient simulator
would leave the field out and the client would act on its default (STATE_UNSPECIFIED), a state no real
resource has. Paths are checked against the response message's own descriptor. The syntax, and why a
mask without ``nextPageToken`` stops the pager: docs/local-stack.md#googles-errors-and-field-masks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from tpujobs.local.simulator.errors import bad_request

# Well-known types rendered as JSON scalars: a path may end at them, never go into them.
_SCALAR_MESSAGES = frozenset(
    {
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
        "google.protobuf.FieldMask",
        "google.protobuf.Empty",
        *(
            f"google.protobuf.{name}Value"
            for name in (
                "Double",
                "Float",
                "Int64",
                "UInt64",
                "Int32",
                "UInt32",
                "Bool",
                "String",
                "Bytes",
            )
        ),
    }
)
# Types whose JSON holds anything: every path below them is accepted.
_OPEN_MESSAGES = frozenset(
    {
        "google.protobuf.Any",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
    }
)

# The message each TPU API response is, by name.
RESPONSES = {
    "QueuedResource": ("tpu", "QueuedResource"),
    "ListQueuedResourcesResponse": ("tpu", "ListQueuedResourcesResponse"),
    "Node": ("tpu", "Node"),
    "ListNodesResponse": ("tpu", "ListNodesResponse"),
    "AlphaNode": ("tpu_v2alpha1", "Node"),
    "AlphaListNodesResponse": ("tpu_v2alpha1", "ListNodesResponse"),
    "Operation": ("longrunning", "Operation"),
    "ListOperationsResponse": ("longrunning", "ListOperationsResponse"),
}


def parse(mask: str) -> list[tuple[str, ...]]:
    """The paths of a mask, with ``a(b,c)`` groups expanded; ValueError when it is malformed."""
    paths: list[tuple[str, ...]] = []

    def read(text: str, start: int, prefix: tuple[str, ...], closing: bool) -> int:
        """Read a comma-separated list from *start*; return where it ended (at ')' or the end)."""
        position = start
        while True:
            name_start = position
            while position < len(text) and text[position] not in ",()":
                position += 1
            names = tuple(part.strip() for part in text[name_start:position].split("."))
            if position < len(text) and text[position] == "(":
                if not all(names):
                    raise ValueError(f"a group needs a field before it in {text!r}")
                position = read(text, position + 1, prefix + names, closing=True)
                if position >= len(text) or text[position] != ")":
                    raise ValueError(f"unbalanced parentheses in {text!r}")
                position += 1
            elif names != ("",):
                if not all(names):
                    raise ValueError(f"empty field name in {text!r}")
                paths.append(prefix + names)
            elif position < len(text) and text[position] == ",":
                raise ValueError(f"empty path in {text!r}")
            if position >= len(text):
                if closing:
                    raise ValueError(f"unbalanced parentheses in {text!r}")
                return position
            if text[position] == ")":
                if not closing:
                    raise ValueError(f"unbalanced parentheses in {text!r}")
                return position
            position += 1  # the comma

    read(mask.strip(), 0, (), closing=False)
    return paths


@functools.cache
def _descriptor(response: str) -> Any:
    """The protobuf descriptor of a response message (imported only when a mask is used)."""
    package, name = RESPONSES[response]
    if package == "tpu":
        from google.cloud import tpu_v2

        return getattr(tpu_v2, name).pb().DESCRIPTOR
    if package == "tpu_v2alpha1":
        from google.cloud import tpu_v2alpha1

        return getattr(tpu_v2alpha1, name).pb().DESCRIPTOR
    from google.longrunning import operations_pb2

    return getattr(operations_pb2, name).DESCRIPTOR


def _resolve(descriptor: Any, path: Sequence[str]) -> tuple[str, ...] | None:
    """*path* with its names as the JSON names, or None when some name is not a field."""
    resolved: list[str] = []
    message = descriptor
    for depth, name in enumerate(path):
        if message is None:  # below a map, or an open type: anything goes
            resolved.extend(path[depth:])
            return tuple(resolved)
        if name == "*":
            resolved.append("*")
            message = None
            continue
        field = next(
            (f for f in message.fields if name in (f.json_name, f.name)),
            None,
        )
        if field is None:
            return None
        resolved.append(field.json_name)
        child = field.message_type
        if child is None:
            message = _LEAF
        elif child.GetOptions().map_entry or child.full_name in _OPEN_MESSAGES:
            message = None
        elif child.full_name in _SCALAR_MESSAGES:
            message = _LEAF
        else:
            message = child
    return tuple(resolved)


class _Leaf:
    """Stands for a scalar: it has no fields, so any deeper name is refused."""

    fields: tuple[Any, ...] = ()


_LEAF = _Leaf()


def check(mask: str, response: str) -> list[tuple[str, ...]]:
    """The mask's paths in JSON names, checked against the *response* message; a malformed
    mask or a path naming no field is refused as Google refuses it (400 INVALID_ARGUMENT)."""
    try:
        paths = parse(mask)
    except ValueError as exc:
        raise bad_request("fields", f"Invalid field mask {mask!r}: {exc}") from exc
    resolved = []
    for path in paths:
        found = _resolve(_descriptor(response), path)
        if found is None:
            dotted = ".".join(path)
            raise bad_request(
                "fields",
                f"Error expanding 'fields' parameter. Cannot find matching fields for path '{dotted}'.",
            )
        resolved.append(found)
    return resolved


def apply(payload: dict[str, Any], paths: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    """Keep only what *paths* name; a path through a list applies to each element."""
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for name in path:
            if name == "*":
                node.clear()
                node["*"] = {}
                break
            if "*" in node:
                break
            node = node.setdefault(name, {})

    def keep(value: Any, wanted: dict[str, Any]) -> Any:
        if not wanted or "*" in wanted:
            return value
        if isinstance(value, list):
            return [keep(item, wanted) for item in value]
        if isinstance(value, dict):
            return {k: keep(v, wanted[k]) for k, v in value.items() if k in wanted}
        return value

    result: dict[str, Any] = keep(payload, tree)
    return result
