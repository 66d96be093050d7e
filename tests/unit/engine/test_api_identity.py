"""Who calls the jobs API, as Cloud Run delivers it, checked by google-auth's real verification code.

Tokens are signed in the test with an RSA key made for it (google.auth.crypt.RSASigner and
google.auth.jwt.encode); its certificate is served from 127.0.0.1 in Google's own format
(`{key id: X.509 PEM}`, as https://www.googleapis.com/oauth2/v1/certs serves it) with a
`Cache-Control: max-age`, and the server counts what it is asked. Nothing of google-auth is
replaced: the JobsApi builds its own verifier (tpujobs.adapters.google_id_tokens) from the
settings, pointed at the local server.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt
from google.auth import jwt as google_jwt

from tpujobs.adapters.google_id_tokens import GoogleIdTokens
from tpujobs.engine.api import JobsApi, Response
from tpujobs.engine.identity import SERVERLESS_AUTHORIZATION, SIGNATURE_REMOVED
from tpujobs.engine.settings import Settings

URL = "https://us-central1-p.cloudfunctions.net/jobs"  # the function's URL: the default audience
ADA = "ada@example.com"
EVE = "eve@example.com"
KEY_ID = "test-key-1"


class CertificateServer:
    """Serves one certificate as Google does, counting the requests; `failing` answers 500."""

    def __init__(self, certificate_pem: str, max_age: int) -> None:
        self.body = json.dumps({KEY_ID: certificate_pem}).encode()
        self.max_age = max_age
        self.requests = 0
        self.failing = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                if server.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                self.send_response(200)  # with a Date header, which caching needs
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header(
                    "Cache-Control",
                    f"public, max-age={server.max_age}, must-revalidate, no-transform",
                )
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/oauth2/v1/certs"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def key() -> tuple[crypt.RSASigner, str]:
    """A signing key made for these tests and a self-signed certificate of its public half."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpujobs test signer")])
    now = datetime.now(timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(private, hashes.SHA256())
    )
    return (
        crypt.RSASigner.from_string(pem, key_id=KEY_ID),
        certificate.public_bytes(serialization.Encoding.PEM).decode(),
    )


