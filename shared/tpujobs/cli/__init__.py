"""The `tpujobs` command line: one module per concern.

`commands` holds the job verbs, `pools` the warm-pool verbs (`tpujobs pool`), `tables` what
they print, `reads` where they read (the `jobs` API, else Firestore), `common` the project,
credentials and failures in one sentence, `root` the whole command tree with the local-stack
verbs (`dev`, `demo`) and the admin groups (`quota`, `secret`). The entry point is `tpujobs.cli:app`.

Importing this package is cheap and loads nothing else: `quota_cli` and `secret_cli` import
`tpujobs.cli.common` while `root` imports them, so the tree is built on first use of `app`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "describe_tables", "jobs_table", "watch_screen"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tpujobs.cli import root

        return getattr(root, name)
    raise AttributeError(f"module 'tpujobs.cli' has no attribute {name!r}")
