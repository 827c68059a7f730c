"""The registry and node TLS Secrets, mounted at ``/certs`` by controller and node pods.

Keys as in the reference: ``ca.crt`` (no standard name), ``tls.crt`` and ``tls.key`` (the
``kubernetes.io/tls`` ones). The PEM values go into ``stringData`` so callers may pass Pulumi
Outputs (the generated keys are secret Outputs) without decoding them in the program; the
API server stores them base64 encoded in ``data``.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl

TLS_SECRET_TYPE = "kubernetes.io/tls"


def _tls_secret(cfg: DeploymentConfig, name: str, ca: Any, cert: Any, key: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": lbl.metadata(cfg, name, lbl.COMPONENT_CERTIFICATES),
        "type": TLS_SECRET_TYPE,
        "stringData": {"ca.crt": ca, "tls.crt": cert, "tls.key": key},
    }


def build_registry_secret(
    cfg: DeploymentConfig, ca_cert: Any, cert: Any, key: Any
) -> dict[str, Any]:
    """Secret of the controller's registry server (certificate name ``pmem-registry``)."""
    return _tls_secret(cfg, cfg.names.registry_secret, ca_cert, cert, key)


def build_node_secret(cfg: DeploymentConfig, ca_cert: Any, cert: Any, key: Any) -> dict[str, Any]:
    """Secret of the node drivers (certificate name ``pmem-node-controller``)."""
    return _tls_secret(cfg, cfg.names.node_secret, ca_cert, cert, key)
