"""Certificates for the PMEM-CSI driver's mutual-TLS gRPC links: generation and validation.

The controller ("registry") and every node ("node controller") authenticate each other with
certificates issued by one private CA. The reference operator (intel/pmem-csi d01bc59,
``pkg/pmem-csi-operator/pmem-tls``) generated them itself, or validated user-supplied ones by
running a real mutual-TLS handshake. This module does both for the Pulumi program and for the
reporter.

It deliberately imports neither pulumi nor anything Kubernetes: the reporter imports it, and it
must stay usable in a process that has only ``cryptography`` and the standard library.

Key material rule: private keys never appear in messages, exception texts or logs produced
here. Parse errors are reported with fixed sentences, not with the underlying exception text.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import secrets
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names the driver checks: the node side dials the registry expecting "pmem-registry", the
# registry requires client certificates for "pmem-node-controller" (pkg/pmem-grpc).
REGISTRY_NAME = "pmem-registry"
NODE_CONTROLLER_NAME = "pmem-node-controller"
CA_COMMON_NAME = "pmem-csi-ca"
CA_DNS_NAMES = ("pmem-csi", "ca")

# The reference used RSA-3072 for every key and one year of validity for CA and leaves.
RSA_KEY_SIZE = 3072
# Smallest RSA key accepted in provided certificates (OpenSSL's default security level 2).
MIN_RSA_KEY_SIZE = 2048
VALIDITY = dt.timedelta(days=365)
# A generated CA lives this many leaf lifetimes, so that leaves are renewed under the same CA
# (one `pulumi up`, nothing to re-trust) and a CA change, which takes a staged rollout (see
# pmem_components.cert_resource), is needed only every few renewals.
CA_LIFETIME_FACTOR = 3
# Backdating covers nodes whose clocks lag the machine that ran `pulumi up`; the reference
# used "now" and could hand out certificates that were briefly not yet valid elsewhere.
BACKDATE = dt.timedelta(minutes=5)
EXPIRY_WARNING = dt.timedelta(days=30)
HANDSHAKE_MAX_ROUNDS = 50

Severity = Literal["error", "warning"]
FIELDS = ("caCert", "registryCert", "registryKey", "nodeControllerCert", "nodeControllerKey")


# --------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate with its private key (as objects, convertible to PEM)."""

    cert: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def key_pem(self) -> str:
        # PKCS#1 "RSA PRIVATE KEY", exactly what the reference wrote into its secrets.
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ).decode()

    def __repr__(self) -> str:  # never let a debug print show the key
        return f"IssuedCertificate(subject={self.cert.subject.rfc4514_string()!r}, key=<hidden>)"


@dataclass(frozen=True)
class DriverCertificates:
    """PEM strings for one driver deployment; ``ca_key`` is only needed to issue more leaves."""

    ca_cert: str
    ca_key: str
    registry_cert: str
    registry_key: str
    node_controller_cert: str
    node_controller_key: str

    def __repr__(self) -> str:
        return "DriverCertificates(<certificates and keys hidden>)"


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_SIZE)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def generate_ca(
    *, now: dt.datetime | None = None, validity: dt.timedelta = VALIDITY
) -> IssuedCertificate:
    """A self-signed CA like the reference's: CA:TRUE, may sign certificates, one year.

    Its subject carries a random serialNumber besides the common name: during a CA change
    the trust bundle holds two CAs, and distinct subjects leave no chain builder (Go's
    crypto/x509, OpenSSL) a choice between two same-named issuers.
    """
    now = now or _utcnow()
    key = _new_key()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME),
            x509.NameAttribute(NameOID.SERIAL_NUMBER, secrets.token_hex(8)),
        ]
    )
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in CA_DNS_NAMES]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return IssuedCertificate(cert=cert, key=key)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Key usage of our certificates: signing and key exchange; CAs also sign certs and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=True,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def generate_leaf(
    ca: IssuedCertificate,
    common_name: str,
    *,
    now: dt.datetime | None = None,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    validity: dt.timedelta = VALIDITY,
) -> IssuedCertificate:
    """A leaf for ``common_name`` (also its only DNS SAN), usable as TLS server *and* client.

    Both roles are needed: nodes dial the registry, and the controller dials back into the
    nodes' controller servers. The validity never exceeds the CA's, so a leaf cannot outlive
    the trust anchor that vouches for it. ``not_before``/``not_after`` exist for tests.
    """
    now = now or _utcnow()
    key = _new_key()
    public = key.public_key()
    start = not_before or max(now - BACKDATE, ca.cert.not_valid_before_utc)
    end = not_after or min(now + validity, ca.cert.not_valid_after_utc)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return IssuedCertificate(cert=cert, key=key)


