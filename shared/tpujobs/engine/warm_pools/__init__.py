"""Warm pools, acted on: units asked for and healed, jobs given units and taken off them.

`tpujobs.domain.pools` decides each change of a pool; these services read the pool, apply the change as a
compare-and-set (`WarmPoolStore.update`) and then act on it, in that order, as the job services do: a crash
between the two leaves a pool document that says what should be, and the reconciler's repair
(`PoolRepair.repair`) or the next event makes it so.
How units are given, healed and released: docs/pools.md#the-pool-document.
"""
