"""The pure domain: job specs, states, transitions and names.

Nothing here imports a Google library, does I/O or reads a clock; time comes in as an
argument. `tests/unit/repo/test_domain_purity.py` proves it.
"""
