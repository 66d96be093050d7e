"""In-memory fakes of the engine's store and messaging ports, shipped like the simulator.

Each copies its Firestore, Pub/Sub or Storage adapter's semantics (ordering, paging, filters,
what a missing document returns, compare-and-set); `tests/contract` runs one suite against
the fake and the real adapter, so the two cannot drift. The engine's logic is tested against
them in seconds (`tests/unit/engine`).
"""

from tpujobs.local.fakes.access import InMemoryAccessPolicies
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.fakes.dead_letters import InMemoryDeadLetters, RecordingRepublisher
from tpujobs.local.fakes.job_store import InMemoryJobStore
from tpujobs.local.fakes.output_bucket import InMemoryOutputBucket
from tpujobs.local.fakes.pools import InMemoryPools, InMemoryWarmPools
from tpujobs.local.fakes.publishers import RecordingPublisher

__all__ = [
    "InMemoryAccessPolicies",
    "InMemoryCapacity",
    "InMemoryDeadLetters",
    "InMemoryJobStore",
    "InMemoryOutputBucket",
    "InMemoryPools",
    "InMemoryWarmPools",
    "RecordingPublisher",
    "RecordingRepublisher",
]
