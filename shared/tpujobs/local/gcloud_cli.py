"""The real gcloud CLI pointed at the local simulators, for tests: a client no one here wrote.

gcloud reads its endpoints from `CLOUDSDK_API_ENDPOINT_OVERRIDES_<API>`, its token from a file,
and its settings from a scratch config folder, so a test's gcloud never touches the machine's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

TIMEOUT_S = 120  # gcloud takes seconds to start; a hang still ends the test


class Gcloud:
    """Runs gcloud with the simulator's endpoints, a fake token and prompts off."""

    def __init__(self, binary: str, env: Mapping[str, str]) -> None:
        self.binary = binary
        self.env = dict(env)

    @classmethod
    def against(cls, endpoints: Mapping[str, str], scratch: Path, project: str) -> Gcloud | None:
        """gcloud whose APIs (`{"TPU": url, "COMPUTE": url}`) are the simulator's; None where
        gcloud is not installed (the caller skips, saying so)."""
        binary = shutil.which("gcloud")
        if binary is None:
            return None
        scratch.mkdir(parents=True, exist_ok=True)
        token = scratch / "token"
        token.write_text("simulated")
        env = {
            **os.environ,
            **{f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}": url for api, url in endpoints.items()},
            "CLOUDSDK_CORE_PROJECT": project,
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
            "CLOUDSDK_CONFIG": str(scratch / "config"),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        }
        return cls(binary, env)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )

    def ok(self, *args: str) -> str:
        """Its output; AssertionError with gcloud's stderr when it fails."""
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout
