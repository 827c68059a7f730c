"""Driver certificates as Pulumi resources: generated once, renewed in place, keys only as secrets.

The operator generated the CA and the two leaf certificates when it first saw a Deployment
and then kept them in Kubernetes Secrets. Pulumi programs are re-run on every ``pulumi up``,
so generating in the program itself would mint new keys each time and restart every driver
pod. Instead a dynamic provider generates them in ``create`` and its ``diff`` reports no
change until a renewal or a step of a CA change is due. The resource is never replaced: every
change is an ``update`` of the same resource, so the Secrets built from it are updated in
place too (with the Kubernetes provider's ``enableSecretMutable``, see Pulumi.yaml), never
deleted and re-created.

Renewal and rotation without an outage. The driver loads its certificate, key and trust
bundle (``ca.crt``, any number of CAs) when a container starts, and each side of a link
verifies the peer against its own ``ca.crt``. Any two pods that can run at the same time
(during a rollout, or because an interrupted ``pulumi up`` updated the Secrets but not yet
the pods, or the reverse) must accept each other. So:

* Leaves near expiry are renewed under the same CA (its key stays in the state, as a Pulumi
  secret): old and new pods trust that CA, one ``pulumi up`` suffices.
* A CA change (``rotation`` changed, the CA within ``renewWithinDays`` of expiry, or a stack
  created before the CA key was kept) is the standard staged one, each stage one ``update``:

  1. ``trust``: ``ca.crt`` becomes old CA + new CA; the leaves stay the old CA's. Every pod
     presents a leaf of the old CA, which every pod trusts.
  2. ``switch``: new leaves from the new CA. Pods of stage 1 and 2 trust both CAs.
  3. ``stable``: the old CA leaves the bundle. Pods of stage 2 and 3 present leaves of the new
     CA, which both trust.

  A stage follows the previous one only when every driver pod in the cluster runs the
  previous stage's material: the program reads the pods' certificate fingerprint
  (``runningFingerprints``) before the update, so pods of non-adjacent stages never meet,
  whatever was interrupted. Without that reading (preflight off, ``renderYamlToDirectory``,
  library use without ``running_certificates``) the change waits at its stage until the
  administrator confirms the stage's hash (``certificates.rolledOut``, checked against the
  stored set, so a stale value moves nothing); the warning of each ``up`` says so. A stage whose
  material is already dead (the old leaves or the old CA expired) is not waited for: nothing
  trusted is left to keep. The ``rotation`` value is recorded when a change starts; changing
  it again meanwhile starts another change after this one.

Secrets: the provider returns the keys as plain values over the provider protocol (dynamic
providers do not accept secret-wrapped results), and the resource lists them in
``additional_secret_outputs``, so the engine encrypts them in the state before they are
written and hands them to the program as secret Outputs. The component re-wraps them with
``Output.secret`` so they stay secret even if the wiring changes, e.g. under test mocks.

Dynamic providers run in a separate process (``pulumi-resource-pulumi-python``) that unpickles
the provider with dill. The provider class therefore lives at module level in this importable
module and holds no state: pickling stores a reference to ``pmem_components.cert_resource``,
which that process must be able to import (it runs in the project directory).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from pmem_components import certs

COMPONENT_TYPE = "pmem-csi:index:DriverCertificates"

# Output names of the dynamic resource; the secret ones are never shown in plaintext.
PUBLIC_OUTPUTS = ("ca_cert", "registry_cert", "node_controller_cert")
SECRET_OUTPUTS = ("registry_key", "node_controller_key")
# The CA that issues the leaves (its key signs renewals) and the stage of a CA change.
STATE_OUTPUTS = ("issuer_cert", "phase")
ISSUER_KEY = "issuer_key"

STABLE, TRUST, SWITCH = "stable", "trust", "switch"


def _load(pem: Any) -> list[x509.Certificate] | None:
    if not isinstance(pem, str) or not pem.strip():
        return None
    try:
        return x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        return None


def _expires_within(cert: x509.Certificate, now: dt.datetime, days: Any) -> bool:
    if not isinstance(days, int | float) or isinstance(days, bool) or days <= 0:
        return False
    return cert.not_valid_after_utc <= now + dt.timedelta(days=float(days))


def _validity(props: dict[str, Any]) -> dt.timedelta:
    days = props.get("validityDays")
    if isinstance(days, int | float) and not isinstance(days, bool) and days > 0:
        return dt.timedelta(days=float(days))
    return certs.VALIDITY


def fingerprint_of(outs: dict[str, Any]) -> str:
    """The fingerprint the component writes into pod templates for these outputs."""
    return certs.material_fingerprint(
        str(outs.get("ca_cert") or ""),
        str(outs.get("registry_cert") or ""),
        str(outs.get("node_controller_cert") or ""),
    )


def next_step(olds: dict[str, Any], news: dict[str, Any], now: dt.datetime) -> str | None:
    """What this ``pulumi up`` does to the stored set (module doc), or None for nothing.

    ``renew`` (new leaves, same CA), ``begin`` (stage 1 of a CA change), ``switch`` (stage
    2), ``settle`` (stage 3), ``recreate`` (a whole new set at once: the stored one is
    unreadable or already dead, so no running pod can be kept working by staging).
    """
    phase = olds.get("phase") or STABLE
    window = news.get("renewWithinDays")
    bundle = _load(olds.get("ca_cert"))
    leaves = [_load(olds.get(k)) for k in ("registry_cert", "node_controller_cert")]
    if bundle is None or any(leaf is None for leaf in leaves):
        return "recreate"
    leaf_certs = [leaf[0] for leaf in leaves if leaf]
    issuer = _load(olds.get("issuer_cert"))
    issuer_cert = issuer[0] if issuer else None
    has_key = issuer_cert is not None and bool(olds.get(ISSUER_KEY))
    leaves_dead = any(c.not_valid_after_utc <= now for c in leaf_certs)
    leaves_due = any(_expires_within(c, now, window) for c in leaf_certs)
    running = news.get("runningFingerprints")
    current = fingerprint_of(olds)
    if isinstance(running, list | tuple):
        rolled = all(fp == current for fp in running)
    else:
        # The pods were not read on purpose (preflight off, no cluster, library use; a failed
        # read holds instead: certrollout.as_fingerprints): only the administrator's word
        # that every pod runs this very material moves the stage. A confirmation left in the
        # config names an earlier stage's hash and moves nothing.
        rolled = news.get("confirmedFingerprint") == current
    if phase == TRUST:
        old_cas = [c for c in bundle if issuer_cert is None or c != issuer_cert]
        if rolled or leaves_dead or all(c.not_valid_after_utc <= now for c in old_cas):
            return "switch"
        return None
    if phase == SWITCH:
        old_cas = [c for c in bundle if issuer_cert is None or c != issuer_cert]
        if rolled or all(c.not_valid_after_utc <= now for c in old_cas):
            return "settle"
        return "renew" if leaves_due and has_key else None
    ca = issuer_cert or bundle[0]
    ca_dead = ca.not_valid_after_utc <= now
    rotate = olds.get("rotation", "") != news.get("rotation", "")
    if rotate or _expires_within(ca, now, window) or ca_dead or (leaves_due and not has_key):
        return "recreate" if (ca_dead or leaves_dead) else "begin"
    return "renew" if leaves_due else None


def _pem(issued: certs.IssuedCertificate) -> tuple[str, str]:
    return issued.cert_pem, issued.key_pem


def _issuer(outs: dict[str, Any]) -> certs.IssuedCertificate:
    cert = x509.load_pem_x509_certificate(str(outs["issuer_cert"]).encode())
    key = serialization.load_pem_private_key(str(outs[ISSUER_KEY]).encode(), password=None)
    return certs.IssuedCertificate(cert=cert, key=key)  # type: ignore[arg-type]


def _new_leaves(outs: dict[str, Any], issuer: certs.IssuedCertificate, validity: Any) -> None:
    outs["registry_cert"], outs["registry_key"] = _pem(
        certs.generate_leaf(issuer, certs.REGISTRY_NAME, validity=validity)
    )
    outs["node_controller_cert"], outs["node_controller_key"] = _pem(
        certs.generate_leaf(issuer, certs.NODE_CONTROLLER_NAME, validity=validity)
    )


def _new_ca(props: dict[str, Any]) -> certs.IssuedCertificate:
    return certs.generate_ca(validity=_validity(props) * certs.CA_LIFETIME_FACTOR)


def _settings(outs: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    outs["renewWithinDays"] = news.get("renewWithinDays", 0)
    outs["validityDays"] = news.get("validityDays", 0)
    return outs


def _leaves_due(olds: dict[str, Any], news: dict[str, Any], now: dt.datetime) -> bool:
    leaves = [_load(olds.get(k)) for k in ("registry_cert", "node_controller_cert")]
    window = news.get("renewWithinDays")
    return any(leaf and _expires_within(leaf[0], now, window) for leaf in leaves)


def apply_step(
    step: str | None,
    olds: dict[str, Any],
    news: dict[str, Any],
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """The outputs after ``step`` (see :func:`next_step`); settings always from ``news``."""
    now = now or dt.datetime.now(dt.UTC)
    outs = _settings(dict(olds), news)
    validity = _validity(news)
    if step == "recreate":
        return _settings(_fresh(news), news)
    if step == "renew":
        _new_leaves(outs, _issuer(outs), validity)
    elif step == "begin":
        if _leaves_due(olds, news, now) and _load(olds.get("issuer_cert")) and olds.get(ISSUER_KEY):
            # Stage 1 keeps leaves of the old CA (every pod of stage 0 and 1 trusts only that
            # one for sure); due ones are renewed under it now, or they could run out while
            # the stage waits for the pods.
            _new_leaves(outs, _issuer(outs), validity)
        ca = _new_ca(news)
        old = _load(olds.get("issuer_cert")) or _load(olds.get("ca_cert")) or []
        outs["ca_cert"] = "".join(
            [*(c.public_bytes(serialization.Encoding.PEM).decode() for c in old[:1]), ca.cert_pem]
        )
        outs["issuer_cert"], outs[ISSUER_KEY] = _pem(ca)
        outs["phase"] = TRUST
        outs["rotation"] = news.get("rotation", "")
    elif step == "switch":
        _new_leaves(outs, _issuer(outs), validity)
        outs["phase"] = SWITCH
    elif step == "settle":
        outs["ca_cert"] = outs["issuer_cert"]
        outs["phase"] = STABLE
    return outs


def _fresh(props: dict[str, Any]) -> dict[str, Any]:
    ca = _new_ca(props)
    outs: dict[str, Any] = {
        "rotation": props.get("rotation", ""),
        "phase": STABLE,
        "ca_cert": ca.cert_pem,
    }
    outs["issuer_cert"], outs[ISSUER_KEY] = _pem(ca)
    _new_leaves(outs, ca, _validity(props))
    return outs


class CertificateProvider(pulumi.dynamic.ResourceProvider):
    """Creates a driver certificate set once and then only ever updates it in place.

    Inputs: ``rotation`` (any string; changing it starts a CA change), ``renewWithinDays``
    (0 = never; otherwise ``pulumi up`` renews leaves, or changes the CA, once one of them
    expires within that many days), ``validityDays`` (leaf lifetime; the CA lives
    ``certs.CA_LIFETIME_FACTOR`` times as long), ``runningFingerprints`` (the certificate
    fingerprints of the driver pods running now, or None when unknown) and
    ``confirmedFingerprint`` (the administrator's word, ``certificates.rolledOut``, that every
    pod runs that material; used only when the pods are unknown). All plain values.
    """

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        outs = _settings(_fresh(props), props)
        ca = x509.load_pem_x509_certificate(str(outs["ca_cert"]).encode())
        # The first CA's serial number names the resource; it stays through every change.
        return pulumi.dynamic.CreateResult(id_=f"{ca.serial_number:x}", outs=outs)

    def diff(
        self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]
    ) -> pulumi.dynamic.DiffResult:
        """Never a replacement (that would delete and re-create the Secrets): a due step or a
        changed setting is an update."""
        step = next_step(_olds, _news, dt.datetime.now(dt.UTC))
        changed = step is not None or any(
            _olds.get(k, 0) != _news.get(k, 0) for k in ("renewWithinDays", "validityDays")
        )
        return pulumi.dynamic.DiffResult(changes=changed, replaces=[])

    def update(
        self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]
    ) -> pulumi.dynamic.UpdateResult:
        """The due step (or just the settings: a new validity applies from the next
        renewal on)."""
        now = dt.datetime.now(dt.UTC)
        step = next_step(_olds, _news, now)
        return pulumi.dynamic.UpdateResult(outs=apply_step(step, _olds, _news, now))

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        """Refresh keeps the stored set: it exists nowhere but in the state."""
        return pulumi.dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing outside the state to remove."""


