"""A GCE-style metadata server per simulated worker host, served by the simulator's HTTP server.

On a TPU VM the agent learns who it is, and whether it is being preempted, from the metadata server;
each simulated host gets a base URL of its own in ``TPUJOBS_METADATA_URL`` instead. As on GCE, requests
need ``Metadata-Flavor: Google``, answers carry an ``ETag`` (a hash of the answer, so rewriting a value
wakes no one), and ``?wait_for_change=true`` holds a request on the simulator's change notice.
Identity tokens are signed by ``identity.IdentitySigner``; everything but ``MetadataService.answer``'s
waiting and the tokens' times is pure. The paths: docs/local-stack.md#a-hosts-metadata-server.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote

from tpujobs.local.simulator.errors import TPU_SERVICE, project_number
from tpujobs.local.simulator.identity import IdentitySigner, hostname, identity_claims
from tpujobs.local.simulator.model import MEGASCALE_PORT, NodeRecord, SimulatorError

METADATA_ROOT = "/simulator/v1/metadata/"
_PATH = re.compile(
    re.escape(METADATA_ROOT)
    + r"(?P<project>[^/]+)/(?P<zone>[^/]+)/(?P<node_id>[^/]+)/(?P<worker>[0-9]+)"
    + r"/computeMetadata/v1/(?P<key>.*)"
)
TEXT = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
MAX_WAIT_SECONDS = 600.0  # wait_for_change is capped, so a forgotten request ends
DEFAULT_WAIT_SECONDS = 60.0
TOKEN_PREFIX = "simulated:"  # a simulated access token is this and the account's email
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_FLAVOR_MISSING = "Missing required header: Metadata-Flavor: Google\n"
_NO_AUDIENCE = "non-empty audience parameter required\n"  # what GCE's metadata server answers
TOKEN_FORMATS = ("standard", "full")


def metadata_url(server_url: str, project: str, zone: str, node_id: str, worker: int) -> str:
    """The base URL a worker's TPUJOBS_METADATA_URL names: ends in /computeMetadata/v1."""
    parts = "/".join(quote(part, safe="") for part in (project, zone, node_id))
    return f"{server_url.rstrip('/')}{METADATA_ROOT}{parts}/{worker}/computeMetadata/v1"


@dataclass(frozen=True)
class MetadataReply:
    """One answer of the metadata server."""

    status: int
    body: str
    content_type: str = TEXT
    etag: str = ""


def tpu_env(node: NodeRecord, worker: int) -> str:
    """The tpu-env attribute: sorted ``KEY: 'value'`` lines, as TPU VMs carry it.

    A node of a multislice request also carries what JAX's cloud_tpu_cluster and libtpu read
    from it to join the slices: MEGASCALE_COORDINATOR_ADDRESS (worker 0 of slice 0, with the
    port), MEGASCALE_NUM_SLICES, MEGASCALE_PORT and MEGASCALE_SLICE_ID.
    """
    values = {
        "ACCELERATOR_TYPE": node.accelerator_type,
        "CONSUMER_PROJECT_ID": node.project,
        "CONSUMER_PROJECT_NUMBER": str(project_number(node.project)),
        "NODE_ID": node.node_id,
        "PREEMPTIBLE": "true" if node.preemptible else "false",
        "RUNTIME_VERSION": node.runtime_version,
        "SERVICE_NAME": TPU_SERVICE,
        "WORKER_ID": str(worker),
        "ZONE": node.zone,
    }
    if node.num_slices:
        values.update(
            {
                "MEGASCALE_COORDINATOR_ADDRESS": node.coordinator_address,
                "MEGASCALE_NUM_SLICES": str(node.num_slices),
                "MEGASCALE_PORT": str(MEGASCALE_PORT),
                "MEGASCALE_SLICE_ID": str(node.slice_id),
            }
        )
    return "".join(f"{key}: '{value}'\n" for key, value in sorted(values.items()))


def attributes(node: NodeRecord, worker: int) -> dict[str, str]:
    """instance/attributes/*: the node's metadata, then the keys the TPU service sets itself."""
    return {
        **node.metadata,
        "accelerator-type": node.accelerator_type,
        "agent-worker-number": str(worker),
        "tpu-env": tpu_env(node, worker),
        # As on TPU VMs: every worker of the node, worker 0 first, `id:host:ip` each.
        "worker-network-endpoints": ",".join(f"unknown:unknown:{ip}" for ip in node.host_addresses),
    }


