"""Cloud Storage through google-cloud-storage (the emulator when STORAGE_EMULATOR_HOST is set).

Its errors go through the one table (adapters/google_errors.py): TransientError or
PermanentError, saying which object failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.cloud import storage

SERVICE = "Cloud Storage"  # how errors name the service: "Cloud Storage failed to ..."


def build_client(project: str) -> storage.Client:
    """A Storage client; anonymous against the emulator, default credentials otherwise."""
    import os

    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project, credentials=AnonymousCredentials())
    return storage.Client(project=project)
