"""Host maintenance Google announces ahead on TPU API nodes: the node's `upcomingMaintenance`.

Of google-cloud-tpu's types only v2alpha1's Node has the field, so the zone's nodes are read once
more, through v2alpha1, on the v2 client's endpoint. That client has no REST transport: against
Google it is gRPC, as production's v2 client is; against the simulator (a v2 client on REST) the
same v2alpha1 messages are read from REST JSON. The notice is advisory: a read that fails is
logged and shows no maintenance for that tick, never a failed listing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import tpu_v2, tpu_v2alpha1

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0  # each page's call, as adapters/tpu.py's
# What the mapping reads: without a mask every node brings its metadata (the agent, ~46 KB).
NODE_FIELDS = "nodes.name,nodes.queuedResource,nodes.upcomingMaintenance,nextPageToken"

Windows = Mapping[str, tuple[tuple[str, str], ...]]
"""(node, window start) of the nodes with maintenance announced, by their queued resource's id."""

NodeLister = Callable[[str], Iterator["tpu_v2alpha1.Node"]]
"""Every v2alpha1 Node of a zone (`projects/P/locations/Z`), page after page."""


def windows_of(nodes: Iterator[tpu_v2alpha1.Node]) -> dict[str, tuple[tuple[str, str], ...]]:
    """What the nodes announce, as the capacity port's `maintenance` says it: per queued resource,
    (node, window start) of each node with a maintenance announced (its window start, else the
    latest start Google allows; "" when it names neither but gives a type or status)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for node in nodes:
        if "upcoming_maintenance" not in node or not node.queued_resource:
            continue
        upcoming = node.upcoming_maintenance
        start = upcoming.window_start_time or upcoming.latest_window_start_time
        if start or upcoming.type_ or upcoming.maintenance_status:
            owner = node.queued_resource.rsplit("/", 1)[-1]
            found.setdefault(owner, []).append((node.name.rsplit("/", 1)[-1], start))
    return {owner: tuple(sorted(hosts)) for owner, hosts in found.items()}


class NodeMaintenance:
    """Reads a zone's announced maintenance windows; see the module's docstring."""

    def __init__(self, list_nodes: NodeLister) -> None:
        self._list_nodes = list_nodes

    @classmethod
    def beside(cls, client: tpu_v2.TpuClient) -> NodeMaintenance:
        """On the endpoint of `client` (the v2 client the adapter was given); the v2alpha1 client
        (or REST session) is built at the first read, inside its error handling."""
        endpoint = client.api_endpoint
        if client.transport.kind == "rest":  # build_client's for the simulator: anonymous
            return cls(_rest_lister(endpoint))
        return cls(_grpc_lister(endpoint))

    def windows(self, parent: str) -> Windows:
        """The windows announced in the zone `parent`; {} when the read fails (logged)."""
        try:
            return windows_of(self._list_nodes(parent))
        except Exception:  # advisory: any failure (API, transport, parsing) must not fail the listing
            log.warning("TPU API (v2alpha1): could not read upcomingMaintenance in %s", parent, exc_info=True)
            return {}


def _grpc_lister(endpoint: str) -> NodeLister:
    """ListNodes of the v2alpha1 gRPC client, built at the first call (its import costs ~0.4 s)."""
    clients: list[tpu_v2alpha1.TpuClient] = []

    def list_nodes(parent: str) -> Iterator[tpu_v2alpha1.Node]:
        if not clients:
            from google.cloud import tpu_v2alpha1

            clients.append(tpu_v2alpha1.TpuClient(client_options={"api_endpoint": endpoint}))
        metadata = [("x-goog-fieldmask", NODE_FIELDS)]
        return iter(clients[0].list_nodes(parent=parent, timeout=CALL_TIMEOUT_S, metadata=metadata))

    return list_nodes


def _rest_lister(endpoint: str) -> NodeLister:
    """GET v2alpha1/{parent}/nodes page by page, each page read as a v2alpha1 ListNodesResponse."""
    sessions: list[AuthorizedSession] = []

    def list_nodes(parent: str) -> Iterator[tpu_v2alpha1.Node]:
        from google.cloud import tpu_v2alpha1

        if not sessions:
            from google.auth.credentials import AnonymousCredentials
            from google.auth.transport.requests import AuthorizedSession

            sessions.append(AuthorizedSession(AnonymousCredentials()))
        token = ""
        while True:
            answer = sessions[0].get(
                f"{endpoint.rstrip('/')}/v2alpha1/{parent}/nodes",
                params={"pageToken": token} if token else None,
                headers={"X-Goog-FieldMask": NODE_FIELDS},
                timeout=CALL_TIMEOUT_S,
            )
            answer.raise_for_status()
            page = tpu_v2alpha1.ListNodesResponse.from_json(answer.text, ignore_unknown_fields=True)
            yield from page.nodes
            token = page.next_page_token
            if not token:
                return

    return list_nodes
