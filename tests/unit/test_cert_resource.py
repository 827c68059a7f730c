"""DriverCertificates wiring under Pulumi mocks, and the dynamic provider's methods directly.

The provider is exercised here without an engine (create/diff/update/read and a dill round
trip like the one ``pulumi-resource-pulumi-python`` performs); the end-to-end run against the
real engine lives in tests/e2e.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest
from certutil import NOW, make_leaf
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.mocks import MockMonitor
from pulumi_mocks import RecordingMocks

from pmem_components import cert_resource, certs
from pmem_components.cert_resource import (
    CertificateProvider,
    DriverCertificates,
    ProvidedCertificates,
)

PROJECT_DIR = Path(__file__).resolve().parents[2]
FAKE = {
    "ca_cert": "CA-PEM",
    "registry_cert": "REG-PEM",
    "registry_key": "REG-KEY",
    "node_controller_cert": "NODE-PEM",
    "node_controller_key": "NODE-KEY",
}


class Mocks(RecordingMocks):
    def __init__(self) -> None:
        super().__init__(FAKE)


class RecordingMonitor(MockMonitor):
    """Remembers ``additionalSecretOutputs`` per registered type, which Mocks cannot see."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.secret_outputs: dict[str, list[str]] = {}

    def RegisterResource(self, request: Any) -> Any:  # the gRPC method name
        self.secret_outputs[request.type] = list(request.additionalSecretOutputs)
        return super().RegisterResource(request)


@pytest.fixture
def mocks() -> tuple[Mocks, RecordingMonitor]:
    m = Mocks()
    monitor = RecordingMonitor(m)
    pulumi.runtime.set_mocks(m, preview=False, monitor=monitor)
    return m, monitor


def _resolve(*outputs: pulumi.Output[Any]) -> pulumi.Output[list[tuple[Any, bool]]]:
    """Each output's value together with its secretness."""

    async def pair(o: pulumi.Output[Any]) -> tuple[Any, bool]:
        return await o.future(), await o.is_secret()

    return pulumi.Output.from_input(
        asyncio.ensure_future(asyncio.gather(*(pair(o) for o in outputs)))
    )


@pulumi.runtime.test
def test_generated_set_is_wired_and_keys_are_secret(mocks: tuple[Mocks, RecordingMonitor]) -> None:
    m, monitor = mocks
    dc = DriverCertificates("pmem", rotation="r1")
    assert dc.generated

    def check(values: list[tuple[Any, bool]]) -> None:
        (ca, ca_s), (rc, rc_s), (rk, rk_s), (nc, nc_s), (nk, nk_s), _urn = values
        assert (ca, rc, nc) == ("CA-PEM", "REG-PEM", "NODE-PEM")
        assert (rk, nk) == ("REG-KEY", "NODE-KEY")
        assert not (ca_s or rc_s or nc_s)
        assert rk_s and nk_s
        types = {r.typ: r for r in m.resources}
        assert set(types) == {
            cert_resource.COMPONENT_TYPE,
            "pulumi-python:dynamic/pmem-csi:Certificates",
        }
        dyn = types["pulumi-python:dynamic/pmem-csi:Certificates"]
        assert dyn.name == "pmem-generated"
        assert dyn.inputs["rotation"] == "r1"
        assert "__provider" in dyn.inputs
        assert sorted(monitor.secret_outputs[dyn.typ]) == [
            "issuer_key",
            "node_controller_key",
            "registry_key",
        ]

    return _resolve(
        dc.ca_cert,
        dc.registry_cert,
        dc.registry_key,
        dc.node_controller_cert,
        dc.node_controller_key,
        dc.urn,  # wait for the component's own registration too
    ).apply(check)


@pulumi.runtime.test
def test_provided_set_registers_no_generator(mocks: tuple[Mocks, RecordingMonitor]) -> None:
    m, _ = mocks
    provided = ProvidedCertificates(
        ca_cert="ca",
        registry_cert="rc",
        registry_key="rk",  # plain on purpose: the component must make it secret
        node_controller_cert="nc",
        node_controller_key=pulumi.Output.secret("nk"),
    )
    dc = DriverCertificates("pmem", provided)
    assert not dc.generated
    assert "rk" not in repr(provided)

    def check(values: list[tuple[Any, bool]]) -> None:
        assert values[:5] == [
            ("ca", False),
            ("rc", False),
            ("rk", True),
            ("nc", False),
            ("nk", True),
        ]
        assert [r.typ for r in m.resources] == [cert_resource.COMPONENT_TYPE]

    return _resolve(
        dc.ca_cert,
        dc.registry_cert,
        dc.registry_key,
        dc.node_controller_cert,
        dc.node_controller_key,
        dc.urn,  # wait for the component's own registration too
    ).apply(check)


