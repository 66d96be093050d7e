"""The worker agent, piece by piece and whole, against local HTTP stand-ins.

The agent's HTTP protocol is what is under test here, so Pub/Sub and Cloud Storage are a
small recording server (`GoogleStub`) that speaks just enough of both REST APIs; the real
emulators are in tests/emulator/test_agent_emulators.py. The metadata server is a fake too
(`FakeMetadata`). Both are importable by test_startup_script.py, which sits beside this file.
"""

from __future__ import annotations

import base64
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

import pytest

from tpujobs.agent import worker
from tpujobs.agent.startup import AgentTimings, render_startup_script
from tpujobs.config import Settings
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec

BASH = shutil.which("bash")
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
BUCKET = "logs-bucket"
PROJECT = "proj-1"


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
        path = urllib.parse.urlsplit(self.path).path
        key = path.removeprefix("/computeMetadata/v1/")
        value = owner.values().get(key)
        self._send(404, "not found") if value is None else self._send(200, value)

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeMetadata(_Server):
    """A GCE metadata server for one worker host; `preempted` flips instance/preempted."""

    handler = _MetadataHandler

    def __init__(
        self, worker: int = 0, node_id: str = "train-1-a1", token: str = "fake-token", **extra: str
    ) -> None:
        self.worker = worker
        self.node_id = node_id
        self.token = token
        self.preempted = False
        self.extra = extra
        self.requests: list[str] = []

    def values(self) -> dict[str, str]:
        tpu_env = f"NODE_ID: '{self.node_id}'\nWORKER_ID: '{self.worker}'\nZONE: 'us-central2-b'\n"
        return {
            "instance/attributes/agent-worker-number": str(self.worker),
            "instance/attributes/tpu-env": tpu_env,
            "instance/preempted": "TRUE" if self.preempted else "FALSE",
            "instance/service-accounts/default/token": json.dumps(
                {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"}
            ),
            **self.extra,
        }

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
    """Just enough of the Pub/Sub and Storage REST APIs, recording every request.

    `failures` maps a substring of a request path to a list of statuses answered, in turn,
    before that path succeeds.
    """

    handler = _GoogleHandler

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.objects: dict[tuple[str, str], bytes] = {}
        self.published: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.failures: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes]:
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
                    payload = json.loads(base64.b64decode(message["data"]))
                    self.published.append((topic, payload, message.get("attributes", {})))
                return 200, json.dumps({"messageIds": ["1"]}).encode()
            upload = re.fullmatch(r"/upload/storage/v1/b/([^/]+)/o", route)
            if method == "POST" and upload and query.get("uploadType") == ["media"]:
                self.objects[(upload.group(1), query["name"][0])] = body
                return 200, json.dumps({"name": query["name"][0]}).encode()
            listing = re.fullmatch(r"/storage/v1/b/([^/]+)/o", route)
            if method == "GET" and listing:
                prefix = query.get("prefix", [""])[0]
                names = sorted(
                    n for (b, n) in self.objects if b == listing.group(1) and n.startswith(prefix)
                )
                return 200, json.dumps({"items": [{"name": n} for n in names]}).encode()
            get = re.fullmatch(r"/storage/v1/b/([^/]+)/o/(.+)", route)
            if method == "GET" and get and query.get("alt") == ["media"]:
                key = (get.group(1), urllib.parse.unquote(get.group(2)))
                if key in self.objects:
                    return 200, self.objects[key]
                return 404, b'{"error": "no such object"}'
            return 400, b'{"error": "the stub does not know this request"}'

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


SETTINGS = Settings(project=PROJECT, prefix="t-", logs_bucket=BUCKET)
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


def chunk_prefix(
    attempt: int = 1, slice_id: int = 0, worker_id: int = 0, job_id: str = "train-1"
) -> str:
    return f"jobs/{job_id}/attempt-{attempt}/chunks/slice-{slice_id}-worker-{worker_id}/"


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
def test_checkpoint_lines_are_recognised_with_their_step_and_detail(
    line: bytes, found: tuple[int, str] | None
) -> None:
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
        "checkpoint_uri": f"gs://{BUCKET}/jobs/train-1/checkpoints/",
        "log_prefix": f"gs://{BUCKET}/jobs/train-1/attempt-2/",
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


