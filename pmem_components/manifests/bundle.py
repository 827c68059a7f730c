"""Every object of one driver deployment, grouped the way the components register them.

The program builds the bundle before registering anything: patches are dry-run against it
(an entry that selects nothing fails the preview up front), and the components then register
exactly these dicts. Certificate values may be Pulumi Outputs (generated certificates);
the builders only place them, never inspect them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pmem_components import certs
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import (
    controller,
    csidriver,
    deployment_cr,
    namespace,
    node,
    rbac,
    secrets,
    services,
)


@dataclass(frozen=True)
class CertificateValues:
    """The five PEM values the Secrets need (strings or Outputs); keys must be secret."""

    ca_cert: Any
    registry_cert: Any
    registry_key: Any = field(repr=False)
    node_controller_cert: Any
    node_controller_key: Any = field(repr=False)
    # A hash of the public certificate material (string or Output), written into the pod
    # templates so that new certificates roll the driver pods; None leaves it out.
    fingerprint: Any = None


PLACEHOLDER_CERTIFICATES = CertificateValues(
    "<ca.crt>", "<registry tls.crt>", "<hidden>", "<node tls.crt>", "<hidden>"
)

# Pod template annotation with the certificates' fingerprint (see CertificateValues).
CERTIFICATES_HASH_ANNOTATION = "pmem-csi.intel.com/certificates-hash"


def certificates_fingerprint(ca_cert: str, registry_cert: str, node_controller_cert: str) -> str:
    """SHA-256 over the three public certificates: changes whenever any of them does.

    The same function as :func:`pmem_components.certs.material_fingerprint`, which the
    certificate provider uses to recognise pods that run the current material.
    """
    return certs.material_fingerprint(ca_cert, registry_cert, node_controller_cert)


def _with_fingerprint(workload: dict[str, Any], fingerprint: Any) -> dict[str, Any]:
    if fingerprint is not None:
        meta = workload["spec"]["template"]["metadata"]
        annotations = {**meta.get("annotations", {}), CERTIFICATES_HASH_ANNOTATION: fingerprint}
        meta["annotations"] = annotations
    return workload


@dataclass(frozen=True)
class DeploymentObjects:
    namespace: dict[str, Any] | None
    secrets: list[dict[str, Any]]
    csi_driver: dict[str, Any]
    controller: list[dict[str, Any]]
    node: list[dict[str, Any]]
    reporter: list[dict[str, Any]]
    deployment_cr: dict[str, Any]

    def all(self) -> list[dict[str, Any]]:
        head = [self.namespace] if self.namespace else []
        return [
            *head,
            *self.secrets,
            self.csi_driver,
            *self.controller,
            *self.node,
            *self.reporter,
            self.deployment_cr,
        ]


def controller_objects(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC, Services and the StatefulSet, in dependency order."""
    return [
        rbac.build_service_account(cfg),
        rbac.build_provisioner_role(cfg),
        rbac.build_provisioner_role_binding(cfg),
        rbac.build_provisioner_cluster_role(cfg),
        rbac.build_provisioner_cluster_role_binding(cfg),
        services.build_controller_service(cfg),
        services.build_metrics_service(cfg),
        controller.build_controller_statefulset(cfg),
    ]


def node_objects(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    return [node.build_node_daemonset(cfg)]


def reporter_objects(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    """The status reporter's objects (built by ``manifests.reporter``) for this deployment
    alone, unless disabled. The Pulumi program deploys one reporter for the whole stack
    instead (``pmem_components.program``); tests use these for a single deployment."""
    if not cfg.reporter.enabled:
        return []
    from pmem_components.manifests import reporter

    return list(
        reporter.build_reporter_objects(
            [(cfg.names, cfg.namespace)],
            cfg.namespace,
            cfg.reporter.image,
            replicas=cfg.reporter.replicas,
            labels=dict(cfg.labels),
            log_level=cfg.reporter.log_level,
            image_pull_policy=cfg.image_pull_policy,
        )
    )


def build_deployment_objects(
    cfg: DeploymentConfig,
    certs: CertificateValues = PLACEHOLDER_CERTIFICATES,
    *,
    create_namespace: bool | None = None,
) -> DeploymentObjects:
    """All objects of ``cfg``; ``create_namespace`` overrides ``cfg.create_namespace``."""
    with_ns = cfg.create_namespace if create_namespace is None else create_namespace
    return DeploymentObjects(
        namespace=namespace.build_namespace(cfg) if with_ns else None,
        secrets=[
            secrets.build_registry_secret(
                cfg, certs.ca_cert, certs.registry_cert, certs.registry_key
            ),
            secrets.build_node_secret(
                cfg, certs.ca_cert, certs.node_controller_cert, certs.node_controller_key
            ),
        ],
        csi_driver=csidriver.build_csi_driver(cfg),
        controller=[
            _with_fingerprint(o, certs.fingerprint) if o["kind"] == "StatefulSet" else o
            for o in controller_objects(cfg)
        ],
        node=[_with_fingerprint(o, certs.fingerprint) for o in node_objects(cfg)],
        reporter=reporter_objects(cfg),
        deployment_cr=deployment_cr.build_deployment_cr(cfg),
    )


def build_shared_namespace(name: str, deployments: list[DeploymentConfig]) -> dict[str, Any]:
    """A Namespace owned by the stack rather than by one deployment (see program.deploy)."""
    return namespace.build_shared_namespace(name, deployments)


def object_names(cfg: DeploymentConfig) -> dict[str, str]:
    """Names of the deployment's objects, keyed by role; exported as stack outputs."""
    n = cfg.names
    out = {
        "deployment": cfg.name,
        "csiDriver": n.csi_driver,
        "registrySecret": n.registry_secret,
        "nodeSecret": n.node_secret,
        "serviceAccount": n.service_account,
        "provisionerRole": n.provisioner_role,
        "provisionerRoleBinding": n.provisioner_role_binding,
        "provisionerClusterRole": n.provisioner_cluster_role,
        "provisionerClusterRoleBinding": n.provisioner_cluster_role_binding,
        "controllerService": n.controller_service,
        "metricsService": n.metrics_service,
        "controllerStatefulSet": n.controller_driver,
        "nodeDaemonSet": n.node_driver,
    }
    if cfg.reporter.enabled:
        out["reporter"] = n.reporter
    return out
