"""JSON bodies as Google's REST APIs read them, for the TPU simulator and the local Secret Manager.

A request body is parsed by protobuf's `json_format` into the installed client library's own
message type (`tpu_v2.Node.pb()`, ...), so an unknown field or a wrong type is refused as Google
refuses it (400 INVALID_ARGUMENT), and handed on as canonical JSON: camelCase names whichever
spelling the caller used, enums by name, default values left out, as the client sends them.
"""

from __future__ import annotations

import json
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
