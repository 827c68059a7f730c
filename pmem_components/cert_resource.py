"""Driver certificates as Pulumi resources: generated once, stable, keys only as secrets.

The operator generated the CA and the two leaf certificates when it first saw a Deployment
and then kept them in Kubernetes Secrets. Pulumi programs are re-run on every ``pulumi up``,
so generating in the program itself would mint new keys each time and restart every driver
pod. Instead a dynamic provider generates them in ``create`` and its ``diff`` reports no
change, so the engine keeps the stored values until the stack config asks for a rotation
(the ``rotation`` input changes) or, if enabled, until the leaves near their expiry.

Secrets: the provider returns the keys as plain values over the provider protocol (dynamic
providers do not accept secret-wrapped results), and the resource lists them in
``additional_secret_outputs``, so the engine encrypts them in the state before they are
written and hands them to the program as secret Outputs. The component re-wraps them with
``Output.secret`` so they stay secret even if the wiring changes, e.g. under test mocks.

The CA private key is dropped, as the reference operator did after issuing the leaves. With
equal CA and leaf lifetimes it could only re-issue leaves that expire together with the CA
anyway, so rotation means a whole new set; and a key that can mint identities the driver
trusts is then not sitting in the state.

Dynamic providers run in a separate process (``pulumi-resource-pulumi-python``) that unpickles
the provider with dill. The provider class therefore lives at module level in this importable
module and holds no state: pickling stores a reference to ``pmem_components.cert_resource``,
which that process must be able to import (it runs in the project directory).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic
from cryptography import x509

from pmem_components import certs

COMPONENT_TYPE = "pmem-csi:index:DriverCertificates"

# Output names of the dynamic resource; the last two are never shown in plaintext.
PUBLIC_OUTPUTS = ("ca_cert", "registry_cert", "node_controller_cert")
SECRET_OUTPUTS = ("registry_key", "node_controller_key")


def _renewal_due(olds: dict[str, Any], within_days: Any, now: dt.datetime) -> bool:
    """True when a stored leaf (or the CA) expires within ``within_days`` days."""
    if not isinstance(within_days, int | float) or within_days <= 0:
        return False
    horizon = now + dt.timedelta(days=float(within_days))
    for key in PUBLIC_OUTPUTS:
        pem = olds.get(key)
        if not isinstance(pem, str):
            continue
        try:
            cert = x509.load_pem_x509_certificate(pem.encode())
        except ValueError:
            return True  # unreadable state: replacing it is the only repair
        if cert.not_valid_after_utc <= horizon:
            return True
    return False


class CertificateProvider(pulumi.dynamic.ResourceProvider):
    """Creates a driver certificate set once and never updates it in place.

    Inputs: ``rotation`` (any string; changing it replaces the set) and ``renewWithinDays``
    (0 = never; otherwise ``pulumi up`` replaces the set once a certificate expires within
    that many days). Both are plain, non-secret values.
    """

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        validity = props.get("validityDays")
        if isinstance(validity, int | float) and validity > 0:
            generated = certs.generate_driver_certificates(dt.timedelta(days=float(validity)))
        else:
            generated = certs.generate_driver_certificates()
        ca = x509.load_pem_x509_certificate(generated.ca_cert.encode())
        outs = {
            "rotation": props.get("rotation", ""),
            "renewWithinDays": props.get("renewWithinDays", 0),
            "validityDays": props.get("validityDays", 0),
            "ca_cert": generated.ca_cert,
            "registry_cert": generated.registry_cert,
            "registry_key": generated.registry_key,
            "node_controller_cert": generated.node_controller_cert,
            "node_controller_key": generated.node_controller_key,
        }
        # The CA's serial number identifies the set and changes with every rotation.
        return pulumi.dynamic.CreateResult(id_=f"{ca.serial_number:x}", outs=outs)

    def diff(
        self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]
    ) -> pulumi.dynamic.DiffResult:
        replaces = []
        if _olds.get("rotation", "") != _news.get("rotation", ""):
            replaces.append("rotation")
        if _renewal_due(_olds, _news.get("renewWithinDays"), dt.datetime.now(dt.UTC)):
            replaces.append("renewWithinDays")
        if replaces:
            # Create the new set before deleting the old one (there is nothing to delete
            # outside Pulumi's state), so Secrets that depend on it are updated, not removed.
            return pulumi.dynamic.DiffResult(
                changes=True, replaces=replaces, delete_before_replace=False
            )
        changed = any(
            _olds.get(k, 0) != _news.get(k, 0) for k in ("renewWithinDays", "validityDays")
        )
        return pulumi.dynamic.DiffResult(changes=changed, replaces=[])

    def update(
        self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]
    ) -> pulumi.dynamic.UpdateResult:
        """Only the settings change in place; the certificates never do (a new validity
        applies from the next renewal or rotation on)."""
        outs = dict(_olds)
        outs["renewWithinDays"] = _news.get("renewWithinDays", 0)
        outs["validityDays"] = _news.get("validityDays", 0)
        return pulumi.dynamic.UpdateResult(outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """Refresh keeps the stored set: it exists nowhere but in the state."""
        return pulumi.dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing outside the state to remove."""


