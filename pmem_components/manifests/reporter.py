"""The status reporter: one per stack, serving every deployment of the stack that enables it.

Why one per stack (not one per deployment, not one per cluster): one reporter per deployment
meant 2 pods, ~26 watches and a Lease renewal every 2 s for each deployment (200 pods, ~2,600
watches, ~150 Lease GET/s at 100 deployments). One per cluster would need an owner for
objects that several stacks share, and cluster-wide Secret access; the stack owns its
deployments, knows them all, and can grant exactly their CRs. The reporter is named after the
stack's first reporter-enabled deployment (``<first>-reporter``, in its namespace), which is
the name that deployment's own reporter had: an existing stack keeps that Deployment, its
Lease and its Events Role (updated in place, see ``pmem_components.program``) and only the
others' reporters go away, after the stack's reporter has rolled out.

It runs with ``--shared-watches`` (``reporter.observe``): one watch per kind by label
(``instance in (<served deployments>)``) -- cluster-wide for the CRs and the cluster-scoped
kinds, per driver namespace for the namespaced ones (Secrets included) -- so pods, Lease
requests and watches do not grow with the number of deployments (watches: 4, plus 8 per
driver namespace).

Each rule exists because ``reporter/`` makes exactly that call (the unit test
``tests/unit/test_reporter_rbac_calls.py`` drives the reporter against a recording API and
checks every call is granted and every grant is used):
- ClusterRole: list/watch on the Deployment CRs (one cluster-wide watch; the reporter ignores
  CRs it does not serve), get (a fresh copy after a 409) and patch on ``/status`` of the
  served CRs only (resourceNames); list/watch/get on the cluster-scoped kinds of the driver
  objects (cluster roles, cluster role bindings, CSI drivers; get: the metadata of an
  expected object absent from the label-selected cache: relabelled, or missing?). Nothing
  namespaced: no pod, Secret or workload of any other namespace (review of issue 16).
- Role in each driver namespace (the namespaces of the served deployments only): list/watch
  on pods and Secrets (by label; Secrets never read with a GET), list/watch/get on services,
  service accounts, daemon sets, stateful sets, roles and role bindings. So the reporter may
  list every Secret of its deployments' namespaces -- whoever created them: with
  ``createNamespace: false`` not the stack; RBAC cannot limit a list to labels, the reporter
  asks by label -- but no Secret elsewhere.
- Role in the reporter's namespace: the Lease: ``create`` (cannot be limited by name) and
  get/update on its own Lease by name.
- Role in ``default`` (``names.CLUSTER_EVENT_NAMESPACE``): create on Events (never patched).
  Events about the cluster-scoped CR are only accepted there (see ``reporter.write``). When a
  namespace above is ``default`` itself, its rules share one Role.
Nothing here grants writes on spec, deletes, or access to other Secrets.

Resources, from the figures in BENCHMARKS.md: about 80 MiB RSS and up to ~70m CPU during a
5,000-node rollout (one deployment); the request covers that so the reporter is neither the
first to be evicted nor starved under contention, the memory limit leaves room for a re-list
of the largest cache next to the cache itself.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from pmem_components import fieldowners
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


# One served deployment: its names and the namespace of its objects.
Served = tuple[n.DeploymentNames, str]

# Kinds watched by label and read by name (an expected object absent from the cache):
# namespaced ones in each driver namespace (Roles), cluster-scoped ones cluster-wide.
WATCHED_NAMESPACED = [
    ("", ["services", "serviceaccounts"]),
    ("apps", ["daemonsets", "statefulsets"]),
    (RBAC_API, ["roles", "rolebindings"]),
]
WATCHED_CLUSTER = [
    (RBAC_API, ["clusterroles", "clusterrolebindings"]),
    ("storage.k8s.io", ["csidrivers"]),
]
# Resources for one driver namespace (BENCHMARKS.md section 6: ~80 MiB RSS and ~70m CPU over
# a 5,000-node rollout); see reporter_resources for more namespaces.
REQUESTS = {"cpu": "100m", "memory": "128Mi"}
LIMITS = {"memory": "384Mi"}
# Memory per driver namespace beyond the first: its 8 watches, each a thread, a TLS connection
# and its cache, ~190 KiB (1.5 MiB a namespace: 62 MiB RSS at 1 namespace, 214 MiB at 100 with
# watches over HTTP/1.1, the fallback, measured with glibc's per-thread caches on; 118 MiB over
# HTTP/2 with them off, as deployed: BENCHMARKS.md section 6).
MEMORY_PER_NAMESPACE_MIB = 2
# The container's environment. glibc keeps a cache of freed blocks per thread (tcache: up to 7
# of each size up to 1 KiB), which malloc's statistics count as in use and no trim returns;
# the reporter runs a thread per watch (8 per driver namespace), so at 100 namespaces those
# caches held about 45 MiB of each pod's ~160 MiB (BENCHMARKS.md section 6). Without them a
# freed block goes back to its arena at once (glibc has a few, each shared by the threads
# attached to it). Read by glibc at exec only, hence an environment variable and not a
# setting of the process.
ENV = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def reporter_resources(driver_namespaces: int) -> dict[str, dict[str, str]]:
    """Requests and limits of the stack's reporter container for the number of driver
    namespaces it watches: its memory grows with them (not with deployments sharing one), and
    a pod using more than it requests is the first evicted under memory pressure."""
    extra = max(driver_namespaces - 1, 0) * MEMORY_PER_NAMESPACE_MIB

    def more(quantity: str) -> str:
        return f"{int(quantity.removesuffix('Mi')) + extra}Mi"

    return {
        "requests": {**REQUESTS, "memory": more(REQUESTS["memory"])},
        "limits": {**LIMITS, "memory": more(LIMITS["memory"])},
    }


def cluster_role_rules(served: list[Served]) -> list[dict]:
    cr_names = [names.name for names, _ in served]
    rules = [
        _rule(n.CRD_GROUP, [n.CRD_PLURAL], WATCH),
        _rule(n.CRD_GROUP, [n.CRD_PLURAL], ["get"], cr_names),
        _rule(n.CRD_GROUP, [f"{n.CRD_PLURAL}/status"], ["patch"], cr_names),
    ]
    rules += [_rule(group, resources, [*WATCH, "get"]) for group, resources in WATCHED_CLUSTER]
    return rules


def driver_namespace_rules() -> list[dict]:
    """What the reporter reads in each namespace of its deployments (and nowhere else)."""
    return [
        _rule("", ["pods"], WATCH),
        *(_rule(group, resources, [*WATCH, "get"]) for group, resources in WATCHED_NAMESPACED),
        # By label, one watch for every deployment of the namespace; never a GET.
        _rule("", ["secrets"], WATCH),
    ]


EVENT_RULE = _rule("", ["events"], ["create"])


def lease_rules(owner: n.DeploymentNames) -> list[dict]:
    return [
        _rule("coordination.k8s.io", ["leases"], ["create"]),
        _rule("coordination.k8s.io", ["leases"], ["get", "update"], [owner.reporter]),
    ]


def namespace_rules(served: list[Served], namespace: str) -> dict[str, list[dict]]:
    """namespace -> the rules of the reporter's Role there (see the module docstring)."""
    out: dict[str, list[dict]] = {}
    for _names, driver_ns in served:
        out.setdefault(driver_ns, driver_namespace_rules())
    out.setdefault(namespace, []).extend(lease_rules(served[0][0]))
    out.setdefault(n.CLUSTER_EVENT_NAMESPACE, []).append(dict(EVENT_RULE))
    return out


