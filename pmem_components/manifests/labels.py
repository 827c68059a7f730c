"""Labels and metadata shared by every object of a driver deployment.

Every object carries the selector labels from :mod:`pmem_components.names` (the reporter lists
a deployment's objects server-side by them), the recommended ``app.kubernetes.io`` labels, and
the user's configured labels, which the reference added to everything the operator created.
"""

from __future__ import annotations

from typing import Any

from pmem_components import names
from pmem_components.config import DeploymentConfig

APP_NAME = "pmem-csi"

# Values of app.kubernetes.io/component.
COMPONENT_CONTROLLER = "controller"
COMPONENT_NODE = "node"
COMPONENT_CERTIFICATES = "certificates"
COMPONENT_DRIVER = "csi-driver"
COMPONENT_DEPLOYMENT = "deployment"
COMPONENT_NAMESPACE = "namespace"

# Pod template label and annotation of the reference: the PMEM-CSI scheduler webhook must
# ignore the driver's own pods, and metrics are scraped from the containers' ports.
WEBHOOK_LABEL = "pmem-csi.intel.com/webhook"
SCRAPE_ANNOTATION = "pmem-csi.intel.com/scrape"


def common_labels(cfg: DeploymentConfig, component: str) -> dict[str, str]:
    """Labels for one object; ours win over configured ones (config rejects collisions)."""
    return {
        **cfg.labels,
        **cfg.names.selector_labels(),
        names.LABEL_NAME: APP_NAME,
        names.LABEL_COMPONENT: component,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
    }


def metadata(
    cfg: DeploymentConfig, name: str, component: str, *, namespaced: bool = True
) -> dict[str, Any]:
    """``metadata`` of a top-level object: name, namespace (unless cluster-scoped), labels."""
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = cfg.namespace
    meta["labels"] = common_labels(cfg, component)
    return meta


def controller_app(cfg: DeploymentConfig) -> str:
    """The reference's ``app`` label value of controller pods, used by selectors."""
    return cfg.names.controller_driver


def node_app(cfg: DeploymentConfig) -> str:
    """The reference's ``app`` label value of node pods, used by the DaemonSet selector."""
    return cfg.names.node_driver


def pod_template_metadata(cfg: DeploymentConfig, component: str, app: str) -> dict[str, Any]:
    """Pod template labels (common + ``app`` + webhook opt-out) and the scrape annotation."""
    return {
        "labels": {**common_labels(cfg, component), "app": app, WEBHOOK_LABEL: "ignore"},
        "annotations": {SCRAPE_ANNOTATION: "containers"},
    }
