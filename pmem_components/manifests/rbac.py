"""ServiceAccount and RBAC of the controller's external-provisioner.

Rules as in the reference, which followed upstream external-provisioner 2.0's rbac.yaml:
leader election and CSIStorageCapacity objects in the namespace (Role), volumes, claims,
storage classes, events, snapshots, CSINodes and nodes cluster-wide (ClusterRole).
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl

RBAC_API = "rbac.authorization.k8s.io"
_ALL = ["get", "watch", "list", "delete", "update", "create"]


def _rule(group: str, resource: str, verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def build_service_account(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": lbl.metadata(cfg, cfg.names.service_account, lbl.COMPONENT_CONTROLLER),
    }


def provisioner_role_rules() -> list[dict[str, Any]]:
    return [
        _rule("", "endpoints", _ALL),
        _rule("coordination.k8s.io", "leases", _ALL),
        _rule(
            "storage.k8s.io",
            "csistoragecapacities",
            ["get", "list", "watch", "create", "update", "patch", "delete"],
        ),
        _rule("", "pods", ["get"]),
        _rule("apps", "replicasets", ["get"]),
    ]


def provisioner_cluster_role_rules() -> list[dict[str, Any]]:
    return [
        _rule("", "persistentvolumes", ["get", "list", "watch", "create", "delete"]),
        _rule("", "persistentvolumeclaims", ["get", "list", "watch", "update"]),
        _rule("storage.k8s.io", "storageclasses", ["get", "list", "watch"]),
        _rule("", "events", ["list", "watch", "create", "update", "patch"]),
        _rule("snapshot.storage.k8s.io", "volumesnapshots", ["get", "list"]),
        _rule("snapshot.storage.k8s.io", "volumesnapshotcontents", ["get", "list"]),
        _rule("storage.k8s.io", "csinodes", ["get", "list", "watch"]),
        _rule("", "nodes", ["get", "list", "watch"]),
    ]


def _subjects(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    return [
        {"kind": "ServiceAccount", "name": cfg.names.service_account, "namespace": cfg.namespace}
    ]


def build_provisioner_role(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "Role",
        "metadata": lbl.metadata(cfg, cfg.names.provisioner_role, lbl.COMPONENT_CONTROLLER),
        "rules": provisioner_role_rules(),
    }


def build_provisioner_role_binding(cfg: DeploymentConfig) -> dict[str, Any]:
    n = cfg.names
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "RoleBinding",
        "metadata": lbl.metadata(cfg, n.provisioner_role_binding, lbl.COMPONENT_CONTROLLER),
        "subjects": _subjects(cfg),
        "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": n.provisioner_role},
    }


def build_provisioner_cluster_role(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "ClusterRole",
        "metadata": lbl.metadata(
            cfg, cfg.names.provisioner_cluster_role, lbl.COMPONENT_CONTROLLER, namespaced=False
        ),
        "rules": provisioner_cluster_role_rules(),
    }


def build_provisioner_cluster_role_binding(cfg: DeploymentConfig) -> dict[str, Any]:
    n = cfg.names
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": lbl.metadata(
            cfg, n.provisioner_cluster_role_binding, lbl.COMPONENT_CONTROLLER, namespaced=False
        ),
        "subjects": _subjects(cfg),
        "roleRef": {
            "apiGroup": RBAC_API,
            "kind": "ClusterRole",
            "name": n.provisioner_cluster_role,
        },
    }