@pytest.fixture
def certs(key, monkeypatch) -> Iterator[CertificateServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # loopback: never through a proxy
    server = CertificateServer(key[1], max_age=3600)
    yield server
    server.stop()


def token(key, **changes: Any) -> str:
    """An ID token as Google mints it for ADA, for the function's URL, valid for an hour."""
    now = int(time.time())
    claims = {
        "iss": "https://accounts.google.com",
        "aud": URL,
        "sub": "1234567890",
        "email": ADA,
        "email_verified": True,
        "iat": now,
        "exp": now + 3600,
        **changes,
    }
    claims = {name: value for name, value in claims.items() if value is not None}
    return google_jwt.encode(key[0], claims).decode()


def stripped(signed: str, tail: str = "") -> str:
    """The token as Cloud Run may forward it: header.payload, then `tail` (or nothing at all)."""
    header, payload, _ = signed.split(".")
    return f"{header}.{payload}" if tail is None else f"{header}.{payload}.{tail}"


class NoJobs:
    """The store of a deployment with no jobs: the identity is what is tested here."""

    def list_jobs(self, **_: Any) -> list[Any]:
        return []


def api(certs: CertificateServer, **settings: Any) -> JobsApi:
    """The API as deployed (`runtime.jobs_api`), its verifier pointed at the local server."""
    configured = Settings(api_certs_url=certs.url, **settings)
    verifier = GoogleIdTokens(configured.api_certs_url)
    return JobsApi(SimpleNamespace(settings=configured), NoJobs(), configured, verify_token=verifier)


def ask(app: JobsApi, **headers: str) -> Response:
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return app.handle("POST", URL, named, b'{"action": "list"}')


def bearer(value: str) -> str:
    return f"Bearer {value}"


# --- tokens with a signature: google-auth verifies them --------------------------------------


def test_a_valid_token_is_the_caller(key, certs):
    """Signed by the served key, for the function's URL, unexpired, verified email: 200."""
    app = api(certs)
    assert app.caller({"Authorization": bearer(token(key))}, URL) == ADA
    assert ask(app, Authorization=bearer(token(key))).status == 200


def test_either_google_issuer_is_accepted(key, certs):
    """Google issues with and without the scheme: accounts.google.com is as good."""
    app = api(certs)
    assert app.caller({"Authorization": bearer(token(key, iss="accounts.google.com"))}, URL) == ADA


def test_an_expired_token_is_401(key, certs):
    """Expired a minute ago, well past the clock skew: 401 saying it expired."""
    now = int(time.time())
    answer = ask(api(certs), Authorization=bearer(token(key, iat=now - 3660, exp=now - 60)))
    assert answer.status == 401 and "expired" in answer.body["error"].lower()


def test_a_token_expired_within_the_clock_skew_is_accepted(key, certs):
    """Expired 3 s ago, within the 10 s allowed for clocks that differ: still the caller."""
    now = int(time.time())
    app = api(certs)
    assert app.caller({"Authorization": bearer(token(key, iat=now - 3603, exp=now - 3))}, URL) == ADA


def test_a_token_for_another_audience_is_401(key, certs):
    """Minted for another service: 401 naming the audience."""
    answer = ask(api(certs), Authorization=bearer(token(key, aud="https://other.example.com")))
    assert answer.status == 401 and "audience" in answer.body["error"]


def test_configured_audiences_are_the_only_ones_accepted(key, certs):
    """TPUJOBS_API_AUDIENCE set: a token for the function's URL no longer passes."""
    app = api(certs, api_audiences=("https://jobs.example.com",))
    assert ask(app, Authorization=bearer(token(key))).status == 401
    assert app.caller({"Authorization": bearer(token(key, aud="https://jobs.example.com"))}, URL) == ADA


def test_a_token_of_another_issuer_is_401(key, certs):
    """Signed by the right key but not issued by Google: 401 naming the issuer."""
    answer = ask(api(certs), Authorization=bearer(token(key, iss="https://issuer.example.com")))
    assert answer.status == 401 and "issuer" in answer.body["error"]


def test_an_unverified_email_is_401(key, certs):
    """email_verified false: the email is not an identity."""
    answer = ask(api(certs), Authorization=bearer(token(key, email_verified=False)))
    assert answer.status == 401 and "verified email" in answer.body["error"]


def test_a_token_without_an_email_is_401(key, certs):
    """A token minted without --include-email names nobody: 401."""
    answer = ask(api(certs), Authorization=bearer(token(key, email=None, email_verified=None)))
    assert answer.status == 401 and "verified email" in answer.body["error"]


def test_a_tampered_payload_is_401_even_where_the_platform_is_trusted(key, certs):
    """Eve's token with ADA put in its payload keeps its signature, which no longer matches: 401,
    with or without TPUJOBS_API_PLATFORM_AUTH, and the token is not in the answer."""
    header, payload, signature = token(key, email=EVE).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "email": ADA}).encode()).decode().rstrip("=")
    tampered = f"{header}.{forged}.{signature}"
    for platform_auth in (False, True):
        answer = ask(api(certs, api_platform_auth=platform_auth), Authorization=bearer(tampered))
        assert answer.status == 401 and "does not verify" in answer.body["error"]
        assert forged not in json.dumps(answer.body) and signature not in json.dumps(answer.body)


# --- tokens whose signature Cloud Run removed ------------------------------------------------


@pytest.mark.parametrize("tail", ["", None, SIGNATURE_REMOVED])
def test_a_stripped_token_is_401_unless_the_deployment_vouches_for_the_platform(key, certs, tail):
    """header.payload., header.payload or header.payload.SIGNATURE_REMOVED_BY_GOOGLE cannot be
    verified here: without TPUJOBS_API_PLATFORM_AUTH, 401 saying why."""
    answer = ask(api(certs), Authorization=bearer(stripped(token(key), tail)))
    assert answer.status == 401
    assert "no signature" in answer.body["error"] and "TPUJOBS_API_PLATFORM_AUTH" in answer.body["error"]


@pytest.mark.parametrize("tail", ["", None, SIGNATURE_REMOVED])
def test_a_stripped_token_is_the_caller_where_the_platform_checked_it(key, certs, tail):
    """With TPUJOBS_API_PLATFORM_AUTH=1 the platform's check is trusted; no certificate fetched."""
    app = api(certs, api_platform_auth=True)
    assert app.caller({"Authorization": bearer(stripped(token(key), tail))}, URL) == ADA
    assert certs.requests == 0


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"exp": int(time.time()) - 60}, "expired"),
        ({"exp": None}, "no expiry"),
        ({"iss": "https://issuer.example.com"}, "issuer"),
        ({"email_verified": False}, "verified email"),
        ({"email_verified": None}, "verified email"),
        ({"email": None}, "verified email"),
    ],
)
def test_a_stripped_token_still_has_its_claims_checked(key, certs, changes, words):
    """Trusted or not, a stripped token's expiry (with the skew), issuer and email are checked."""
    answer = ask(api(certs, api_platform_auth=True), Authorization=bearer(stripped(token(key, **changes))))
    assert answer.status == 401 and words in answer.body["error"], answer.body