class GeneratedCertificates(pulumi.dynamic.Resource, module="pmem-csi", name="Certificates"):
    """The dynamic resource holding one generated set.

    Its type token is ``pulumi-python:dynamic/pmem-csi:Certificates``.
    """

    ca_cert: pulumi.Output[str]
    registry_cert: pulumi.Output[str]
    registry_key: pulumi.Output[str]
    node_controller_cert: pulumi.Output[str]
    node_controller_key: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        rotation: pulumi.Input[str] = "",
        renew_within_days: pulumi.Input[int] = 0,
        validity_days: pulumi.Input[int] = 0,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        secret_opts = pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_OUTPUTS))
        props: dict[str, Any] = {
            "rotation": rotation,
            "renewWithinDays": renew_within_days,
            "validityDays": validity_days,
            **dict.fromkeys(PUBLIC_OUTPUTS + SECRET_OUTPUTS),
        }
        super().__init__(
            CertificateProvider(),
            name,
            props,
            pulumi.ResourceOptions.merge(opts, secret_opts),
        )


@dataclass(frozen=True)
class ProvidedCertificates:
    """User-supplied PEMs from the stack config.

    The program validates them with ``certs.validate_driver_certificates`` first; this
    component only wires them through and marks the keys secret.
    """

    ca_cert: pulumi.Input[str]
    registry_cert: pulumi.Input[str]
    registry_key: pulumi.Input[str]
    node_controller_cert: pulumi.Input[str]
    node_controller_key: pulumi.Input[str]

    def __repr__(self) -> str:
        return "ProvidedCertificates(<hidden>)"


class DriverCertificates(pulumi.ComponentResource):
    """The certificate set of one driver deployment, provided or generated.

    Outputs: ``ca_cert``, ``registry_cert``, ``node_controller_cert`` (public) and
    ``registry_key``, ``node_controller_key`` (always secret). ``generated`` tells whether
    this stack owns the set (and so whether ``rotation`` has any effect).
    """

    ca_cert: pulumi.Output[str]
    registry_cert: pulumi.Output[str]
    registry_key: pulumi.Output[str]
    node_controller_cert: pulumi.Output[str]
    node_controller_key: pulumi.Output[str]
    generated: bool

    def __init__(
        self,
        name: str,
        provided: ProvidedCertificates | None = None,
        *,
        rotation: pulumi.Input[str] = "",
        renew_within_days: pulumi.Input[int] = 0,
        validity_days: pulumi.Input[int] = 0,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.generated = provided is None
        source: Any
        if provided is None:
            source = GeneratedCertificates(
                f"{name}-generated",
                rotation=rotation,
                renew_within_days=renew_within_days,
                validity_days=validity_days,
                opts=pulumi.ResourceOptions(parent=self),
            )
        else:
            source = provided
        self.ca_cert = pulumi.Output.from_input(source.ca_cert)
        self.registry_cert = pulumi.Output.from_input(source.registry_cert)
        self.node_controller_cert = pulumi.Output.from_input(source.node_controller_cert)
        self.registry_key = pulumi.Output.secret(source.registry_key)
        self.node_controller_key = pulumi.Output.secret(source.node_controller_key)
        self.register_outputs(
            {
                "ca_cert": self.ca_cert,
                "registry_cert": self.registry_cert,
                "registry_key": self.registry_key,
                "node_controller_cert": self.node_controller_cert,
                "node_controller_key": self.node_controller_key,
            }
        )
