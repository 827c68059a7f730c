"""The driver's RBAC matches the reference operator's, and grants no more (issue 10, item 6).

The reference rules are data here, copied from intel/pmem-csi at d01bc59,
``pkg/pmem-csi-operator/controller/deployment/controller_driver.go``:
``getControllerProvisionerRole`` (Role ``<name>-external-provisioner-cfg``) and
``getControllerProvisionerClusterRole`` (ClusterRole ``<name>-external-provisioner-runner``),
bound to the controller's ServiceAccount by ``getControllerProvisionerRoleBinding`` and
``getControllerProvisionerClusterRoleBinding``. The node DaemonSet runs under the namespace's
default ServiceAccount there (no RBAC of its own), and so it does here.

Why a copy and not a reference to our own module: a test comparing the builder with itself
cannot fail. The reporter's RBAC is not the driver's and is tested by behaviour in
``tests/e2e/test_operator_scenarios.py``.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import bundle

# getControllerProvisionerRole, controller_driver.go (d01bc59).
REFERENCE_ROLE_RULES: list[tuple[str, str, list[str]]] = [
    ("", "endpoints", ["get", "watch", "list", "delete", "update", "create"]),
    ("coordination.k8s.io", "leases", ["get", "watch", "list", "delete", "update", "create"]),
    (
        "storage.k8s.io",
        "csistoragecapacities",
        ["get", "list", "watch", "create", "update", "patch", "delete"],
    ),
    ("", "pods", ["get"]),
    ("apps", "replicasets", ["get"]),
]

# getControllerProvisionerClusterRole, controller_driver.go (d01bc59).
REFERENCE_CLUSTER_ROLE_RULES: list[tuple[str, str, list[str]]] = [
    ("", "persistentvolumes", ["get", "list", "watch", "create", "delete"]),
    ("", "persistentvolumeclaims", ["get", "list", "watch", "update"]),
    ("storage.k8s.io", "storageclasses", ["get", "list", "watch"]),
    ("", "events", ["list", "watch", "create", "update", "patch"]),
    ("snapshot.storage.k8s.io", "volumesnapshots", ["get", "list"]),
    ("snapshot.storage.k8s.io", "volumesnapshotcontents", ["get", "list"]),
    ("storage.k8s.io", "csinodes", ["get", "list", "watch"]),
    ("", "nodes", ["get", "list", "watch"]),
]


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """Every (group, resource, verb, resourceName or '*') a rule list grants, expanded."""
    out: set[tuple[str, str, str, str]] = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        out.add((group, resource, verb, name))
    return out


def _reference(rules: list[tuple[str, str, list[str]]]) -> set[tuple[str, str, str, str]]:
    return {(g, r, v, "*") for g, r, verbs in rules for v in verbs}


def _driver_rbac(cfg: DeploymentConfig) -> dict[str, list[dict[str, Any]]]:
    """The driver's (not the reporter's) RBAC objects by kind."""
    objs = bundle.build_deployment_objects(cfg)
    reporter = {id(o) for o in objs.reporter}
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objs.all():
        if id(obj) not in reporter and obj["apiVersion"].startswith("rbac.authorization.k8s.io"):
            out.setdefault(obj["kind"], []).append(obj)
    return out


CONFIGS = [
    DeploymentConfig(),
    DeploymentConfig(
        name="a.b.example.org",
        namespace="other",
        device_mode="direct",
        labels={"team": "storage"},
        reporter={"image": "registry.example/r:1"},
    ),
]


def test_driver_roles_grant_exactly_the_reference_rules() -> None:
    for cfg in CONFIGS:
        rbac = _driver_rbac(cfg)
        assert sorted(rbac) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
        assert all(len(objs) == 1 for objs in rbac.values()), rbac
        assert _grants(rbac["Role"][0]["rules"]) == _reference(REFERENCE_ROLE_RULES)
        assert _grants(rbac["ClusterRole"][0]["rules"]) == _reference(REFERENCE_CLUSTER_ROLE_RULES)


def test_driver_roles_are_bound_to_the_controller_service_account_only() -> None:
    for cfg in CONFIGS:
        rbac = _driver_rbac(cfg)
        n = cfg.names
        subject = [
            {"kind": "ServiceAccount", "name": n.service_account, "namespace": cfg.namespace}
        ]
        # Reference names: <hyphened>-controller, -external-provisioner-cfg/-runner.
        assert n.service_account == f"{n.hyphened}-controller"
        role, binding = rbac["Role"][0], rbac["RoleBinding"][0]
        assert role["metadata"]["name"] == f"{n.hyphened}-external-provisioner-cfg"
        assert role["metadata"]["namespace"] == cfg.namespace
        assert binding["subjects"] == subject
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        crole, cbinding = rbac["ClusterRole"][0], rbac["ClusterRoleBinding"][0]
        assert crole["metadata"]["name"] == f"{n.hyphened}-external-provisioner-runner"
        assert cbinding["subjects"] == subject
        assert cbinding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": crole["metadata"]["name"],
        }


def test_node_driver_and_controller_pods_use_no_other_service_account() -> None:
    """The DaemonSet has no ServiceAccount of its own (the reference's has none either)."""
    for cfg in CONFIGS:
        objs = bundle.build_deployment_objects(cfg)
        (ds,) = objs.node
        assert ds["spec"]["template"]["spec"].get("serviceAccountName") in (None, "default")
        sts = next(o for o in objs.controller if o["kind"] == "StatefulSet")
        assert sts["spec"]["template"]["spec"]["serviceAccountName"] == cfg.names.service_account
        driver_sas = [
            o["metadata"]["name"]
            for o in objs.all()
            if o["kind"] == "ServiceAccount" and o not in objs.reporter
        ]
        assert driver_sas == [cfg.names.service_account]