@pytest.mark.parametrize(
    "changes",
    [
        {"attempt": "2"},
        {"attempt": True},
        {"resume": 1},
        {"command": None},
        {"env": {"A": 1}},
        {"grace_seconds": 0},
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
        "TPUJOBS_CHECKPOINT_URI": f"gs://{BUCKET}/jobs/train-1/checkpoints/",
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
def test_a_safe_tarball_unpacks_files_dirs_inner_links_and_modes(
    tmp_path: Path, standard_filter: bool
) -> None:
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
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT)
    publisher.publish(
        WORKER_EVENTS, {"kind": "started", "job_id": "j"}, {"job_id": "j", "kind": "started"}
    )
    method, path, headers, body = google.requests[0]
    assert (method, path) == ("POST", f"/v1/projects/{PROJECT}/topics/{WORKER_EVENTS}:publish")
    assert headers["Content-Type"] == "application/json"
    assert "Authorization" not in headers  # an emulator takes no credentials
    message = json.loads(body)["messages"][0]
    assert json.loads(base64.b64decode(message["data"])) == {"kind": "started", "job_id": "j"}
    assert message["attributes"] == {"job_id": "j", "kind": "started"}


def test_a_publish_is_retried_through_server_errors_and_rate_limits(google: GoogleStub) -> None:
    """503, 429 and 500 answers are retried; the message then goes through once."""
    google.failures[":publish"] = [503, 429, 500]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT)
    publisher.publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
    assert google.kinds(WORKER_EVENTS) == ["heartbeat"]
    assert len(google.requests) == 4


def test_a_client_error_is_not_retried(google: GoogleStub) -> None:
    """A 400 or 404 fails at once: retrying cannot help."""
    google.failures[":publish"] = [404]
    publisher = worker.Publisher(worker.GoogleApi(google.url, None), PROJECT)
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
        worker.Publisher(api, PROJECT).publish(WORKER_EVENTS, {"kind": "started"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer first"
        server.token = "second"
        google.failures[":publish"] = [401]
        worker.Publisher(api, PROJECT).publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer second"
        token_reads = [p for p in server.requests if p.endswith("/token")]
    assert len(token_reads) == 2


def test_storage_uploads_downloads_and_lists_with_the_json_api(
    google: GoogleStub, tmp_path: Path
) -> None:
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
    found = sorted(
        str(p.relative_to(tmp_path / "code")) for p in (tmp_path / "code").rglob("*") if p.is_file()
    )
    assert found == ["pkg/util.py", "train.py"]


def test_a_code_prefix_with_a_climbing_object_name_is_refused(
    google: GoogleStub, tmp_path: Path
) -> None:
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
    deadline = time.monotonic() + 5
    while not google.chunks("p/") and time.monotonic() < deadline:
        time.sleep(0.02)
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
    assert attributes == {"job_id": "train-1", "attempt": "1", "kind": "exited"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", exited["at"])
    assert google.output(chunk_prefix()) == b"out-1\nerr-1\nout-2\n"
    assert json.loads(google.objects[(BUCKET, chunk_prefix() + "complete.json")])["exit_code"] == 3
    assert "out-1\n" in stdout  # tee'd to the agent's own stdout
    assert google.messages(PREEMPTION) == []
    assert "fake-token" not in stdout + stderr


def test_heartbeats_arrive_while_the_command_runs(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """With heartbeat_seconds 0.3 a 1.2 s command is seen alive several times between started and exited."""
    job = a_job(command="sleep 1.2")
    code, _, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
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
    code, _, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
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
    code, _, _ = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
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
    code, _, _ = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
    assert code == worker.AGENT_FAILED
    assert [p["exit_code"] for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "exited"] == [
        1
    ]
    output = google.output(chunk_prefix())
    assert b"could not fetch the code" in output and b"command-ran" not in output


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_sigterm_publishes_one_notice_first_then_stops_the_command_without_an_exited_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """SIGTERM to the agent: one preemption notice, the command's trap runs, no exited report."""
    job = a_job(
        command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done"
    )
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
    assert attributes == {"job_id": "train-1", "attempt": "1"}
    assert "exited" not in google.kinds(WORKER_EVENTS)
    assert b"got-term\n" in google.output(chunk_prefix())
    assert (BUCKET, chunk_prefix() + "complete.json") not in google.objects
    assert process.returncode == 9


def wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def test_the_agent_runs_on_python_3_8(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
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
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }
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
