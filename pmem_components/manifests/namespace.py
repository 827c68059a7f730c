"""The Namespace of a driver deployment, created by the program unless ``createNamespace``
is false (for namespaces managed elsewhere, e.g. with their own quotas and policies)."""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl


def build_namespace(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": lbl.metadata(cfg, cfg.namespace, lbl.COMPONENT_NAMESPACE, namespaced=False),
    }
