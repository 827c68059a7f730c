"""The cluster-scoped CSIDriver object, named after the driver (dots kept).

The reference used ``storage.k8s.io/v1beta1``, which Kubernetes 1.22 removed; ``v1`` has the
same fields. No attach step (PMEM is local), pod info on mount (needed for ephemeral
volumes), and both persistent and inline ephemeral volumes.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl


def build_csi_driver(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": lbl.metadata(cfg, cfg.names.csi_driver, lbl.COMPONENT_DRIVER, namespaced=False),
        "spec": {
            "attachRequired": False,
            "podInfoOnMount": True,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
        },
    }
