"""Identity tokens from a simulated worker's metadata server, verified as the control plane verifies
Google's: google-auth against the certificates the simulator serves."""

from __future__ import annotations

import base64
import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from tpujobs.adapters.google_id_tokens import GoogleIdTokens
from tpujobs.engine.identity import InvalidToken
from tpujobs.local.simulator import QueuedResourceRequest, Simulator, SimulatorConfig, SliceRequest
from tpujobs.local.simulator.identity import CERTS_PATH, account_id, instance_id
from tpujobs.local.simulator.metadata import lookup, metadata_url
from tpujobs.local.simulator.model import project_number
from tpujobs.local.simulator.server import SimulatorServer
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
ZONE = "us-central2-b"
ACCOUNT = f"worker@{PROJECT}.iam.gserviceaccount.com"
AUDIENCE = "https://jobs.example.test/report-key"
CREATED = 1_700_000_000.0


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    """A served simulator with one ACTIVE two-worker node "n" running as ACCOUNT; no worker processes."""
    clock = SecondsClock()  # the model's; the tokens' times come from the real wall clock
    config = SimulatorConfig(accept_seconds=0.0, waiting_seconds=1.0, provisioning_seconds=2.0)
    sim = Simulator(config, clock=clock, wall_clock=lambda: CREATED)
    template = {"serviceAccount": {"email": ACCOUNT}}
    request = QueuedResourceRequest(
        slices=(SliceRequest("v4-16", "tpu-ubuntu2204-base", node_id="n", template=template),)
    )
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    with SimulatorServer(simulator=sim, run_workers=False) as served:
        yield served


def fetch(server: SimulatorServer, worker: int, key: str, **query: str) -> tuple[int, str]:
    url = metadata_url(server.url, PROJECT, ZONE, "n", worker) + "/" + key
    if query:
        url += "?" + urlencode(query)
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def token(server: SimulatorServer, worker: int = 0, alias: str = "default", **query: str) -> str:
    status, body = fetch(server, worker, f"instance/service-accounts/{alias}/identity", audience=AUDIENCE, **query)
    assert status == 200, body
    return body


def verifier(server: SimulatorServer) -> GoogleIdTokens:
    return GoogleIdTokens(certs_url=server.url + CERTS_PATH)


def test_a_full_token_verifies_for_its_audience_and_names_the_vm(server: SimulatorServer) -> None:
    claims = verifier(server)(token(server, 1, format="full"), [AUDIENCE])

    node = server.simulator.nodes.get_node(PROJECT, ZONE, "n")
    hostname = lookup(node, 1, "instance/hostname").body
    assert claims["iss"] == "https://accounts.google.com"
    assert (claims["aud"], claims["email"], claims["email_verified"]) == (AUDIENCE, ACCOUNT, True)
    assert claims["sub"] == claims["azp"] == account_id(ACCOUNT)
    assert claims["exp"] - claims["iat"] == 3600
    engine = claims["google"]["compute_engine"]
    assert {key: engine[key] for key in ("project_id", "project_number", "zone", "instance_name")} == {
        "project_id": PROJECT,
        "project_number": project_number(PROJECT),
        "zone": ZONE,
        "instance_name": hostname,
    }
    assert engine["instance_creation_timestamp"] == int(CREATED)
    assert engine["instance_id"].isdigit() and len(engine["instance_id"]) == 19
    assert "license_id" not in engine


def test_a_standard_token_has_no_instance_details_and_licenses_add_the_licence_list(server: SimulatorServer) -> None:
    standard = verifier(server)(token(server, alias=ACCOUNT), [AUDIENCE])
    with_licences = verifier(server)(token(server, format="full", licenses="TRUE"), [AUDIENCE])

    assert "google" not in standard and standard["email"] == ACCOUNT
    assert with_licences["google"]["compute_engine"]["license_id"] == []


def test_two_workers_are_two_instances_and_each_keeps_its_id(server: SimulatorServer) -> None:
    def served_id(worker: int) -> str:
        claims = verifier(server)(token(server, worker, format="full"), [AUDIENCE])
        return str(claims["google"]["compute_engine"]["instance_id"])

    assert served_id(0) == served_id(0) != served_id(1)


def test_a_token_is_refused_for_another_audience(server: SimulatorServer) -> None:
    with pytest.raises(InvalidToken):
        verifier(server)(token(server), ["https://elsewhere.example.test"])


def test_a_token_whose_signature_is_altered_is_refused(server: SimulatorServer) -> None:
    header, payload, signature = token(server).split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[0] ^= 0x01
    altered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode("ascii")

    with pytest.raises(InvalidToken):
        verifier(server)(f"{header}.{payload}.{altered}", [AUDIENCE])


def test_a_token_names_the_served_key_and_the_certificates_may_be_cached(server: SimulatorServer) -> None:
    header = json.loads(base64.urlsafe_b64decode(token(server).split(".")[0] + "=="))
    with urllib.request.urlopen(server.url + CERTS_PATH, timeout=30) as answer:
        certs = json.loads(answer.read())
        cache_control = answer.headers["Cache-Control"]

    assert header["alg"] == "RS256"
    assert list(certs) == [header["kid"]]
    assert certs[header["kid"]].startswith("-----BEGIN CERTIFICATE-----")
    assert "max-age=" in cache_control


@pytest.mark.parametrize("query", [{}, {"audience": ""}])
def test_the_identity_path_without_an_audience_is_a_bad_request(server: SimulatorServer, query: dict[str, str]) -> None:
    status, body = fetch(server, 0, "instance/service-accounts/default/identity", **query)

    assert (status, body) == (400, "non-empty audience parameter required\n")


def test_another_accounts_identity_is_not_served(server: SimulatorServer) -> None:
    status, _ = fetch(
        server, 0, "instance/service-accounts/other@x.iam.gserviceaccount.com/identity", audience=AUDIENCE
    )

    assert status == 404


def test_a_node_made_again_under_the_same_name_is_a_new_instance(server: SimulatorServer) -> None:
    """instance_id is stable for one node, and another for a node later created with the same name."""
    node = server.simulator.nodes.get_node(PROJECT, ZONE, "n")
    again = dataclasses.replace(node, number=node.number + 1, create_time=node.create_time + 60)

    assert instance_id(node, 0) == instance_id(dataclasses.replace(node), 0) != instance_id(again, 0)