def test_a_stripped_token_expired_within_the_clock_skew_is_accepted(key, certs):
    """The same 10 s of skew as for signed tokens."""
    app = api(certs, api_platform_auth=True)
    now = int(time.time())
    assert app.caller({"Authorization": bearer(stripped(token(key, exp=now - 3)))}, URL) == ADA


def test_a_stripped_token_that_is_not_json_is_401(certs):
    """Garbage between the dots is not an identity."""
    app = api(certs, api_platform_auth=True)
    answer = ask(app, Authorization=bearer("bm90.anNvbg."))
    assert answer.status == 401 and "does not verify" in answer.body["error"]


# --- X-Serverless-Authorization --------------------------------------------------------------


def test_x_serverless_authorization_is_preferred_over_authorization(key, certs):
    """Cloud Run checks X-Serverless-Authorization when present and passes Authorization through
    unchecked: the caller is the former's, whatever the latter says."""
    app = api(certs)
    headers = {
        SERVERLESS_AUTHORIZATION: bearer(token(key)),
        "Authorization": bearer(token(key, email=EVE)),
    }
    assert app.caller(headers, URL) == ADA


def test_a_forged_authorization_beside_x_serverless_authorization_proves_nothing(key, certs):
    """Eve passes the platform with her own token in X-Serverless-Authorization and puts a
    stripped token naming ADA in Authorization: she is still Eve."""
    app = api(certs, api_platform_auth=True)
    headers = {
        SERVERLESS_AUTHORIZATION: bearer(stripped(token(key, email=EVE))),
        "Authorization": bearer(stripped(token(key))),
    }
    assert app.caller(headers, URL) == EVE


def test_a_stripped_x_serverless_authorization_follows_the_same_rule(key, certs):
    """Without TPUJOBS_API_PLATFORM_AUTH a stripped X-Serverless-Authorization is 401, even beside
    a valid Authorization: the header Cloud Run checked is the only one read."""
    headers = {
        SERVERLESS_AUTHORIZATION: bearer(stripped(token(key), SIGNATURE_REMOVED)),
        "Authorization": bearer(token(key)),
    }
    answer = ask(api(certs), **headers)
    assert answer.status == 401 and SERVERLESS_AUTHORIZATION in answer.body["error"]
    assert api(certs, api_platform_auth=True).caller(headers, URL) == ADA


def test_a_malformed_x_serverless_authorization_does_not_fall_back(key, certs):
    """X-Serverless-Authorization present but not 'Bearer TOKEN': 401, Authorization unread."""
    headers = {SERVERLESS_AUTHORIZATION: "Basic YWRhOnB3", "Authorization": bearer(token(key))}
    answer = ask(api(certs), **headers)
    assert answer.status == 401 and SERVERLESS_AUTHORIZATION in answer.body["error"]


# --- Google's certificates: cached as they allow, out of reach is 503 ------------------------


def test_certificates_are_fetched_once_while_fresh(key, certs):
    """Twenty requests within max-age: one fetch of the certificates."""
    app = api(certs)
    for _ in range(20):
        assert ask(app, Authorization=bearer(token(key))).status == 200
    assert certs.requests == 1


def test_certificates_are_fetched_again_once_stale(key, certs):
    """max-age=1: after it has passed, the next verification fetches them again."""
    certs.max_age = 1
    app = api(certs)
    assert ask(app, Authorization=bearer(token(key))).status == 200
    assert certs.requests == 1
    time.sleep(2.5)
    assert ask(app, Authorization=bearer(token(key))).status == 200
    assert certs.requests == 2


def test_certificates_out_of_reach_is_503(key, certs):
    """The certificate server down, or failing: 503 to try again, never a 401."""
    app = api(certs)
    certs.failing = True
    answer = ask(app, Authorization=bearer(token(key)))
    assert answer.status == 503 and "try again" in answer.body["error"]
    certs.stop()
    answer = ask(app, Authorization=bearer(token(key)))
    assert answer.status == 503 and "try again" in answer.body["error"]


def test_the_settings_come_from_the_environment():
    """TPUJOBS_API_PLATFORM_AUTH=1 and TPUJOBS_API_CERTS_URL; off and Google's URL by default."""
    settings = Settings.from_env({"TPUJOBS_API_PLATFORM_AUTH": "1", "TPUJOBS_API_CERTS_URL": "http://127.0.0.1:1/c"})
    assert settings.api_platform_auth and settings.api_certs_url == "http://127.0.0.1:1/c"
    default = Settings.from_env({})
    assert not default.api_platform_auth and default.api_certs_url == ""
    from tpujobs.adapters.google_id_tokens import GOOGLE_CERTS_URL, GoogleIdTokens

    assert GoogleIdTokens(default.api_certs_url).certs_url == GOOGLE_CERTS_URL