def stage_message(
    name: str,
    phase: Any,
    *,
    fingerprint: str,
    observed: bool,
    config_key: str,
    namespace: str,
    holding_back: Sequence[str] = (),
    read_failed: str = "",
    selector: str = "",
    taken: bool = False,
) -> str:
    """What ``pulumi up`` tells the administrator while a CA change waits at a stage.

    ``observed``: the pods were read; ``holding_back``: the lines naming what keeps the stage
    (``certrollout.holding_back``). Without the pods, the way on is the administrator's
    confirmation of the stage's hash (``certificates.rolledOut``), which
    :func:`next_step` accepts only for this very stage. ``read_failed``: why the pods could
    not be read; the stage then holds whatever ``rolledOut`` says. ``selector``: the
    deployment's label selector (``Names.label_selector``), so that the ``kubectl`` shown
    lists its driver pods only. ``taken``: this very run took the stage, so the pods read
    before it cannot be on its material yet; they roll now.
    """
    from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION as hash_key

    stage = "1 of 3 (trust bundle)" if phase == TRUST else "2 of 3 (new leaves)"
    column = hash_key.replace(".", "\\.")
    pick = f" -l {selector}" if selector else ""
    head = f"{name}: certificate CA change at stage {stage}"
    if read_failed:
        return (
            f"{head}: the driver pods could not be read ({read_failed}), so the stage waits "
            "until a later `pulumi up` reads them (check the stack's access to pods, "
            "StatefulSets and DaemonSets in namespace "
            f"{namespace}); the next stage needs every driver pod on certificates {fingerprint}"
        )
    if taken:
        number = "1" if phase == TRUST else "2"
        return (
            f"{head}: stage {number} taken; the pods roll now. Run `pulumi up` again once "
            f"every driver pod runs certificates {fingerprint}: that takes the next stage"
        )
    if observed:
        if not holding_back:
            return (
                f"{head}: run `pulumi up` again once every driver pod runs certificates "
                f"{fingerprint}"
            )
        return (
            f"{head}: the next stage waits until every driver pod runs certificates "
            f"{fingerprint}; held back by: " + "; ".join(holding_back)
        )
    return (
        f"{head}: the running driver pods are not known (pmem-csi:preflight is off, or "
        "library use without PmemCsiDeploymentArgs.running_certificates), so the "
        "change waits here, and if the current certificates expire meanwhile the driver's "
        "links fail. Check that every driver pod carries "
        f"{hash_key}={fingerprint} (kubectl get pods -n {namespace}{pick} -o "
        f"'custom-columns=NAME:.metadata.name,HASH:.metadata.annotations.{column}'), then "
        f"`pulumi config set --path '{config_key}.rolledOut' {fingerprint}` and run "
        "`pulumi up`: that takes the next stage"
    )


