"""Notifications on the local stack: a receiver on loopback hears a job's RUNNING and SUCCEEDED,
each signed with its team's key, through the real notify function and its push subscription."""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from tpujobs.domain.notify_delivery import (
    DELIVERY_HEADER,
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    NotifyKeys,
    derived_signing_key,
    verify,
)
from tpujobs.local import stack
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_webhook_on_loopback_receives_running_and_succeeded_signed(env, submit_job):
    """The job asks for RUNNING and SUCCEEDED: both arrive once each, in order, with a valid
    signature and the event's id; the record in Firestore lists both as delivered."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        job_id = submit_job(
            prefix="notify", command="echo hello", notify=[{"webhook": url, "on": ["RUNNING", "SUCCEEDED"]}]
        )

        def both_arrived():
            """the receiver got RUNNING and SUCCEEDED"""
            states = [json.loads(body)["state"] for _, body in _Receiver.received if job_id.encode() in body]
            return states if "SUCCEEDED" in states else None

        # Generous, within the test timeout: a two-host job provisions, runs and ends, then two pushes.
        states = wait_for(both_arrived, timeout=90)
        assert states == ["RUNNING", "SUCCEEDED"]
        state = stack.load(Path(os.environ["TPUJOBS_STATE_DIR"]))
        assert state is not None
        keys = NotifyKeys.of(derived_signing_key(state.report_key))  # the local stack's notify master key
        for headers, body in _Receiver.received:
            team = headers[KEY_ID_HEADER]
            assert team.split(":", 1)[0] in ("owner", "claimed", "account"), team
            assert verify(keys.team_key(team), headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER])
            fields = json.loads(body)
            assert headers[DELIVERY_HEADER].startswith(f"{job_id}/")
            assert fields["job_id"] == job_id and fields["attempt"] == 1 and job_id in fields["text"]
        from google.cloud import firestore

        record = (
            firestore.Client(project=env["project"])
            .collection("jobs")
            .document(job_id)
            .collection("notifications")
            .document("notify-0")
            .get()
            .to_dict()
        )
        assert record is not None and len(record["delivered"]) == 2 and record["last_error"] == ""
        assert url not in json.dumps(record, default=str), "the record never holds the URL"
    finally:
        server.shutdown()
        server.server_close()
