"""The reporter objects of the layout before one reporter per stack (issue 16), verbatim.

``pmem_components/manifests/reporter.py`` as of commit c8bd2d3 (the last before 4d47a5e
moved to one reporter per stack), for ``tests/e2e/test_reporter_stack.py``: a stack made
by that program had exactly these objects (RBAC names and rules, Deployment arguments), so
the migration is tested from them, not from today's builder. Do not update it.

Its docstring then:
    The status reporter's Deployment, ServiceAccount and least-privilege RBAC.

    Each rule exists because ``reporter/`` makes exactly that call (the unit test
    ``tests/unit/test_reporter_rbac_calls.py`` drives the reporter against a recording API and
    checks every call is granted and every grant is used):
    - ClusterRole: list/watch on the one Deployment CR (resourceNames; the reporter lists and
      watches it with ``fieldSelector=metadata.name=NAME``, which resourceNames authorize), get on
      it (a fresh copy after a 409), patch on its ``/status``; list/watch by name on the three
      cluster-scoped objects it checks (its provisioner ClusterRole and ClusterRoleBinding, its
      CSIDriver) -- nothing else cluster-wide.
    - Role in the driver's namespace (where the reporter itself runs): list/watch on the
      namespaced kinds it watches (by label), and get (metadata only) on those but pods, for an
      expected object absent from its cache (relabelled or missing?); list/watch on the two
      certificate Secrets by name only (watched with a name field selector, so no polling and no
      other Secret); the Lease: ``create`` (cannot be limited by name) and get/update on its own
      Lease by name.
    - Role in ``default`` (``names.CLUSTER_EVENT_NAMESPACE``): create on Events (never patched).
      Events about the cluster-scoped CR are only accepted there (see ``reporter.write``), and a
      Role there grants less than the same rule in the ClusterRole would. When the driver's
      namespace is ``default`` itself, the rule goes into the main Role instead.
    Nothing here grants writes on spec, deletes, or access to other Secrets.
"""

from __future__ import annotations

from typing import Any

from pmem_components import names as n

RBAC_API = "rbac.authorization.k8s.io"
COMPONENT_REPORTER = "reporter"
METRICS_PORT = 8080
# The image (tools/image.py) creates its non-root user with this uid and runs as it.
REPORTER_UID = 10001
WATCH = ["list", "watch"]


