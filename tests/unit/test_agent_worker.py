"""The worker agent, piece by piece and whole, against local HTTP stand-ins.

The agent's HTTP protocol is what is under test here, so Pub/Sub and Cloud Storage are a
small recording server (`GoogleStub`) that speaks just enough of both REST APIs; the real
emulators are in tests/emulator/test_agent_emulators.py. The metadata server is a fake too
(`FakeMetadata`). Both are importable by test_startup_script.py, which sits beside this file.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from tpujobs.agent import worker
from tpujobs.domain import signing
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine import reports
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import AgentTimings, render_startup_script
from tpujobs.local.testing import wait_for

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
        key: str | None = signing.key_text(KEY),
        account: str = ACCOUNT,
        **extra: str,
    ) -> None:
        self.worker = worker
        self.node_id = node_id
        self.token = token
        self.key = key  # the tpujobs-report-key attribute; None: absent
        self.account = account
        self.preempted = False
        self.maintenance_event = "NONE"
        self.hold = True
        self.closing = threading.Event()
        self.extra = extra
        self.requests: list[str] = []

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
            **self.extra,
        }
        if self.key is not None:
            values["instance/attributes/tpujobs-report-key"] = self.key
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


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        yield server


@pytest.fixture
def google() -> Iterator[GoogleStub]:
    with GoogleStub() as server:
        yield server


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


SETTINGS = Settings(project=PROJECT, prefix="t-", logs_bucket=BUCKET, tpu_service_account=ACCOUNT)
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
        "PUBSUB_EMULATOR_HOST": google.url.removeprefix("http://"),
        "STORAGE_EMULATOR_HOST": google.url,
        "TPUJOBS_SECRETS_ENDPOINT": google.url,
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
    model = reports.PreemptionNotice if topic == PREEMPTION else reports.WorkerReport
    messages = google.signed(topic)
    assert messages
    for data, attributes in messages:
        signature = attributes.get(signing.SIGNATURE_ATTRIBUTE)
        assert signing.signature_problem(key, data, signature) is None, (data, attributes)
        report = reports.decode_report(model, data)
        assert report.at is not None and re.fullmatch(r"[0-9a-f]{32}", report.nonce)
    nonces = [json.loads(data)["nonce"] for data, _ in messages]
    assert len(set(nonces)) == len(nonces)


# --- identity -------------------------------------------------------------------------


def test_tpu_env_is_read_as_key_value_lines_with_quotes_removed() -> None:
    """`KEY: 'value'`, `KEY: "value"` and `KEY: value` lines all give value; junk lines are skipped."""
    text = "NODE_ID: 'train-1-a2-1'\nWORKER_ID: \"3\"\nZONE: us-central2-b\nnot a pair\n\n"
    assert worker.parse_tpu_env(text) == {
        "NODE_ID": "train-1-a2-1",
        "WORKER_ID": "3",
        "ZONE": "us-central2-b",
    }


@pytest.mark.parametrize(
    ("node_id", "queued_resource", "slice_id"),
    [
        ("train-1-a2-1", "train-1-a2", 1),
        ("train-1-a2-0", "train-1-a2", 0),
        ("train-1-a2-17", "train-1-a2", 17),
        ("x-9-a12-3", "x-9-a12", 3),
        ("other-name-5", "train-1-a2", 5),
    ],
)
def test_the_slice_id_is_the_number_after_the_queued_resource_name(
    node_id: str, queued_resource: str, slice_id: int
) -> None:
    """NODE_ID {queued_resource}-{n} is slice n; a node named otherwise gives its trailing number."""
    assert worker.slice_id_from_node_id(node_id, queued_resource) == slice_id


def test_a_node_id_without_a_number_names_no_slice() -> None:
    """NODE_ID with no trailing number is an error, not a silent slice 0."""
    with pytest.raises(worker.AgentError, match="NODE_ID"):
        worker.slice_id_from_node_id("train-1-a2", "train-1-a2")


def test_a_single_slice_job_is_slice_zero_whatever_its_node_is_called() -> None:
    """With num_slices 1 the slice id is 0, even when the node id ends in a number."""
    with FakeMetadata(worker=2, node_id="train-1-a2") as server:
        identity = worker.discover_identity(
            worker.Metadata(server.base), {"num_slices": 1, "queued_resource": "train-1-a2"}
        )
    assert identity == (2, 0)


def test_a_multislice_worker_reads_its_worker_number_and_slice_from_the_metadata() -> None:
    """agent-worker-number is the worker id; NODE_ID's suffix after the queued resource is the slice."""
    with FakeMetadata(worker=3, node_id="train-1-a2-1") as server:
        identity = worker.discover_identity(
            worker.Metadata(server.base), {"num_slices": 2, "queued_resource": "train-1-a2"}
        )
    assert identity == (3, 1)


def test_the_metadata_is_asked_with_the_metadata_flavor_header() -> None:
    """The fake answers 403 without Metadata-Flavor: Google, so a successful read proves the header."""
    with FakeMetadata(worker=5) as server:
        assert worker.Metadata(server.base).get("instance/attributes/agent-worker-number") == "5"
        assert worker.Metadata(server.base).get_optional("instance/attributes/nothing") is None


# --- small pure pieces ----------------------------------------------------------------


def test_timestamps_are_rfc3339_utc_with_milliseconds() -> None:
    """rfc3339 gives 2025-03-01T12:00:00.123Z for that instant."""
    instant = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc).timestamp()
    assert worker.rfc3339(instant) == "2025-03-01T12:00:00.123Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", worker.rfc3339())


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-15, 143), (-9, 137)])
def test_a_death_by_signal_is_reported_as_128_plus_the_signal(returncode: int, code: int) -> None:
    """Negative return codes (killed by signal N) become 128 + N, as a shell reports them."""
    assert worker.exit_status(returncode) == code


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (b"TPUJOBS_CHECKPOINT step=123", (123, "")),
        (b"TPUJOBS_CHECKPOINT step=5 saved to gs://b/ckpt/5\r\n", (5, "saved to gs://b/ckpt/5")),
        (b"  TPUJOBS_CHECKPOINT step=7", (7, "")),
        (b"TPUJOBS_CHECKPOINT step=x", None),
        (b"echo TPUJOBS_CHECKPOINT step=1", None),
        (b"TPUJOBS_CHECKPOINTS step=1", None),
    ],
)
def test_checkpoint_lines_are_recognised_with_their_step_and_detail(line: bytes, found: tuple[int, str] | None) -> None:
    """`TPUJOBS_CHECKPOINT step=N rest` gives (N, rest); anything else is not a checkpoint."""
    assert worker.parse_checkpoint(line) == found


def test_a_checkpoint_detail_is_cut_to_what_the_control_plane_accepts() -> None:
    """A detail longer than 1024 characters is truncated."""
    found = worker.parse_checkpoint(b"TPUJOBS_CHECKPOINT step=1 " + b"x" * 5000)
    assert found is not None and len(found[1]) == 1024


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
    }
    config.update(changes)
    return config


def test_a_config_gets_its_defaults(tmp_path: Path) -> None:
    """heartbeat 10 s, grace 30 s, chunks 2 s, no setup, no code, empty env when absent."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config()))
    config = worker.load_config(str(path))
    assert (config["heartbeat_seconds"], config["grace_seconds"], config["chunk_seconds"]) == (
        10,
        30,
        2,
    )
    assert (config["setup"], config["code_uri"], config["env"]) == (None, None, {})
    assert (config["secrets"], config["code_sha256"]) == ({}, None)


@pytest.mark.parametrize(
    "changes",
    [
        {"attempt": "2"},
        {"attempt": True},
        {"resume": 1},
        {"command": None},
        {"env": {"A": 1}},
        {"grace_seconds": 0},
        {"secrets": {"HF_TOKEN": "hf-token"}},
        {"secrets": {"HF_TOKEN": "projects/p/secrets/s"}},
        {"secrets": {"TPUJOBS_X": "projects/p/secrets/s/versions/1"}},
        {"secrets": ["HF_TOKEN"]},
        {"code_sha256": "abc"},
        {"code_sha256": 7},
    ],
)
def test_a_config_with_a_wrong_type_is_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    """Wrong types are an AgentError naming the key, not a crash later."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(**changes)))
    with pytest.raises(worker.AgentError, match=next(iter(changes))):
        worker.load_config(str(path))


def test_the_job_environment_is_the_host_env_then_the_spec_env_then_tpujobs_variables() -> None:
    """Contract section 2: the TPUJOBS_ variables, the spec's env, the host's env minus its TPUJOBS_."""
    env = worker.job_environment(
        {"PATH": "/bin", "SHARED": "host", "TPUJOBS_WORKDIR": "/w", "TPUJOBS_SLICE_ID": "9"},
        a_config(env={"SHARED": "spec", "LR": "0.1"}),
        3,
        1,
    )
    assert env == {
        "PATH": "/bin",
        "SHARED": "spec",
        "LR": "0.1",
        "TPUJOBS_JOB_ID": "train-1",
        "TPUJOBS_ATTEMPT": "2",
        "TPUJOBS_RESUME": "1",
        "TPUJOBS_CHECKPOINT_URI": f"gs://{BUCKET}/checkpoints/jobs/train-1/",
        "TPUJOBS_WORKER_ID": "3",
        "TPUJOBS_NUM_WORKERS": "4",
        "TPUJOBS_SLICE_ID": "1",
        "TPUJOBS_NUM_SLICES": "2",
    }


# --- tarballs -------------------------------------------------------------------------


