"""The stack's reporter: its Deployment and least-privilege RBAC, as built for the program."""

from __future__ import annotations

from pmem_components.manifests.reporter import (
    LIMITS,
    MEMORY_PER_NAMESPACE_MIB,
    REQUESTS,
    build_reporter_objects,
)
from pmem_components.names import DeploymentNames

NAMES = DeploymentNames("pmem-csi.intel.com")
OTHER = DeploymentNames("other.example.org")


def all_objects(served=None, **kw):
    args = {
        "namespace": "drv",
        "image": "reg/reporter:1",
        "replicas": 2,
        "labels": {"team": "storage"},
        "log_level": 4,
        "image_pull_policy": "Always",
    }
    args.update(kw)
    return build_reporter_objects(served or [(NAMES, args["namespace"])], **args)


def objects(**kw):
    """The objects in the reporter's namespace and the cluster-scoped ones, by kind."""
    ns = kw.get("namespace", "drv")
    return {o["kind"]: o for o in all_objects(**kw) if o["metadata"].get("namespace") in (None, ns)}


def verbs_for(rules, group, resource):
    return [
        (sorted(r["verbs"]), r.get("resourceNames"))
        for r in rules
        if group in r["apiGroups"] and resource in r["resources"]
    ]


def test_kinds_names_and_labels():
    objs = objects()
    assert set(objs) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
    }
    for o in objs.values():
        if o["kind"] in ("ServiceAccount", "Deployment"):
            assert o["metadata"]["name"] == "pmem-csi-intel-com-reporter"
        else:
            # Not the names the per-deployment layout's grants had (review of issue 16): one
            # `pulumi up` creates these before the Deployment rolls, and deletes the old ones
            # (still granting the old pods what they watch) only at its end.
            assert o["metadata"]["name"] == "pmem-csi-intel-com-reporter-stack"
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "pmem-csi"
        assert labels["app.kubernetes.io/instance"] == "pmem-csi-intel-com"
        assert labels["team"] == "storage"
        if o["kind"].startswith("Cluster"):
            assert "namespace" not in o["metadata"]
        else:
            assert o["metadata"]["namespace"] == "drv"


NAMESPACED = [
    ("", "pods"),
    ("", "services"),
    ("", "serviceaccounts"),
    ("apps", "daemonsets"),
    ("apps", "statefulsets"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("", "secrets"),
]


def test_the_cluster_role_grants_no_namespaced_kind():
    """Review of issue 16: going to one reporter per stack made the ClusterRole list/watch/get
    pods, services, daemon sets... in every namespace of the cluster."""
    served = [(NAMES, "drv"), (OTHER, "drv2")]
    (role,) = [o for o in all_objects(served) if o["kind"] == "ClusterRole"]
    for group, res in NAMESPACED:
        assert verbs_for(role["rules"], group, res) == [], res


def test_namespaced_kinds_are_granted_in_the_driver_namespaces_only():
    served = [(NAMES, "drv"), (OTHER, "drv2")]
    roles = {o["metadata"]["namespace"]: o for o in all_objects(served) if o["kind"] == "Role"}
    for ns in ("drv", "drv2"):
        rules = roles[ns]["rules"]
        assert verbs_for(rules, "", "pods") == [(["list", "watch"], None)]
        # Secrets by label in the driver namespace (one watch for all its deployments):
        # list/watch, never get.
        assert verbs_for(rules, "", "secrets") == [(["list", "watch"], None)]
        for group, res in NAMESPACED:
            if res not in ("pods", "secrets"):
                assert verbs_for(rules, group, res) == [(["get", "list", "watch"], None)], res
    for group, res in NAMESPACED:
        assert verbs_for(roles["default"]["rules"], group, res) == [], res


def test_cluster_role_grants_the_served_crs_and_label_watches_but_no_secrets():
    served = [(NAMES, "drv"), (OTHER, "drv2")]
    (role,) = [o for o in all_objects(served) if o["kind"] == "ClusterRole"]
    rules = role["rules"]
    crs = ["pmem-csi.intel.com", "other.example.org"]
    assert verbs_for(rules, "pmem-csi.intel.com", "deployments") == [
        (["list", "watch"], None),
        (["get"], crs),
    ]
    assert verbs_for(rules, "pmem-csi.intel.com", "deployments/status") == [(["patch"], crs)]
    for group, res in [
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
        ("storage.k8s.io", "csidrivers"),
    ]:
        # get: the metadata of an expected object missing from the label-selected cache.
        assert verbs_for(rules, group, res) == [(["get", "list", "watch"], None)], res
    assert verbs_for(rules, "", "secrets") == []
    assert all("create" not in r["verbs"] and "delete" not in r["verbs"] for r in rules)


def test_secrets_in_driver_namespaces_lease_where_the_reporter_runs():
    served = [(NAMES, "drv"), (OTHER, "drv2")]
    roles = {o["metadata"]["namespace"]: o for o in all_objects(served) if o["kind"] == "Role"}
    assert set(roles) == {"drv", "drv2", "default"}
    # By label in the driver namespaces (test_namespaced_kinds_are_granted_in_the_driver_...).
    assert verbs_for(roles["drv2"]["rules"], "", "secrets") == [(["list", "watch"], None)]
    assert verbs_for(roles["drv2"]["rules"], "coordination.k8s.io", "leases") == []
    assert verbs_for(roles["drv"]["rules"], "", "secrets") == [(["list", "watch"], None)]
    assert verbs_for(roles["drv"]["rules"], "coordination.k8s.io", "leases") == [
        (["create"], None),
        (["get", "update"], ["pmem-csi-intel-com-reporter"]),
    ]
    bindings = [o for o in all_objects(served) if o["kind"] == "RoleBinding"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"drv", "drv2", "default"}
    for b in bindings:
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "pmem-csi-intel-com-reporter", "namespace": "drv"}
        ]


