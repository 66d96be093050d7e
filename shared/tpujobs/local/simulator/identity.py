"""Instance identity tokens of simulated TPU VMs, signed by a key the simulator makes at start.

On Google a VM proves who it is with a Google-signed JWT from its metadata server; here the simulator
signs the same claims with its own RSA key and serves the key's certificate at /simulator/v1/certs in
Google's v1 format (`{key id: X.509 PEM}`), so google-auth's `verify_token` checks them unchanged.
The claims follow https://cloud.google.com/compute/docs/instances/verifying-instance-identity
("Verify VM identity": the token's payload, format=full and licenses=TRUE).
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpujobs.local.simulator.errors import project_number
from tpujobs.local.simulator.model import NodeRecord

CERTS_PATH = "/simulator/v1/certs"
ISSUER = "https://accounts.google.com"  # what Google's instance tokens carry as iss
TOKEN_SECONDS = 3600  # "each token expires within one hour"
# Google's certificates answer with a max-age of some hours; google-auth's caching session honours it.
CERTS_CACHE_CONTROL = "public, max-age=21600, must-revalidate, no-transform"
KEY_BITS = 2048


def hostname(node: NodeRecord, worker: int) -> str:
    """The worker VM's name: what instance/hostname answers and instance_name carries."""
    return f"t1v-n-{node.number:x}-w-{worker}"


def _digits(seed: str, digits: int) -> int:
    """A stable number of exactly `digits` digits drawn from `seed`, as Google's ids look."""
    value = int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest(), "big")
    low = 10 ** (digits - 1)
    return low + value % (9 * low)


def account_id(email: str) -> str:
    """The service account's unique id (sub and azp): 21 digits, stable per email."""
    return str(_digits(f"account:{email}", 21))


def instance_id(node: NodeRecord, worker: int) -> str:
    """The worker VM's instance id: 19 digits, stable per (node, worker). A node made again under
    the same name has another number and creation time, so its VMs are new instances."""
    seed = f"instance:{node.project}/{node.zone}/{node.node_id}/{node.number}/{node.create_time!r}/{worker}"
    return str(_digits(seed, 19))


def identity_claims(
    node: NodeRecord,
    worker: int,
    audience: str,
    *,
    now: float,
    full: bool,
    licenses: bool,
    email: str = "",
    vm: tuple[str, str, float] | None = None,
) -> dict[str, Any]:
    """What Google puts in a VM's identity token; `google.compute_engine` only with format=full.
    *vm*: a Compute Engine VM's own (name, id, creation time) instead of the TPU node's worker's.

    Licences are the boot image's licence codes; a simulated VM boots no image, so the list is empty.
    """
    email = email or node.service_account
    issued = int(now)
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": audience,
        "azp": account_id(email),
        "sub": account_id(email),
        "email": email,
        "email_verified": True,
        "iat": issued,
        "exp": issued + TOKEN_SECONDS,
    }
    if full:
        engine: dict[str, Any] = {
            "project_id": node.project,
            "project_number": project_number(node.project),
            "zone": node.zone,
            "instance_id": vm[1] if vm else instance_id(node, worker),
            "instance_name": vm[0] if vm else hostname(node, worker),
            "instance_creation_timestamp": int(vm[2] if vm else node.create_time),
        }
        if licenses:
            engine["license_id"] = []
        claims["google"] = {"compute_engine": engine}
    return claims


class IdentitySigner:
    """The simulator's signing key: one per process, made when the simulator starts.

    `wall_clock` must be real time: google-auth checks iat and exp against the verifier's clock.
    """

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID
        from google.auth import crypt

        key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
        public_der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.key_id = hashlib.sha1(public_der).hexdigest()  # 40 hex digits, as Google's kids look
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpujobs-simulator-identity")])
        start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256())
        )
        self._certificate_pem = certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")
        private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._signer = crypt.RSASigner.from_string(private_pem, key_id=self.key_id)
        self._wall_clock = wall_clock

    def certs(self) -> dict[str, str]:
        """Google's v1 certificate document: key id to X.509 PEM."""
        return {self.key_id: self._certificate_pem}

    def now(self) -> float:
        return self._wall_clock()

    def sign(self, claims: Mapping[str, Any]) -> str:
        """An RS256 JWT of `claims` whose header names this key."""
        from google.auth import jwt

        return jwt.encode(self._signer, dict(claims)).decode("ascii")