def make_tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """A .tar.gz of (kind, name, content-or-link-target) members: kind file, dir, sym, lnk, fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = value.encode()
                info.size = len(data)
                info.mode = 0o755 if name.endswith(".sh") else 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
            elif kind == "lnk":
                info.type, info.linkname = tarfile.LNKTYPE, value
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.mark.parametrize("standard_filter", [True, False], ids=["with-filter", "own-checks-only"])
def test_a_safe_tarball_unpacks_files_dirs_inner_links_and_modes(tmp_path: Path, standard_filter: bool) -> None:
    """Files, nested directories, a link inside the tree and the executable bit all arrive."""
    archive = make_tar(
        tmp_path / "code.tar.gz",
        [
            ("dir", "pkg", ""),
            ("file", "pkg/train.py", "print('hi')\n"),
            ("file", "run.sh", "#!/bin/sh\necho run\n"),
            ("sym", "pkg/link.py", "train.py"),
            ("lnk", "hard.py", "pkg/train.py"),
        ],
    )
    dest = tmp_path / "code"
    worker.safe_extract(str(archive), str(dest), standard_filter=standard_filter)
    assert (dest / "pkg" / "train.py").read_text() == "print('hi')\n"
    assert (dest / "pkg" / "link.py").read_text() == "print('hi')\n"
    assert (dest / "hard.py").read_text() == "print('hi')\n"
    assert os.access(dest / "run.sh", os.X_OK)


HOSTILE_TARS = {
    "absolute_path": [("file", "/tmp/evil-{n}", "x")],
    "dot_dot": [("file", "../evil-{n}", "x")],
    "dot_dot_inside": [("file", "a/../../evil-{n}", "x")],
    "symlink_absolute": [("sym", "link", "/tmp")],
    "symlink_climbing": [("sym", "link", "../..")],
    "file_through_symlink": [("sym", "out", ".."), ("file", "out/evil-{n}", "x")],
    "symlink_chain": [("dir", "a", ""), ("sym", "a/b", ".."), ("sym", "a/c", "b/..")],
    "hardlink_absolute": [("lnk", "passwd", "/etc/passwd")],
    "hardlink_climbing": [("lnk", "passwd", "../../etc/passwd")],
    "fifo": [("fifo", "pipe", "")],
}


@pytest.mark.parametrize("standard_filter", [True, False], ids=["with-filter", "own-checks-only"])
@pytest.mark.parametrize("members", HOSTILE_TARS.values(), ids=HOSTILE_TARS.keys())
def test_a_hostile_tarball_is_refused_and_writes_nothing_outside(
    tmp_path: Path, members: list[tuple[str, str, str]], standard_filter: bool
) -> None:
    """Absolute paths, `..`, links leading out and special files raise AgentError; nothing escapes."""
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    members = [(k, n.replace("{n}", marker), v) for k, n, v in members]
    archive = make_tar(tmp_path / "bad.tar.gz", members)
    dest = tmp_path / "deep" / "code"
    with pytest.raises(worker.AgentError):
        worker.safe_extract(str(archive), str(dest), standard_filter=standard_filter)
    assert not list(tmp_path.rglob(f"evil-{marker}"))
    assert not Path(f"/tmp/evil-{marker}").exists()


# --- the HTTP protocol ----------------------------------------------------------------


def test_a_report_is_a_pubsub_rest_publish_of_base64_json_with_attributes(
    google: GoogleStub,
) -> None:
    """POST /v1/projects/P/topics/T:publish with messages[0].data = base64(JSON) and attributes."""
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, KEY)
    publisher.publish(WORKER_EVENTS, {"kind": "started", "job_id": "j"}, {"job_id": "j", "kind": "started"})
    method, path, headers, body = google.requests[0]
    assert (method, path) == ("POST", f"/v1/projects/{PROJECT}/topics/{WORKER_EVENTS}:publish")
    assert headers["Content-Type"] == "application/json"
    assert "Authorization" not in headers  # an emulator takes no credentials
    message = json.loads(body)["messages"][0]
    data = base64.b64decode(message["data"])
    assert json.loads(data) == {"kind": "started", "job_id": "j"}
    assert message["attributes"] == {
        "job_id": "j",
        "kind": "started",
        "tpujobs-signature": signing.sign(KEY, data),
    }


def test_a_publish_is_retried_through_server_errors_and_rate_limits(google: GoogleStub) -> None:
    """503, 429 and 500 answers are retried; the message then goes through once."""
    google.failures[":publish"] = [503, 429, 500]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, KEY)
    publisher.publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
    assert google.kinds(WORKER_EVENTS) == ["heartbeat"]
    assert len(google.requests) == 4


def test_a_client_error_is_not_retried(google: GoogleStub) -> None:
    """A 400 or 404 fails at once: retrying cannot help."""
    google.failures[":publish"] = [404]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, KEY)
    with pytest.raises(worker.HttpError, match="404"):
        publisher.publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
    assert len(google.requests) == 1


def test_retries_are_bounded_when_the_server_never_recovers(google: GoogleStub) -> None:
    """After the last attempt the error is raised instead of looping forever."""
    google.failures[":publish"] = [503] * 20
    api = worker.GoogleApi(google.url, None)
    with pytest.raises(worker.HttpError, match="503"):
        worker.with_retries(
            lambda: api.call("POST", "/v1/projects/p/topics/t:publish", b"{}", attempts=1),
            attempts=3,
            sleep=lambda s: None,
        )
    assert len(google.requests) == 3


def test_a_connection_error_is_retried() -> None:
    """Nothing listening is a transient error: retried a bounded number of times."""
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("nobody home")
        return "ok"

    assert worker.with_retries(call, sleep=lambda s: None) == "ok"
    assert len(calls) == 3


def test_without_an_emulator_the_real_api_is_called_with_the_metadata_token() -> None:
    """No PUBSUB_EMULATOR_HOST: https://pubsub.googleapis.com with the VM's bearer token."""
    with FakeMetadata(token="tok-123") as server:
        tokens = worker.TokenSource(worker.Metadata(server.base))
        api = worker.GoogleApi.from_env("PUBSUB_EMULATOR_HOST", worker.PUBSUB_API, {}, tokens)
        assert api.base_url == "https://pubsub.googleapis.com"
        assert api.tokens is tokens
        assert tokens.token() == "tok-123"
    emulated = worker.GoogleApi.from_env(
        "PUBSUB_EMULATOR_HOST",
        worker.PUBSUB_API,
        {"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"},
        tokens,
    )
    assert (emulated.base_url, emulated.tokens) == ("http://127.0.0.1:8085", None)


def test_the_token_goes_in_the_authorization_header_and_is_refreshed_after_a_401(
    google: GoogleStub,
) -> None:
    """Bearer <token> on every call; a 401 drops the cached token, fetches a new one and retries."""
    with FakeMetadata(token="first") as server:
        tokens = worker.TokenSource(worker.Metadata(server.base))
        api = worker.GoogleApi(google.url, tokens)
        worker.Publisher(api, PROJECT, KEY).publish(WORKER_EVENTS, {"kind": "started"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer first"
        server.token = "second"
        google.failures[":publish"] = [401]
        worker.Publisher(api, PROJECT, KEY).publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer second"
        token_reads = [p for p in server.requests if p.endswith("/token")]
    assert len(token_reads) == 2


def test_storage_uploads_downloads_and_lists_with_the_json_api(google: GoogleStub, tmp_path: Path) -> None:
    """Media upload by ?name=, alt=media download by quoted name, and ?prefix= listing."""
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    storage.upload(BUCKET, "jobs/a b/x#1.log", b"data", "text/plain")
    method, path, headers, body = google.requests[-1]
    assert (method, headers["Content-Type"]) == ("POST", "text/plain")
    assert path == f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=jobs%2Fa%20b%2Fx%231.log"
    assert body == b"data"
    storage.download(BUCKET, "jobs/a b/x#1.log", str(tmp_path / "out"))
    assert google.requests[-1][1] == f"/storage/v1/b/{BUCKET}/o/jobs%2Fa%20b%2Fx%231.log?alt=media"
    assert (tmp_path / "out").read_bytes() == b"data"
    assert storage.list_names(BUCKET, "jobs/") == ["jobs/a b/x#1.log"]


def test_a_code_prefix_is_downloaded_whole_and_folder_placeholders_are_skipped(
    google: GoogleStub, tmp_path: Path
) -> None:
    """gs://b/code/ gives every object under it at its relative path."""
    google.objects[(BUCKET, "code/train.py")] = b"print(1)\n"
    google.objects[(BUCKET, "code/pkg/util.py")] = b"X = 1\n"
    google.objects[(BUCKET, "code/pkg/")] = b""
    google.objects[(BUCKET, "other/skip.py")] = b""
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    worker.fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "code"))
    found = sorted(str(p.relative_to(tmp_path / "code")) for p in (tmp_path / "code").rglob("*") if p.is_file())
    assert found == ["pkg/util.py", "train.py"]


def test_a_code_prefix_with_a_climbing_object_name_is_refused(google: GoogleStub, tmp_path: Path) -> None:
    """An object named code/../../evil does not land outside the code directory."""
    google.objects[(BUCKET, "code/../../evil")] = b"x"
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    with pytest.raises(worker.AgentError, match=r"\.\."):
        worker.fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "a" / "code"))
    assert not list(tmp_path.rglob("evil"))


