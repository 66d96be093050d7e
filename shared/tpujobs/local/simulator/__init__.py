"""A local Cloud TPU API (queued resources, nodes, operations over REST) and a local Secret Manager.

Tests and the local stack point Google's real clients at them. The model's names come from
`model` (its `__all__`); the server, the metadata service and the workers add their own.
"""

from tpujobs.local.simulator.errors import Fault as Fault
from tpujobs.local.simulator.metadata import MetadataReply as MetadataReply
from tpujobs.local.simulator.metadata import MetadataService as MetadataService
from tpujobs.local.simulator.metadata import metadata_url as metadata_url
from tpujobs.local.simulator.model import *  # noqa: F403  every name of model.__all__, listed there once
from tpujobs.local.simulator.server import SimulatorApi as SimulatorApi
from tpujobs.local.simulator.server import SimulatorServer as SimulatorServer
from tpujobs.local.simulator.workers import StopReason as StopReason
from tpujobs.local.simulator.workers import WorkerInfo as WorkerInfo
from tpujobs.local.simulator.workers import WorkerPool as WorkerPool
