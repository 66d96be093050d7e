"""The worker agent: what runs on every TPU VM host of a job, standard library only (Python 3.8+).

It ships as a zipapp built from this package (`tpujobs.engine.startup_script`), and imports
nothing else of tpujobs; `wire` is the contract both sides import. README.md says what it
does, in order, and why it is built this way.
"""