def test_a_code_tarball_is_downloaded_and_unpacked(google: GoogleStub, tmp_path: Path) -> None:
    """gs://b/code.tar.gz is unpacked into the code directory."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "print(2)\n")])
    google.objects[(BUCKET, "code.tar.gz")] = archive.read_bytes()
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    worker.fetch_code(storage, f"gs://{BUCKET}/code.tar.gz", str(tmp_path / "w" / "code"))
    assert (tmp_path / "w" / "code" / "train.py").read_text() == "print(2)\n"
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["code"]  # the download is gone


# --- output shipping ------------------------------------------------------------------


def test_output_is_shipped_in_numbered_chunks_with_a_completion_marker(google: GoogleStub) -> None:
    """Each tick ships what arrived as the next chunk; close writes the rest and complete.json."""
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    shipper = worker.LogShipper(storage, BUCKET, "p/", chunk_seconds=0.1)
    shipper.write(b"one\n")
    wait_for(lambda: google.chunks("p/"), timeout=5, interval=0.02, what="the first chunk")
    shipper.write(b"two\n")
    shipper.close(exit_code=3)
    names = [n for n, _ in google.chunks("p/")]
    assert names == ["p/000000.log", "p/000001.log", "p/complete.json"]
    assert google.output("p/") == b"one\ntwo\n"
    assert json.loads(google.objects[(BUCKET, "p/complete.json")]) == {"exit_code": 3, "chunks": 2}


def test_a_large_burst_is_split_into_256_kib_chunks(google: GoogleStub) -> None:
    """600 KiB written at once becomes chunks of at most 256 KiB that concatenate back."""
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    shipper = worker.LogShipper(storage, BUCKET, "p/", chunk_seconds=30)
    data = bytes(range(256)) * (600 * 4)
    shipper.write(data)
    shipper.close(exit_code=None)
    chunks = google.chunks("p/")
    assert [len(d) for _, d in chunks] == [262144, 262144, len(data) - 2 * 262144]
    assert google.output("p/") == data
    assert (BUCKET, "p/complete.json") not in google.objects  # no exit code: not a clean end


def test_output_survives_failed_uploads_and_goes_out_later(google: GoogleStub) -> None:
    """When every retry of an upload fails, the data stays pending and ships on the next tick."""
    google.failures["/upload/"] = [503, 503]  # every retry of the first try
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    shipper = worker.LogShipper(storage, BUCKET, "p/", chunk_seconds=0.1, attempts=2)
    shipper.write(b"kept\n")
    shipper.close(exit_code=0)
    assert google.output("p/") == b"kept\n"
    assert [n for n, _ in google.chunks("p/")] == ["p/000000.log", "p/complete.json"]
    assert len([r for r in google.requests if "/upload/" in r[1]]) == 4  # 2 failed, chunk, marker


def test_while_uploads_fail_only_the_newest_output_is_kept_within_the_bound(
    google: GoogleStub,
) -> None:
    """Past max_pending bytes the oldest output is dropped and counted; the rest still ships in order."""
    google.failures["/upload/"] = [503] * 4
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    shipper = worker.LogShipper(storage, BUCKET, "p/", chunk_seconds=30, attempts=2, max_pending=10)
    shipper.write(b"0123456789")
    assert shipper._ship() is False  # the upload fails; the data stays
    shipper.write(b"abcdef")
    assert shipper._ship() is False
    shipper.close(exit_code=0)
    assert google.output("p/") == b"6789abcdef"
    assert shipper.dropped == 6


# --- the whole agent, through the startup script --------------------------------------


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


def test_the_agent_reports_started_and_exited_and_ships_the_output(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A command printing to stdout and stderr and exiting 3: started, exited(3), output in chunks."""
    job = a_job(command="echo out-1; echo err-1 >&2; echo out-2; exit 3")
    code, stdout, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
    assert code == 3, stderr
    assert google.kinds(WORKER_EVENTS)[0] == "started"
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"
    exited, attributes = google.messages(WORKER_EVENTS)[-1]
    assert exited["exit_code"] == 3
    assert {k: exited[k] for k in ("job_id", "attempt", "slice_id", "worker_id")} == {
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
    }
    assert attributes == {
        "job_id": "train-1",
        "attempt": "1",
        "kind": "exited",
        "tpujobs-signature": attributes["tpujobs-signature"],
    }
    assert_all_signed(google, WORKER_EVENTS)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", exited["at"])
    # When the host started the command, as the started report said: an exit handled first still counts it.
    started = google.messages(WORKER_EVENTS)[0][0]
    assert exited["command_started_at"] <= started["at"] <= exited["at"]
    assert google.output(chunk_prefix()) == b"out-1\nerr-1\nout-2\n"
    assert json.loads(google.objects[(BUCKET, chunk_prefix() + "complete.json")])["exit_code"] == 3
    assert "out-1\n" in stdout  # tee'd to the agent's own stdout
    assert google.messages(PREEMPTION) == []
    assert "fake-token" not in stdout + stderr


