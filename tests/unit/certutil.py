"""Build deliberately broken certificates for the certificate tests, in memory.

Nothing is checked in: every test certificate is minted here with ``cryptography``. Keys are
RSA-2048 (fast, still accepted by OpenSSL's default security level) and cached per process,
because key generation dominates the runtime of these tests.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pmem_components.certs import NODE_CONTROLLER_NAME, REGISTRY_NAME, IssuedCertificate

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)
# The certificate resource's settings of the rollover tests' first set (``gen0`` in
# conftest.py): 10-day leaves under a 30-day CA.
FIRST_SETTINGS = {"rotation": "", "renewWithinDays": 5, "validityDays": 10}


def pem_certs(pem: str) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order."""
    return x509.load_pem_x509_certificates(pem.encode())


@functools.cache
def key(slot: int) -> rsa.RSAPrivateKey:
    """A reusable key; ``slot`` keeps distinct roles on distinct keys."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def make_ca(
    slot: int = 0,
    *,
    cn: str = "test-ca",
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> IssuedCertificate:
    k = key(slot)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(k.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - DAY)
        .not_valid_after(not_after or NOW + 365 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(k, hashes.SHA256())
    )
    return IssuedCertificate(cert=cert, key=k)


def make_leaf(
    ca: IssuedCertificate,
    name: str,
    *,
    slot: int,
    sans: list[str] | None = None,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    leaf_key: rsa.RSAPrivateKey | None = None,
) -> IssuedCertificate:
    k = leaf_key or key(slot)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(k.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or NOW - DAY)
        .not_valid_after(not_after or NOW + 300 * DAY)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in (sans or [name])]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return IssuedCertificate(cert=cert, key=k)


@dataclass
class CertSet:
    """The five PEM inputs of ``validate_driver_certificates``, easy to tamper with."""

    ca_cert: str
    registry_cert: str
    registry_key: str
    node_controller_cert: str
    node_controller_key: str

    def args(self) -> tuple[str, str, str, str, str]:
        return (
            self.ca_cert,
            self.registry_cert,
            self.registry_key,
            self.node_controller_cert,
            self.node_controller_key,
        )


def pem_key(k: rsa.RSAPrivateKey) -> str:
    return k.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def good_set(ca: IssuedCertificate | None = None) -> CertSet:
    ca = ca or make_ca()
    reg = make_leaf(ca, REGISTRY_NAME, slot=1)
    node = make_leaf(ca, NODE_CONTROLLER_NAME, slot=2)
    return CertSet(ca.cert_pem, reg.cert_pem, pem_key(reg.key), node.cert_pem, pem_key(node.key))