def token(email: str) -> dict[str, object]:
    """The access token answer of a VM that runs as `email`."""
    return {"access_token": TOKEN_PREFIX + email, "expires_in": 3600, "token_type": "Bearer"}


def service_accounts(node: NodeRecord) -> dict[str, str]:
    """instance/service-accounts/*: the node's one account, as `default` and by its email."""
    email = node.service_account
    values = {"instance/service-accounts/": f"default/\n{email}/\n"}
    for alias in ("default", email):
        base = f"instance/service-accounts/{alias}/"
        values[base] = "email\nidentity\nscopes\ntoken\n"
        values[base + "email"] = email
        values[base + "scopes"] = CLOUD_PLATFORM_SCOPE + "\n"
    return values


UPCOMING_MAINTENANCE = "instance/upcoming-maintenance"
NO_MAINTENANCE = "NONE"  # what instance/upcoming-maintenance answers when nothing is scheduled
# Node.upcomingMaintenance's fields and the metadata server's JSON names for them.
_MAINTENANCE_KEYS = {
    "canReschedule": "can_reschedule",
    "latestWindowStartTime": "latest_window_start_time",
    "maintenanceStatus": "maintenance_status",
    "type": "type",
    "windowEndTime": "window_end_time",
    "windowStartTime": "window_start_time",
}


def upcoming_maintenance(announced: Mapping[str, object] | None) -> tuple[str, str]:
    """instance/upcoming-maintenance as text and as `?alt=json`, from the API's camelCase fields
    (None: nothing scheduled), in the snake_case JSON a TPU VM's metadata server writes."""
    if announced is None:
        return NO_MAINTENANCE, json.dumps(NO_MAINTENANCE)
    shown = {_MAINTENANCE_KEYS[k]: v for k, v in announced.items() if k in _MAINTENANCE_KEYS}
    answer = json.dumps({**shown, "maintenance_reasons": []}, sort_keys=True)
    return answer, answer


@dataclass(frozen=True)
class HostOverlay:
    """What a Compute Engine VM's metadata server answers beyond (or instead of) a TPU node's:
    its own attributes (instance metadata and the TPU keys), other paths, and the `?alt=json`
    answers of paths that have one (`compute_hosts.py` makes these)."""

    attributes: Mapping[str, str]
    values: Mapping[str, str]
    json_values: Mapping[str, str]
    vm: tuple[str, str, float] | None = None  # its name, id and creation time, for identity tokens


def lookup(node: NodeRecord, worker: int, key: str, overlay: HostOverlay | None = None) -> MetadataReply:
    """The answer for one path under computeMetadata/v1 of one worker; 404 when unknown."""
    attrs = dict(overlay.attributes) if overlay is not None else attributes(node, worker)
    values: dict[str, str] = {
        "instance/preempted": "TRUE" if node.preempted else "FALSE",
        "instance/maintenance-event": node.maintenance_event,
        UPCOMING_MAINTENANCE: upcoming_maintenance(node.upcoming_maintenance)[0],
        "instance/hostname": hostname(node, worker),
        "instance/zone": f"projects/{node.project}/zones/{node.zone}",
        "instance/network-interfaces/0/ip": node.host_addresses[worker],
        "instance/attributes/": "".join(f"{name}\n" for name in sorted(attrs)),
        "project/project-id": node.project,
        **{f"instance/attributes/{name}": value for name, value in attrs.items()},
        **service_accounts(node),
        **(overlay.values if overlay is not None else {}),
    }
    if key in (
        "instance/service-accounts/default/token",
        f"instance/service-accounts/{node.service_account}/token",
    ):
        return _reply(json.dumps(token(node.service_account)), JSON_TYPE)
    if key in values:
        return _reply(values[key], TEXT)
    return MetadataReply(404, f"no metadata at {key!r}\n")


def json_values(node: NodeRecord) -> dict[str, str]:
    """The `?alt=json` answers of a TPU node's host that differ from its text ones."""
    return {UPCOMING_MAINTENANCE: upcoming_maintenance(node.upcoming_maintenance)[1]}


