"""The reporter's Deployment and least-privilege RBAC, as built for the Pulumi program."""

from __future__ import annotations

from pmem_components.manifests.reporter import build_reporter_objects
from pmem_components.names import DeploymentNames

NAMES = DeploymentNames("pmem-csi.intel.com")


def all_objects(**kw):
    args = {
        "names": NAMES,
        "namespace": "drv",
        "image": "reg/reporter:1",
        "replicas": 2,
        "labels": {"team": "storage"},
        "log_level": 4,
        "image_pull_policy": "Always",
    }
    args.update(kw)
    return build_reporter_objects(**args)


def objects(**kw):
    """The objects in the reporter's namespace and the cluster-scoped ones, by kind."""
    return {
        o["kind"]: o
        for o in all_objects(**kw)
        if o["metadata"].get("namespace") != "default" or kw.get("namespace") == "default"
    }


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
        assert o["metadata"]["name"] == "pmem-csi-intel-com-reporter"
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "pmem-csi"
        assert labels["app.kubernetes.io/instance"] == "pmem-csi-intel-com"
        assert labels["team"] == "storage"
        if o["kind"].startswith("Cluster"):
            assert "namespace" not in o["metadata"]
        else:
            assert o["metadata"]["namespace"] == "drv"


def test_cluster_role_is_least_privilege():
    rules = objects()["ClusterRole"]["rules"]
    assert verbs_for(rules, "pmem-csi.intel.com", "deployments") == [
        (["get", "list", "watch"], ["pmem-csi.intel.com"])
    ]
    # Only this deployment's own cluster-scoped objects, by name; nothing cluster-wide.
    assert verbs_for(rules, "pmem-csi.intel.com", "deployments/status") == [
        (["patch"], ["pmem-csi.intel.com"])
    ]
    for group, res, name in [
        ("rbac.authorization.k8s.io", "clusterroles", NAMES.provisioner_cluster_role),
        (
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            NAMES.provisioner_cluster_role_binding,
        ),
        ("storage.k8s.io", "csidrivers", NAMES.csi_driver),
    ]:
        assert verbs_for(rules, group, res) == [(["list", "watch"], [name])]
    assert all(r.get("resourceNames") for r in rules)
    all_verbs = {v for r in rules for v in r["verbs"]}
    assert all_verbs == {"get", "list", "watch", "patch"}
    assert not any("*" in r["resources"] or "*" in r["verbs"] for r in rules)


def test_role_secrets_by_name_events_and_lease():
    rules = objects()["Role"]["rules"]
    assert verbs_for(rules, "", "secrets") == [
        (
            ["list", "watch"],
            ["pmem-csi-intel-com-registry-secrets", "pmem-csi-intel-com-node-secrets"],
        )
    ]
    assert verbs_for(rules, "", "events") == []  # they go to "default", see below
    assert verbs_for(rules, "coordination.k8s.io", "leases") == [
        (["create"], None),
        (["get", "update"], ["pmem-csi-intel-com-reporter"]),
    ]
    assert verbs_for(rules, "", "pods") == [(["list", "watch"], None)]
    # get (metadata only) tells a relabelled object from a missing one.
    for group, res in [
        ("", "services"),
        ("", "serviceaccounts"),
        ("apps", "daemonsets"),
        ("apps", "statefulsets"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
    ]:
        assert verbs_for(rules, group, res) == [(["get", "list", "watch"], None)]
    binding = objects()["RoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pmem-csi-intel-com-reporter", "namespace": "drv"}
    ]
    assert binding["roleRef"]["name"] == "pmem-csi-intel-com-reporter"


def test_deployment():
    dep = objects(replicas=3)["Deployment"]
    spec = dep["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "pmem-csi-intel-com-reporter"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "reg/reporter:1" and c["imagePullPolicy"] == "Always"
    assert c["args"][:4] == ["--deployment", "pmem-csi.intel.com", "--namespace", "drv"]
    assert "--log-level" in c["args"] and "4" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["requests"] and c["resources"]["limits"]
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