def _report_stage(
    name: str,
    values: Sequence[Any],
    running: Any,
    config_key: str,
    namespace: str,
    selector: str = "",
) -> None:
    """Tell the administrator that a CA change is under way and what moves it on."""
    from pmem_components import certrollout

    phase, ca, registry, node = values
    if phase not in (TRUST, SWITCH) or pulumi.runtime.is_dry_run():
        return
    fingerprint = certs.material_fingerprint(str(ca), str(registry), str(node))
    failed = running.failed if isinstance(running, certrollout.Rollout) else ""
    unread = isinstance(running, certrollout.Rollout) and not running.read
    observed = unread or certrollout.as_fingerprints(running) is not None
    # The pods were read before this run's update: at another stored stage (or, not read, at
    # none, which means stable) this run took the stage, and the pods cannot be on it yet.
    taken = isinstance(running, certrollout.Rollout) and not failed and (
        not running.read or (running.phase is not None and running.phase != phase)
    )
    lines: list[str] = []
    if failed or taken:
        pass
    elif isinstance(running, certrollout.Rollout) and running.read:
        lines = certrollout.holding_back(running, fingerprint, namespace)
    elif observed and not unread:
        behind = [fp for fp in running if fp != fingerprint]
        lines = [f"{len(behind)} pod(s) on other certificates"] if behind else []
    pulumi.log.warn(
        stage_message(
            name,
            phase,
            fingerprint=fingerprint,
            observed=observed,
            config_key=config_key,
            namespace=namespace,
            holding_back=lines,
            read_failed=failed,
            selector=selector,
            taken=taken,
        )
    )


