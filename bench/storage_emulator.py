"""The local Cloud Storage's upload time as its objects grow: gcp-storage-emulator as shipped
against `tpujobs.local.storage_emulator` (which skips rewriting every object's metadata on each
write when it runs in memory).

Each run starts a fresh emulator, uploads --objects small objects (as the agents' output chunks
are) with google-cloud-storage, and reports the median upload of the first and the last 200.

    .venv/bin/python bench/storage_emulator.py [--objects 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tpujobs.local import processes, wiring


def as_shipped(port: int) -> processes.ServiceSpec:
    mended = processes.storage_emulator(port)
    script = processes._venv_script("gcp-storage-emulator")
    argv = (script, "start", f"--host={processes.LOOPBACK}", f"--port={port}", "--in-memory")
    return processes.ServiceSpec(name="storage", argv=argv, port=port, ready=mended.ready, deadline_s=30.0)


def one_run(spec_of, objects: int) -> tuple[float, float]:
    port = processes.free_port()
    started = processes.start([spec_of(port)], Path(tempfile.mkdtemp(prefix="tpujobs-bench-storage-")))
    try:
        bucket = wiring.storage_client(f"http://{processes.LOOPBACK}:{port}", "bench").create_bucket(
            f"bench-{uuid.uuid4().hex[:8]}"
        )
        seconds = []
        for n in range(objects):
            started_at = time.perf_counter()
            bucket.blob(f"out/{n:06d}.log").upload_from_string(b"x" * 200)
            seconds.append(time.perf_counter() - started_at)
        return statistics.median(seconds[:200]), statistics.median(seconds[-200:])
    finally:
        processes.stop(started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name, spec_of in (("as shipped", as_shipped), ("mended", processes.storage_emulator)):
        runs = [one_run(spec_of, args.objects) for _ in range(args.repeats)]
        first = statistics.median(r[0] for r in runs) * 1000
        last = statistics.median(r[1] for r in runs) * 1000
        print(f"{name:>10}: median upload {first:.1f} ms for the first 200 objects, {last:.1f} ms for the last 200 "
              f"of {args.objects} (medians of {args.repeats} runs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
