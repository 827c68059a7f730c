"""The reporter's input snapshot: everything the status computation looks at for one CR.

The I/O side (watch caches) and the pure status computation meet here. Objects are kept as
plain dicts in the camelCase JSON shape the API server returns (what
``ApiClient().sanitize_for_serialization`` or a raw watch event yields), because both a watch
cache and a unit test can build those without the kubernetes client's model classes, and
because the status logic only ever reads a few fields from them.

This module imports only the standard library and ``pmem_components.names`` (which does not
import pulumi), so the reporter stays free of the Pulumi SDK.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pmem_components.names import DeploymentNames

# A Kubernetes object as camelCase JSON.
Obj = dict[str, Any]

DEFAULT_NAMESPACE = "pmem-csi"

# Kinds of the driver's sub-objects, as used as keys of ``Observed.objects``.
SECRET = "Secret"
SERVICE_ACCOUNT = "ServiceAccount"
ROLE = "Role"
ROLE_BINDING = "RoleBinding"
CLUSTER_ROLE = "ClusterRole"
CLUSTER_ROLE_BINDING = "ClusterRoleBinding"
SERVICE = "Service"
CSI_DRIVER = "CSIDriver"
STATEFUL_SET = "StatefulSet"
DAEMON_SET = "DaemonSet"
# Not an expected object (the workloads own them), but watched and possibly unreadable.
POD = "Pod"


class ApiResource(NamedTuple):
    """Where a kind lives in the API, so the I/O side need not hard-code it a second time."""

    api_version: str
    plural: str
    namespaced: bool


API_RESOURCES: Mapping[str, ApiResource] = {
    SECRET: ApiResource("v1", "secrets", True),
    SERVICE_ACCOUNT: ApiResource("v1", "serviceaccounts", True),
    ROLE: ApiResource("rbac.authorization.k8s.io/v1", "roles", True),
    ROLE_BINDING: ApiResource("rbac.authorization.k8s.io/v1", "rolebindings", True),
    CLUSTER_ROLE: ApiResource("rbac.authorization.k8s.io/v1", "clusterroles", False),
    CLUSTER_ROLE_BINDING: ApiResource("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    SERVICE: ApiResource("v1", "services", True),
    CSI_DRIVER: ApiResource("storage.k8s.io/v1", "csidrivers", False),
    STATEFUL_SET: ApiResource("apps/v1", "statefulsets", True),
    DAEMON_SET: ApiResource("apps/v1", "daemonsets", True),
}


class ExpectedObject(NamedTuple):
    """One sub-object the Pulumi program creates for a deployment.

    A NamedTuple so callers may unpack it as ``(kind, namespaced, name)``.
    """

    kind: str
    namespaced: bool
    name: str


def expected_objects(names: DeploymentNames) -> list[ExpectedObject]:
    """Every sub-object a healthy deployment has, in a stable, user-friendly order.

    ``DriverDeployed`` is False when any of these is missing, and the I/O side fetches or
    watches exactly these. Namespaced ones live in the CR's ``spec.namespace``.
    The reporter's own objects are deliberately not listed: they say nothing about the driver.
    """
    entries = [
        (SECRET, names.registry_secret),
        (SECRET, names.node_secret),
        (SERVICE_ACCOUNT, names.service_account),
        (ROLE, names.provisioner_role),
        (ROLE_BINDING, names.provisioner_role_binding),
        (CLUSTER_ROLE, names.provisioner_cluster_role),
        (CLUSTER_ROLE_BINDING, names.provisioner_cluster_role_binding),
        (SERVICE, names.controller_service),
        (SERVICE, names.metrics_service),
        (CSI_DRIVER, names.csi_driver),
        (STATEFUL_SET, names.controller_driver),
        (DAEMON_SET, names.node_driver),
    ]
    return [ExpectedObject(kind, API_RESOURCES[kind].namespaced, name) for kind, name in entries]


class LookupFailed(Exception):
    """Reading an absent object by name failed (403, 500, a timeout): whether it exists,
    relabelled, or is missing is unknown (``reporter.observe.Observer.lookup_labels``).

    ``retry_in``: seconds until the lookup is asked again, so the CR can be reconciled then
    instead of staying Unknown until the next resync.
    """

    def __init__(self, message: str, retry_in: float = 0.0) -> None:
        super().__init__(message)
        self.retry_in = retry_in


@dataclass(frozen=True)
class Observed:
    """What the reporter saw for one Deployment CR at one moment.

    Attributes:
        cr: the Deployment CR as JSON (metadata.name, metadata.generation, spec, status).
        objects: kind -> name -> object, or None when the object was looked for and is
            missing. A kind/name absent from the mapping counts as missing too, so a test only
            has to list what exists.
        controller_pods: pods of the controller StatefulSet.
        node_pods: pods of the node DaemonSet.
        nodes: the cluster's nodes, when the I/O side has them; optional because the status
            can be computed from the DaemonSet's counters alone.
        unreadable: kind -> why the reporter could not read objects of that kind (401/403,
            or no list yet after an error). Objects of such a kind are unknown, not missing:
            a failed read must not be reported as a missing Secret.
        relabelled: (kind, name) -> the labels it has now, for expected objects that are
            absent from the label-selected caches but exist (someone removed or changed
            their ``part-of``/``instance`` label): found by name, reported as relabelled.
    """

    cr: Obj
    objects: Mapping[str, Mapping[str, Obj | None]] = field(default_factory=dict)
    controller_pods: Sequence[Obj] = ()
    node_pods: Sequence[Obj] = ()
    nodes: Sequence[Obj] | None = None
    unreadable: Mapping[str, str] = field(default_factory=dict)
    relabelled: Mapping[tuple[str, str], Mapping[str, str]] = field(default_factory=dict)
    # Seconds after which a part of this snapshot that could not be read (a failed lookup)
    # is read again: the CR must be computed again then (None: nothing to wait for).
    recheck_in: float | None = None

    @property
    def name(self) -> str:
        return str(self.cr.get("metadata", {}).get("name", ""))

    @property
    def names(self) -> DeploymentNames:
        return DeploymentNames(self.name)

    @property
    def generation(self) -> int | None:
        gen = self.cr.get("metadata", {}).get("generation")
        return int(gen) if gen is not None else None

    @property
    def namespace(self) -> str:
        """Namespace of the namespaced sub-objects; the CR itself is cluster-scoped."""
        return str((self.cr.get("spec") or {}).get("namespace") or DEFAULT_NAMESPACE)

    @property
    def current_status(self) -> Obj:
        """The status as last written (empty before the first write)."""
        return dict(self.cr.get("status") or {})

    def get(self, kind: str, name: str) -> Obj | None:
        """The observed object, or None when it is missing."""
        return self.objects.get(kind, {}).get(name)
