"""The documents the in-memory job store keeps, as Firestore keeps them: one lock, one dict per collection."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

Document = dict[str, Any]


def projected(document: Document, fields: Sequence[str]) -> Document:
    """The document as a read that selects `fields` returns it (`spec.x` a field of the map)."""
    found: Document = {}
    for path in fields:
        top, _, inner = path.partition(".")
        if top not in document:
            continue
        if not inner:
            found[top] = copy.deepcopy(document[top])
        elif isinstance(document[top], dict) and inner in document[top]:
            found.setdefault(top, {})[inner] = copy.deepcopy(document[top][inner])
    return found


class Collections:
    """The job store's collections, shared by its parts; each call holds the one lock."""

    def __init__(self, rejection_retention: timedelta = timedelta(days=30)) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, Document] = {}
        self._events: dict[str, dict[str, Document]] = {}  # job id -> event document id -> document
        self._workers: dict[str, dict[str, Document]] = {}  # job id -> a{attempt}-{worker} -> document
        self._attempts: dict[str, dict[str, Document]] = {}  # job id -> str(attempt) -> document
        self._rejections: dict[str, Document] = {}
        self._reports_seen: dict[str, Document] = {}
        self._unit_secrets: dict[str, Document] = {}  # never expire (adapters.firestore_unit_secrets)
        self._rejection_retention = rejection_retention

    # -- for the other fakes: the jobs collection as their queries see it -----------------------

    def job_documents(self) -> list[tuple[str, Document]]:
        """(job id, a copy of its document) of every job, in document-id order."""
        with self._lock:
            return [(job_id, copy.deepcopy(self._jobs[job_id])) for job_id in sorted(self._jobs)]
