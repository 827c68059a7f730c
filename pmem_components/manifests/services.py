"""The controller's two Services.

The registry Service (ClusterIP) is how node drivers reach the controller: their
``-registryEndpoint`` uses its name. The metrics Service is a NodePort, as in the reference,
so that metrics can be scraped from outside the cluster.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl
from pmem_components.manifests.ports import CONTROLLER_METRICS_PORT, CONTROLLER_SERVICE_PORT


def _service(cfg: DeploymentConfig, name: str, service_type: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": lbl.metadata(cfg, name, lbl.COMPONENT_CONTROLLER),
        "spec": {
            "type": service_type,
            "ports": [{"port": port, "targetPort": port}],
            "selector": {"app": lbl.controller_app(cfg)},
        },
    }


def build_controller_service(cfg: DeploymentConfig) -> dict[str, Any]:
    return _service(cfg, cfg.names.controller_service, "ClusterIP", CONTROLLER_SERVICE_PORT)


def build_metrics_service(cfg: DeploymentConfig) -> dict[str, Any]:
    return _service(cfg, cfg.names.metrics_service, "NodePort", CONTROLLER_METRICS_PORT)
