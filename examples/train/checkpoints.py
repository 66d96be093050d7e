"""Save and load a tiny checkpoint at TPUJOBS_CHECKPOINT_URI with the standard library only.

Real jobs use their framework's checkpointing (Orbax, torch_xla) against the same gs://
prefix; this keeps the example free of dependencies. It talks to the Storage emulator
when STORAGE_EMULATOR_HOST is set, else to Cloud Storage with the VM's metadata token.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request

METADATA_TOKEN = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    return bucket, prefix


def _endpoint_and_headers() -> tuple[str, dict[str, str]]:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return emulator.rstrip("/"), {}
    metadata = os.environ.get("TPUJOBS_METADATA_URL", "http://metadata.google.internal/computeMetadata/v1")
    request = urllib.request.Request(
        f"{metadata}/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        token = json.load(answer)["access_token"]
    return "https://storage.googleapis.com", {"Authorization": f"Bearer {token}"}


def save(uri: str, state: dict) -> None:
    """Write `state` as JSON to {uri}state.json."""
    bucket, prefix = _split(uri)
    base, headers = _endpoint_and_headers()
    name = urllib.parse.quote(prefix + "state.json", safe="")
    url = f"{base}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"
    request = urllib.request.Request(
        url,
        data=json.dumps(state).encode(),
        headers={**headers, "Content-Type": "application/octet-stream"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=30).read()


def load(uri: str) -> dict | None:
    """The last state saved under `uri`, or None when there is none yet."""
    bucket, prefix = _split(uri)
    base, headers = _endpoint_and_headers()
    name = urllib.parse.quote(prefix + "state.json", safe="")
    request = urllib.request.Request(f"{base}/storage/v1/b/{bucket}/o/{name}?alt=media", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
