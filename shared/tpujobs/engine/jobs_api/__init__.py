"""The parts of the `jobs` HTTP function (`tpujobs.engine.api.JobsApi` is its front door): the
request models, the answers, and the actions by topic (jobs, warm pools, admin records)."""
