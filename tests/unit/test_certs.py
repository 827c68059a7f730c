"""Certificate generation and validation, including the real in-memory mutual-TLS handshake."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from certutil import DAY, NOW, good_set, make_ca, make_leaf, pem_key
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from pmem_components import certs
from pmem_components.certs import NODE_CONTROLLER_NAME, REGISTRY_NAME, CertProblem


def reasons(problems: list[CertProblem]) -> set[tuple[str, str, str]]:
    return {(p.field, p.reason, p.severity) for p in problems}


@pytest.fixture(scope="module")
def generated() -> certs.DriverCertificates:
    return certs.generate_driver_certificates()


# --- generation ------------------------------------------------------------------------------


def test_generated_set_validates_clean(generated: certs.DriverCertificates) -> None:
    d = generated
    problems = certs.validate_driver_certificates(
        d.ca_cert, d.registry_cert, d.registry_key, d.node_controller_cert, d.node_controller_key
    )
    assert problems == []


def test_generated_certificates_match_reference(generated: certs.DriverCertificates) -> None:
    ca = x509.load_pem_x509_certificate(generated.ca_cert.encode())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    for pem, name in (
        (generated.registry_cert, REGISTRY_NAME),
        (generated.node_controller_cert, NODE_CONTROLLER_NAME),
    ):
        leaf = x509.load_pem_x509_certificate(pem.encode())
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [name]
        assert leaf.subject.rfc4514_string() == f"CN={name}"
        assert leaf.issuer == ca.subject
        lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
        assert dt.timedelta(days=364) < lifetime <= dt.timedelta(days=366)
        assert leaf.not_valid_after_utc <= ca.not_valid_after_utc
        assert isinstance(leaf.public_key(), rsa.RSAPublicKey)
        assert leaf.public_key().key_size == 3072
    # PKCS#1, like the reference operator wrote into its secrets.
    assert generated.registry_key.startswith("-----BEGIN RSA PRIVATE KEY-----")


def test_repr_hides_keys(generated: certs.DriverCertificates) -> None:
    assert "PRIVATE" not in repr(generated)
    ca = make_ca()
    assert "PRIVATE" not in repr(ca)


# --- static checks ---------------------------------------------------------------------------


def test_helper_set_is_clean() -> None:
    assert certs.validate_driver_certificates(*good_set().args()) == []


def test_expired() -> None:
    ca = make_ca()
    s = good_set(ca)
    old = make_leaf(ca, REGISTRY_NAME, slot=1, not_before=NOW - 400 * DAY, not_after=NOW - DAY)
    s.registry_cert = old.cert_pem
    problems = certs.validate_driver_certificates(*s.args())
    assert ("registryCert", "Expired", "error") in reasons(problems)
    assert all("registryCert" in p.message for p in problems if p.field == "registryCert")


def test_not_yet_valid() -> None:
    ca = make_ca()
    s = good_set(ca)
    s.node_controller_cert = make_leaf(
        ca, NODE_CONTROLLER_NAME, slot=2, not_before=NOW + DAY, not_after=NOW + 100 * DAY
    ).cert_pem
    assert ("nodeControllerCert", "NotYetValid", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


def test_now_parameter_moves_the_clock() -> None:
    problems = certs.validate_driver_certificates(
        *good_set().args(), now=NOW + 1000 * DAY, handshake=False
    )
    assert {("caCert", "Expired", "error"), ("registryCert", "Expired", "error")} <= reasons(
        problems
    )


def test_expiring_soon_is_a_warning_and_still_handshakes() -> None:
    ca = make_ca()
    s = good_set(ca)
    s.registry_cert = make_leaf(ca, REGISTRY_NAME, slot=1, not_after=NOW + 10 * DAY).cert_pem
    problems = certs.validate_driver_certificates(*s.args())
    assert reasons(problems) == {("registryCert", "ExpiringSoon", "warning")}


def test_wrong_ca() -> None:
    s = good_set()
    other = make_ca(slot=9, cn="other-ca")
    s.node_controller_cert = make_leaf(other, NODE_CONTROLLER_NAME, slot=2).cert_pem
    assert ("nodeControllerCert", "WrongCA", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


def test_same_subject_different_ca_key_is_wrong_ca() -> None:
    """Issuer name alone must not be trusted: the signature decides."""
    s = good_set(make_ca(slot=0, cn="test-ca"))
    impostor = make_ca(slot=9, cn="test-ca")
    s.registry_cert = make_leaf(impostor, REGISTRY_NAME, slot=1).cert_pem
    assert ("registryCert", "WrongCA", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


def test_ca_that_is_not_a_ca() -> None:
    s = good_set()
    s.ca_cert = s.registry_cert
    assert ("caCert", "NotACA", "error") in reasons(
        certs.validate_driver_certificates(*s.args(), handshake=False)
    )


def test_mismatched_key() -> None:
    s = good_set()
    s.registry_key = s.node_controller_key
    problems = certs.validate_driver_certificates(*s.args())
    assert ("registryKey", "KeyMismatch", "error") in reasons(problems)


def test_wrong_name() -> None:
    ca = make_ca()
    s = good_set(ca)
    s.registry_cert = make_leaf(ca, "pmem-registry.example.com", slot=1).cert_pem
    assert ("registryCert", "WrongName", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


def test_node_controller_cn_only_is_a_warning() -> None:
    """The registry's client check falls back to the CN, so this works, but is deprecated."""
    ca = make_ca()
    s = good_set(ca)
    s.node_controller_cert = make_leaf(
        ca, NODE_CONTROLLER_NAME, slot=2, sans=["something-else"]
    ).cert_pem
    assert reasons(certs.validate_driver_certificates(*s.args())) == {
        ("nodeControllerCert", "CommonNameOnly", "warning")
    }