def generate_driver_certificates(
    validity: dt.timedelta = VALIDITY, ca_validity: dt.timedelta | None = None
) -> DriverCertificates:
    """A fresh CA plus the registry and node-controller certificates it signed.

    ``validity`` is the leaves' lifetime, ``ca_validity`` the CA's (default: the same, as the
    reference had it); the leaves never outlive the CA (``generate_leaf``).
    """
    ca = generate_ca(validity=ca_validity or validity)
    registry = generate_leaf(ca, REGISTRY_NAME, validity=validity)
    node = generate_leaf(ca, NODE_CONTROLLER_NAME, validity=validity)
    return DriverCertificates(
        ca_cert=ca.cert_pem,
        ca_key=ca.key_pem,
        registry_cert=registry.cert_pem,
        registry_key=registry.key_pem,
        node_controller_cert=node.cert_pem,
        node_controller_key=node.key_pem,
    )


def material_fingerprint(ca_cert: str, registry_cert: str, node_controller_cert: str) -> str:
    """SHA-256 over the public certificate material: changes whenever any of it does.

    The component writes it into the driver pods' templates (so new material rolls them),
    and the certificate provider compares it with the running pods' to tell when a CA
    change may take its next step. Only public material goes in: the private keys change
    together with their certificates, and hashing them would make the pod templates secret
    in Pulumi's eyes.
    """
    digest = hashlib.sha256()
    for pem in (ca_cert, registry_cert, node_controller_cert):
        digest.update(pem.strip().encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def split_pem(pem: str) -> list[str]:
    """The certificates of a PEM bundle, each as its own PEM string (order kept)."""
    return [c.public_bytes(serialization.Encoding.PEM).decode() for c in _load_certs(pem)]


# --------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class CertProblem:
    """One finding about user-supplied certificates.

    ``field`` is the configuration key (caCert, registryCert, ...), ``reason`` a CamelCase
    token for machines (conditions, tests), ``message`` a sentence for humans.
    """

    field: str
    reason: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}: {self.message}"


def _load_certs(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


def _load_key(pem: str) -> PrivateKeyTypes:
    return serialization.load_pem_private_key(pem.encode(), password=None)


def _public_der(obj: x509.Certificate | PrivateKeyTypes) -> bytes:
    public = obj.public_key()
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


def _common_names(cert: x509.Certificate) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]


def _check_validity(
    field: str, cert: x509.Certificate, now: dt.datetime, what: str
) -> list[CertProblem]:
    if now < cert.not_valid_before_utc:
        return [
            CertProblem(
                field,
                "NotYetValid",
                f"{field}: {what} is not valid before {cert.not_valid_before_utc.isoformat()}",
            )
        ]
    if now > cert.not_valid_after_utc:
        return [
            CertProblem(
                field,
                "Expired",
                f"{field}: {what} expired at {cert.not_valid_after_utc.isoformat()}",
            )
        ]
    if cert.not_valid_after_utc - now < EXPIRY_WARNING:
        return [
            CertProblem(
                field,
                "ExpiringSoon",
                f"{field}: {what} expires at {cert.not_valid_after_utc.isoformat()}, "
                f"within {EXPIRY_WARNING.days} days; rotate the certificates",
                "warning",
            )
        ]
    return []


