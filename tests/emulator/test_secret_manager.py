"""The local Secret Manager through the real google-cloud-secret-manager REST client, the
adapter and `tpujobs secret`, as the CLI, the agent and production call Secret Manager."""

from __future__ import annotations

import json
import logging
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google.auth.credentials
import google_crc32c
import pytest
from google.api_core import exceptions
from google.cloud import secretmanager
from typer.testing import CliRunner

from tpujobs.adapters.secrets import LOCAL_OPERATOR_TOKEN, Secrets, build_client
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.local.simulator.secret_manager import SecretManagerServer, crc32c

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
PARENT = f"projects/{PROJECT}"
PREFIX = "t1-"
ADA = "ada-vm@tpujobs-test.iam.gserviceaccount.com"
BOB = "bob-vm@tpujobs-test.iam.gserviceaccount.com"
VALUE = b"hf_s3cret-value-0123456789"  # must appear in no output, log or error


@pytest.fixture
def server() -> Iterator[SecretManagerServer]:
    with SecretManagerServer(prefix=PREFIX) as running:
        yield running


class StaticToken(google.auth.credentials.Credentials):
    """A bearer token as a VM's agent sends it; refreshing (on a 401) keeps the same token."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def refresh(self, request: Any) -> None:
        pass


def client_for(server: SecretManagerServer, token: str | None = LOCAL_OPERATOR_TOKEN) -> Any:
    """The REST client as the stack's operator, with another bearer token, or with none (None)."""
    credentials = google.auth.credentials.AnonymousCredentials() if token is None else StaticToken(token)
    return secretmanager.SecretManagerServiceClient(
        transport="rest",
        client_options={"api_endpoint": server.url},
        credentials=credentials,
    )


@pytest.fixture
def client(server: SecretManagerServer) -> secretmanager.SecretManagerServiceClient:
    return client_for(server)


def make_secret(
    client: secretmanager.SecretManagerServiceClient, secret_id: str, **labels: str
) -> secretmanager.Secret:
    return client.create_secret(
        parent=PARENT,
        secret_id=secret_id,
        secret={"replication": {"automatic": {}}, "labels": labels},
    )


def add(client: secretmanager.SecretManagerServiceClient, name: str, data: bytes) -> str:
    version = client.add_secret_version(
        parent=name, payload={"data": data, "data_crc32c": int(google_crc32c.value(data))}
    )
    return str(version.name)


def status_of(error: pytest.ExceptionInfo[exceptions.GoogleAPICallError]) -> str:
    """The google.rpc status name in the body; REST clients pick exceptions by HTTP code only."""
    assert error.value.response is not None
    return str(error.value.response.json()["error"]["status"])


# -- the API -------------------------------------------------------------------------------


