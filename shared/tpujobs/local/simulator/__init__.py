"""A local Cloud TPU API (queued resources, nodes, operations over REST), Compute Engine v1, and a local Secret Manager.

Tests and the local stack point Google's real clients at them. The model's names come from
`model` (its `__all__`); the server, the metadata service and the workers add their own. The
server and the workers load on first use: they import Google's client types (compute_v1 alone
takes seconds), and a CLI verb that only talks to a running simulator (`client`) needs neither.
"""

from typing import TYPE_CHECKING, Any

from tpujobs.local.simulator.errors import Fault as Fault
from tpujobs.local.simulator.metadata import MetadataReply as MetadataReply
from tpujobs.local.simulator.metadata import MetadataService as MetadataService
from tpujobs.local.simulator.metadata import metadata_url as metadata_url
from tpujobs.local.simulator.model import *  # noqa: F403  every name of model.__all__, listed there once

if TYPE_CHECKING:
    from tpujobs.local.simulator.server import SimulatorApi as SimulatorApi
    from tpujobs.local.simulator.server import SimulatorServer as SimulatorServer
    from tpujobs.local.simulator.workers import StopReason as StopReason
    from tpujobs.local.simulator.workers import WorkerInfo as WorkerInfo
    from tpujobs.local.simulator.workers import WorkerPool as WorkerPool

_LAZY = {
    "SimulatorApi": "server",
    "SimulatorServer": "server",
    "StopReason": "workers",
    "WorkerInfo": "workers",
    "WorkerPool": "workers",
}


def __getattr__(name: str) -> Any:
    """The server's and the workers' names, imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
