"""The job engine's use cases, one service each: submission, admission, the attempt lifecycle,
worker reports, capacity events and controls, over the journal that commits and announces.
`tpujobs.engine.services.Engine` wires them on one set of ports."""