class GeneratedCertificates(pulumi.dynamic.Resource, module="pmem-csi", name="Certificates"):
    """The dynamic resource holding one generated set.

    Its type token is ``pulumi-python:dynamic/pmem-csi:Certificates``.
    """

    ca_cert: pulumi.Output[str]
    registry_cert: pulumi.Output[str]
    registry_key: pulumi.Output[str]
    node_controller_cert: pulumi.Output[str]
    node_controller_key: pulumi.Output[str]
    phase: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        rotation: pulumi.Input[str] = "",
        renew_within_days: pulumi.Input[int] = 0,
        validity_days: pulumi.Input[int] = 0,
        running_fingerprints: Sequence[str] | None = None,
        confirmed_fingerprint: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        secret_opts = pulumi.ResourceOptions(
            additional_secret_outputs=[*SECRET_OUTPUTS, ISSUER_KEY]
        )
        props: dict[str, Any] = {
            "rotation": rotation,
            "renewWithinDays": renew_within_days,
            "validityDays": validity_days,
            "runningFingerprints": (
                None if running_fingerprints is None else sorted(set(running_fingerprints))
            ),
            "confirmedFingerprint": confirmed_fingerprint,
            **dict.fromkeys(PUBLIC_OUTPUTS + SECRET_OUTPUTS + STATE_OUTPUTS + (ISSUER_KEY,)),
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
        running: Any = None,
        confirmed_fingerprint: str | None = None,
        config_key: str = "certificates",
        namespace: str = "",
        selector: str = "",
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``running``: the driver pods now (a ``certrollout.Rollout`` read from the cluster,
        a list of their fingerprints, or None: unknown); ``confirmed_fingerprint``: the
        administrator's ``certificates.rolledOut``; ``config_key``, ``namespace`` and
        ``selector`` (the deployment's label selector) go into the stage warning."""
        from pmem_components import certrollout

        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.generated = provided is None
        source: Any
        if provided is None:
            source = GeneratedCertificates(
                f"{name}-generated",
                rotation=rotation,
                renew_within_days=renew_within_days,
                validity_days=validity_days,
                running_fingerprints=certrollout.as_fingerprints(running),
                confirmed_fingerprint=confirmed_fingerprint,
                opts=pulumi.ResourceOptions(parent=self),
            )
            pulumi.Output.all(
                source.phase, source.ca_cert, source.registry_cert, source.node_controller_cert
            ).apply(
                lambda values: _report_stage(
                    name, values, running, config_key, namespace, selector
                )
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