def test_deployment_serves_every_deployment_with_shared_watches():
    served = [(NAMES, "drv"), (OTHER, "drv2")]
    (dep,) = [o for o in all_objects(served, replicas=3) if o["kind"] == "Deployment"]
    spec = dep["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "pmem-csi-intel-com-reporter"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "reg/reporter:1" and c["imagePullPolicy"] == "Always"
    assert c["args"][:7] == [
        "--deployment",
        "pmem-csi.intel.com",
        "--deployment",
        "other.example.org",
        "--shared-watches",
        "--namespace",
        "drv",
    ]
    assert "--log-level" in c["args"] and "4" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # Two driver namespaces: the memory of one more namespace's watches on top.
    assert c["resources"] == {
        "requests": {"cpu": "100m", "memory": "130Mi"},
        "limits": {"memory": "386Mi"},
    }
    selector = spec["selector"]["matchLabels"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in selector.items())
    assert selector["app.kubernetes.io/component"] == "reporter"


def test_events_role_in_default_namespace():
    """Events about the cluster-scoped CR are only accepted in "default"; grant exactly that."""
    extra = [o for o in all_objects() if o["metadata"].get("namespace") == "default"]
    assert [o["kind"] for o in extra] == ["Role", "RoleBinding"]
    role, binding = extra
    assert role["metadata"]["name"] == "pmem-csi-intel-com-reporter-events"
    assert verbs_for(role["rules"], "", "events") == [(["create"], None)]
    assert len(role["rules"]) == 1
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pmem-csi-intel-com-reporter", "namespace": "drv"}
    ]
    assert binding["roleRef"]["name"] == "pmem-csi-intel-com-reporter-events"


def test_driver_in_default_namespace_gets_events_rule_in_its_role():
    objs = all_objects(namespace="default")
    assert [o["kind"] for o in objs].count("Role") == 1
    (role,) = [o for o in objs if o["kind"] == "Role"]
    assert verbs_for(role["rules"], "", "events") == [(["create"], None)]
    assert verbs_for(role["rules"], "", "secrets") == [(["list", "watch"], None)]


def _resources(served: list) -> dict:
    (dep,) = [o for o in all_objects(served) if o["kind"] == "Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_the_reporters_memory_grows_with_its_driver_namespaces_not_with_deployments() -> None:
    """BENCHMARKS.md section 6: 62 MiB RSS with one driver namespace, 214 MiB with 100 (8
    watches each, ~190 KiB a watch), while a fixed 128Mi request left a 100-namespace reporter
    using more than it requested (the first pod evicted under memory pressure)."""
    one = [(NAMES, "drv"), (OTHER, "drv")]  # two deployments, one namespace
    assert _resources(one) == {"requests": REQUESTS, "limits": LIMITS}
    hundred = [(DeploymentNames(f"d{i}.example.org"), f"ns{i}") for i in range(100)]
    res = _resources(hundred)
    assert res == {
        "requests": {"cpu": "100m", "memory": f"{128 + 99 * MEMORY_PER_NAMESPACE_MIB}Mi"},
        "limits": {"memory": f"{384 + 99 * MEMORY_PER_NAMESPACE_MIB}Mi"},
    }
    assert int(res["requests"]["memory"].removesuffix("Mi")) >= 214  # the measured RSS