def test_a_created_secret_reads_back_with_its_labels_and_replication(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """create_secret then get_secret: name, labels, automatic replication and a create time."""
    made = make_secret(client, "tok", tpujobs="secret")
    got = client.get_secret(name=f"{PARENT}/secrets/tok")
    assert made.name == got.name == f"{PARENT}/secrets/tok"
    assert dict(got.labels) == {"tpujobs": "secret"}
    assert "automatic" in secretmanager.Replication.to_dict(got.replication)
    assert got.create_time.year >= 2024


def test_versions_are_numbered_and_latest_is_the_newest(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """add_secret_version twice: access by number and by latest returns the data and its CRC32C."""
    secret = make_secret(client, "tok").name
    assert add(client, secret, b"one") == f"{secret}/versions/1"
    assert add(client, secret, VALUE) == f"{secret}/versions/2"

    latest = client.access_secret_version(name=f"{secret}/versions/latest")
    first = client.access_secret_version(name=f"{secret}/versions/1")

    assert latest.name == f"{secret}/versions/2"
    assert latest.payload.data == VALUE
    assert latest.payload.data_crc32c == google_crc32c.value(VALUE) == crc32c(VALUE)
    assert first.payload.data == b"one"


def test_a_version_without_a_checksum_is_given_one(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """No data_crc32c on add: the server computes it, and says the client did not send one."""
    secret = make_secret(client, "tok").name
    version = client.add_secret_version(parent=secret, payload={"data": VALUE})
    assert version.client_specified_payload_checksum is False
    assert client.access_secret_version(name=version.name).payload.data_crc32c == crc32c(VALUE)


def test_a_wrong_checksum_is_invalid_argument_and_adds_nothing(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """A data_crc32c that does not match the data: 400 INVALID_ARGUMENT, no version."""
    secret = make_secret(client, "tok").name
    with pytest.raises(exceptions.BadRequest) as error:
        client.add_secret_version(parent=secret, payload={"data": VALUE, "data_crc32c": 1})
    assert status_of(error) == "INVALID_ARGUMENT"
    assert VALUE.decode() not in str(error.value)
    assert list(client.list_secret_versions(parent=secret)) == []


def test_list_pages_through_every_secret(client: secretmanager.SecretManagerServiceClient) -> None:
    """page_size 2 over 5 secrets: three pages, every secret once, in name order."""
    for index in range(5):
        make_secret(client, f"s{index}")
    pages = list(client.list_secrets(request={"parent": PARENT, "page_size": 2}).pages)
    assert [len(page.secrets) for page in pages] == [2, 2, 1]
    names = [secret.name for page in pages for secret in page.secrets]
    assert names == [f"{PARENT}/secrets/s{i}" for i in range(5)]


def test_list_filters_on_labels_and_name(client: secretmanager.SecretManagerServiceClient) -> None:
    """labels.KEY=VALUE, name:TEXT and OR are applied; other projects never show."""
    make_secret(client, "t1-tpujobs_ada-vm_a", tpujobs="secret")
    make_secret(client, "t1-tpujobs_bob-vm_b", tpujobs="secret")
    make_secret(client, "unrelated", team="x")
    client.create_secret(parent="projects/other", secret_id="x", secret={"replication": {"automatic": {}}})

    def ids(text: str) -> list[str]:
        found = client.list_secrets(request={"parent": PARENT, "filter": text})
        return [s.name.rsplit("/", 1)[-1] for s in found]

    assert ids("labels.tpujobs=secret") == ["t1-tpujobs_ada-vm_a", "t1-tpujobs_bob-vm_b"]
    assert ids("labels.tpujobs=secret AND name:ada-vm") == ["t1-tpujobs_ada-vm_a"]
    assert ids("name:bob OR name:unrel") == ["t1-tpujobs_bob-vm_b", "unrelated"]
    assert ids("labels.team:*") == ["unrelated"]
    with pytest.raises(exceptions.BadRequest):
        ids("create_time>2021-01-01T00:00:00Z")


def test_versions_list_newest_first_with_paging(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """list_secret_versions: 3, 2, 1, two per page."""
    secret = make_secret(client, "tok").name
    for index in range(3):
        add(client, secret, b"v%d" % index)
    pages = list(client.list_secret_versions(request={"parent": secret, "page_size": 2}).pages)
    assert [[v.name.rsplit("/", 1)[-1] for v in page.versions] for page in pages] == [
        ["3", "2"],
        ["1"],
    ]


def test_missing_secrets_and_versions_are_not_found(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """404 for a missing secret, a secret without versions, and a missing version number."""
    with pytest.raises(exceptions.NotFound, match="not found"):
        client.get_secret(name=f"{PARENT}/secrets/nope")
    with pytest.raises(exceptions.NotFound, match="not found or has no versions"):
        client.access_secret_version(name=f"{PARENT}/secrets/nope/versions/latest")
    secret = make_secret(client, "empty").name
    with pytest.raises(exceptions.NotFound, match="not found or has no versions"):
        client.access_secret_version(name=f"{secret}/versions/latest")
    add(client, secret, b"x")
    with pytest.raises(exceptions.NotFound) as error:
        client.access_secret_version(name=f"{secret}/versions/7")
    assert status_of(error) == "NOT_FOUND"


def test_creating_a_secret_twice_is_already_exists(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """The second create: 409 with status ALREADY_EXISTS (Conflict over REST)."""
    make_secret(client, "tok")
    with pytest.raises(exceptions.Conflict, match="already exists") as error:
        make_secret(client, "tok")
    assert status_of(error) == "ALREADY_EXISTS"


@pytest.mark.parametrize("secret_id", ["has.dot", "x" * 256, "sp ace"])
def test_a_bad_secret_id_is_invalid_argument(client: secretmanager.SecretManagerServiceClient, secret_id: str) -> None:
    """Secret ids are [a-zA-Z0-9_-]{1,255}: anything else is 400 INVALID_ARGUMENT."""
    with pytest.raises(exceptions.BadRequest) as error:
        make_secret(client, secret_id)
    assert status_of(error) == "INVALID_ARGUMENT"


def test_a_secret_without_replication_is_invalid_argument(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """Replication is required, as the API requires it."""
    with pytest.raises(exceptions.BadRequest, match="replication"):
        client.create_secret(parent=PARENT, secret_id="tok", secret={})


def test_disabled_and_destroyed_versions_are_failed_precondition(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """Access of a DISABLED or DESTROYED version: FAILED_PRECONDITION; enable restores access."""
    secret = make_secret(client, "tok").name
    version = add(client, secret, VALUE)
    client.disable_secret_version(name=version)
    with pytest.raises(exceptions.BadRequest, match="DISABLED") as error:
        client.access_secret_version(name=f"{secret}/versions/latest")
    assert status_of(error) == "FAILED_PRECONDITION"

    client.enable_secret_version(name=version)
    assert client.access_secret_version(name=version).payload.data == VALUE

    destroyed = client.destroy_secret_version(name=version)
    assert destroyed.state == secretmanager.SecretVersion.State.DESTROYED
    with pytest.raises(exceptions.BadRequest, match="DESTROYED"):
        client.access_secret_version(name=version)


def test_a_deleted_secret_is_gone_with_its_versions(
    client: secretmanager.SecretManagerServiceClient,
) -> None:
    """delete_secret: get and access are NOT_FOUND, and the id can be made again."""
    secret = make_secret(client, "tok").name
    add(client, secret, VALUE)
    client.delete_secret(name=secret)
    with pytest.raises(exceptions.NotFound):
        client.get_secret(name=secret)
    with pytest.raises(exceptions.NotFound):
        client.access_secret_version(name=f"{secret}/versions/1")
    make_secret(client, "tok")
    assert list(client.list_secret_versions(parent=secret)) == []


def _post(server: SecretManagerServer, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.url}/v1/{PARENT}/{path}",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {LOCAL_OPERATOR_TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


@pytest.mark.parametrize(
    "body",
    [
        b'{"replication": {"automatic": {}}, "colour": "blue"}',
        b'{"replication": {"automatic": {}}, "labels": {"team": 7}}',
        b'{"replication": "automatic"}',
        b'{"replication": {"automatic": {}, "userManaged": {"replicas": [{"location": "x"}]}}}',
    ],
)
def test_a_secret_with_an_unknown_field_or_a_wrong_type_is_400_invalid_argument(
    server: SecretManagerServer, body: bytes
) -> None:
    """The body is read as the client library's own Secret (json_format), as Google reads it."""
    status, answer = _post(server, "secrets?secretId=tok", body)
    assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert _post(server, "secrets?secretId=tok", b'{"replication": {"automatic": {}}}')[0] == 200


@pytest.mark.parametrize(
    "payload", [{"payload": VALUE.decode()}, {"payload": {"data": VALUE.decode(), "colour": 1}}, [VALUE.decode()]]
)
def test_a_version_body_that_is_no_request_is_refused_without_quoting_it(
    server: SecretManagerServer, payload: Any
) -> None:
    """A bad AddSecretVersionRequest is 400 INVALID_ARGUMENT, and its message never holds the value."""
    assert _post(server, "secrets?secretId=tok", b'{"replication": {"automatic": {}}}')[0] == 200
    status, answer = _post(server, "secrets/tok:addVersion", json.dumps(payload).encode())
    assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert VALUE.decode()[:6] not in answer["error"]["message"]


# -- who may read what ---------------------------------------------------------------------


def test_a_vm_account_reads_the_secrets_of_its_own_namespace(
    server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient
) -> None:
    """`simulated:EMAIL` may access {prefix}tpujobs_{account id}_* secrets."""
    secret = make_secret(client, "t1-tpujobs_ada-vm_hf-token").name
    add(client, secret, VALUE)
    vm = client_for(server, f"simulated:{ADA}")
    assert vm.access_secret_version(name=f"{secret}/versions/latest").payload.data == VALUE


def test_a_vm_account_is_denied_another_accounts_secret(
    server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient
) -> None:
    """Bob's VM reading Ada's secret: 403 in Google's words, naming the permission and resource."""
    secret = make_secret(client, "t1-tpujobs_ada-vm_hf-token").name
    add(client, secret, VALUE)
    vm = client_for(server, f"simulated:{BOB}")
    with pytest.raises(exceptions.Forbidden) as error:
        vm.access_secret_version(name=f"{secret}/versions/latest")
    assert status_of(error) == "PERMISSION_DENIED"  # Forbidden: REST picks by HTTP status
    assert error.value.message.endswith(
        "Permission 'secretmanager.versions.access' denied for resource "
        f"'{secret}/versions/latest' (or it may not exist)."
    )


@pytest.mark.parametrize(
    "secret_id",
    [
        "hf-token",  # outside any namespace
        "tpujobs_ada-vm_hf-token",  # the namespace without the deployment's prefix
        "t1-tpujobs_ada-vmx_hf-token",  # an account whose id merely starts alike
    ],
)
def test_a_vm_account_is_denied_secrets_outside_its_exact_namespace(
    server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient, secret_id: str
) -> None:
    """The rule is the exact prefix `{prefix}tpujobs_{account id}_`."""
    secret = make_secret(client, secret_id).name
    add(client, secret, VALUE)
    with pytest.raises(exceptions.Forbidden):
        client_for(server, f"simulated:{ADA}").access_secret_version(name=f"{secret}/versions/latest")


def test_a_vm_account_may_only_access(
    server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient
) -> None:
    """Create, list, get and add version are denied even in the account's own namespace."""
    secret = make_secret(client, "t1-tpujobs_ada-vm_tok").name
    vm = client_for(server, f"simulated:{ADA}")
    with pytest.raises(exceptions.Forbidden, match=r"secretmanager\.secrets\.create"):
        make_secret(vm, "t1-tpujobs_ada-vm_new")
    with pytest.raises(exceptions.Forbidden, match=r"secretmanager\.secrets\.list"):
        list(vm.list_secrets(parent=PARENT))
    with pytest.raises(exceptions.Forbidden, match=r"secretmanager\.secrets\.get"):
        vm.get_secret(name=secret)
    with pytest.raises(exceptions.Forbidden, match=r"secretmanager\.versions\.add"):
        add(vm, secret, VALUE)


def test_a_missing_secret_in_the_own_namespace_is_not_found(
    server: SecretManagerServer,
) -> None:
    """Permission holds, the secret does not exist: 404, so the agent can say which it is."""
    vm = client_for(server, f"simulated:{ADA}")
    with pytest.raises(exceptions.NotFound, match="not found or has no versions"):
        vm.access_secret_version(name=f"{PARENT}/secrets/t1-tpujobs_ada-vm_nope/versions/latest")


def test_a_request_without_credentials_is_unauthenticated(server: SecretManagerServer) -> None:
    """As Google's: no Authorization header is 401 UNAUTHENTICATED, even to list."""
    request = urllib.request.Request(f"{server.url}/v1/{PARENT}/secrets")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 401
    assert json.load(refused.value)["error"]["status"] == "UNAUTHENTICATED"


@pytest.mark.parametrize("token", ["simulated", "simulated:not-an-email", "ya29.real-token", "local-operatorX"])
def test_any_other_token_is_unauthenticated(server: SecretManagerServer, token: str) -> None:
    """Only the operator's token or `simulated:EMAIL` are understood: anything else is 401."""
    with pytest.raises(exceptions.Unauthorized) as error:
        client_for(server, token).access_secret_version(name=f"{PARENT}/secrets/t1-tpujobs_ada-vm_x/versions/latest")
    assert status_of(error) == "UNAUTHENTICATED"
    with pytest.raises(exceptions.Unauthorized):
        list(client_for(server, token).list_secrets(parent=PARENT))


# -- serving -------------------------------------------------------------------------------


def test_state_survives_a_restart_in_a_file_only_its_owner_reads(tmp_path: Path) -> None:
    """With a state file, a second server sees the first one's secrets; the file is 0600."""
    state = tmp_path / "secrets.json"
    with SecretManagerServer(state_file=state) as first:
        secret = make_secret(client_for(first), "tok").name
        add(client_for(first), secret, VALUE)
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    with SecretManagerServer(state_file=state) as second:
        assert client_for(second).access_secret_version(name=f"{secret}/versions/1").payload.data == VALUE


def test_values_are_never_logged(
    client: secretmanager.SecretManagerServiceClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Every request logged at DEBUG: the value is in no record."""
    caplog.set_level(logging.DEBUG)
    secret = make_secret(client, "tok").name
    add(client, secret, VALUE)
    client.access_secret_version(name=f"{secret}/versions/latest")
    with pytest.raises(exceptions.BadRequest):
        client.add_secret_version(parent=secret, payload={"data": VALUE, "data_crc32c": 7})
    assert caplog.records
    assert VALUE.decode() not in caplog.text


def test_the_module_serves_until_sigterm() -> None:
    """`python -m tpujobs.local.simulator.secret_manager --port 0` says where it listens, exits on SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tpujobs.local.simulator.secret_manager", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("tpujobs-secret-manager listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[-1].strip()
        client = secretmanager.SecretManagerServiceClient(
            transport="rest",
            client_options={"api_endpoint": url},
            credentials=StaticToken(LOCAL_OPERATOR_TOKEN),
        )
        make_secret(client, "tok")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


# -- the adapter ---------------------------------------------------------------------------


@pytest.fixture
def secrets(server: SecretManagerServer) -> Secrets:
    return Secrets(build_client(server.url), PROJECT, PREFIX)


def test_set_creates_the_secret_in_the_accounts_namespace_and_adds_versions(
    secrets: Secrets, server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient
) -> None:
    """set twice: one labelled secret, versions 1 and 2; Ada's VM reads the latest."""
    first = secrets.set_secret("hf-token", b"old", ADA)
    second = secrets.set_secret("hf-token", VALUE, ADA)

    secret = f"{PARENT}/secrets/t1-tpujobs_ada-vm_hf-token"
    assert (first, second) == (f"{secret}/versions/1", f"{secret}/versions/2")
    assert dict(client.get_secret(name=secret).labels) == {"tpujobs": "secret"}
    vm = client_for(server, f"simulated:{ADA}")
    assert vm.access_secret_version(name=f"{secret}/versions/latest").payload.data == VALUE


def test_list_shows_each_account_name_and_latest_version_without_values(
    secrets: Secrets, server: SecretManagerServer, client: secretmanager.SecretManagerServiceClient
) -> None:
    """list: tpujobs' secrets of this deployment only, by account; --account narrows it."""
    secrets.set_secret("hf-token", VALUE, ADA)
    secrets.set_secret("hf-token", VALUE, ADA)
    secrets.set_secret("wandb", VALUE, BOB)
    make_secret(client, "unrelated", tpujobs="secret")  # not in any namespace
    Secrets(build_client(server.url), PROJECT, "t2-").set_secret("x", VALUE, ADA)

    found = secrets.list_secrets()

    assert [(i.name, i.account, i.version) for i in found] == [
        ("hf-token", ADA, 2),
        ("wandb", BOB, 1),
    ]
    assert all(i.created is not None for i in found)
    assert VALUE.decode() not in repr(found)
    assert [i.name for i in secrets.list_secrets(BOB)] == ["wandb"]


def test_set_refuses_a_bad_name_or_account_with_a_sentence(secrets: Secrets) -> None:
    """Validation errors are PermanentError, and never quote the value."""
    with pytest.raises(PermanentError, match="secret name"):
        secrets.set_secret("bad@name", VALUE, ADA)
    with pytest.raises(PermanentError, match="service account email") as error:
        secrets.set_secret("tok", VALUE, "not-an-email")
    assert VALUE.decode() not in str(error.value)


def test_an_unreachable_secret_manager_is_transient() -> None:
    """Nothing listening: TransientError, worth retrying."""
    from tpujobs.local.processes import free_port

    gone = Secrets(build_client(f"http://127.0.0.1:{free_port()}"), PROJECT, PREFIX)
    with pytest.raises(TransientError, match=r"unreachable|failed"):
        gone.set_secret("tok", VALUE, ADA)


# -- the CLI -------------------------------------------------------------------------------


@pytest.fixture
def cli_env(server: SecretManagerServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """The CLI pointed at the server, as `tpujobs dev env` would point it; no stack on record."""
    env = {
        "TPUJOBS_STATE_DIR": str(tmp_path / "no-stack"),
        "GOOGLE_CLOUD_PROJECT": PROJECT,
        "TPUJOBS_PREFIX": PREFIX,
        "TPUJOBS_SECRETS_ENDPOINT": server.url,
        "TPUJOBS_TPU_SERVICE_ACCOUNT": ADA,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def run_cli(*args: str, input: bytes | str | None = None) -> Any:
    from tpujobs.cli import app

    return CliRunner().invoke(app, list(args), input=input, env={"COLUMNS": "200"})


def test_secret_set_reads_standard_input_and_prints_only_the_version(
    cli_env: dict[str, str], secrets: Secrets, server: SecretManagerServer
) -> None:
    """`tpujobs secret set hf-token` < value: the default account's secret; the value never shown."""
    result = run_cli("secret", "set", "hf-token", input=VALUE + b"\n")

    assert result.exit_code == 0, result.output
    assert "t1-tpujobs_ada-vm_hf-token/versions/1" in result.output
    assert VALUE.decode() not in result.output
    vm = client_for(server, f"simulated:{ADA}")
    read = vm.access_secret_version(name=f"{PARENT}/secrets/t1-tpujobs_ada-vm_hf-token/versions/1")
    assert read.payload.data == VALUE  # the trailing newline of `echo` is not part of it


def test_secret_set_from_a_file_for_another_account_keeps_the_bytes(
    cli_env: dict[str, str], tmp_path: Path, server: SecretManagerServer
) -> None:
    """--from-file is read byte for byte, into --account's namespace."""
    path = tmp_path / "key.pem"
    path.write_bytes(VALUE + b"\n")
    result = run_cli("secret", "set", "key", "--account", BOB, "--from-file", str(path))
    assert result.exit_code == 0, result.output
    vm = client_for(server, f"simulated:{BOB}")
    read = vm.access_secret_version(name=f"{PARENT}/secrets/t1-tpujobs_bob-vm_key/versions/latest")
    assert read.payload.data == VALUE + b"\n"


def test_secret_set_refuses_an_empty_value_and_a_bad_name(cli_env: dict[str, str], secrets: Secrets) -> None:
    """An empty value or a NAME with @ is refused, and nothing is created."""
    empty = run_cli("secret", "set", "tok", input=b"")
    assert empty.exit_code == 1
    assert "empty" in empty.output
    bad = run_cli("secret", "set", "tok@2", input=VALUE)
    assert bad.exit_code == 2
    assert secrets.list_secrets() == []


def test_secret_set_without_any_account_says_what_to_do(
    cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --account and no TPUJOBS_TPU_SERVICE_ACCOUNT: exit 1 with a sentence."""
    monkeypatch.delenv("TPUJOBS_TPU_SERVICE_ACCOUNT")
    result = run_cli("secret", "set", "tok", input=VALUE)
    assert result.exit_code == 1
    assert "--account" in result.output


def test_secret_list_prints_a_table_of_names_accounts_and_versions(cli_env: dict[str, str], secrets: Secrets) -> None:
    """`tpujobs secret list`: NAME, ACCOUNT, VERSION, CREATED; `--account` narrows; no values."""
    secrets.set_secret("hf-token", VALUE, ADA)
    secrets.set_secret("hf-token", VALUE, ADA)
    secrets.set_secret("wandb", VALUE, BOB)

    every = run_cli("secret", "list")
    bobs = run_cli("secret", "list", "--account", BOB)

    assert every.exit_code == 0, every.output
    for word in ("NAME", "ACCOUNT", "VERSION", "CREATED", "hf-token", ADA, "wandb", BOB):
        assert word in every.output
    assert VALUE.decode() not in every.output
    assert "wandb" in bobs.output and "hf-token" not in bobs.output


def test_cli_errors_are_sentences_not_tracebacks(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Secret Manager unreachable: exit 1 with what failed."""
    from tpujobs.local.processes import free_port

    port = free_port()
    monkeypatch.setenv("TPUJOBS_SECRETS_ENDPOINT", f"http://127.0.0.1:{port}")
    result = run_cli("secret", "list")
    assert result.exit_code == 1
    assert "could not list secrets: Secret Manager unreachable" in result.output
    assert str(port) in result.output
    assert "Traceback" not in result.output