def test_heartbeats_arrive_while_the_command_runs(tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> None:
    """With heartbeat_seconds 0.3 a 1.2 s command is seen alive several times between started and exited."""
    job = a_job(command="sleep 1.2")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 0, stderr
    kinds = google.kinds(WORKER_EVENTS)
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert kinds.count("heartbeat") >= 2
    assert set(kinds[1:-1]) == {"heartbeat"}


def test_a_checkpoint_line_becomes_a_checkpoint_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """`TPUJOBS_CHECKPOINT step=5 detail` printed by the command is reported with step and detail."""
    job = a_job(command="echo TPUJOBS_CHECKPOINT step=5 saved ok")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 0, stderr
    checkpoints = [(p, a) for p, a in google.messages(WORKER_EVENTS) if p["kind"] == "checkpoint"]
    assert len(checkpoints) == 1
    payload, attributes = checkpoints[0]
    assert (payload["step"], payload["detail"]) == (5, "saved ok")
    assert attributes["kind"] == "checkpoint"


def test_setup_runs_once_per_host_and_later_attempts_skip_it(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Two attempts in sibling work dirs: setup ran once; the command ran twice."""
    host = tmp_path / "host"
    host.mkdir()
    counter = tmp_path / "setups"
    for attempt in (1, 2):
        job = a_job(attempt, setup=f"echo x >> {counter}", command="echo ran")
        code, _, stderr = run_script(
            render_startup_script(job, SETTINGS, timings=FAST),
            host / f"attempt-{attempt}",
            metadata,
            google,
        )
        assert code == 0, stderr
    assert counter.read_text() == "x\n"
    assert google.output(chunk_prefix(2)) == b"ran\n"


def test_a_failed_setup_is_the_attempts_error_and_the_command_never_runs(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Setup exiting 4: exited(4) is reported, the command's output never appears, no setup marker."""
    job = a_job(setup="echo installing; exit 4", command="echo command-ran")
    code, _, _ = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 4
    exited = [p for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "exited"]
    assert [p["exit_code"] for p in exited] == [4]
    assert google.output(chunk_prefix()) == b"installing\n"
    assert not list(tmp_path.glob(".setup-done-*"))


def test_a_missing_code_object_fails_the_attempt_with_a_reason_in_the_output(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """code_uri naming nothing: exited(1), the command does not run, the log says why."""
    job = a_job(code_uri=f"gs://{BUCKET}/missing.tar.gz", command="echo command-ran")
    code, _, _ = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == worker.AGENT_FAILED
    assert [p["exit_code"] for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "exited"] == [1]
    output = google.output(chunk_prefix())
    assert b"could not fetch the code" in output and b"command-ran" not in output


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_sigterm_publishes_one_notice_first_then_stops_the_command_without_an_exited_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """SIGTERM to the agent: one preemption notice, the command's trap runs, no exited report."""
    job = a_job(command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done")
    process = start_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=python3_dir(tmp_path, python),
    )
    try:
        wait_for(lambda: b"ready" in google.output(chunk_prefix()))
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGTERM)  # a second signal sends no second notice
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    notices = google.messages(PREEMPTION)
    assert len(notices) == 1
    notice, attributes = notices[0]
    assert notice["reason"] == "SIGTERM"
    assert attributes == {
        "job_id": "train-1",
        "attempt": "1",
        "tpujobs-signature": attributes["tpujobs-signature"],
    }
    assert_all_signed(google, PREEMPTION)
    assert re.fullmatch(r"[0-9a-f]{32}", notice["nonce"])
    assert "exited" not in google.kinds(WORKER_EVENTS)
    assert b"got-term\n" in google.output(chunk_prefix())
    assert (BUCKET, chunk_prefix() + "complete.json") not in google.objects
    assert process.returncode == 9


def test_the_agent_runs_on_python_3_8(tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> None:
    """With python3 being 3.8 (the oldest we promise), a job runs and reports as usual."""
    bin_dir = python3_dir(tmp_path, "3.8")
    job = a_job(command="python3 -c 'import sys; print(sys.version_info[:2])'; exit 2")
    code, _, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=bin_dir,
    )
    assert code == 2, stderr
    assert google.output(chunk_prefix()) == b"(3, 8)\n"
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"


def test_worker_py_parses_as_python_3_8() -> None:
    """No syntax newer than 3.8 in the agent (it runs on old TPU VM images)."""
    import ast

    ast.parse(Path(worker.__file__).read_text(), feature_version=(3, 8))


def test_the_agent_imports_only_the_standard_library() -> None:
    """Every import of worker.py is in sys.stdlib_module_names."""
    import ast

    tree = ast.parse(Path(worker.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - set(sys.stdlib_module_names) == set()


def test_after_the_preemption_notice_only_checkpoints_are_still_reported() -> None:
    """A job saving on SIGTERM keeps its work; its exit code, caused by the notice, is not a failure."""
    published: list[str] = []

    class Recorder:
        def publish(self, topic, payload, attributes, **_):
            published.append(payload["kind"])

    identity = {"job_id": "j", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = worker.Reporter(Recorder(), "tpujobs-worker-events", identity)
    reporter.report("heartbeat")
    reporter.silence()
    reporter.report("checkpoint", step=7, detail="")
    reporter.report("exited", exit_code=143)
    reporter.close(timeout=5.0)
    assert published[-1] == "checkpoint" and "exited" not in published


def test_checkpoints_waiting_to_be_published_coalesce_to_the_latest() -> None:
    """A command printing checkpoint lines in a loop while a publish is slow queues one report,
    the latest step, in its place among the others: it cannot flood the topic."""
    published: list[tuple[str, Any]] = []
    first_publish_may_end = threading.Event()

    class SlowRecorder:
        def publish(self, topic, payload, attributes, **_):
            first_publish_may_end.wait(5.0)
            published.append((payload["kind"], payload.get("step")))

    identity = {"job_id": "j", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = worker.Reporter(SlowRecorder(), "tpujobs-worker-events", identity)
    reporter.report("started")  # being published (slowly) while the rest is queued
    for step in range(1, 1001):
        reporter.report("checkpoint", step=step, detail="")
    reporter.report("exited", exit_code=0)
    first_publish_may_end.set()
    reporter.close(timeout=5.0)
    assert published == [("started", None), ("checkpoint", 1000), ("exited", None)]


# --- signing --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_the_report_key_is_read_back_from_what_signing_key_text_writes(seed: int) -> None:
    """parse_report_key inverts tpujobs.domain.signing.key_text, a trailing newline or not."""
    key = hashlib.sha256(f"key {seed}".encode()).digest()
    assert worker.parse_report_key(signing.key_text(key)) == key
    assert worker.parse_report_key(signing.key_text(key) + "\n") == key
    assert worker.KEY_PREFIX == signing.KEY_PREFIX
    assert worker.SIGNATURE_ATTRIBUTE == signing.SIGNATURE_ATTRIBUTE


MALFORMED_KEYS = {
    "empty": "",
    "no_prefix": base64.urlsafe_b64encode(KEY).decode().rstrip("="),
    "other_version": "tpujobs-key-v2:" + base64.urlsafe_b64encode(KEY).decode().rstrip("="),
    "padded": signing.KEY_PREFIX + base64.urlsafe_b64encode(KEY).decode(),
    "standard_alphabet": signing.KEY_PREFIX + "+/" + "A" * 41,
    "short": signing.key_text(KEY[:16]),
    "long": signing.key_text(KEY + b"x"),
    "not_canonical": signing.key_text(KEY)[:-1] + "B",
}


@pytest.mark.parametrize("text", MALFORMED_KEYS.values(), ids=MALFORMED_KEYS.keys())
def test_a_malformed_report_key_is_refused_without_quoting_it(text: str) -> None:
    """Anything but `tpujobs-key-v1:` + canonical unpadded base64url of 32 bytes is an AgentError."""
    with pytest.raises(worker.AgentError) as refused:
        worker.parse_report_key(text)
    body = text.partition(":")[2] or text
    assert not body or body not in str(refused.value)


def test_the_agents_signature_is_what_the_control_plane_verifies() -> None:
    """worker.sign equals signing.sign; signature_problem accepts it and refuses other bytes or keys."""
    data = worker.encode_payload({"kind": "exited", "exit_code": 0, "nonce": "ab" * 16})
    signature = worker.sign(KEY, data)
    assert signature == signing.sign(KEY, data)
    assert signing.signature_problem(KEY, data, signature) is None
    assert signing.signature_problem(KEY, data.replace(b":0", b":1"), signature) is not None
    assert signing.signature_problem(bytes(32), data, signature) is not None


def test_a_publisher_refuses_a_key_that_is_not_32_bytes(google: GoogleStub) -> None:
    """No publisher exists without a usable key, so nothing is ever published unsigned."""
    with pytest.raises(worker.AgentError):
        worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, b"short")


def test_a_retried_publish_sends_the_same_bytes_and_signature(google: GoogleStub) -> None:
    """Two 503s then success: three identical request bodies, one signature over their data."""
    google.failures[":publish"] = [503, 503]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, KEY)
    identity = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = worker.Reporter(publisher, WORKER_EVENTS, identity)
    reporter.report("heartbeat")
    reporter.close(timeout=10.0)
    bodies = [body for _, path, _, body in google.requests if path.endswith(":publish")]
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert_all_signed(google, WORKER_EVENTS)


def test_a_preemption_notice_published_again_after_a_failure_keeps_its_bytes(
    google: GoogleStub,
) -> None:
    """The quick first try fails; the retry thread sends the same data, nonce and signature."""
    google.failures[":publish"] = [503]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT, KEY)
    stopped: list[str] = []
    identity = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    preemption = worker.Preemption(publisher, PREEMPTION, identity, stopped.append)
    preemption.trigger("SIGTERM")
    preemption.wait(10.0)
    bodies = [body for _, path, _, body in google.requests if path.endswith(":publish")]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert stopped == ["SIGTERM"]
    assert_all_signed(google, PREEMPTION)


@pytest.mark.parametrize(
    "key", [None, MALFORMED_KEYS["short"], MALFORMED_KEYS["padded"]], ids=["absent", "short", "padded"]
)
def test_without_a_valid_report_key_the_agent_does_not_start(
    tmp_path: Path, google: GoogleStub, key: str | None
) -> None:
    """No key or a malformed one: exit AGENT_CANNOT_START, nothing published, the key never logged."""
    with FakeMetadata(key=key) as metadata:
        code, stdout, stderr = run_script(
            render_startup_script(a_job(command="touch ran"), SETTINGS, timings=FAST),
            tmp_path / "w",
            metadata,
            google,
        )
    assert code == worker.AGENT_CANNOT_START
    assert "report key" in stderr and "no report would be believed" in stderr
    assert google.published == []
    assert not (tmp_path / "w" / "code" / "ran").exists()
    if key:
        assert key.partition(":")[2] not in stdout + stderr


def test_every_report_of_a_run_is_signed_with_a_fresh_nonce(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """started, heartbeats, a checkpoint and exited all verify, each with its own nonce."""
    job = a_job(command="sleep 0.7; echo TPUJOBS_CHECKPOINT step=3; exit 1")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 1, stderr
    kinds = google.kinds(WORKER_EVENTS)
    assert {"started", "heartbeat", "checkpoint", "exited"} <= set(kinds)
    assert_all_signed(google, WORKER_EVENTS)


# --- secrets --------------------------------------------------------------------------

HF_VERSION = f"projects/{PROJECT}/secrets/t-tpujobs_tpujobs-tpu-vm_hf-token/versions/latest"


def test_crc32c_is_castagnoli_as_secret_manager_computes_it() -> None:
    """The check value of CRC-32C, and agreement with google-crc32c on other inputs."""
    assert worker.crc32c(b"123456789") == 0xE3069283
    for data in (b"", b"a", bytes(range(256)) * 3, "hf_ünï".encode()):
        assert worker.crc32c(data) == google_crc32c.value(data)


def test_secrets_are_read_from_google_unless_the_local_endpoint_is_named() -> None:
    """secretmanager.googleapis.com by default; TPUJOBS_SECRETS_ENDPOINT locally; a token always."""
    with FakeMetadata() as server:
        tokens = worker.TokenSource(worker.Metadata(server.base))
        real = worker.GoogleApi.secrets_from_env({}, tokens)
        local = worker.GoogleApi.secrets_from_env({"TPUJOBS_SECRETS_ENDPOINT": "127.0.0.1:9999"}, tokens)
    assert (real.base_url, real.tokens) == ("https://secretmanager.googleapis.com", tokens)
    assert (local.base_url, local.tokens) == ("http://127.0.0.1:9999", tokens)


def secret_reader(google: GoogleStub, metadata: FakeMetadata, attempts: int = 8) -> Any:
    tokens = worker.TokenSource(worker.Metadata(metadata.base))
    api = worker.GoogleApi(google.url, tokens, direct=True)
    return worker.SecretReader(api, worker.Metadata(metadata.base), attempts=attempts)


def test_a_secret_is_read_with_the_vms_bearer_token_through_server_errors(
    google: GoogleStub, metadata: FakeMetadata
) -> None:
    """GET /v1/{version}:access with Authorization: Bearer <token>; 503 and 429 are retried."""
    google.secrets[HF_VERSION] = "hf_ünï\n".encode()
    google.failures[":access"] = [503, 429]
    value = secret_reader(google, metadata).read("HF_TOKEN", HF_VERSION)
    assert value == "hf_ünï\n"
    accesses = [(path, headers) for _, path, headers, _ in google.requests if ":access" in path]
    assert len(accesses) == 3
    assert accesses[-1][0] == f"/v1/{HF_VERSION}:access"
    assert all(headers["Authorization"] == "Bearer fake-token" for _, headers in accesses)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, f"secret HF_TOKEN ({HF_VERSION}) does not exist or is not readable by {ACCOUNT}: 404 NOT_FOUND"),
        (403, f"secret HF_TOKEN ({HF_VERSION}) is not readable by {ACCOUNT}: 403 PERMISSION_DENIED"),
    ],
)
def test_a_missing_or_forbidden_secret_is_refused_at_once_naming_secret_and_account(
    google: GoogleStub, metadata: FakeMetadata, status: int, expected: str
) -> None:
    """404 and 403 are not retried: a Refused sentence with the env name, the secret and the account."""
    if status == 403:
        google.denied.add(HF_VERSION)
    with pytest.raises(worker.Refused) as refused:
        secret_reader(google, metadata).read("HF_TOKEN", HF_VERSION)
    assert str(refused.value) == expected
    assert len([r for r in google.requests if ":access" in r[1]]) == 1


def test_a_secret_manager_that_keeps_failing_ends_in_a_refusal_after_bounded_tries(
    google: GoogleStub, metadata: FakeMetadata
) -> None:
    """503 on every try: after `attempts` tries, a Refused naming the secret and the account."""
    google.failures[":access"] = [503] * 10
    with pytest.raises(worker.Refused) as refused:
        secret_reader(google, metadata, attempts=3).read("HF_TOKEN", HF_VERSION)
    assert str(refused.value) == (
        f"secret HF_TOKEN ({HF_VERSION}) could not be read by {ACCOUNT}: Secret Manager answered 503 (after 3 tries)"
    )
    assert len([r for r in google.requests if ":access" in r[1]]) == 3


class _Answer:
    """A stand-in for GoogleApi that answers every call with the given bytes."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def call(self, *args: Any, **kwargs: Any) -> bytes:
        return self.raw


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (b'{"payload": {"data": "aHVudGVyMg==", "dataCrc32c": "1"}}', "does not match its CRC32C"),
        (b'{"payload": {"data": "AGh1bnRlcjI="}}', "NUL byte"),
        (b'{"payload": {"data": "!!"}}', "no readable value"),
        (b"not json", "no readable value"),
    ],
    ids=["crc_mismatch", "nul_byte", "bad_base64", "not_json"],
)
def test_a_secret_answer_that_cannot_be_used_is_refused_without_quoting_it(
    metadata: FakeMetadata, answer: bytes, reason: str
) -> None:
    """A corrupted, undecodable or NUL-holding value is refused; the sentence never holds it."""
    reader = worker.SecretReader(_Answer(answer), worker.Metadata(metadata.base))  # type: ignore[arg-type]
    with pytest.raises(worker.Refused, match=reason) as refused:
        reader.read("HF_TOKEN", HF_VERSION)
    assert str(refused.value).startswith(f"secret HF_TOKEN ({HF_VERSION})")
    for leaked in ("hunter2", "aHVudGVyMg", "AGh1bnRlcjI"):
        assert leaked not in str(refused.value)


def test_secret_values_join_the_job_environment_beside_env() -> None:
    """job_environment puts each secret under its env name; TPUJOBS_ variables still win."""
    env = worker.job_environment({}, a_config(env={"LR": "0.1"}), 0, 0, {"HF_TOKEN": "v"})
    assert (env["HF_TOKEN"], env["LR"], env["TPUJOBS_WORKER_ID"]) == ("v", "0.1", "0")


def files_under(root: Path) -> bytes:
    """Every regular file's bytes under root, concatenated."""
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_a_secret_reaches_setup_and_command_and_nothing_else(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """The command prints a digest of $HF_TOKEN; the value is in no request, report, log or file."""
    value = "hf_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    google.secrets[HF_VERSION] = value.encode()
    job = a_job(
        secrets={"HF_TOKEN": "hf-token"},
        setup='test -n "$HF_TOKEN" && echo setup-saw-it',
        command="printf %s \"$HF_TOKEN\" | sha256sum | cut -d' ' -f1",
    )
    code, stdout, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=python3_dir(tmp_path, python),
    )
    assert code == 0, stderr
    digest = hashlib.sha256(value.encode()).hexdigest()
    assert google.output(chunk_prefix()) == f"setup-saw-it\n{digest}\n".encode()
    access = [h for _, p, h, _ in google.requests if p == f"/v1/{HF_VERSION}:access"]
    assert [h["Authorization"] for h in access] == ["Bearer fake-token"]
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["secrets"] == {"HF_TOKEN": HF_VERSION}
    assert_all_signed(google, WORKER_EVENTS)
    for seen in (google.everything_sent(), stdout.encode(), stderr.encode(), files_under(tmp_path)):
        assert value.encode() not in seen


@pytest.mark.parametrize("status", [404, 403])
def test_an_unreadable_secret_aborts_the_attempt_once_and_runs_nothing(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, status: int
) -> None:
    """404 or 403: one signed `aborted` report with the sentence, the sentence in the output, no setup or command."""
    if status == 403:
        google.secrets[HF_VERSION] = b"x"
        google.denied.add(HF_VERSION)
    job = a_job(secrets={"HF_TOKEN": "hf-token"}, setup=f"touch {tmp_path}/setup-ran", command=f"touch {tmp_path}/ran")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == worker.AGENT_FAILED, stderr
    messages = google.messages(WORKER_EVENTS)
    assert [p["kind"] for p, _ in messages] == ["aborted"]
    detail = messages[0][0]["detail"]
    assert detail.startswith(f"secret HF_TOKEN ({HF_VERSION}) ")
    assert f"by {ACCOUNT}: {status} " in detail
    assert messages[0][1]["kind"] == "aborted"
    assert_all_signed(google, WORKER_EVENTS)
    assert google.output(chunk_prefix()) == f"[tpujobs-agent] {detail}\n".encode()
    assert not (tmp_path / "setup-ran").exists() and not (tmp_path / "ran").exists()
    assert len([r for r in google.requests if ":access" in r[1]]) == 1


def test_the_local_secret_manager_lets_a_vm_read_its_own_accounts_secrets_only(
    tmp_path: Path, google: GoogleStub
) -> None:
    """With the simulator's token, simulated:EMAIL, the VM reads its namespace and is refused another's."""
    local = pytest.importorskip("tpujobs.local.simulator.secret_manager")
    value = b"hf_local_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16].encode()
    server = local.SecretManagerServer(prefix="t-")
    for secret_id, data in [("t-tpujobs_tpujobs-tpu-vm_hf-token", value), ("t-tpujobs_other-acct_x", b"y")]:
        server.service.create(PROJECT, secret_id, {"automatic": {}}, {}, {})
        server.service.add_version(PROJECT, secret_id, data, None)
    with server, FakeMetadata(token=f"simulated:{ACCOUNT}") as metadata:
        reader = worker.SecretReader(
            worker.GoogleApi.secrets_from_env(
                {"TPUJOBS_SECRETS_ENDPOINT": server.url},
                worker.TokenSource(worker.Metadata(metadata.base)),
            ),
            worker.Metadata(metadata.base),
        )
        assert reader.read("HF_TOKEN", HF_VERSION) == value.decode()
        other = f"projects/{PROJECT}/secrets/t-tpujobs_other-acct_x/versions/latest"
        with pytest.raises(worker.Refused, match=f"is not readable by {re.escape(ACCOUNT)}: 403 PERMISSION_DENIED"):
            reader.read("X", other)


# --- code digest ----------------------------------------------------------------------


def test_a_code_tarball_with_the_recorded_digest_is_unpacked(google: GoogleStub, tmp_path: Path) -> None:
    """code_sha256 equal to the tarball's SHA-256 (either case): unpacked as usual."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "print(2)\n")])
    google.objects[(BUCKET, "code.tar.gz")] = archive.read_bytes()
    digest = hashlib.sha256(archive.read_bytes()).hexdigest().upper()
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    worker.fetch_code(storage, f"gs://{BUCKET}/code.tar.gz", str(tmp_path / "w" / "code"), digest)
    assert (tmp_path / "w" / "code" / "train.py").read_text() == "print(2)\n"


def test_a_code_tarball_with_another_digest_is_refused_before_unpacking(google: GoogleStub, tmp_path: Path) -> None:
    """A planted tarball: Refused with both digests, nothing unpacked, the download removed."""
    archive = make_tar(tmp_path / "c.tar.gz", [("file", "train.py", "planted\n")])
    google.objects[(BUCKET, "code/x.tar.gz")] = archive.read_bytes()
    found = hashlib.sha256(archive.read_bytes()).hexdigest()
    recorded = "d" * 64
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    (tmp_path / "w").mkdir()
    with pytest.raises(worker.Refused) as refused:
        worker.fetch_code(storage, f"gs://{BUCKET}/code/x.tar.gz", str(tmp_path / "w" / "code"), recorded)
    assert str(refused.value) == (
        f"the code tarball gs://{BUCKET}/code/x.tar.gz has SHA-256 {found}, not {recorded} "
        "recorded with the job: refused (it was replaced or planted after submission)"
    )
    assert [p.name for p in (tmp_path / "w").rglob("*")] == ["code"]


def test_a_digest_with_a_code_prefix_is_refused_before_anything_is_fetched(google: GoogleStub, tmp_path: Path) -> None:
    """code_sha256 with gs://b/code/: there is no one digest to check, so nothing is downloaded."""
    google.objects[(BUCKET, "code/train.py")] = b"print(1)\n"
    storage = worker.Storage(worker.GoogleApi(google.url, None))
    with pytest.raises(worker.Refused, match="is a prefix"):
        worker.fetch_code(storage, f"gs://{BUCKET}/code/", str(tmp_path / "code"), "a" * 64)
    assert google.requests == []


def test_a_planted_tarball_aborts_the_attempt_and_runs_nothing(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A tarball replaced after submission: one `aborted` report naming both digests; no command."""
    submitted = make_tar(tmp_path / "good.tar.gz", [("file", "run.sh", "echo good\n")])
    planted = make_tar(tmp_path / "bad.tar.gz", [("file", "run.sh", f"touch {tmp_path}/ran\n")])
    google.objects[(BUCKET, "code/x.tar.gz")] = planted.read_bytes()
    job = a_job(
        code_uri=f"gs://{BUCKET}/code/x.tar.gz",
        code_sha256=hashlib.sha256(submitted.read_bytes()).hexdigest(),
        command="bash run.sh",
    )
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == worker.AGENT_FAILED, stderr
    messages = google.messages(WORKER_EVENTS)
    assert [p["kind"] for p, _ in messages] == ["aborted"]
    assert "has SHA-256 " + hashlib.sha256(planted.read_bytes()).hexdigest() in messages[0][0]["detail"]
    assert_all_signed(google, WORKER_EVENTS)
    assert not (tmp_path / "ran").exists()
    assert list((tmp_path / "w" / "code").iterdir()) == []


# --- reboots ----------------------------------------------------------------------------

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
    return worker.process_start(pid) == ""


# What survives of the first start: a reboot kills everything; a killed agent leaves its
# command (in a session of its own) running; a startup script run by hand meets both alive.
SURVIVORS = {
    "nothing": ("its command (pid {command}, started ", ") is gone"),
    "the_command": ("its command (pid {command}, started ", ") is still running"),
    "agent_and_command": ("that agent (pid {agent}) is still running", ") is still running"),
}


@pytest.mark.parametrize("survivors", SURVIVORS, ids=SURVIVORS)
def test_a_second_start_of_an_attempt_reports_it_lost_and_never_runs_the_command_again(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, survivors: str
) -> None:
    """The startup script run again for a started attempt: one signed `rebooted` saying what it found, no
    second command, the output untouched."""
    runs = tmp_path / "runs"
    job = a_job(command=f"echo run >> '{runs}'; echo ready; sleep 600")
    script = render_startup_script(job, SETTINGS, timings=FAST)
    record = tmp_path / RECORD
    first = start_script(script, tmp_path / "w", metadata, google)
    command = 0
    try:
        wait_for(lambda: "running" in read_record(record) and b"ready" in google.output(chunk_prefix()))
        command = read_record(record)["running"]["pid"]
        if survivors != "agent_and_command":
            kill_group(first.pid)  # the agent (the startup script exec'd it) dies
            first.wait(timeout=10)
        if survivors == "nothing":
            kill_group(command)
            wait_for(lambda: gone(command))
        output = google.chunks(chunk_prefix())
        code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    finally:
        kill_group(first.pid)
        if command:
            kill_group(command)
        first.wait(timeout=10)
    assert code == worker.AGENT_STARTED_AGAIN, stderr
    assert runs.read_text() == "run\n"
    rebooted = [(p, a) for p, a in google.messages(WORKER_EVENTS) if p["kind"] == "rebooted"]
    assert len(rebooted) == 1
    payload, attributes = rebooted[0]
    assert {k: payload[k] for k in ("job_id", "attempt", "slice_id", "worker_id")} == {
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
    }
    assert attributes["kind"] == "rebooted"
    for fragment in SURVIVORS[survivors]:
        assert fragment.format(command=command, agent=first.pid) in payload["detail"]
    assert payload["detail"].endswith(": nothing is started again")
    assert_all_signed(google, WORKER_EVENTS)
    assert google.kinds(WORKER_EVENTS).count("started") == 1
    assert google.chunks(chunk_prefix()) == output  # the first start's output, as it was
    assert google.messages(PREEMPTION) == []


def test_a_start_after_the_attempt_ended_on_this_host_reports_nothing_and_runs_nothing(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A reboot after the command exited and said so: the second start sends nothing (the end was counted) and runs
    nothing."""
    runs = tmp_path / "runs"
    script = render_startup_script(a_job(command=f"echo run >> '{runs}'; exit 3"), SETTINGS, timings=FAST)
    code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    assert code == 3, stderr
    assert read_record(tmp_path / RECORD)["ended"] == "exited"
    sent = google.kinds(WORKER_EVENTS)
    code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    assert code == worker.AGENT_STARTED_AGAIN, stderr
    assert "already ended on this host" in stderr
    assert google.kinds(WORKER_EVENTS) == sent and sent[-1] == "exited"
    assert runs.read_text() == "run\n"


def test_another_attempt_slice_or_worker_on_the_same_disk_is_a_first_start() -> None:
    """The record is named by job, attempt, slice and worker, beside the attempt's work dir."""
    config = {"job_id": "train-1", "attempt": 1}
    paths = {
        worker.AttemptRecord.beside("/var/lib/tpujobs/train-1/attempt-1", c, s, w).path
        for c, s, w in [
            (config, 0, 0),
            ({**config, "attempt": 2}, 0, 0),
            (config, 1, 0),
            (config, 0, 1),
            ({**config, "job_id": "train-2"}, 0, 0),
        ]
    }
    assert len(paths) == 5
    assert "/var/lib/tpujobs/train-1/.tpujobs-attempt-train-1-a1-slice0-worker0.json" in paths
    hostile = worker.AttemptRecord.beside("/w/work", {"job_id": "../../etc/x", "attempt": 1}, 0, 0)
    assert os.path.dirname(hostile.path) == "/w"


def test_of_two_claims_of_one_attempt_only_the_first_wins(tmp_path: Path) -> None:
    """claim() is None once, then returns what the first start wrote; an unreadable record still counts as a start."""
    record = worker.AttemptRecord(str(tmp_path / "host" / RECORD))
    assert record.claim({"agent_started_at": "T1"}) is None
    assert record.claim({"agent_started_at": "T2"}) == {"agent_started_at": "T1"}
    record.update(ended="exited")
    assert record.read() == {"agent_started_at": "T1", "ended": "exited"}
    Path(record.path).write_text("{torn")
    assert record.claim({"agent_started_at": "T3"}) == {}
    assert [p.name for p in (tmp_path / "host").iterdir()] == [RECORD]  # no temporary left


def test_what_a_second_start_found_is_said_in_one_sentence() -> None:
    """Another boot, this boot, nothing started, an ended attempt, an unreadable record."""
    first = {"agent_started_at": "12:00Z", "boot": "boot-1", "agent_pid": 1, "agent_start": "5"}
    command = {"what": "command", "pid": 2**22 + 7, "start": "9", "boot": "boot-1", "at": "12:01Z"}
    assert worker.started_again_detail({**first, "running": command}, "boot-2") == (
        "the agent first started 12:00Z, before the host rebooted; its command "
        f"(pid {2**22 + 7}, started 12:01Z) is gone: nothing is started again"
    )
    assert worker.started_again_detail(first, "boot-1") == (
        "the agent first started 12:00Z, earlier in this boot; it had not started setup or "
        "the command: nothing is started again"
    )
    ended = worker.started_again_detail({**first, "running": {**command, "what": "setup"}, "ended": "preempted"}, "")
    assert "its setup (pid" in ended and "it had ended (preempted)" in ended
    assert "unreadable" in worker.started_again_detail({}, "boot-1")


# --- maintenance events and preemption, waited on -------------------------------------


@pytest.mark.parametrize(
    ("flip", "key", "reason"),
    [
        ("preempted", "instance/preempted", "metadata: instance/preempted"),
        (
            "maintenance",
            "instance/maintenance-event",
            "metadata: instance/maintenance-event is TERMINATE_ON_HOST_MAINTENANCE (host maintenance)",
        ),
    ],
)
def test_a_preemption_or_terminating_maintenance_in_the_metadata_is_one_notice(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, flip: str, key: str, reason: str
) -> None:
    """Waited on with wait_for_change: one signed notice naming its cause, the command stopped, no exited report."""
    job = a_job(command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done")
    process = start_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    try:
        wait_for(lambda: b"ready" in google.output(chunk_prefix()))
        wait_for(lambda: any(key in r and "last_etag=" in r for r in metadata.requests))  # held
        if flip == "preempted":
            metadata.preempted = True
        else:
            metadata.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    notices = google.messages(PREEMPTION)
    assert [n["reason"] for n, _ in notices] == [reason]
    assert_all_signed(google, PREEMPTION)
    assert "exited" not in google.kinds(WORKER_EVENTS)
    assert b"got-term\n" in google.output(chunk_prefix())
    assert read_record(tmp_path / RECORD)["ended"] == "preempted"


@pytest.mark.parametrize(
    "value", ["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "SOMETHING_GOOGLE_ADDS_LATER", "", "TERMINATE"]
)
def test_a_maintenance_event_that_does_not_terminate_the_vm_stops_nothing(value: str) -> None:
    """Only TERMINATE_ON_HOST_MAINTENANCE (any case, spaces) is a notice; a TPU VM is never live-migrated."""
    assert worker.maintenance_notice(value) is None
    assert "host maintenance" in str(worker.maintenance_notice(" terminate_on_host_maintenance\n"))


def test_a_job_runs_to_its_end_while_the_metadata_announces_a_migration(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """MIGRATE_ON_HOST_MAINTENANCE: no notice, the command exits as it would, the value is logged once."""
    metadata.maintenance_event = "MIGRATE_ON_HOST_MAINTENANCE"
    code, _, stderr = run_script(
        render_startup_script(a_job(command="sleep 0.5; exit 4"), SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
    )
    assert code == 4, stderr
    assert google.messages(PREEMPTION) == []
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"
    assert stderr.count("MIGRATE_ON_HOST_MAINTENANCE") == 1


def test_watching_a_server_that_answers_at_once_does_not_spin(metadata: FakeMetadata) -> None:
    """A metadata server that never holds a request is asked at most once per floor interval."""
    metadata.hold = False
    seen: list[str] = []
    stop = threading.Event()
    watcher = worker.watch_metadata(
        worker.Metadata(metadata.base), "instance/maintenance-event", lambda v: seen.append(v) or False,
        stop, floor=0.2,
    )  # fmt: skip
    time.sleep(1.0)
    stop.set()
    watcher.join(5)
    assert 2 <= len(seen) <= 8 and set(seen) == {"NONE"}


def test_a_watch_ends_when_its_value_comes_and_keeps_going_through_errors(
    metadata: FakeMetadata,
) -> None:
    """A key the server lacks (404) is asked again later, not taken for a value; the wanted value ends the watch."""
    seen: list[str] = []
    stop = threading.Event()
    watcher = worker.watch_preempted(worker.Metadata(metadata.base), seen.append, stop)
    metadata.preempted = True
    watcher.join(10)
    assert seen == ["metadata: instance/preempted"] and not watcher.is_alive()
    missing = worker.watch_metadata(worker.Metadata(metadata.base), "instance/nothing", lambda v: True, stop)
    time.sleep(0.3)
    assert missing.is_alive()
    stop.set()
    missing.join(15)


# --- multislice environment -----------------------------------------------------------


def test_every_megascale_key_of_tpu_env_is_kept_unchanged_and_nothing_else() -> None:
    """MEGASCALE_* keys pass as the metadata gives them; other tpu-env keys do not; none is invented."""
    tpu_env = worker.parse_tpu_env(
        "NODE_ID: 'train-1-a2-1'\nWORKER_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
        "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_PORT: '8080'\nMEGASCALE_SLICE_ID: '1'\nMEGASCALE_FUTURE_KEY: 'x y'\n"
    )
    assert worker.megascale_environment(tpu_env) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_PORT": "8080",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_FUTURE_KEY": "x y",
    }
    assert worker.megascale_environment(worker.parse_tpu_env("NODE_ID: 'n'\nWORKER_ID: '0'\n")) == {}


def test_the_megascale_values_join_the_job_environment_under_the_spec_env() -> None:
    """The host's MEGASCALE_* values are in the job's environment; the spec's env may still set one."""
    megascale = {"MEGASCALE_SLICE_ID": "1", "MEGASCALE_PORT": "8080"}
    env = worker.job_environment({}, a_config(env={"MEGASCALE_PORT": "9000"}), 0, 1, {}, megascale)
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_PORT"]) == ("1", "9000")


def test_a_multislice_host_passes_the_megascale_keys_to_setup_and_command(tmp_path: Path, google: GoogleStub) -> None:
    """Through the startup script: tpu-env's MEGASCALE_* values are what setup and command see."""
    tpu_env = (
        "NODE_ID: 'train-1-a1-1'\nWORKER_ID: '0'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
        "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_PORT: '8080'\nMEGASCALE_SLICE_ID: '1'\n"
    )
    job = a_job(
        accelerator_type="v5litepod-16",
        slices=2,
        setup="echo setup $MEGASCALE_SLICE_ID",
        command="env | grep ^MEGASCALE_ | sort",
    )
    with FakeMetadata(node_id="train-1-a1-1", **{"instance/attributes/tpu-env": tpu_env}) as metadata:
        code, _, stderr = run_script(
            render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
        )
    assert code == 0, stderr
    prefix = next(n for (_, n) in google.objects if n.endswith("/000000.log")).rsplit("/", 1)[0]
    assert google.output(prefix) == (
        b"setup 1\nMEGASCALE_COORDINATOR_ADDRESS=10.0.0.2:8080\nMEGASCALE_NUM_SLICES=2\n"
        b"MEGASCALE_PORT=8080\nMEGASCALE_SLICE_ID=1\n"
    )


# --- containers: configuration and the docker command -----------------------------------


IMAGE = "us-docker.pkg.dev/proj-1/repo/trainer:2026-11"


def test_a_config_with_an_image_gets_the_default_pull_policy(tmp_path: Path) -> None:
    """No image: image and policy null; a tagged image: if-missing; untagged or :latest: always."""
    path = tmp_path / "config.json"
    for image, policy in [(None, None), (IMAGE, "if-missing"), ("trainer", "always"), ("r.io/t:latest", "always")]:
        path.write_text(json.dumps(a_config(image=image)))
        config = worker.load_config(str(path))
        assert (config["image"], config["image_pull_policy"]) == (image, policy)


@pytest.mark.parametrize(
    "changes",
    [
        {"image": "-v/etc:/x busybox"},
        {"image": "--privileged"},
        {"image": "trainer latest"},
        {"image": ""},
        {"image": 7},
        {"image": IMAGE, "image_pull_policy": "never"},
        {"image": IMAGE, "image_pull_policy": 1},
    ],
)
def test_a_config_with_a_bad_image_or_pull_policy_is_refused(tmp_path: Path, changes: dict[str, Any]) -> None:
    """An image reference with whitespace or a leading dash, or an unknown policy, names its key."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(**changes)))
    with pytest.raises(worker.AgentError, match=list(changes)[-1]):
        worker.load_config(str(path))


@pytest.mark.parametrize(
    ("image", "host", "google_registry"),
    [
        (IMAGE, "us-docker.pkg.dev", True),
        ("europe-west4-docker.pkg.dev/p/r/t@sha256:" + "a" * 64, "europe-west4-docker.pkg.dev", True),
        ("gcr.io/p/t:1", "gcr.io", True),
        ("eu.gcr.io/p/t:1", "eu.gcr.io", True),
        ("127.0.0.1:5000/team/t:1", "127.0.0.1:5000", False),
        ("localhost/t", "localhost", False),
        ("ubuntu:22.04", "docker.io", False),
        ("library/ubuntu", "docker.io", False),
        ("evilgcr.io/t:1", "evilgcr.io", False),
        ("pkg.dev.example.com/t:1", "pkg.dev.example.com", False),
    ],
)
def test_only_googles_registries_get_the_hosts_token(image: str, host: str, google_registry: bool) -> None:
    """The registry is the first component when it names a host; *.pkg.dev and (*.)gcr.io are Google's."""
    assert worker.registry_host(image) == host
    assert bool(worker.GOOGLE_REGISTRY.fullmatch(host)) is google_registry


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        (IMAGE, "us-docker.pkg.dev/proj-1/repo/trainer"),
        ("127.0.0.1:5000/t", "127.0.0.1:5000/t"),
        ("127.0.0.1:5000/t:v1", "127.0.0.1:5000/t"),
        ("r.io/t@sha256:" + "b" * 64, "r.io/t"),
        ("ubuntu:22.04", "ubuntu"),
    ],
)
def test_an_images_repository_is_its_reference_without_tag_or_digest(image: str, repository: str) -> None:
    """A registry's port is not a tag."""
    assert worker.image_repository(image) == repository


PULL_ERRORS = {
    "not found": (
        "not found",
        "Error response from daemon: manifest for 127.0.0.1:5000/t:1 not found: manifest unknown: manifest unknown",
    ),
    "ar not found": ("not found", "Error response from daemon: failed to resolve reference: not found"),
    "denied": (
        "access denied",
        'Error response from daemon: Head "https://us-docker.pkg.dev/v2/p/r/t/manifests/1": denied: Permission '
        '"artifactregistry.repositories.downloadArtifacts" denied on resource',
    ),
    "unauthorized": ("access denied", "Error response from daemon: unauthorized: authentication failed"),
    "403": ("access denied", "Error response from daemon: received unexpected HTTP status: 403 Forbidden"),
    "refused": (
        "no network",
        'Error response from daemon: Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
    ),
    "no such host": ("no network", "dial tcp: lookup us-docker.pkg.dev on 10.0.0.1:53: no such host"),
    "timeout": (
        "no network",
        "Error response from daemon: Get https://gcr.io/v2/: net/http: request canceled while waiting for "
        "connection (Client.Timeout exceeded while awaiting headers)",
    ),
    "named like an error": (
        "not found",
        "Error response from daemon: manifest for r.io/timeout-denied:1 not found: manifest unknown",
    ),
}


@pytest.mark.parametrize(("why", "said"), PULL_ERRORS.values(), ids=PULL_ERRORS.keys())
def test_a_failed_pull_says_why_in_one_sentence_naming_the_image(why: str, said: str) -> None:
    """The reason by docker's words (the image's own name ignored), then docker's words, on one line."""
    image = "r.io/timeout-denied:1" if "timeout-denied" in said else "127.0.0.1:5000/t:1"
    sentence = worker.pull_problem(image, said + "\n")
    assert sentence.startswith(f"cannot pull the image {image}: {why} (docker said: ")
    assert "\n" not in sentence and len(sentence) < worker.MAX_DETAIL_CHARS


def test_a_pull_error_of_no_known_kind_is_reported_in_dockers_own_bounded_words() -> None:
    """Unknown words are quoted, cut to MAX_DOCKER_WORDS."""
    sentence = worker.pull_problem("r.io/t:1", "something odd " * 100)
    assert sentence.startswith("cannot pull the image r.io/t:1: docker said: something odd something odd")
    assert len(sentence) <= len("cannot pull the image r.io/t:1: docker said: ") + worker.MAX_DOCKER_WORDS


def test_dockers_own_failure_is_told_from_the_commands_exit_code() -> None:
    """A 125/126/127 is docker's when docker or its init said so last; else it is the command's."""
    tail = b"training...\n[FATAL tini (7)] exec sh failed: No such file or directory\n"
    assert worker.docker_failure(tail) == "[FATAL tini (7)] exec sh failed: No such file or directory"
    daemon = b"docker: Error response from daemon: failed to create task: unable to apply caps.\n"
    assert worker.docker_failure(daemon).startswith("docker: Error response from daemon")
    assert worker.docker_failure(b"bash: train.py: command not found\n") is None


def test_the_container_environment_passes_the_jobs_names_only_and_keeps_the_host_out() -> None:
    """-e NAME for the spec's env, secrets, TPUJOBS_* and MEGASCALE_*; values only in the CLI's
    environment; the host's variables stay out; DOCKER_* names steer the CLI, so are left out."""
    host = {"PATH": "/usr/bin", "HOME": "/root", "DOCKER_HOST": "unix:///var/run/docker.sock", "TPUJOBS_WORKDIR": "/w"}
    config = a_config(env={"LR": "0.1", "DOCKER_HOST": "tcp://elsewhere:2375"})
    megascale = {"MEGASCALE_SLICE_ID": "1"}
    job_env = worker.job_environment(host, config, 3, 1, {"HF_TOKEN": "s3cret"}, megascale)
    names, cli_env, left_out = worker.container_environment(job_env, host, config, ["HF_TOKEN"], megascale)
    assert names == [
        "HF_TOKEN",
        "LR",
        "MEGASCALE_SLICE_ID",
        "TPUJOBS_ATTEMPT",
        "TPUJOBS_CHECKPOINT_URI",
        "TPUJOBS_JOB_ID",
        "TPUJOBS_NUM_SLICES",
        "TPUJOBS_NUM_WORKERS",
        "TPUJOBS_RESUME",
        "TPUJOBS_SLICE_ID",
        "TPUJOBS_WORKER_ID",
    ]
    assert left_out == ["DOCKER_HOST"]
    assert cli_env["DOCKER_HOST"] == "unix:///var/run/docker.sock"  # the host's: the agent's docker stays its own
    assert (cli_env["HF_TOKEN"], cli_env["PATH"], cli_env["TPUJOBS_WORKER_ID"]) == ("s3cret", "/usr/bin", "3")
    assert "TPUJOBS_WORKDIR" not in cli_env


def test_a_jobs_home_reaches_the_container_but_the_cli_keeps_the_hosts_docker_config() -> None:
    """A config under the job's HOME could switch the CLI's context to another daemon: the CLI
    is pointed at the host's config directory; without a job HOME nothing is added."""
    host = {"PATH": "/usr/bin", "HOME": "/root"}
    config = a_config(env={"HOME": "/workspace"})
    job_env = worker.job_environment(host, config, 0, 0)
    names, cli_env, _ = worker.container_environment(job_env, host, config, [], {})
    assert "HOME" in names
    assert (cli_env["HOME"], cli_env["DOCKER_CONFIG"]) == ("/workspace", "/root/.docker")
    plain = a_config(env={})
    _, cli_env, _ = worker.container_environment(worker.job_environment(host, plain, 0, 0), host, plain, [], {})
    assert "DOCKER_CONFIG" not in cli_env
    own = {**host, "DOCKER_CONFIG": "/etc/docker-cli"}
    _, cli_env, _ = worker.container_environment(worker.job_environment(own, config, 0, 0), own, config, [], {})
    assert cli_env["DOCKER_CONFIG"] == "/etc/docker-cli"


def test_docker_run_is_built_as_tpu_vms_run_containers_with_no_value_on_its_command_line() -> None:
    """Privileged, host network and IPC, /dev, docker's init forwarding to the group, names and
    labels, the code mount; setup and command as arguments after the wrapper, never inside it."""
    setup, command = 'pip install -r "req.txt"; echo $HOME', "python3 train.py --lr=$LR"
    argv = worker.docker_run_argv(
        "/usr/bin/docker", IMAGE, "tpujobs-train-1-a2-s1-w3", ["tpujobs.job=train-1"], ["HF_TOKEN", "LR"],
        setup, command, privileged=True, mount=("/var/lib/tpujobs/train-1/attempt-2/code", "/srv/app"),
    )  # fmt: skip
    assert argv[:2] == ["/usr/bin/docker", "run"]
    for option in (
        ["--rm"],
        ["--init"],
        ["--sig-proxy=false"],
        ["--privileged"],
        ["--network", "host"],
        ["--ipc", "host"],
        ["-v", "/dev:/dev"],
        ["-e", "TINI_KILL_PROCESS_GROUP=1"],
        ["--name", "tpujobs-train-1-a2-s1-w3"],
        ["--label", "tpujobs.job=train-1"],
        ["-e", "HF_TOKEN"],
        ["-e", "LR"],
        ["-v", "/var/lib/tpujobs/train-1/attempt-2/code:/srv/app", "-w", "/srv/app"],
    ):
        assert any(argv[i : i + len(option)] == option for i in range(len(argv))), option
    assert argv[-8:] == ["--entrypoint", "sh", IMAGE, "-c", worker.WRAPPER, "tpujobs", setup, command]
    unprivileged = worker.docker_run_argv("/usr/bin/docker", IMAGE, "n", [], [], None, "true", privileged=False)
    assert "--privileged" not in unprivileged and unprivileged[-2:] == ["", "true"]


def test_a_code_directory_that_cannot_be_mounted_safely_is_refused() -> None:
    """A ':' or ',' in a mounted path would change what -v means: a sentence, not a mount."""
    with pytest.raises(worker.ImageProblem, match="cannot be mounted"):
        worker.docker_run_argv("docker", IMAGE, "n", [], [], None, "true", mount=("/w/a:b/code", "/workspace"))


def test_container_names_and_labels_name_job_attempt_slice_worker_and_the_simulated_host() -> None:
    """Deterministic names a docker name accepts; the host label only on a simulated host."""
    config = a_config(job_id="train-1", attempt=2)
    assert worker.container_name(config, 1, 3) == "tpujobs-train-1-a2-s1-w3"
    assert worker.container_labels(config, 1, 3, "") == [
        "tpujobs.job=train-1",
        "tpujobs.attempt=2",
        "tpujobs.slice=1",
        "tpujobs.worker=3",
    ]
    assert worker.container_labels(config, 1, 3, "qr/1/3/abc")[-1] == "tpujobs.host=qr/1/3/abc"


SETUP_FAILED_LINE = "[tpujobs-agent] setup exited with 4; the command does not run\n"
WRAPPER_CASES = {
    "setup then command": ("echo one > marker", "cat marker; exit 3", 3, "one\n"),
    "no setup": ("", "echo only-command", 0, "only-command\n"),
    "setup fails": ("echo trying; exit 4", "echo never", 4, f"trying\n{SETUP_FAILED_LINE}"),
    "quotes stay data": ("echo \"'$1'\" '\"; echo injected'", "echo ok", 0, "'' \"; echo injected\nok\n"),
}  # fmt: skip


@pytest.mark.parametrize(("setup", "command", "code", "output"), WRAPPER_CASES.values(), ids=WRAPPER_CASES.keys())
def test_the_wrapper_runs_setup_then_the_command_in_one_shell_session(
    tmp_path: Path, setup: str, command: str, code: int, output: str
) -> None:
    """As the container runs it (`sh -c WRAPPER tpujobs SETUP COMMAND`): setup's files are the
    command's, a failed setup stops everything with its code, arguments are never wrapper text."""
    done = subprocess.run(
        ["sh", "-c", worker.WRAPPER, "tpujobs", setup, command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (code, output), done.stderr


class _Tokens:
    """The host's token, as TokenSource gives it."""

    def token(self) -> str:
        return "ya29.host-token-value"


def test_a_google_registry_pull_logs_in_with_the_hosts_token_on_stdin_in_a_private_directory(
    tmp_path: Path,
) -> None:
    """A recording stand-in for the docker CLI (the real one needs a real Artifact Registry):
    login gets oauth2accesstoken and the token on stdin only, in a 0700 directory that the pull
    uses and that is gone afterwards."""
    record = tmp_path / "calls.jsonl"
    stand_in = tmp_path / "docker"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import json, os, stat, sys\n"
        "args = sys.argv[1:]\n"
        "stdin = sys.stdin.read() if 'login' in args else ''\n"
        "config = args[args.index('--config') + 1] if '--config' in args else None\n"
        "mode = oct(stat.S_IMODE(os.stat(config).st_mode)) if config else None\n"
        f"with open({str(record)!r}, 'a') as out:\n"
        "    out.write(json.dumps({'args': args, 'stdin': stdin, 'mode': mode}) + '\\n')\n"
    )
    stand_in.chmod(0o755)
    docker = worker.Docker(str(stand_in), {"PATH": os.environ["PATH"]}, _Tokens())  # type: ignore[arg-type]
    docker.pull(IMAGE, threading.Event())
    login, pull = [json.loads(line) for line in record.read_text().splitlines()]
    config = login["args"][1]
    assert login["args"] == [
        "--config", config, "login", "--username", "oauth2accesstoken", "--password-stdin", "https://us-docker.pkg.dev",
    ]  # fmt: skip
    assert (login["stdin"], login["mode"]) == ("ya29.host-token-value", "0o700")
    assert pull["args"] == ["--config", config, "pull", "--quiet", IMAGE]
    assert not Path(config).exists()
    record.unlink()
    docker.pull("127.0.0.1:5000/t:1", threading.Event())  # not Google's: no login, no config
    (only,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert only["args"] == ["pull", "--quiet", "127.0.0.1:5000/t:1"]