def _rule(
    group: str, resources: list[str], verbs: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [group], "resources": resources, "verbs": list(verbs)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


def reporter_labels(names: n.DeploymentNames, labels: dict[str, str]) -> dict[str, str]:
    """Configured labels plus ours; ours win so selectors cannot be broken by configuration."""
    return {
        **labels,
        **names.selector_labels(),
        n.LABEL_NAME: "pmem-csi",
        n.LABEL_COMPONENT: COMPONENT_REPORTER,
        n.LABEL_MANAGED_BY: n.MANAGED_BY,
    }


def reporter_selector(names: n.DeploymentNames) -> dict[str, str]:
    """Pod selector of the reporter's Deployment: this deployment's reporter pods only."""
    return {**names.selector_labels(), n.LABEL_COMPONENT: COMPONENT_REPORTER}


def cluster_role_rules(names: n.DeploymentNames) -> list[dict]:
    cr_names = [names.name]
    return [
        _rule(n.CRD_GROUP, [n.CRD_PLURAL], ["get", *WATCH], cr_names),
        _rule(n.CRD_GROUP, [f"{n.CRD_PLURAL}/status"], ["patch"], cr_names),
        _rule(RBAC_API, ["clusterroles"], WATCH, [names.provisioner_cluster_role]),
        _rule(RBAC_API, ["clusterrolebindings"], WATCH, [names.provisioner_cluster_role_binding]),
        _rule("storage.k8s.io", ["csidrivers"], WATCH, [names.csi_driver]),
    ]


EVENT_RULE = _rule("", ["events"], ["create"])


def role_rules(names: n.DeploymentNames, with_events: bool = False) -> list[dict]:
    """Rules in the driver's namespace; ``with_events`` when that is the Events' namespace."""
    rules = [
        _rule("", ["pods"], WATCH),
        # get: an object absent from the label-selected caches is looked up by name (its
        # metadata only), to tell "relabelled" from "missing".
        _rule("", ["services", "serviceaccounts"], [*WATCH, "get"]),
        _rule("apps", ["daemonsets", "statefulsets"], [*WATCH, "get"]),
        _rule(RBAC_API, ["roles", "rolebindings"], [*WATCH, "get"]),
        _rule("", ["secrets"], WATCH, [names.registry_secret, names.node_secret]),
        _rule("coordination.k8s.io", ["leases"], ["create"]),
        _rule("coordination.k8s.io", ["leases"], ["get", "update"], [names.reporter]),
    ]
    if with_events:
        rules.insert(4, dict(EVENT_RULE))
    return rules


def build_reporter_objects(
    names: n.DeploymentNames,
    namespace: str,
    image: str,
    replicas: int = 2,
    labels: dict[str, str] | None = None,
    log_level: int = 3,
    image_pull_policy: str = "IfNotPresent",
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole(+Binding), Role(+Binding), Events Role(+Binding) and
    Deployment of the reporter.

    The reporter runs in the driver's namespace, which is where its Role grants access and
    where its Lease lives; its Events go to ``names.CLUSTER_EVENT_NAMESPACE``.
    """
    lbls = reporter_labels(names, labels or {})
    name = names.reporter

    def meta(namespaced: bool = True) -> dict[str, Any]:
        m: dict[str, Any] = {"name": name, "labels": dict(lbls)}
        if namespaced:
            m["namespace"] = namespace
        return m

    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    service_account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}
    cluster_role = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "ClusterRole",
        "metadata": meta(namespaced=False),
        "rules": cluster_role_rules(names),
    }
    cluster_role_binding = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta(namespaced=False),
        "subjects": subjects,
        "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": name},
    }
    events_here = namespace == n.CLUSTER_EVENT_NAMESPACE
    role = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "Role",
        "metadata": meta(),
        "rules": role_rules(names, with_events=events_here),
    }
    role_binding = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "RoleBinding",
        "metadata": meta(),
        "subjects": subjects,
        "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": name},
    }
    event_objects: list[dict[str, Any]] = []
    if not events_here:
        event_meta = {
            "name": names.reporter_events,
            "namespace": n.CLUSTER_EVENT_NAMESPACE,
            "labels": dict(lbls),
        }
        event_objects = [
            {
                "apiVersion": f"{RBAC_API}/v1",
                "kind": "Role",
                "metadata": dict(event_meta),
                "rules": [dict(EVENT_RULE)],
            },
            {
                "apiVersion": f"{RBAC_API}/v1",
                "kind": "RoleBinding",
                "metadata": dict(event_meta),
                "subjects": subjects,
                "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": names.reporter_events},
            },
        ]
    return [
        service_account,
        cluster_role,
        cluster_role_binding,
        role,
        role_binding,
        *event_objects,
        build_reporter_deployment(
            names, namespace, image, replicas, lbls, log_level, image_pull_policy
        ),
    ]


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def build_reporter_deployment(
    names: n.DeploymentNames,
    namespace: str,
    image: str,
    replicas: int,
    labels: dict[str, str],
    log_level: int,
    image_pull_policy: str,
) -> dict[str, Any]:
    selector = reporter_selector(names)
    args = [
        "--deployment",
        names.name,
        "--namespace",
        namespace,
        "--lease-name",
        names.reporter,
        "--log-level",
        str(log_level),
        "--metrics-port",
        str(METRICS_PORT),
    ]
    container = {
        "name": "reporter",
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "args": args,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 1),
        "resources": {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.reporter, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": names.reporter,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": REPORTER_UID,
                        "runAsGroup": REPORTER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    # Spread replicas so one node's death leaves a candidate for the Lease.
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": selector},
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                    "terminationGracePeriodSeconds": 10,
                    "containers": [container],
                },
            },
        },
    }
