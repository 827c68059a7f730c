"""The ``deployments.pmem-csi.intel.com`` object that records one driver deployment.

With the operator, this custom resource was the input; here the stack config is, and the CR
is the record the reporter writes status into and administrators ``kubectl get``. Its spec
holds the effective values (defaults filled in) of the reference's DeploymentSpec plus this
project's additions (namespace, patches, reporter). Private keys never go into it: it is
readable by anyone allowed to list the CRs and it is stored in Pulumi state unencrypted.
User-provided public certificates are included, base64 encoded as the schema's
``format: byte`` requires; generated ones are not, so the spec is known at preview time.
"""

from __future__ import annotations

import base64
from typing import Any

from pmem_components import names
from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl

API_VERSION = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"


def _b64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()


def build_spec(cfg: DeploymentConfig) -> dict[str, Any]:
    """The CR spec; see the module docstring for what is left out and why."""
    spec: dict[str, Any] = {
        "namespace": cfg.namespace,
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "provisionerImage": cfg.provisioner_image,
        "nodeRegistrarImage": cfg.node_registrar_image,
        "controllerResources": cfg.controller_resources.to_k8s(),
        "nodeResources": cfg.node_resources.to_k8s(),
        "deviceMode": cfg.device_mode,
        "logLevel": cfg.log_level,
        "nodeSelector": dict(cfg.node_selector),
        "labels": dict(cfg.labels),
        "kubeletDir": cfg.kubelet_dir,
    }
    if cfg.pmem_percentage is not None:
        spec["pmemPercentage"] = cfg.pmem_percentage
    certs = cfg.certificates
    if certs.provided:
        for key, pem in (
            ("caCert", certs.ca_cert),
            ("registryCert", certs.registry_cert),
            ("nodeControllerCert", certs.node_controller_cert),
        ):
            if pem:
                spec[key] = _b64(pem)
    if cfg.patches:
        spec["patches"] = [p.model_dump(by_alias=True, exclude_none=True) for p in cfg.patches]
    spec["reporter"] = cfg.reporter.model_dump(by_alias=True)
    return spec


def build_deployment_cr(cfg: DeploymentConfig) -> dict[str, Any]:
    """The cluster-scoped Deployment CR, named like the driver; no status (the reporter's)."""
    return {
        "apiVersion": API_VERSION,
        "kind": names.CRD_KIND,
        "metadata": lbl.metadata(cfg, cfg.name, lbl.COMPONENT_DEPLOYMENT, namespaced=False),
        "spec": build_spec(cfg),
    }