def rbac_name(owner: n.DeploymentNames) -> str:
    """The name of the stack reporter's ClusterRole, Roles and bindings: not the one the
    per-deployment layout's had (``owner.reporter``), so moving to this layout is additive.

    Why (review of issue 16): that ``pulumi up`` narrows the ClusterRole (no cluster-wide
    pods, no workloads) and widens the Roles (more namespaces), while the Deployment rolls
    from old pods to new ones. Updated in place, either the old pods lose their grants
    before they are gone or the new pods start before theirs exist. Under new names the new
    grants are created first (the Deployment depends on them, ``program.register_reporter``)
    and the old ones, no longer declared, are deleted at the end of the update, after the
    Deployment has rolled out -- with the ServiceAccount kept, both sets apply meanwhile.
    """
    return f"{owner.reporter}-stack"


def build_reporter_objects(
    served: list[Served],
    namespace: str,
    image: str,
    replicas: int = 2,
    labels: dict[str, str] | None = None,
    log_level: int = 3,
    image_pull_policy: str = "IfNotPresent",
) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole(+Binding), a Role(+Binding) per namespace it needs, and the
    Deployment of the stack's reporter, serving ``served`` (the first names it).

    The reporter runs in ``namespace`` (the first served deployment's), where its Lease lives;
    its Events go to ``names.CLUSTER_EVENT_NAMESPACE``.
    """
    if not served:
        raise ValueError("a reporter serves at least one deployment")
    owner = served[0][0]
    lbls = reporter_labels(owner, labels or {})
    name = owner.reporter

    def meta(ns: str | None) -> dict[str, Any]:
        m: dict[str, Any] = {"name": name, "labels": dict(lbls)}
        if ns is not None:
            m["namespace"] = ns
        return m

    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    grants = rbac_name(owner)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(namespace)},
        {
            "apiVersion": f"{RBAC_API}/v1",
            "kind": "ClusterRole",
            "metadata": {**meta(None), "name": grants},
            "rules": cluster_role_rules(served),
        },
        {
            "apiVersion": f"{RBAC_API}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {**meta(None), "name": grants},
            "subjects": subjects,
            "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": grants},
        },
    ]
    for ns, rules in namespace_rules(served, namespace).items():
        # The Events Role in "default" keeps the name it always had (its one rule is the
        # per-deployment layout's: updated in place); the others are new (``rbac_name``).
        role = (
            owner.reporter_events if ns == n.CLUSTER_EVENT_NAMESPACE and ns != namespace else grants
        )
        role_meta = {**meta(ns), "name": role}
        objects += [
            {"apiVersion": f"{RBAC_API}/v1", "kind": "Role", "metadata": role_meta, "rules": rules},
            {
                "apiVersion": f"{RBAC_API}/v1",
                "kind": "RoleBinding",
                "metadata": dict(role_meta),
                "subjects": subjects,
                "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": role},
            },
        ]
    objects.append(
        build_reporter_deployment(
            served, namespace, image, replicas, lbls, log_level, image_pull_policy
        )
    )
    return objects


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def build_reporter_deployment(
    served: list[Served],
    namespace: str,
    image: str,
    replicas: int,
    labels: dict[str, str],
    log_level: int,
    image_pull_policy: str,
) -> dict[str, Any]:
    names = served[0][0]
    selector = reporter_selector(names)
    args = [arg for served_names, _ in served for arg in ("--deployment", served_names.name)]
    args += [
        "--shared-watches",
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
        "env": [{"name": k, "value": v} for k, v in ENV.items()],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 1),
        "resources": reporter_resources(len({ns for _, ns in served})),
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


def with_allowed_field_owners(
    deployment: dict[str, Any], allowed: Sequence[fieldowners.Allowance]
) -> dict[str, Any]:
    """The reporter's Deployment with the administrator's field ownership policy entries in
    its container's environment (:data:`pmem_components.fieldowners.ALLOWED_ENV`), so the
    reporter and the program's take-over judge drift by one list. Unchanged without entries.
    """
    if not allowed:
        return deployment
    value = json.dumps(
        [{"manager": a.manager, "paths": list(a.paths), "reason": a.reason} for a in allowed]
    )
    out = copy.deepcopy(deployment)
    for container in out["spec"]["template"]["spec"]["containers"]:
        env = [e for e in container.get("env") or [] if e.get("name") != fieldowners.ALLOWED_ENV]
        container["env"] = [*env, {"name": fieldowners.ALLOWED_ENV, "value": value}]
    return out
