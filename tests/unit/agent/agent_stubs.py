"""Stand-ins for the agent's tests: a fake metadata server (`FakeMetadata`), a recording Pub/Sub,
Cloud Storage and Secret Manager (`GoogleStub`), and helpers that run the startup script as a VM does."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from tpujobs.agent.boot_record import process_start
from tpujobs.domain import signing
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.messages import decode_report
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import AgentTimings
from tpujobs.engine.worker_reports import PreemptionNotice, WorkerReport

BASH = shutil.which("bash")
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
BUCKET = "logs-bucket"
PROJECT = "proj-1"
KEY = hashlib.sha256(b"the attempt key of the tests").digest()  # what the metadata hands out
ACCOUNT = f"tpujobs-tpu-vm@{PROJECT}.iam.gserviceaccount.com"


# --- stand-ins ------------------------------------------------------------------------


class _Server:
    """A ThreadingHTTPServer on a free loopback port, run in a thread, used as a context."""

    handler: type[BaseHTTPRequestHandler]

    def __enter__(self) -> Any:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"


class _MetadataHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        owner: FakeMetadata = self.server.owner  # type: ignore[attr-defined]
        owner.requests.append(self.path)
        if self.headers.get("Metadata-Flavor") != "Google":
            self._send(403, "Missing Metadata-Flavor")
            return
        parts = urllib.parse.urlsplit(self.path)
        key = parts.path.removeprefix("/computeMetadata/v1/")
        query = urllib.parse.parse_qs(parts.query)
        value = owner.values().get(key)
        if value is not None and query.get("wait_for_change") == ["true"] and owner.hold:
            value = owner.wait_for_change(key, value, query)
        self._send(404, "not found") if value is None else self._send(200, value)

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("ETag", etag(body))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class FakeMetadata(_Server):
    """A GCE metadata server for one worker host; `preempted` flips instance/preempted and
    `maintenance_event` sets instance/maintenance-event. Like GCE it answers with an ETag and
    holds a `wait_for_change` request until the value's ETag differs from `last_etag` (without
    one: until the value changes), or `timeout_sec` passes; with `hold` False it answers at
    once, as a server that cannot wait.
    """

    handler = _MetadataHandler

    def __init__(
        self,
        worker: int = 0,
        node_id: str = "train-1-a1",
        token: str = "fake-token",
        account: str = ACCOUNT,
        **extra: str,
    ) -> None:
        self.worker = worker
        self.node_id = node_id
        self.token = token
        self.account = account
        self.preempted = False
        self.maintenance_event = "NONE"
        self.hold = True
        self.closing = threading.Event()
        self.extra = extra
        self.requests: list[str] = []
        self.key_server: GoogleStub | None = None  # who answers this host's `attempt-key`, if a test says

    def wait_for_change(self, key: str, value: str, query: dict[str, list[str]]) -> str | None:
        """The value once its ETag differs from last_etag (without one: once it changes), or at timeout_sec."""
        last = query.get("last_etag", [""])[0] or etag(value)
        if last != etag(value):
            return value
        deadline = time.monotonic() + float(query.get("timeout_sec", ["60"])[0])
        while time.monotonic() < deadline and not self.closing.wait(0.02):
            value = self.values().get(key)
            if value is None or etag(value) != last:
                return value
        return value

    def __exit__(self, *exc: object) -> None:
        self.closing.set()  # held requests end
        super().__exit__(*exc)

    def values(self) -> dict[str, str]:
        tpu_env = f"NODE_ID: '{self.node_id}'\nWORKER_ID: '{self.worker}'\nZONE: 'us-central2-b'\n"
        values = {
            "instance/attributes/agent-worker-number": str(self.worker),
            "instance/attributes/tpu-env": tpu_env,
            "instance/preempted": "TRUE" if self.preempted else "FALSE",
            "instance/maintenance-event": self.maintenance_event,
            "instance/service-accounts/default/email": self.account,
            "instance/service-accounts/default/token": json.dumps(
                {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"}
            ),
            # What the control plane's `attempt-key` takes (GoogleStub answers it): any text here.
            "instance/service-accounts/default/identity": f"identity-of-{self.node_id}-w{self.worker}",
            **self.extra,
        }
        names = sorted(
            key.removeprefix("instance/attributes/") for key in values if key.startswith("instance/attributes/")
        )
        values["instance/attributes/"] = "".join(f"{name}\n" for name in names)  # the listing, as GCE's
        return values

    @property
    def base(self) -> str:
        return self.url + "/computeMetadata/v1"


class _GoogleHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _handle(self) -> None:
        owner: GoogleStub = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, answer = owner.answer(self.command, self.path, dict(self.headers), body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = _handle


class GoogleStub(_Server):
    """Just enough of the Pub/Sub, Storage and Secret Manager REST APIs, recording every request.

    `failures` maps a substring of a request path to a list of statuses answered, in turn,
    before that path succeeds. `secrets` maps a version name to its value; one in `denied`
    is 403 PERMISSION_DENIED, one not in `secrets` 404 NOT_FOUND.
    """

    handler = _GoogleHandler

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.objects: dict[tuple[str, str], bytes] = {}
        self.published: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.data: list[tuple[str, bytes, dict[str, str]]] = []  # the exact bytes published
        self.failures: dict[str, list[int]] = {}
        self.secrets: dict[str, bytes] = {}
        self.denied: set[str] = set()
        # What `attempt-key` answers (None: 403, as for a VM that is not the attempt's host).
        self.key_answer: dict[str, Any] | None = {"key": signing.key_text(KEY), "key_version": "1", "job_created": "1"}
        self.key_requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        with self.lock:
            self.requests.append((method, path, headers, body))
            for fragment, statuses in self.failures.items():
                if fragment in path and statuses:
                    return statuses.pop(0), b'{"error": "injected"}'
            parts = urllib.parse.urlsplit(path)
            query = urllib.parse.parse_qs(parts.query)
            route = parts.path
            if method == "POST" and route == KEY_PATH:
                self.key_requests.append(json.loads(body))
                if self.key_answer is None:
                    return 403, json.dumps({"error": "No key for this VM."}).encode()
                return 200, json.dumps(self.key_answer).encode()
            publish = re.fullmatch(r"/v1/projects/([^/]+)/topics/([^/]+):publish", route)
            if method == "POST" and publish:
                topic = urllib.parse.unquote(publish.group(2))
                for message in json.loads(body)["messages"]:
                    data = base64.b64decode(message["data"])
                    attributes = message.get("attributes", {})
                    self.published.append((topic, json.loads(data), attributes))
                    self.data.append((topic, data, attributes))
                return 200, json.dumps({"messageIds": ["1"]}).encode()
            access = re.fullmatch(r"/v1/(projects/[^/]+/secrets/[^/]+/versions/[^/]+):access", route)
            if method == "GET" and access:
                return self._access(urllib.parse.unquote(access.group(1)))
            upload = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", route)
            if method == "POST" and upload and query.get("uploadType") == ["media"]:
                self.objects[(upload.group(1), query["name"][0])] = body
                return 200, json.dumps({"name": query["name"][0]}).encode()
            listing = re.fullmatch(r"/storage/v1/b/([^/]+)/o", route)
            if method == "GET" and listing:
                prefix = query.get("prefix", [""])[0]
                names = sorted(n for (b, n) in self.objects if b == listing.group(1) and n.startswith(prefix))
                return 200, json.dumps({"items": [{"name": n} for n in names]}).encode()
            get = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", route)
            if method == "GET" and get and query.get("alt") == ["media"]:
                key = (get.group(1), urllib.parse.unquote(get.group(2)))
                if key in self.objects:
                    return 200, self.objects[key]
                return 404, b'{"error": "no such object"}'
            return 400, b'{"error": "the stub does not know this request"}'

    def _access(self, name: str) -> tuple[int, bytes]:
        if name in self.denied:
            error = {"code": 403, "message": f"Permission denied on {name}", "status": "PERMISSION_DENIED"}
            return 403, json.dumps({"error": error}).encode()
        if name not in self.secrets:
            error = {"code": 404, "message": f"Secret [{name}] not found", "status": "NOT_FOUND"}
            return 404, json.dumps({"error": error}).encode()
        value = self.secrets[name]
        payload = {"data": base64.b64encode(value).decode(), "dataCrc32c": str(google_crc32c.value(value))}
        return 200, json.dumps({"name": name, "payload": payload}).encode()

    def signed(self, topic: str) -> list[tuple[bytes, dict[str, str]]]:
        """(data, attributes) of each message published on the topic, as sent."""
        with self.lock:
            return [(data, attributes) for t, data, attributes in self.data if t == topic]

    def everything_sent(self) -> bytes:
        """Every request the stub saw, path, headers and body: to search for what must not leak."""
        with self.lock:
            requests = [f"{m} {p} {h}".encode() + b" " + body for m, p, h, body in self.requests]
            published = [data + json.dumps(attributes).encode() for _, data, attributes in self.data]
            return b"\n".join(requests + published + list(self.objects.values()))

    def kinds(self, topic: str) -> list[str]:
        with self.lock:
            return [payload.get("kind", "notice") for t, payload, _ in self.published if t == topic]

    def messages(self, topic: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
        with self.lock:
            return [(payload, attrs) for t, payload, attrs in self.published if t == topic]

    def chunks(self, prefix: str) -> list[tuple[str, bytes]]:
        with self.lock:
            return sorted((n, d) for (b, n), d in self.objects.items() if n.startswith(prefix))

    def output(self, prefix: str) -> bytes:
        return b"".join(d for n, d in self.chunks(prefix) if n.endswith(".log"))


def a_job(attempt: int = 1, **spec_changes: Any) -> Job:
    """A job made by new_job from a valid spec, at the given attempt."""
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "echo hello",
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), "us-central2-b", NOW)
    return job.evolve(attempt=attempt, queued_resource=f"{job.job_id}-a{attempt}")


KEY_PATH = "/attempt-key"  # where GoogleStub answers the jobs function's `attempt-key`
# The stub's port is known only once it runs: start_script points the agent at it (TPUJOBS_KEY_URL).
KEY_URL_PLACEHOLDER = "http://attempt-keys.invalid" + KEY_PATH
SETTINGS = Settings(
    project=PROJECT, prefix="t-", logs_bucket=BUCKET, tpu_service_account=ACCOUNT, key_url=KEY_URL_PLACEHOLDER
)
FAST = AgentTimings(heartbeat_seconds=0.3, grace_seconds=1, chunk_seconds=0.2)
WORKER_EVENTS = "t-tpujobs-worker-events"
PREEMPTION = "t-tpujobs-preemption"


def start_script(
    script: str,
    workdir: Path,
    metadata: FakeMetadata,
    google: GoogleStub,
    python_dir: Path | None = None,
) -> subprocess.Popen[str]:
    """The startup script, run with bash in its own process group, as a VM (or the simulator) would."""
    path = workdir.parent / f"startup-{workdir.name}.sh"
    path.write_text(script)
    env = {
        "PATH": (f"{python_dir}:" if python_dir else "") + os.environ.get("PATH", ""),
        "HOME": str(workdir.parent),
        "TPUJOBS_WORKDIR": str(workdir),
        "TPUJOBS_METADATA_URL": metadata.base,
        "TPUJOBS_KEY_URL": google.url + KEY_PATH,  # the stub's, in place of the config's
        "PUBSUB_EMULATOR_HOST": google.url.removeprefix("http://"),
        "STORAGE_EMULATOR_HOST": google.url,
        "TPUJOBS_SECRETS_ENDPOINT": google.url,
        # Commands as the agent's own user: the tests' commands write into pytest's private dirs
        # (test_agent_confinement.py runs them as a job user).
        "TPUJOBS_JOB_USER": "root",
    }
    return subprocess.Popen(
        [BASH or "bash", str(path)],
        cwd=workdir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_script(script: str, workdir: Path, metadata: FakeMetadata, google: GoogleStub, **kw: Any):
    """Run the startup script to the end; (exit code, stdout, stderr)."""
    process = start_script(script, workdir, metadata, google, **kw)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, out, err


def chunk_prefix(attempt: int = 1, slice_id: int = 0, worker_id: int = 0, job_id: str = "train-1") -> str:
    return f"logs/jobs/{job_id}/attempt-{attempt}/chunks/slice-{slice_id}-worker-{worker_id}/"


def assert_all_signed(google: GoogleStub, topic: str, key: bytes = KEY) -> None:
    """Every message on the topic verifies under the key and fits the control plane's model."""
    model = PreemptionNotice if topic == PREEMPTION else WorkerReport
    messages = google.signed(topic)
    assert messages
    for data, attributes in messages:
        signature = attributes.get(signing.SIGNATURE_ATTRIBUTE)
        assert signing.signature_problem(key, data, signature) is None, (data, attributes)
        report = decode_report(model, data)
        assert report.at is not None and re.fullmatch(r"[0-9a-f]{32}", report.nonce)
    nonces = [json.loads(data)["nonce"] for data, _ in messages]
    assert len(set(nonces)) == len(nonces)