def _check_bundle(
    cas: list[x509.Certificate], now: dt.datetime, what: str
) -> tuple[list[tuple[x509.Certificate, CertProblem]], list[x509.Certificate]]:
    """The validity findings of one ``ca.crt`` (each with its CA), and the CAs in it a chain
    can end at.

    A bundle of several CAs holds the outgoing CA during a CA change, and that one may
    expire before the change completes. Expired (or not yet valid) CAs beside a valid one
    are dead weight, not a fault: chain building (Go's crypto/x509 in the driver, OpenSSL
    here) skips a root outside its validity and ends at another, so the driver works as
    long as the leaves chain to a valid CA. They are warnings then, and leaves are checked
    against the valid CAs only. A bundle with no valid CA left keeps the errors.
    """
    valid = [c for c in cas if c.not_valid_before_utc <= now <= c.not_valid_after_utc]
    if len(cas) < 2 or not valid:
        return [(c, p) for c in cas for p in _check_validity("caCert", c, now, what)], cas
    problems: list[tuple[x509.Certificate, CertProblem]] = []
    for ca in cas:
        if ca in valid:
            problems += [(ca, p) for p in _check_validity("caCert", ca, now, what)]
            continue
        late = now > ca.not_valid_after_utc
        when = (ca.not_valid_after_utc if late else ca.not_valid_before_utc).isoformat()
        problems.append(
            (
                ca,
                CertProblem(
                    "caCert",
                    "ExpiredInBundle" if late else "NotYetValidInBundle",
                    f"caCert: {what} {ca.subject.rfc4514_string()!r} "
                    + (f"expired at {when}" if late else f"is not valid before {when}")
                    + "; chains end at the other CA(s) of the bundle, this one is unused",
                    "warning",
                ),
            )
        )
    return problems, valid


def _check_ca(cas: list[x509.Certificate]) -> list[CertProblem]:
    problems = []
    for ca in cas:
        try:
            bc = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
            is_ca = bc.ca
        except x509.ExtensionNotFound:
            is_ca = False
        try:
            ku = ca.extensions.get_extension_for_class(x509.KeyUsage).value
            can_sign = ku.key_cert_sign
        except x509.ExtensionNotFound:
            can_sign = True  # no KeyUsage extension means no restriction
        if not (is_ca and can_sign):
            problems.append(
                CertProblem(
                    "caCert",
                    "NotACA",
                    f"caCert: certificate {ca.subject.rfc4514_string()!r} is not a CA "
                    "(needs basicConstraints CA:TRUE and keyCertSign)",
                )
            )
    return problems


def _signed_by_any(leaf: x509.Certificate, cas: list[x509.Certificate]) -> bool:
    for ca in cas:
        try:
            leaf.verify_directly_issued_by(ca)
        except Exception:  # wrong issuer name, bad signature, unsupported key: all mean "no"
            continue
        return True
    return False


def _check_leaf(
    field: str,
    cert: x509.Certificate,
    expected_name: str,
    cas: list[x509.Certificate],
    now: dt.datetime,
    *,
    cn_fallback_ok: bool,
) -> list[CertProblem]:
    problems: list[CertProblem] = []
    if cas and not _signed_by_any(cert, cas):
        problems.append(
            CertProblem(
                field,
                "WrongCA",
                f"{field}: certificate is not signed by the certificate(s) in caCert",
            )
        )
    problems += _check_validity(field, cert, now, "certificate")
    dns = _dns_names(cert)
    if expected_name not in dns:
        if expected_name in _common_names(cert) and cn_fallback_ok:
            problems.append(
                CertProblem(
                    field,
                    "CommonNameOnly",
                    f"{field}: {expected_name!r} is only the subject common name; the driver "
                    "still accepts that but it is deprecated, add it as a DNS SAN",
                    "warning",
                )
            )
        else:
            problems.append(
                CertProblem(
                    field,
                    "WrongName",
                    f"{field}: certificate must carry DNS name {expected_name!r} "
                    f"(has SANs {dns or 'none'})",
                )
            )
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        missing = [
            label
            for oid, label in (
                (ExtendedKeyUsageOID.SERVER_AUTH, "serverAuth"),
                (ExtendedKeyUsageOID.CLIENT_AUTH, "clientAuth"),
            )
            if oid not in eku
        ]
    except x509.ExtensionNotFound:
        missing = []  # no EKU extension means any usage
    if missing:
        problems.append(
            CertProblem(
                field,
                "MissingExtendedKeyUsage",
                f"{field}: certificate lacks extended key usage {', '.join(missing)}; the "
                "driver uses each certificate both as TLS server and client",
            )
        )
    return problems


