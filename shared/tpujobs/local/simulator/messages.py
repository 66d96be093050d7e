"""JSON as Google's REST APIs read and write it, for the TPU simulator and the local Secret Manager.

A request body is parsed by protobuf's `json_format` into the client library's own message type, so
a wrong field is refused as Google refuses it, and handed on as canonical (camelCase) JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message


class BadBody(ValueError):
    """A body the API refuses: not JSON, not an object, or not the message it should be."""


def canonical(body: bytes, message_type: type[Message], what: str) -> dict[str, Any]:
    """`body` read as a `message_type` (named `what` in errors) and written back as the API's JSON."""
    data = json_object(body, what)
    try:
        message = json_format.ParseDict(data, message_type(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadBody(f"Invalid {what}: {first_line}") from None
    return json_format.MessageToDict(message)


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """`body` as a JSON object (empty: {}); the message never quotes the body, which may hold a secret."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise BadBody("The request body is not JSON.") from None
    if not isinstance(data, dict):
        raise BadBody(f"{what} must be a JSON object.")
    return data


def camel(name: str) -> str:
    """A field name, or a dotted path of them, in camelCase: network_config.enable_external_ips is
    networkConfig.enableExternalIps (the REST APIs take both spellings, in masks too)."""
    return ".".join(_camel_part(part.strip()) for part in name.strip().split("."))


def _camel_part(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def timestamp(wall: float) -> str:
    """RFC 3339 in UTC, as google.protobuf.Timestamp is written in JSON."""
    return datetime.fromtimestamp(wall, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def query_str(query: Mapping[str, list[str]], name: str) -> str:
    """A query parameter's last value ("" when absent), as Google's frontends read a repeated one."""
    return query.get(name, [""])[-1]