def a_config(**changes: Any) -> dict[str, Any]:
    config = {
        "job_id": "train-1",
        "attempt": 2,
        "resume": True,
        "command": "true",
        "num_slices": 2,
        "hosts_per_slice": 4,
        "queued_resource": "train-1-a2",
        "checkpoint_uri": f"gs://{BUCKET}/checkpoints/jobs/train-1/",
        "log_prefix": f"gs://{BUCKET}/logs/jobs/train-1/attempt-2/",
        "project": PROJECT,
        "worker_events_topic": WORKER_EVENTS,
        "preemption_topic": PREEMPTION,
        "key_url": KEY_URL_PLACEHOLDER,
    }
    config.update(changes)
    return config


def _python38() -> str | None:
    """A python3.8 that runs: on PATH, or installed by pyenv."""
    candidates = [shutil.which("python3.8")]
    candidates += [str(p) for p in Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")]
    for candidate in filter(None, candidates):
        result = subprocess.run([candidate, "--version"], capture_output=True, check=False)
        if result.returncode == 0:
            return candidate
    return None


PYTHON38 = _python38()


def python3_dir(tmp_path: Path, version: str) -> Path | None:
    """None for the default python3; else a directory whose python3 is that version (or skip)."""
    if version == "default":
        return None
    if PYTHON38 is None:
        pytest.skip("needs a working python3.8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").symlink_to(PYTHON38)
    return bin_dir


HF_VERSION = f"projects/{PROJECT}/secrets/t-tpujobs_tpujobs-tpu-vm_hf-token/versions/latest"

RECORD = ".tpujobs-attempt-train-1-a1-slice0-worker0.json"  # beside the work dir tmp_path / "w"


def read_record(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def gone(pid: int) -> bool:
    return process_start(pid) == ""


# What survives of the first start: a reboot kills everything; a killed agent leaves its
# command (in a session of its own) running; a startup script run by hand meets both alive.