def validate_driver_certificates(
    ca_cert: str,
    registry_cert: str,
    registry_key: str,
    node_controller_cert: str,
    node_controller_key: str,
    *,
    now: dt.datetime | None = None,
    handshake: bool = True,
    node_ca_cert: str | None = None,
) -> list[CertProblem]:
    """Everything wrong with a user-supplied certificate set; empty means usable.

    ``ca_cert`` is what the registry side trusts and ``node_ca_cert`` what the node side
    trusts (default: the same). They differ, legitimately, while a CA change rolls out: one
    Secret already holds the old+new trust bundle, the other still the old CA (an
    interrupted ``pulumi up``), and each may hold one or several CAs. The rule is the
    driver's own: each side verifies its peer's certificate against *its own* ``ca.crt``,
    so the node controller's certificate must chain to ``ca_cert`` and the registry's to
    ``node_ca_cert``; the handshake runs with exactly those trust anchors.

    Static checks (parsing, key/cert match, issuer, validity, names, key usage) run first with
    ``now`` as the clock. Only when none of them found an error is the decisive check run: a
    real mutual-TLS handshake in memory, registry as server requiring a client certificate
    for ``pmem-node-controller``, node controller as client expecting ``pmem-registry`` --
    what the reference operator did before accepting certificates. The handshake runs on the
    real clock (OpenSSL's), not on ``now``; ``handshake=False`` skips it (for "what if" checks
    at another time).
    """
    now = now or _utcnow()
    problems: list[CertProblem] = []

    cas: list[x509.Certificate] = []
    try:
        cas = _load_certs(ca_cert)
    except ValueError:
        problems.append(
            CertProblem("caCert", "InvalidPEM", "caCert: not a PEM-encoded X.509 certificate")
        )
    problems += _check_ca(cas)
    found, usable = _check_bundle(cas, now, "CA certificate")
    problems += [p for _, p in found]
    node_cas, node_usable = cas, usable
    separate = node_ca_cert is not None and node_ca_cert.strip() != ca_cert.strip()
    if separate:
        try:
            node_cas = _load_certs(node_ca_cert or "")
        except ValueError:
            node_cas = []
            problems.append(
                CertProblem(
                    "caCert", "InvalidPEM", "caCert (node side): not a PEM-encoded certificate"
                )
            )
        problems += _check_ca(node_cas)
        seen = {c.fingerprint(hashes.SHA256()) for c in cas}
        found, node_usable = _check_bundle(node_cas, now, "CA certificate (node side)")
        # A CA the registry side holds too was judged above already.
        problems += [p for ca, p in found if ca.fingerprint(hashes.SHA256()) not in seen]

    leaves = (
        ("registryCert", registry_cert, "registryKey", registry_key, REGISTRY_NAME, False),
        (
            "nodeControllerCert",
            node_controller_cert,
            "nodeControllerKey",
            node_controller_key,
            NODE_CONTROLLER_NAME,
            # The registry's own client-name check falls back to the CN (pkg/pmem-grpc); the
            # node side dials with Go's standard verification, which ignores the CN.
            True,
        ),
    )
    # Keys as loaded (and RSA-checked) here, handed to the handshake so it need not load them
    # again: loading an RSA-3072 key with its consistency checks is ~0.15 s, most of the cost.
    loaded: dict[str, PrivateKeyTypes] = {}
    for cert_field, cert_pem, key_field, key_pem, name, cn_ok in leaves:
        cert: x509.Certificate | None = None
        try:
            cert = _load_certs(cert_pem)[0]
        except ValueError:
            problems.append(
                CertProblem(
                    cert_field, "InvalidPEM", f"{cert_field}: not a PEM-encoded X.509 certificate"
                )
            )
        key: PrivateKeyTypes | None = None
        try:
            key = _load_key(key_pem)
        except TypeError:
            problems.append(
                CertProblem(
                    key_field,
                    "EncryptedKey",
                    f"{key_field}: private key is password-protected; the driver needs it "
                    "unencrypted",
                )
            )
        except Exception:  # ValueError and friends; never echo parser details for keys
            problems.append(
                CertProblem(key_field, "InvalidPEM", f"{key_field}: not a PEM-encoded private key")
            )
        if key is not None and not isinstance(
            key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
        ):
            problems.append(
                CertProblem(
                    key_field,
                    "UnsupportedKeyType",
                    f"{key_field}: key type {type(key).__name__} is not usable by the driver",
                )
            )
            key = None
        if isinstance(key, rsa.RSAPrivateKey) and key.key_size < MIN_RSA_KEY_SIZE:
            # Said here rather than left to the handshake, whose verdict (EE_KEY_TOO_SMALL)
            # depends on the host's OpenSSL security level and names no setting clearly.
            problems.append(
                CertProblem(
                    key_field,
                    "KeyTooSmall",
                    f"{key_field}: RSA key of {key.key_size} bits is too small; use at least "
                    f"{MIN_RSA_KEY_SIZE} bits",
                )
            )
        if key is not None:
            loaded[key_field] = key
        if cert is None:
            continue
        if key is not None and _public_der(key) != _public_der(cert):
            problems.append(
                CertProblem(
                    key_field,
                    "KeyMismatch",
                    f"{key_field}: private key does not belong to the certificate in {cert_field}",
                )
            )
        # The driver checks a certificate only against the *peer's* ca.crt: the node
        # controller's against the registry Secret's, the registry's against the node
        # Secret's. With two ca.crt, the registry's certificate is checked against the node
        # side's alone (CAMismatch below), not against its own Secret's.
        own_side = [] if separate and cert_field == "registryCert" else usable
        problems += _check_leaf(cert_field, cert, name, own_side, now, cn_fallback_ok=cn_ok)
        node_side_rejects = separate and node_cas and not _signed_by_any(cert, node_usable)
        if cert_field == "registryCert" and node_side_rejects:
            problems.append(
                CertProblem(
                    "caCert",
                    "CAMismatch",
                    "registryCert: certificate is not signed by any CA in the node side's "
                    "ca.crt, so the node drivers reject the registry",
                )
            )

    if handshake and not any(p.severity == "error" for p in problems):
        reg_key, node_key = loaded.get("registryKey"), loaded.get("nodeControllerKey")
        problems += check_mutual_tls(
            ca_cert,
            registry_cert,
            registry_key,
            node_controller_cert,
            node_controller_key,
            loaded_keys=(reg_key, node_key) if reg_key and node_key else None,
            client_ca_cert=node_ca_cert if separate else None,
        )
    return problems


