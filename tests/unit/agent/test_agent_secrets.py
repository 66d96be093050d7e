"""The job's secrets, read from Secret Manager as the VM's account, and in nothing but the job's environment."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from agent_stubs import (
    ACCOUNT,
    FAST,
    HF_VERSION,
    PROJECT,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_config,
    a_job,
    assert_all_signed,
    chunk_prefix,
    python3_dir,
    run_script,
)

from tpujobs.agent.basics import AGENT_FAILED, Refused
from tpujobs.agent.config import job_environment
from tpujobs.agent.rest import GoogleApi, Metadata, SecretReader, TokenSource, crc32c
from tpujobs.engine.startup_script import render_startup_script

# --- secrets --------------------------------------------------------------------------


def test_crc32c_is_castagnoli_as_secret_manager_computes_it() -> None:
    """The check value of CRC-32C, and agreement with google-crc32c on other inputs."""
    assert crc32c(b"123456789") == 0xE3069283
    for data in (b"", b"a", bytes(range(256)) * 3, "hf_ünï".encode()):
        assert crc32c(data) == google_crc32c.value(data)


def test_secrets_are_read_from_google_unless_the_local_endpoint_is_named() -> None:
    """secretmanager.googleapis.com by default; TPUJOBS_SECRETS_ENDPOINT locally; a token always."""
    with FakeMetadata() as server:
        tokens = TokenSource(Metadata(server.base))
        real = GoogleApi.secrets_from_env({}, tokens)
        local = GoogleApi.secrets_from_env({"TPUJOBS_SECRETS_ENDPOINT": "127.0.0.1:9999"}, tokens)
    assert (real.base_url, real.tokens) == ("https://secretmanager.googleapis.com", tokens)
    assert (local.base_url, local.tokens) == ("http://127.0.0.1:9999", tokens)


def secret_reader(google: GoogleStub, metadata: FakeMetadata, attempts: int = 8) -> Any:
    tokens = TokenSource(Metadata(metadata.base))
    api = GoogleApi(google.url, tokens, direct=True)
    return SecretReader(api, Metadata(metadata.base), attempts=attempts)


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
    with pytest.raises(Refused) as refused:
        secret_reader(google, metadata).read("HF_TOKEN", HF_VERSION)
    assert str(refused.value) == expected
    assert len([r for r in google.requests if ":access" in r[1]]) == 1


def test_a_secret_manager_that_keeps_failing_ends_in_a_refusal_after_bounded_tries(
    google: GoogleStub, metadata: FakeMetadata
) -> None:
    """503 on every try: after `attempts` tries, a Refused naming the secret and the account."""
    google.failures[":access"] = [503] * 10
    with pytest.raises(Refused) as refused:
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
    reader = SecretReader(_Answer(answer), Metadata(metadata.base))  # type: ignore[arg-type]
    with pytest.raises(Refused, match=reason) as refused:
        reader.read("HF_TOKEN", HF_VERSION)
    assert str(refused.value).startswith(f"secret HF_TOKEN ({HF_VERSION})")
    for leaked in ("hunter2", "aHVudGVyMg", "AGh1bnRlcjI"):
        assert leaked not in str(refused.value)


def test_secret_values_join_the_job_environment_beside_env() -> None:
    """job_environment puts each secret under its env name; TPUJOBS_ variables still win."""
    env = job_environment({}, a_config(env={"LR": "0.1"}), 0, 0, {"HF_TOKEN": "v"})
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


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_a_secret_the_command_prints_in_any_form_leaves_the_vm_masked(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """The command prints $HF_TOKEN raw and in base64, then fails: the output chunks and the
    failed `exited` (its last lines) carry `[secret HF_TOKEN]`, never the value in either form."""
    value = "hf_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    google.secrets[HF_VERSION] = value.encode()
    job = a_job(
        secrets={"HF_TOKEN": "hf-token"},
        command='echo "token $HF_TOKEN"; printf %s "$HF_TOKEN" | base64; exit 1',
    )
    run_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=python3_dir(tmp_path, python),
    )
    assert google.output(chunk_prefix()) == b"token [secret HF_TOKEN]\n[secret HF_TOKEN]\n"
    encoded = base64.b64encode(value.encode())
    for seen in (google.everything_sent(), files_under(tmp_path)):
        assert value.encode() not in seen and encoded not in seen and encoded.rstrip(b"=") not in seen
    assert b"[secret HF_TOKEN]" in google.everything_sent()


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
    assert code == AGENT_FAILED, stderr
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
        reader = SecretReader(
            GoogleApi.secrets_from_env(
                {"TPUJOBS_SECRETS_ENDPOINT": server.url},
                TokenSource(Metadata(metadata.base)),
            ),
            Metadata(metadata.base),
        )
        assert reader.read("HF_TOKEN", HF_VERSION) == value.decode()
        other = f"projects/{PROJECT}/secrets/t-tpujobs_other-acct_x/versions/latest"
        with pytest.raises(Refused, match=f"is not readable by {re.escape(ACCOUNT)}: 403 PERMISSION_DENIED"):
            reader.read("X", other)
