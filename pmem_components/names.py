"""Object names derived from a deployment's name.

The reference operator (intel/pmem-csi d01bc59, ``deployment_types.go``) named every object
after the Deployment CR. Administrators who knew the operator find the same names here, and
the Pulumi program and the reporter agree on them because both call this module. It imports
nothing but the standard library so the reporter can use it without pulumi.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DRIVER_NAME = "pmem-csi.intel.com"

# Labels on every object of a deployment; the reporter selects by them server-side.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "pmem-csi"
MANAGED_BY = "pmem-csi-pulumi"

CRD_GROUP = "pmem-csi.intel.com"
CRD_PLURAL = "deployments"
CRD_NAME = f"{CRD_PLURAL}.{CRD_GROUP}"
CRD_KIND = "Deployment"
CRD_STORAGE_VERSION = "v1beta1"
# Events about a cluster-scoped object (our CR) must live here: the API server rejects a
# core/v1 Event whose involvedObject has no namespace in any namespace but "default" (and
# kube-system for new-style events), and ``kubectl describe`` looks for them with an empty
# involvedObject.namespace. client-go's recorder does the same.
CLUSTER_EVENT_NAMESPACE = "default"


@dataclass(frozen=True)
class DeploymentNames:
    """All object names of one driver deployment, from the driver (= CR) name."""

    name: str

    @property
    def hyphened(self) -> str:
        """The name with dots replaced, usable where DNS labels are required."""
        return self.name.replace(".", "-")

    @property
    def registry_secret(self) -> str:
        return f"{self.hyphened}-registry-secrets"

    @property
    def node_secret(self) -> str:
        return f"{self.hyphened}-node-secrets"

    @property
    def csi_driver(self) -> str:
        return self.name

    @property
    def controller_service(self) -> str:
        return f"{self.hyphened}-controller"

    @property
    def metrics_service(self) -> str:
        return f"{self.hyphened}-metrics"

    @property
    def service_account(self) -> str:
        return f"{self.hyphened}-controller"

    @property
    def provisioner_role(self) -> str:
        return f"{self.hyphened}-external-provisioner-cfg"

    @property
    def provisioner_role_binding(self) -> str:
        return f"{self.hyphened}-csi-provisioner-role-cfg"

    @property
    def provisioner_cluster_role(self) -> str:
        return f"{self.hyphened}-external-provisioner-runner"

    @property
    def provisioner_cluster_role_binding(self) -> str:
        return f"{self.hyphened}-csi-provisioner-role"

    @property
    def node_driver(self) -> str:
        """The node DaemonSet."""
        return f"{self.hyphened}-node"

    @property
    def controller_driver(self) -> str:
        """The controller StatefulSet."""
        return f"{self.hyphened}-controller"

    @property
    def reporter(self) -> str:
        """The reporter's Deployment, ServiceAccount, Role(s) and Lease."""
        return f"{self.hyphened}-reporter"

    @property
    def reporter_events(self) -> str:
        """The reporter's Role(Binding) for Events in ``CLUSTER_EVENT_NAMESPACE``."""
        return f"{self.reporter}-events"

    def selector_labels(self) -> dict[str, str]:
        """Labels that select every object of this deployment (and nothing else)."""
        return {LABEL_PART_OF: PART_OF, LABEL_INSTANCE: self.hyphened}