def identity(
    node: NodeRecord,
    worker: int,
    key: str,
    query: Mapping[str, list[str]],
    signer: IdentitySigner,
    overlay: HostOverlay | None = None,
) -> MetadataReply | None:
    """instance/service-accounts/{default,email}/identity: a signed identity token for `audience`,
    with the instance's details under format=full; None when `key` is another path."""
    email = node.service_account
    if key not in (f"instance/service-accounts/{alias}/identity" for alias in ("default", email)):
        return None
    audience = _flag(query, "audience")
    if not audience:
        return MetadataReply(400, _NO_AUDIENCE)
    token_format = (_flag(query, "format") or "standard").lower()
    if token_format not in TOKEN_FORMATS:
        return MetadataReply(400, f"format must be one of {', '.join(TOKEN_FORMATS)}\n")
    claims = identity_claims(
        node,
        worker,
        audience,
        now=signer.now(),
        full=token_format == "full",
        licenses=_flag(query, "licenses").upper() == "TRUE",
        vm=overlay.vm if overlay is not None else None,
    )
    return _reply(signer.sign(claims), TEXT)


def _reply(body: str, content_type: str) -> MetadataReply:
    etag = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    return MetadataReply(200, body, content_type, etag)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def _flag(query: Mapping[str, list[str]], name: str) -> str:
    return query.get(name, [""])[-1]


class Changes(Protocol):
    """What a held request sleeps on: the simulator's change counter (``Simulator`` has it)."""

    def generation(self) -> int: ...

    def wait_for_change(self, seen: int, timeout: float) -> int: ...


STOP_CHECK_SECONDS = 1.0  # a held request looks at `stopping` at least this often


class MetadataService:
    """Answers metadata requests from the simulator's current nodes."""

    def __init__(
        self,
        get_node: Callable[[str, str, str], NodeRecord],
        *,
        stopping: threading.Event | None = None,
        changes: Changes | None = None,
        poll_seconds: float = 0.05,
        signer: IdentitySigner | None = None,
        overlay: Callable[[NodeRecord, int], HostOverlay | None] | None = None,
    ) -> None:
        """Without *changes*, a held request re-reads every *poll_seconds* instead; without *signer*,
        identity tokens are signed by a key made here; *overlay* gives a Compute Engine VM's own answers."""
        self._overlay = overlay
        self._get_node = get_node  # the server passes Simulator.host_node; raises SimulatorError when gone
        self.signer = signer or IdentitySigner()
        self._stopping = stopping or threading.Event()
        self._changes = changes
        self._poll_seconds = poll_seconds

    @staticmethod
    def handles(path: str) -> bool:
        return path.startswith(METADATA_ROOT)

    def answer(self, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str]) -> MetadataReply:
        """One request; with wait_for_change=true, held until the answer differs or time runs out."""
        if _header(headers, "Metadata-Flavor") != "Google":
            return MetadataReply(403, _FLAVOR_MISSING)
        match = _PATH.fullmatch(path)
        if match is None:
            return MetadataReply(404, f"no metadata server at {path}\n")
        seen_generation = self._changes.generation() if self._changes is not None else 0
        reply = self._once(match, query)
        if _flag(query, "wait_for_change").lower() != "true" or reply.status != 200:
            return reply
        last_etag = _flag(query, "last_etag")
        if last_etag and last_etag != reply.etag:
            return reply
        try:
            timeout = float(_flag(query, "timeout_sec") or DEFAULT_WAIT_SECONDS)
        except ValueError:
            return MetadataReply(400, "timeout_sec must be a number\n")
        deadline = time.monotonic() + min(max(timeout, 0.0), MAX_WAIT_SECONDS)
        seen = reply.etag
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._changes is not None:  # read before _once, so no change slips between
                seen_generation = self._changes.wait_for_change(seen_generation, min(remaining, STOP_CHECK_SECONDS))
            elif self._stopping.wait(min(remaining, self._poll_seconds)):
                break
            reply = self._once(match, query)
            if reply.status != 200 or reply.etag != seen:
                return reply
        return reply

    def _once(self, match: re.Match[str], query: Mapping[str, list[str]]) -> MetadataReply:
        worker = int(match["worker"])
        try:
            node = self._get_node(unquote(match["project"]), unquote(match["zone"]), unquote(match["node_id"]))
        except SimulatorError as error:
            return MetadataReply(404, error.message + "\n")
        if worker >= len(node.host_addresses):
            return MetadataReply(404, f"node {node.node_id} has workers 0..{len(node.host_addresses) - 1}\n")
        overlay = self._overlay(node, worker) if self._overlay is not None else None
        token = identity(node, worker, match["key"], query, self.signer, overlay)
        if token is not None:
            return token
        if _flag(query, "alt") == "json":
            answers = overlay.json_values if overlay is not None else json_values(node)
            if match["key"] in answers:
                return _reply(answers[match["key"]], JSON_TYPE)
        return lookup(node, worker, match["key"], overlay)
