"""The dashboard's caller is IAP's signed header, verified with google-auth, or no one (401).

Tokens are signed here with an ES256 key made for the test, and the verifier fetches its public
key from a fake certs URL, exactly as IAP's are fetched: `{key id: PEM public key}`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import jwt
from google.auth.crypt import es256

from tpujobs.adapters.iap_tokens import IapTokens
from tpujobs.engine.dashboard.caller import IAP_HEADER, IAP_ISSUER, DashboardCaller, Unauthenticated

AUDIENCE = "/projects/123/global/backendServices/456"
CERTS_URL = "https://iap.test/public_key"
KID = "test-key"


@dataclass
class FakeResponse:
    status: int
    data: bytes
    headers: dict[str, str]


def a_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def certs(key: ec.EllipticCurvePrivateKey) -> Any:
    """A google-auth transport request that serves the key's public half at CERTS_URL only."""
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def request(url: str, method: str = "GET", **kwargs: Any) -> FakeResponse:
        assert url == CERTS_URL
        return FakeResponse(200, json.dumps({KID: public.decode()}).encode(), {})

    return request


def token(key: ec.EllipticCurvePrivateKey, **claims: Any) -> str:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    now = int(time.time())
    payload = {"iss": IAP_ISSUER, "aud": AUDIENCE, "email": "ada@example.com", "iat": now, "exp": now + 600, **claims}
    return jwt.encode(es256.ES256Signer.from_string(pem, KID), payload).decode()


@pytest.fixture
def key() -> ec.EllipticCurvePrivateKey:
    return a_key()


def caller(key: ec.EllipticCurvePrivateKey) -> DashboardCaller:
    return DashboardCaller(IapTokens(CERTS_URL, request=certs(key)), AUDIENCE)


def test_a_header_iap_signed_for_this_audience_names_the_caller(key: ec.EllipticCurvePrivateKey) -> None:
    """The email of a valid ES256 assertion; IAP's `accounts.google.com:` prefix is not part of it."""
    assert caller(key).email({IAP_HEADER: token(key)}) == "ada@example.com"
    assert caller(key).email({IAP_HEADER: token(key, email="accounts.google.com:bo@x.com")}) == "bo@x.com"


@pytest.mark.parametrize(
    ("what", "claims"),
    [
        ("expired", {"iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}),
        ("wrong audience", {"aud": "/projects/123/global/backendServices/999"}),
        ("another issuer", {"iss": "https://accounts.google.com"}),
        ("no email", {"email": ""}),
    ],
)
def test_a_bad_assertion_is_refused(key: ec.EllipticCurvePrivateKey, what: str, claims: dict[str, Any]) -> None:
    """Expired, for another audience, from another issuer, or without an email: no caller."""
    with pytest.raises(Unauthenticated):
        caller(key).email({IAP_HEADER: token(key, **claims)})


def test_a_header_signed_by_another_key_is_refused(key: ec.EllipticCurvePrivateKey) -> None:
    """Signed with a key IAP does not publish (same key id): the signature does not verify."""
    with pytest.raises(Unauthenticated, match="does not verify"):
        caller(key).email({IAP_HEADER: token(a_key())})


def test_no_header_is_refused_and_iaps_unsigned_email_header_is_never_read(key: ec.EllipticCurvePrivateKey) -> None:
    """Only the signed assertion counts: X-Goog-Authenticated-User-Email alone is nobody."""
    with pytest.raises(Unauthenticated, match=IAP_HEADER):
        caller(key).email({"X-Goog-Authenticated-User-Email": "accounts.google.com:root@example.com"})


def test_without_an_audience_nothing_verifies(key: ec.EllipticCurvePrivateKey) -> None:
    """A deployment with no IAP audience configured refuses even a good token."""
    unconfigured = DashboardCaller(IapTokens(CERTS_URL, request=certs(key)), "")
    with pytest.raises(Unauthenticated, match="TPUJOBS_DASHBOARD_IAP_AUDIENCE"):
        unconfigured.email({IAP_HEADER: token(key)})


def test_the_local_user_is_honoured_only_in_the_local_stack(key: ec.EllipticCurvePrivateKey) -> None:
    """local_stack: the configured user, whatever the headers; otherwise the setting is ignored."""
    local = DashboardCaller(IapTokens(CERTS_URL, request=certs(key)), "", local_stack=True, local_user="me@local")
    assert local.email({}) == "me@local"
    deployed = DashboardCaller(IapTokens(CERTS_URL, request=certs(key)), AUDIENCE, local_user="me@local")
    with pytest.raises(Unauthenticated):
        deployed.email({})
