"""The `tpujobs` command line (contract sections 5 and 7): one module per concern.

`commands` holds the job verbs, `tables` what they print, `common` how the CLI finds its
project, credentials and the `jobs` API. The entry point is `tpujobs.cli:app`.
"""

from __future__ import annotations

from tpujobs.cli.commands import app, describe_tables, jobs_table, watch_screen

__all__ = ["app", "describe_tables", "jobs_table", "watch_screen"]