# --------------------------------------------------------------------------------------------
# Mutual-TLS handshake


def _memfd_chain(chain: bytes) -> int | None:
    """An anonymous in-memory file holding ``chain``, or None where the kernel offers none.

    ``memfd_create`` needs no writable directory: the reporter's container has a read-only
    root filesystem and no /tmp, and a temporary file there fails every verdict. The file
    exists only as this descriptor (close-on-exec, so no child inherits it) and is gone
    when it is closed.
    """
    create = getattr(os, "memfd_create", None)
    if create is None:
        return None
    try:
        fd = create("pmem-csi-cert-chain", os.MFD_CLOEXEC)
    except OSError:  # ENOSYS / EPERM under a seccomp filter: fall back to a file
        return None
    try:
        view = memoryview(chain)
        while view:
            view = view[os.write(fd, view) :]
        if not os.path.exists(_fd_path(fd)):  # no /proc: OpenSSL could not open it
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


@contextmanager
def _cert_chain_file(
    cert_pem: str, key_pem: str, key: PrivateKeyTypes | None = None
) -> Iterator[tuple[str, bytes | None]]:
    """A path holding cert+key for ``SSLContext.load_cert_chain``, which only reads paths.

    On Linux the path is ``/proc/self/fd/N`` of an in-memory file (see ``_memfd_chain``), so
    the check works with a read-only root filesystem and writes nothing anywhere; the key
    never leaves process memory, so it is not encrypted there. Only where memfd is missing
    (other systems, or a kernel that forbids it) is a temporary file used: the key is then
    re-encrypted with a random one-time password, in a private (0700) directory removed
    right after.
    """
    if key is None:
        key = _load_key(key_pem)
    head = cert_pem.encode().rstrip(b"\n") + b"\n"
    fd = _memfd_chain(
        head
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    if fd is not None:
        try:
            yield _fd_path(fd), None
        finally:
            os.close(fd)
        return
    password = secrets.token_bytes(32)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password),
    )
    with tempfile.TemporaryDirectory(prefix="pmem-csi-certs-") as tmp:
        path = os.path.join(tmp, "chain.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(head + encrypted)
        yield path, password


def _context(
    side: int, ca_pem: str, cert_pem: str, key_pem: str, key: PrivateKeyTypes | None = None
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(side)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # as the driver (pkg/pmem-grpc)
    ctx.load_verify_locations(cadata=ca_pem)
    with _cert_chain_file(cert_pem, key_pem, key) as (path, password):
        ctx.load_cert_chain(path, password=password)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _pump(src: ssl.MemoryBIO, dst: ssl.MemoryBIO) -> bool:
    data = src.read()
    if data:
        dst.write(data)
    return bool(data)


def _step(obj: ssl.SSLObject) -> bool:
    """One handshake step; True once this side finished."""
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        return False
    return True


def check_mutual_tls(
    ca_cert: str,
    registry_cert: str,
    registry_key: str,
    node_controller_cert: str,
    node_controller_key: str,
    *,
    loaded_keys: tuple[PrivateKeyTypes, PrivateKeyTypes] | None = None,
    client_ca_cert: str | None = None,
) -> list[CertProblem]:
    """Run a real TLS handshake between registry (server) and node controller (client).

    ``client_ca_cert`` is what the node controller trusts when it is not ``ca_cert`` (the
    registry's): two Secrets of adjacent generations during a CA change.

    Both ends live in this process and exchange bytes through ``ssl.MemoryBIO`` buffers, so
    no socket, thread or timeout is involved; a round limit stops a stuck exchange. Each side
    verifies the other against ``ca_cert``: the client checks the server name
    ``pmem-registry`` (OpenSSL hostname check, SAN only, like Go), the server requires a
    client certificate and then checks it names ``pmem-node-controller`` (SAN, or CN as the
    driver's fallback). One direction suffices because the link is mutual.

    ``loaded_keys`` (registry, node controller) are the same two keys already parsed by the
    caller (``validate_driver_certificates``); passing them saves parsing each RSA key a
    second time, which is most of this function's cost.
    """
    reg_key, node_key = loaded_keys or (None, None)
    try:
        server_ctx = _context(
            ssl.PROTOCOL_TLS_SERVER, ca_cert, registry_cert, registry_key, reg_key
        )
    except (ssl.SSLError, ValueError, TypeError) as e:
        return [_handshake_problem("registryCert", "cannot load registry certificate/key", e)]
    try:
        client_ctx = _context(
            ssl.PROTOCOL_TLS_CLIENT,
            client_ca_cert or ca_cert,
            node_controller_cert,
            node_controller_key,
            node_key,
        )
    except (ssl.SSLError, ValueError, TypeError) as e:
        return [
            _handshake_problem(
                "nodeControllerCert", "cannot load node-controller certificate/key", e
            )
        ]
    client_ctx.check_hostname = True

    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False, server_hostname=REGISTRY_NAME)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)

    client_done = server_done = False
    for _ in range(HANDSHAKE_MAX_ROUNDS):
        if not client_done:
            try:
                client_done = _step(client)
            except ssl.SSLError as e:
                # The client rejected the server's certificate (or the server's alert).
                return [_handshake_problem("registryCert", "node controller rejected", e)]
        moved = _pump(c_out, s_in)
        if not server_done:
            try:
                server_done = _step(server)
            except ssl.SSLError as e:
                return [_handshake_problem("nodeControllerCert", "registry rejected", e)]
        moved = _pump(s_out, c_in) or moved
        if client_done and server_done:
            break
        if not moved and client_done:
            # TLS 1.3: the client finishes first; give the server the rounds to catch up.
            continue
    else:
        return [
            CertProblem(
                "registryCert",
                "HandshakeFailed",
                "registryCert/nodeControllerCert: TLS handshake did not complete",
            )
        ]
    # TLS 1.3 lets the client finish before the server has judged the client certificate;
    # the server side raised above in that case, so reaching here means both accepted.
    peer = server.getpeercert()
    names = [v for k, v in peer.get("subjectAltName", ()) if k == "DNS"]
    cns = [v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"]
    if NODE_CONTROLLER_NAME not in names and NODE_CONTROLLER_NAME not in cns:
        return [
            CertProblem(
                "nodeControllerCert",
                "HandshakeFailed",
                f"nodeControllerCert: registry accepted the TLS handshake but the client "
                f"certificate is not for {NODE_CONTROLLER_NAME!r}",
            )
        ]
    return []


def _handshake_problem(field: str, what: str, err: Exception) -> CertProblem:
    # ssl.SSLError texts are OpenSSL reason strings ("certificate verify failed: ..."),
    # never key bytes; other errors are reduced to their type name.
    detail = (
        getattr(err, "verify_message", None) or getattr(err, "reason", None) or type(err).__name__
    )
    return CertProblem(field, "HandshakeFailed", f"{field}: mutual-TLS check: {what}: {detail}")
