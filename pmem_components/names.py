"""Object names derived from a deployment's name.

The reference operator (intel/pmem-csi d01bc59, ``deployment_types.go``) named every object
after the Deployment CR. Administrators who knew the operator find the same names here, and
the Pulumi program and the reporter agree on them because both call this module. It imports
nothing but the standard library so the reporter can use it without pulumi.
"""

from __future__ import annotations

import hashlib
import json
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

    def label_selector(self) -> str:
        """:meth:`selector_labels` as a label selector (``kubectl -l``, ``labelSelector``)."""
        return ",".join(f"{k}={v}" for k, v in self.selector_labels().items())


# Annotation on the objects a stack owns at stack level (Namespaces) and on the Deployment CR:
# which Pulumi stack (``<organization>/<project>/<stack>``; ``<project>/<stack>`` before the
# organization was added) manages them. It names the owner in the preflight's messages; what
# makes an object this stack's is that the stack's own state holds it (a same-named stack can
# run on another backend, or follow a removed one: pmem_components/identity.py).
STACK_ANNOTATION = "pmem-csi.intel.com/pulumi-stack"

# Upper bounds Kubernetes puts on what the controllers derive from our names.
LABEL_VALUE_MAX = 63
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
CSI_DRIVER_NAME_MAX = 63
# controller-revision-hash of StatefulSet pods is "<statefulset>-<hash>"; the hash is a
# uint32 in the API machinery's safe alphabet, at most 10 characters.
REVISION_HASH_MAX = 10
# Names of ReplicaSets ("<deployment>-<pod-template-hash>") and pods ("<owner>-<5 chars>").
POD_SUFFIX_MAX = 6


@dataclass(frozen=True)
class DerivedValue:
    """One string Kubernetes derives from the driver name, and the limit it must meet."""

    what: str
    value: str
    limit: int


def derived_values(name: str) -> list[DerivedValue]:
    """Every name and label value that grows with the driver name, with its limit.

    The longest of them is not one we set: the StatefulSet controller labels the controller
    pod ``controller-revision-hash: <statefulset>-<hash>``, so a driver name that fits every
    object we create can still produce a pod the API server rejects.
    """
    n = DeploymentNames(name)
    sts_hash = f"{n.controller_driver}-{'h' * REVISION_HASH_MAX}"
    return [
        DerivedValue("CSIDriver name", n.csi_driver, CSI_DRIVER_NAME_MAX),
        DerivedValue(f"label {LABEL_INSTANCE}", n.hyphened, LABEL_VALUE_MAX),
        DerivedValue("Service name", n.controller_service, DNS_LABEL_MAX),
        DerivedValue("Service name", n.metrics_service, DNS_LABEL_MAX),
        DerivedValue("pod label app", n.controller_driver, LABEL_VALUE_MAX),
        DerivedValue("pod label app", n.node_driver, LABEL_VALUE_MAX),
        DerivedValue("controller pod name", f"{n.controller_driver}-0", DNS_LABEL_MAX),
        DerivedValue("controller pod label controller-revision-hash", sts_hash, LABEL_VALUE_MAX),
        DerivedValue("reporter pod label app", n.reporter, LABEL_VALUE_MAX),
        DerivedValue(
            "reporter ReplicaSet name",
            f"{n.reporter}-{'h' * REVISION_HASH_MAX}",
            DNS_SUBDOMAIN_MAX,
        ),
        DerivedValue("reporter events Role name", n.reporter_events, DNS_SUBDOMAIN_MAX),
        DerivedValue("provisioner ClusterRoleBinding", n.provisioner_cluster_role, 253),
        DerivedValue("node state directory", f"/var/lib/{name}", 4096),
    ]


def max_name_length(name: str) -> tuple[int, DerivedValue | None]:
    """The longest driver name of this shape that fits, and the value that limits it."""
    best: tuple[int, DerivedValue | None] = (DNS_SUBDOMAIN_MAX, None)
    for d in derived_values(name):
        allowed = d.limit - (len(d.value) - len(name))
        if allowed < best[0]:
            best = (allowed, d)
    return best


# On the driver's DaemonSet and StatefulSet: the digest of the Deployment CR spec they were
# built from (``spec_digest``). The reporter reports ``Running`` at the CR's generation N only
# once both workloads carry generation N's digest and have rolled out: otherwise the CR's new
# generation, seen before the workloads' update (separate watches, in any order), would be
# reported Running on the old pods.
SPEC_DIGEST_ANNOTATION = "pmem-csi.intel.com/deployment-spec-digest"


def spec_digest(spec: object) -> str:
    """sha256 of the CR spec in canonical JSON, null values left out.

    Nulls are dropped because the API server prunes them from a custom resource (non-nullable
    fields), so the stored spec the reporter sees has none; integral floats count as integers
    (Pulumi's wire format has only floats, the API server stores ``5`` for an integer field);
    key order does not matter.
    """

    def clean(value: object) -> object:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    text = json.dumps(clean(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
