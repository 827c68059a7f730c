"""The Namespace of a driver deployment, created by the program unless ``createNamespace``
is false (for namespaces managed elsewhere, e.g. with their own quotas and policies).

A namespace may hold several deployments, so the program registers it once per stack, not as
part of whichever deployment names it first (removing that deployment would otherwise delete
the namespace and with it every other deployment's objects): :func:`build_shared_namespace`.
"""

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


def build_shared_namespace(name: str, deployments: list[DeploymentConfig]) -> dict[str, Any]:
    """The stack-level Namespace ``name``, labelled as the first deployment in it labels it.

    The labels follow the first deployment (as they did when that deployment owned the
    namespace); when it is removed they follow the next one, an in-place label update.
    """
    first = next(d for d in deployments if d.namespace == name)
    return build_namespace(first)