# --- the provider itself ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def created() -> pulumi.dynamic.CreateResult:
    return CertificateProvider().create({"rotation": "", "renewWithinDays": 0})


def test_create_generates_a_valid_set_and_keeps_the_ca_key(
    created: pulumi.dynamic.CreateResult,
) -> None:
    outs = created.outs
    assert outs is not None
    assert set(outs) == {
        "rotation",
        "renewWithinDays",
        "validityDays",
        "phase",
        "issuer_cert",
        "issuer_key",
        *FAKE,
    }
    problems = certs.validate_driver_certificates(
        outs["ca_cert"],
        outs["registry_cert"],
        outs["registry_key"],
        outs["node_controller_cert"],
        outs["node_controller_key"],
    )
    assert problems == []
    assert created.id


def test_diff_is_stable(created: pulumi.dynamic.CreateResult) -> None:
    olds = dict(created.outs or {})
    result = CertificateProvider().diff(created.id, olds, {"rotation": "", "renewWithinDays": 0})
    assert result.changes is False
    assert not result.replaces


def test_rotation_is_an_update_never_a_replacement(created: pulumi.dynamic.CreateResult) -> None:
    """A replacement of the set would replace the Secrets built from it (delete, create)."""
    olds = dict(created.outs or {})
    result = CertificateProvider().diff(created.id, olds, {"rotation": "2", "renewWithinDays": 0})
    assert result.changes is True
    assert not result.replaces
    updated = CertificateProvider().update(created.id, olds, {"rotation": "2"})
    assert updated.outs is not None
    # Stage 1 of the CA change: the old CA stays trusted next to the new one.
    assert olds["ca_cert"].strip() in updated.outs["ca_cert"]
    assert len(x509.load_pem_x509_certificates(updated.outs["ca_cert"].encode())) == 2


def test_renewal_only_near_expiry_and_in_place_under_the_same_ca(
    created: pulumi.dynamic.CreateResult,
) -> None:
    olds = dict(created.outs or {})
    fresh = CertificateProvider().diff(created.id, olds, {"rotation": "", "renewWithinDays": 30})
    assert not fresh.replaces  # one year left
    assert fresh.changes is True  # only the setting changes, in place
    # A leaf expiring in 5 days, from the stored CA (the state keeps its key).
    issuer = certs.IssuedCertificate(
        cert=x509.load_pem_x509_certificate(olds["ca_cert"].encode()),
        key=serialization.load_pem_private_key(olds["issuer_key"].encode(), password=None),  # type: ignore[arg-type]
    )
    olds["registry_cert"] = make_leaf(
        issuer, certs.REGISTRY_NAME, slot=1, not_after=NOW + dt.timedelta(days=5)
    ).cert_pem
    news = {"rotation": "", "renewWithinDays": 30}
    due = CertificateProvider().diff(created.id, olds, news)
    assert due.changes is True and not due.replaces
    renewed = CertificateProvider().update(created.id, olds, news).outs or {}
    assert renewed["ca_cert"] == olds["ca_cert"]
    leaf = x509.load_pem_x509_certificate(renewed["registry_cert"].encode())
    assert leaf.not_valid_after_utc > NOW + dt.timedelta(days=300)
    leaf.verify_directly_issued_by(issuer.cert)


def test_update_and_read_keep_certificates(created: pulumi.dynamic.CreateResult) -> None:
    olds = dict(created.outs or {})
    updated = CertificateProvider().update(created.id, olds, {"renewWithinDays": 14})
    assert updated.outs is not None
    assert updated.outs["renewWithinDays"] == 14
    assert updated.outs["registry_key"] == olds["registry_key"]
    read = CertificateProvider().read(created.id, olds)
    assert read.outs == olds and read.id == created.id


def test_provider_unpickles_in_a_fresh_process() -> None:
    """What pulumi-resource-pulumi-python does: dill-load the provider by module reference."""
    blob = serialize_provider(CertificateProvider())
    assert b"pmem_components.cert_resource" in base64.b64decode(blob)
    code = (
        "import base64, sys, dill\n"
        "p = dill.loads(base64.b64decode(sys.stdin.read()))\n"
        "print(type(p).__module__, type(p).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=blob,
        capture_output=True,
        text=True,
        cwd=PROJECT_DIR,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "pmem_components.cert_resource CertificateProvider"
