"""Warm pools, acted on: units asked for and healed, jobs given units and taken off them.

`tpujobs.domain.pools` decides each change of a pool; these services read the pool, apply the
change as a compare-and-set (`WarmPoolStore.update`) and then act on it, in that order, as the
job services do: a crash between the two leaves a pool document that says what should be, and
the reconciler's repair (`PoolRepair.repair`) or the next event makes it so.

How a job gets a unit (`PoolUnits.fill`): the pool's queue is read (priority, then age); a unit
already naming a queued job is a claim left half-way and is finished first; else the first idle
unit is given to the head of the queue (the compare-and-set makes it that job's alone), the job
is committed PROVISIONING on it, and the unit's agents are told by writing its hosts' metadata
(`UnitAgents.tell`), which they wait on. Taking a job off a unit (`leave_unit`) is the same in
reverse: the unit is freed in the document, then its agents are told to stop.

A unit whose capacity is lost is asked for again at once as its next generation; the job on it
recovers by its own `on_preemption` rule, through the pool's queue, onto whichever unit is free
first. A unit idle past the pool's `idle_minutes` is released and asked for again when a job
needs it. Units hold chips of the admission quota (`UnitQuota`) from their request until they
are released.
"""
