"""A deployment's VM defaults: plain data, apart from the spec's validation models.

Settings holds one, and every function reads Settings at cold start; keeping VmDefaults out of
`domain.spec` means reading the settings never loads pydantic (`domain.spec` re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VmDefaults:
    """A deployment's VM options for the specs that leave them out (Settings, from the
    TPUJOBS_DEFAULT_* variables), so a team sets its network once. Empty: no default."""

    network: str = ""
    subnetwork: str = ""
    internal_ips: bool | None = None
    tags: tuple[str, ...] = ()
    data_disks: tuple[tuple[str, str], ...] = ()  # (source_disk, mode)
    runtime_version: str = ""

    def spec_fields(self) -> dict[str, Any]:
        """The defaults that are set, as spec fields (JSON values)."""
        fields: dict[str, Any] = {
            "network": self.network or None,
            "subnetwork": self.subnetwork or None,
            "internal_ips": self.internal_ips,
            "tags": list(self.tags) or None,
            "data_disks": [{"source_disk": s, "mode": m} for s, m in self.data_disks] or None,
            "runtime_version": self.runtime_version or None,
        }
        return {name: value for name, value in fields.items() if value is not None}