def test_registry_cn_only_is_an_error() -> None:
    """Go clients ignore the CN when checking a server name."""
    ca = make_ca()
    s = good_set(ca)
    s.registry_cert = make_leaf(ca, REGISTRY_NAME, slot=1, sans=["something-else"]).cert_pem
    assert ("registryCert", "WrongName", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


@pytest.mark.parametrize(
    "field",
    [f.name for f in dataclasses.fields(certs.DriverCertificates) if f.name != "ca_key"],
)
def test_garbage_pem(field: str) -> None:
    s = good_set()
    setattr(s, field, "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    config_key = {
        "ca_cert": "caCert",
        "registry_cert": "registryCert",
        "registry_key": "registryKey",
        "node_controller_cert": "nodeControllerCert",
        "node_controller_key": "nodeControllerKey",
    }[field]
    assert (config_key, "InvalidPEM", "error") in reasons(
        certs.validate_driver_certificates(*s.args())
    )


def test_key_material_never_in_messages() -> None:
    s = good_set()
    s.registry_key, s.node_controller_key = s.node_controller_key, s.registry_key
    broken_key = s.registry_key[:200] + "garbage" + s.registry_key[200:]
    problems = certs.validate_driver_certificates(*s.args())
    problems += certs.validate_driver_certificates(
        s.ca_cert, s.registry_cert, broken_key, s.node_controller_cert, s.node_controller_key
    )
    assert problems
    for p in problems:
        for secret in (s.registry_key, s.node_controller_key, broken_key):
            body = secret.splitlines()[3]
            assert body not in p.message
        assert "PRIVATE KEY" not in p.message


# --- handshake -------------------------------------------------------------------------------


def test_handshake_passes_for_good_set() -> None:
    assert certs.check_mutual_tls(*good_set().args()) == []


def test_handshake_fails_when_ca_is_wrong() -> None:
    s = good_set()
    s.ca_cert = make_ca(slot=9, cn="other-ca").cert_pem
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("registryCert", "HandshakeFailed")]
    assert "issuer" in problems[0].message or "verify" in problems[0].message


def test_handshake_fails_when_client_is_from_another_ca() -> None:
    s = good_set()
    other = make_ca(slot=9, cn="other-ca")
    node = make_leaf(other, NODE_CONTROLLER_NAME, slot=2)
    s.node_controller_cert, s.node_controller_key = node.cert_pem, pem_key(node.key)
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("nodeControllerCert", "HandshakeFailed")]


def test_handshake_checks_server_name() -> None:
    s = good_set()
    s.registry_cert, s.registry_key = s.node_controller_cert, s.node_controller_key
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("registryCert", "HandshakeFailed")]


def test_handshake_checks_client_name() -> None:
    s = good_set()
    s.node_controller_cert, s.node_controller_key = s.registry_cert, s.registry_key
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("nodeControllerCert", "HandshakeFailed")]


def test_validation_skips_handshake_after_static_errors() -> None:
    s = good_set()
    s.registry_key = s.node_controller_key
    problems = certs.validate_driver_certificates(*s.args())
    assert "HandshakeFailed" not in {p.reason for p in problems}


def test_handshake_reports_unloadable_input_instead_of_raising() -> None:
    s = good_set()
    s.registry_key = "not a key"
    problems = certs.check_mutual_tls(*s.args())
    assert [(p.field, p.reason) for p in problems] == [("registryCert", "HandshakeFailed")]


def test_module_does_not_import_pulumi() -> None:
    """The reporter imports certs and must not need the Pulumi SDK."""
    code = "import sys, pmem_components.certs; print('pulumi' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "False"
