"""Manifest builders: every object of a deployment and the effect of every config field.

Expected values come from the reference operator (intel/pmem-csi d01bc59,
controller_driver.go): names, args, env, ports, volumes, security settings, RBAC rules.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pmem_components import names
from pmem_components.config import DeploymentConfig, load_config
from pmem_components.manifests import (
    bundle,
    controller,
    csidriver,
    deployment_cr,
    labels,
    namespace,
    node,
    rbac,
    secrets,
    services,
)
from pmem_components.manifests.crd import CRD_FILE

CRD_ROOT = CRD_FILE.parent.parent


def cfg(**fields: Any) -> DeploymentConfig:
    return load_config({"deployments": [fields]}, check_certificates=False).deployments[0]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def volumes(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c["volumeMounts"]}


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# ------------------------------------------------------------------------------ object set


def test_bundle_contains_every_object_with_reference_names() -> None:
    objs = bundle.build_deployment_objects(cfg()).all()
    got = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objs}
    ns = "pmem-csi"
    expected = {
        ("Namespace", "pmem-csi", None),
        ("Secret", "pmem-csi-intel-com-registry-secrets", ns),
        ("Secret", "pmem-csi-intel-com-node-secrets", ns),
        ("CSIDriver", "pmem-csi.intel.com", None),
        ("ServiceAccount", "pmem-csi-intel-com-controller", ns),
        ("Role", "pmem-csi-intel-com-external-provisioner-cfg", ns),
        ("RoleBinding", "pmem-csi-intel-com-csi-provisioner-role-cfg", ns),
        ("ClusterRole", "pmem-csi-intel-com-external-provisioner-runner", None),
        ("ClusterRoleBinding", "pmem-csi-intel-com-csi-provisioner-role", None),
        ("Service", "pmem-csi-intel-com-controller", ns),
        ("Service", "pmem-csi-intel-com-metrics", ns),
        ("StatefulSet", "pmem-csi-intel-com-controller", ns),
        ("DaemonSet", "pmem-csi-intel-com-node", ns),
        ("Deployment", "pmem-csi.intel.com", None),
    }
    assert expected <= got
    # Anything else can only be the reporter's objects.
    for kind, name, _ in got - expected:
        assert name.startswith("pmem-csi-intel-com-reporter"), (kind, name)


def test_namespace_can_be_left_out() -> None:
    objs = bundle.build_deployment_objects(cfg(createNamespace=False)).all()
    assert "Namespace" not in {o["kind"] for o in objs}
    objs = bundle.build_deployment_objects(cfg(), create_namespace=False).all()
    assert "Namespace" not in {o["kind"] for o in objs}
    assert namespace.build_namespace(cfg(namespace="x"))["metadata"]["name"] == "x"


def test_disabled_reporter_has_no_objects() -> None:
    assert bundle.reporter_objects(cfg(reporter={"enabled": False})) == []
    assert "reporter" not in bundle.object_names(cfg(reporter={"enabled": False}))
    with_image = cfg(reporter={"image": "registry.example/pmem-csi-reporter:1"})
    assert bundle.object_names(with_image)["reporter"] == "pmem-csi-intel-com-reporter"


def test_reporter_is_deployed_only_with_an_image_and_runs_that_image() -> None:
    """No public reporter image exists: without ``reporter.image`` nothing is deployed."""
    assert bundle.reporter_objects(cfg()) == []
    assert "reporter" not in bundle.object_names(cfg())
    image = "registry.example/pmem-csi-reporter@sha256:" + "0" * 64
    objs = bundle.reporter_objects(cfg(reporter={"image": image}))
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert container(dep, "reporter")["image"] == image


def test_object_names_follow_the_driver_name() -> None:
    got = bundle.object_names(cfg(name="a.b"))
    assert got["csiDriver"] == "a.b" and got["deployment"] == "a.b"
    assert got["nodeDaemonSet"] == "a-b-node"
    assert got["controllerStatefulSet"] == "a-b-controller"


# ------------------------------------------------------------------------------ labels


def test_every_object_and_pod_template_has_the_common_and_configured_labels() -> None:
    c = cfg(name="x.y", labels={"team": "storage", "example.com/tier": "a"})
    for obj in bundle.build_deployment_objects(c).all():
        metas = [obj["metadata"]]
        if "template" in obj.get("spec", {}):
            metas.append(obj["spec"]["template"]["metadata"])
        for meta in metas:
            lab = meta["labels"]
            assert lab["team"] == "storage", obj["kind"]
            assert lab["example.com/tier"] == "a"
            assert lab[names.LABEL_PART_OF] == "pmem-csi"
            assert lab[names.LABEL_INSTANCE] == "x-y"
            assert lab[names.LABEL_NAME] == "pmem-csi"
            assert lab[names.LABEL_MANAGED_BY] == "pmem-csi-pulumi"
            assert lab[names.LABEL_COMPONENT]


def test_pod_templates_have_app_label_webhook_opt_out_and_scrape_annotation() -> None:
    ss = controller.build_controller_statefulset(cfg())
    ds = node.build_node_daemonset(cfg())
    for obj, app in ((ss, "pmem-csi-intel-com-controller"), (ds, "pmem-csi-intel-com-node")):
        meta = obj["spec"]["template"]["metadata"]
        assert meta["labels"]["app"] == app
        assert meta["labels"]["pmem-csi.intel.com/webhook"] == "ignore"
        assert meta["annotations"] == {"pmem-csi.intel.com/scrape": "containers"}
        assert obj["spec"]["selector"] == {"matchLabels": {"app": app}}


def test_common_labels_win_over_nothing_but_keep_user_labels() -> None:
    got = labels.common_labels(cfg(labels={"a": "b"}), "node")
    assert got["a"] == "b" and got[names.LABEL_COMPONENT] == "node"


# ------------------------------------------------------------------------------ controller


def test_controller_statefulset() -> None:
    ss = controller.build_controller_statefulset(cfg())
    assert ss["apiVersion"] == "apps/v1" and ss["kind"] == "StatefulSet"
    assert ss["metadata"]["namespace"] == "pmem-csi"
    spec = ss["spec"]
    assert spec["replicas"] == 1
    assert spec["serviceName"] == "pmem-csi-intel-com-controller"
    pod = spec["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000}
    assert pod["serviceAccountName"] == "pmem-csi-intel-com-controller"
    assert [c["name"] for c in pod["containers"]] == ["pmem-driver", "external-provisioner"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "pmem-csi.intel.com/controller", "operator": "NotIn", "values": ["no", "false"]}
    ]
    # The reference's master taint, and control-plane, its name on current clusters.
    assert pod["tolerations"] == [
        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
    ]
    vols = volumes(ss)
    assert vols["plugin-socket-dir"] == {"name": "plugin-socket-dir", "emptyDir": {}}
    assert vols["tmp-dir"] == {"name": "tmp-dir", "emptyDir": {}}
    assert vols["registry-cert"]["secret"] == {"secretName": "pmem-csi-intel-com-registry-secrets"}


def test_controller_container() -> None:
    c = container(controller.build_controller_statefulset(cfg()), "pmem-driver")
    assert c["image"] == "intel/pmem-csi-driver:canary"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["command"] == [
        "/usr/local/bin/pmem-csi-driver",
        "-v=5",
        "-mode=controller",
        "-endpoint=unix:///csi/csi-controller.sock",
        "-registryEndpoint=tcp://0.0.0.0:10000",
        "-nodeid=$(KUBE_NODE_NAME)",
        "-caFile=/certs/ca.crt",
        "-certFile=/certs/tls.crt",
        "-keyFile=/certs/tls.key",
        "-drivername=$(PMEM_CSI_DRIVER_NAME)",
        "-metricsListen=:10010",
    ]
    assert env(c) == {
        "KUBE_NODE_NAME": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
        "TERMINATION_LOG_PATH": "/tmp/termination-log",
        "PMEM_CSI_DRIVER_NAME": "pmem-csi.intel.com",
        "GODEBUG": "x509ignoreCN=0",
    }
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {
        "registry-cert": "/certs",
        "plugin-socket-dir": "/csi",
        "tmp-dir": "/tmp",
    }
    assert c["ports"] == [{"name": "metrics", "containerPort": 10010, "protocol": "TCP"}]
    assert c["resources"] == {"limits": {"cpu": "100m", "memory": "250Mi"}}
    assert c["terminationMessagePath"] == "/tmp/termination-log"
    assert c["securityContext"] == {"readOnlyRootFilesystem": True}


def test_provisioner_container() -> None:
    c = container(controller.build_controller_statefulset(cfg()), "external-provisioner")
    assert c["image"] == "k8s.gcr.io/sig-storage/csi-provisioner:v2.0.2"
    assert c["args"] == [
        "-v=5",
        "--csi-address=/csi/csi-controller.sock",
        "--feature-gates=Topology=true",
        "--strict-topology=true",
        "--timeout=5m",
        "--default-fstype=ext4",
        "--metrics-address=:10011",
    ]
    assert c["ports"] == [{"name": "prov-metrics", "containerPort": 10011, "protocol": "TCP"}]
    assert c["volumeMounts"] == [{"name": "plugin-socket-dir", "mountPath": "/csi"}]
    assert c["securityContext"] == {"readOnlyRootFilesystem": True}


# ------------------------------------------------------------------------------ node


def test_node_daemonset() -> None:
    ds = node.build_node_daemonset(cfg())
    assert ds["apiVersion"] == "apps/v1" and ds["kind"] == "DaemonSet"
    assert ds["metadata"]["name"] == "pmem-csi-intel-com-node"
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"storage": "pmem"}
    assert [c["name"] for c in pod["containers"]] == ["pmem-driver", "driver-registrar"]
    vols = {n: v.get("hostPath", v.get("secret")) for n, v in volumes(ds).items()}
    dc = "DirectoryOrCreate"
    assert vols == {
        "socket-dir": {"path": "/var/lib/kubelet/plugins/pmem-csi.intel.com", "type": dc},
        "registration-dir": {"path": "/var/lib/kubelet/plugins_registry/", "type": dc},
        "mountpoint-dir": {"path": "/var/lib/kubelet/plugins/kubernetes.io/csi", "type": dc},
        "pods-dir": {"path": "/var/lib/kubelet/pods", "type": dc},
        "node-cert": {"secretName": "pmem-csi-intel-com-node-secrets"},
        "pmem-state-dir": {"path": "/var/lib/pmem-csi.intel.com", "type": dc},
        "dev-dir": {"path": "/dev", "type": dc},
        "sys-dir": {"path": "/sys", "type": dc},
    }


def test_node_driver_container() -> None:
    c = container(node.build_node_daemonset(cfg()), "pmem-driver")
    assert c["command"] == [
        "/usr/local/bin/pmem-csi-driver",
        "-deviceManager=lvm",
        "-v=5",
        "-mode=node",
        "-endpoint=unix:///csi/csi.sock",
        "-nodeid=$(KUBE_NODE_NAME)",
        "-controllerEndpoint=tcp://$(KUBE_POD_IP):10001",
        "-registryEndpoint=tcp://pmem-csi-intel-com-controller:10000",
        "-caFile=/certs/ca.crt",
        "-certFile=/certs/tls.crt",
        "-keyFile=/certs/tls.key",
        "-statePath=/var/lib/$(PMEM_CSI_DRIVER_NAME)",
        "-drivername=$(PMEM_CSI_DRIVER_NAME)",
        "-pmemPercentage=100",
        "-metricsListen=:10010",
    ]
    assert env(c) == {
        "KUBE_NODE_NAME": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
        "KUBE_POD_IP": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
        "PMEM_CSI_DRIVER_NAME": "pmem-csi.intel.com",
        "TERMINATION_LOG_PATH": "/tmp/termination-log",
        "GODEBUG": "x509ignoreCN=0",
    }
    m = mounts(c)
    assert m["mountpoint-dir"] == {
        "name": "mountpoint-dir",
        "mountPath": "/var/lib/kubelet/plugins/kubernetes.io/csi",
        "mountPropagation": "Bidirectional",
    }
    assert m["pods-dir"]["mountPath"] == "/var/lib/kubelet/pods"
    assert m["pods-dir"]["mountPropagation"] == "Bidirectional"
    assert m["pmem-state-dir"]["mountPath"] == "/var/lib/pmem-csi.intel.com"
    assert m["pmem-state-dir"]["mountPropagation"] == "Bidirectional"
    assert {n: x["mountPath"] for n, x in m.items() if "mountPropagation" not in x} == {
        "node-cert": "/certs",
        "dev-dir": "/dev",
        "sys-dir": "/sys",
        "socket-dir": "/csi",
    }
    assert c["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert c["ports"] == [{"name": "metrics", "containerPort": 10010, "protocol": "TCP"}]
    assert c["resources"] == {"limits": {"cpu": "100m", "memory": "250Mi"}}
    assert c["terminationMessagePath"] == "/tmp/termination-log"


def test_registrar_container() -> None:
    c = container(node.build_node_daemonset(cfg()), "driver-registrar")
    assert c["image"] == "k8s.gcr.io/sig-storage/csi-node-driver-registrar:v1.2.0"
    assert c["args"] == [
        "-v=5",
        "--kubelet-registration-path=/var/lib/kubelet/plugins/$(PMEM_CSI_DRIVER_NAME)/csi.sock",
        "--csi-address=/csi/csi.sock",
    ]
    assert c["env"] == [{"name": "PMEM_CSI_DRIVER_NAME", "value": "pmem-csi.intel.com"}]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {
        "socket-dir": "/csi",
        "registration-dir": "/registration",
    }
    assert c["securityContext"] == {"readOnlyRootFilesystem": True}
    assert c["resources"] == {"limits": {"cpu": "100m", "memory": "250Mi"}}


# ------------------------------------------------------------------------------ config effects


def test_images_and_pull_policy() -> None:
    c = cfg(image="d:1", provisionerImage="p:2", nodeRegistrarImage="r:3", imagePullPolicy="Never")
    ss, ds = controller.build_controller_statefulset(c), node.build_node_daemonset(c)
    assert container(ss, "pmem-driver")["image"] == "d:1"
    assert container(ds, "pmem-driver")["image"] == "d:1"
    assert container(ss, "external-provisioner")["image"] == "p:2"
    assert container(ds, "driver-registrar")["image"] == "r:3"
    for obj in (ss, ds):
        for ctr in obj["spec"]["template"]["spec"]["containers"]:
            assert ctr["imagePullPolicy"] == "Never"


def test_resources() -> None:
    c = cfg(
        controllerResources={"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
        nodeResources={"requests": {"memory": "2Gi"}},
    )
    ss, ds = controller.build_controller_statefulset(c), node.build_node_daemonset(c)
    for ctr in ss["spec"]["template"]["spec"]["containers"]:
        assert ctr["resources"] == {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1"}}
    for ctr in ds["spec"]["template"]["spec"]["containers"]:
        assert ctr["resources"] == {"requests": {"memory": "2Gi"}}


def test_direct_mode_has_no_pmem_percentage() -> None:
    cmd = container(node.build_node_daemonset(cfg(deviceMode="direct")), "pmem-driver")["command"]
    assert "-deviceManager=direct" in cmd
    assert not any(a.startswith("-pmemPercentage") for a in cmd)
    cmd = container(node.build_node_daemonset(cfg(pmemPercentage=42)), "pmem-driver")["command"]
    assert "-pmemPercentage=42" in cmd


def test_log_level_reaches_every_container() -> None:
    c = cfg(logLevel=2)
    ss, ds = controller.build_controller_statefulset(c), node.build_node_daemonset(c)
    assert "-v=2" in container(ss, "pmem-driver")["command"]
    assert "-v=2" in container(ss, "external-provisioner")["args"]
    assert "-v=2" in container(ds, "pmem-driver")["command"]
    assert "-v=2" in container(ds, "driver-registrar")["args"]


def test_node_selector() -> None:
    ds = node.build_node_daemonset(cfg(nodeSelector={"pmem": "yes", "zone": "a"}))
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"pmem": "yes", "zone": "a"}


def test_kubelet_dir() -> None:
    ds = node.build_node_daemonset(cfg(kubeletDir="/k/"))
    paths = {v["hostPath"]["path"] for v in volumes(ds).values() if "hostPath" in v}
    assert {"/k/plugins/pmem-csi.intel.com", "/k/plugins_registry/", "/k/pods"} <= paths
    assert "/k/plugins/kubernetes.io/csi" in paths
    reg = container(ds, "driver-registrar")["args"][1]
    assert reg == "--kubelet-registration-path=/k/plugins/$(PMEM_CSI_DRIVER_NAME)/csi.sock"
    m = mounts(container(ds, "pmem-driver"))
    assert m["pods-dir"]["mountPath"] == "/k/pods"


def test_name_and_namespace() -> None:
    c = cfg(name="pmem.example.org", namespace="storage")
    for obj in bundle.build_deployment_objects(c).all():
        meta = obj["metadata"]
        if obj["kind"] in ("Namespace", "CSIDriver", "ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in meta
        elif obj["kind"] == "Deployment" and obj["apiVersion"].startswith("pmem-csi"):
            assert "namespace" not in meta and meta["name"] == "pmem.example.org"
        elif meta["name"] == "pmem-example-org-reporter-events":
            # Events about the cluster-scoped CR are only accepted in "default".
            assert meta["namespace"] == "default", obj["kind"]
        else:
            assert meta["namespace"] == "storage", obj["kind"]
    ds = node.build_node_daemonset(c)
    cmd = container(ds, "pmem-driver")["command"]
    assert "-registryEndpoint=tcp://pmem-example-org-controller:10000" in cmd
    assert env(container(ds, "pmem-driver"))["PMEM_CSI_DRIVER_NAME"] == "pmem.example.org"
    assert volumes(ds)["pmem-state-dir"]["hostPath"]["path"] == "/var/lib/pmem.example.org"
    for binding in (
        rbac.build_provisioner_role_binding(c),
        rbac.build_provisioner_cluster_role_binding(c),
    ):
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "pmem-example-org-controller",
                "namespace": "storage",
            }
        ]


# ------------------------------------------------------------------------------ rbac, services


def test_service_account_and_role() -> None:
    c = cfg()
    sa = rbac.build_service_account(c)
    assert (sa["apiVersion"], sa["kind"]) == ("v1", "ServiceAccount")
    role = rbac.build_provisioner_role(c)
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in role["rules"]}
    all_verbs = ["get", "watch", "list", "delete", "update", "create"]
    assert rules == {
        ("", "endpoints"): all_verbs,
        ("coordination.k8s.io", "leases"): all_verbs,
        ("storage.k8s.io", "csistoragecapacities"): [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
        ],
        ("", "pods"): ["get"],
        ("apps", "replicasets"): ["get"],
    }
    rb = rbac.build_provisioner_role_binding(c)
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "pmem-csi-intel-com-external-provisioner-cfg",
    }


def test_cluster_role() -> None:
    c = cfg()
    cr = rbac.build_provisioner_cluster_role(c)
    assert "namespace" not in cr["metadata"]
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in cr["rules"]}
    assert rules == {
        ("", "persistentvolumes"): ["get", "list", "watch", "create", "delete"],
        ("", "persistentvolumeclaims"): ["get", "list", "watch", "update"],
        ("storage.k8s.io", "storageclasses"): ["get", "list", "watch"],
        ("", "events"): ["list", "watch", "create", "update", "patch"],
        ("snapshot.storage.k8s.io", "volumesnapshots"): ["get", "list"],
        ("snapshot.storage.k8s.io", "volumesnapshotcontents"): ["get", "list"],
        ("storage.k8s.io", "csinodes"): ["get", "list", "watch"],
        ("", "nodes"): ["get", "list", "watch"],
    }
    crb = rbac.build_provisioner_cluster_role_binding(c)
    assert crb["roleRef"]["kind"] == "ClusterRole"
    assert crb["roleRef"]["name"] == "pmem-csi-intel-com-external-provisioner-runner"


def test_services() -> None:
    ctl = services.build_controller_service(cfg())
    met = services.build_metrics_service(cfg())
    assert ctl["spec"] == {
        "type": "ClusterIP",
        "ports": [{"port": 10000, "targetPort": 10000}],
        "selector": {"app": "pmem-csi-intel-com-controller"},
    }
    assert met["spec"] == {
        "type": "NodePort",
        "ports": [{"port": 10010, "targetPort": 10010}],
        "selector": {"app": "pmem-csi-intel-com-controller"},
    }


def test_csi_driver() -> None:
    d = csidriver.build_csi_driver(cfg())
    assert d["apiVersion"] == "storage.k8s.io/v1"
    assert d["metadata"]["name"] == "pmem-csi.intel.com"
    assert d["spec"] == {
        "attachRequired": False,
        "podInfoOnMount": True,
        "volumeLifecycleModes": ["Persistent", "Ephemeral"],
    }


def test_tls_secrets() -> None:
    c = cfg()
    reg = secrets.build_registry_secret(c, "CA", "RC", "RK")
    nod = secrets.build_node_secret(c, "CA", "NC", "NK")
    assert reg["type"] == nod["type"] == "kubernetes.io/tls"
    assert reg["metadata"]["name"] == "pmem-csi-intel-com-registry-secrets"
    assert nod["metadata"]["name"] == "pmem-csi-intel-com-node-secrets"
    assert reg["stringData"] == {"ca.crt": "CA", "tls.crt": "RC", "tls.key": "RK"}
    assert nod["stringData"] == {"ca.crt": "CA", "tls.crt": "NC", "tls.key": "NK"}


# ------------------------------------------------------------------------------ the CR


def test_deployment_cr_mirrors_effective_config() -> None:
    cr = deployment_cr.build_deployment_cr(cfg(labels={"t": "x"}))
    assert cr["apiVersion"] == "pmem-csi.intel.com/v1beta1" and cr["kind"] == "Deployment"
    assert cr["metadata"]["name"] == "pmem-csi.intel.com"
    assert "namespace" not in cr["metadata"] and "status" not in cr
    assert cr["spec"] == {
        "namespace": "pmem-csi",
        "image": "intel/pmem-csi-driver:canary",
        "imagePullPolicy": "IfNotPresent",
        "provisionerImage": "k8s.gcr.io/sig-storage/csi-provisioner:v2.0.2",
        "nodeRegistrarImage": "k8s.gcr.io/sig-storage/csi-node-driver-registrar:v1.2.0",
        "controllerResources": {"limits": {"cpu": "100m", "memory": "250Mi"}},
        "nodeResources": {"limits": {"cpu": "100m", "memory": "250Mi"}},
        "deviceMode": "lvm",
        "logLevel": 5,
        "pmemPercentage": 100,
        "nodeSelector": {"storage": "pmem"},
        "labels": {"t": "x"},
        "kubeletDir": "/var/lib/kubelet",
        "reporter": {
            "enabled": False,
            "replicas": 2,
            "logLevel": 3,
        },
    }


def test_deployment_cr_direct_mode_and_patches() -> None:
    patch = {"kind": "DaemonSet", "name": "n", "jsonPatch": [{"op": "remove", "path": "/x"}]}
    spec = deployment_cr.build_spec(cfg(deviceMode="ndctl", patches=[patch]))
    assert spec["deviceMode"] == "direct" and "pmemPercentage" not in spec
    assert spec["patches"] == [patch]


def test_deployment_cr_has_public_certificates_only() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n"
    key = "-----BEGIN PRIVATE KEY-----\nSECRET\n-----END PRIVATE KEY-----\n"
    c = cfg(
        certificates={
            "caCert": pem,
            "registryCert": pem,
            "registryKey": key,
            "nodeControllerCert": pem,
            "nodeControllerKey": key,
        }
    )
    spec = deployment_cr.build_spec(c)
    for field in ("caCert", "registryCert", "nodeControllerCert"):
        assert base64.b64decode(spec[field]).decode() == pem
    assert "registryKey" not in spec and "nodeControllerKey" not in spec
    assert "SECRET" not in repr(deployment_cr.build_deployment_cr(c))
    assert "caCert" not in deployment_cr.build_spec(cfg())


@pytest.mark.parametrize("mode", ["lvm", "direct"])
def test_cr_spec_validates_against_crd_enum(mode: str) -> None:
    from pmem_components.manifests.crd import load_crd

    schema = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props = schema["properties"]["spec"]["properties"]
    spec = deployment_cr.build_spec(cfg(deviceMode=mode))
    assert set(spec) <= set(props)
    assert spec["deviceMode"] in props["deviceMode"]["enum"]


def test_config_and_builders_do_not_import_pulumi() -> None:
    """The reporter and tools use these modules without the Pulumi SDK."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pmem_components.config import load_config\n"
        "from pmem_components.manifests import bundle\n"
        "bundle.build_deployment_objects(load_config({}).deployments[0])\n"
        "assert 'pulumi' not in sys.modules and 'pulumi_kubernetes' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(CRD_ROOT))


def test_port_names_are_unique_within_every_pod() -> None:
    """Duplicate port names in one pod make the API server warn on every apply."""
    objs = bundle.build_deployment_objects(cfg()).all()
    pods = [o["spec"]["template"]["spec"] for o in objs if "template" in o.get("spec", {})]
    assert len(pods) >= 2
    for pod in pods:
        port_names = [p["name"] for c in pod["containers"] for p in c.get("ports", [])]
        assert port_names and len(port_names) == len(set(port_names)), port_names
