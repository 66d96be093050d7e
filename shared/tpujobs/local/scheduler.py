"""The local stand-in for Cloud Scheduler: publish a tick to `tpujobs-reconcile` every few seconds.

Production ticks once a minute; locally a short interval keeps demos and tests brisk. Each
tick also deletes the records past their `expire_at` (`FirestoreJobStore.prune_expired`): the
emulator has no TTL, and this is what production's TTL policies do, so retention can be seen
and tested on a laptop.
`python -m tpujobs.local.scheduler --interval 3` with the stack's environment.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.engine.topology import RECONCILE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between ticks")
    args = parser.parse_args(argv)
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.engine.errors import TransientError

    settings = Settings.from_env()
    publisher = Publisher.build(settings.project, settings.prefix)
    store = FirestoreJobStore(firestore.Client(project=settings.project))
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    print(f"tpujobs-scheduler ticking every {args.interval} s", flush=True)
    while not stopping.wait(args.interval):
        tick = {"tick": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
        try:
            publisher.publish_bytes(RECONCILE, json.dumps(tick).encode())
        except TransientError as error:
            print(f"tick not published: {error}", file=sys.stderr, flush=True)
        prune(store)
    return 0


def prune(store: FirestoreJobStore) -> None:
    """Delete what Firestore's TTL would have by now; a failure waits for the next tick."""
    from tpujobs.engine.errors import TransientError

    try:
        gone = store.prune_expired(datetime.now(timezone.utc))
    except TransientError as error:
        print(f"expired records not pruned: {error}", file=sys.stderr, flush=True)
        return
    if gone:
        print(f"pruned expired jobs: {', '.join(gone)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
