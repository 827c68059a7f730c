"""The controller StatefulSet: the PMEM-CSI registry/controller plus the external-provisioner.

One replica, as in the reference: the controller keeps the node registry in memory. It runs
as a non-root user; a node label ``pmem-csi.intel.com/controller=no|false`` keeps it off a
node, and it tolerates the control-plane taint so small clusters can host it there.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl
from pmem_components.manifests.ports import (
    CONTROLLER_METRICS_PORT,
    CONTROLLER_SERVICE_PORT,
    PROVISIONER_METRICS_PORT,
    PROVISIONER_METRICS_PORT_NAME,
    metrics_ports,
)

DRIVER_BINARY = "/usr/local/bin/pmem-csi-driver"
CONTROLLER_SOCKET = "/csi/csi-controller.sock"
TERMINATION_LOG = "/tmp/termination-log"
CONTROLLER_USER = 1000
CONTROLLER_NODE_LABEL = "pmem-csi.intel.com/controller"


def node_name_env() -> dict[str, Any]:
    """``KUBE_NODE_NAME`` from the downward API; the driver uses it as its node ID."""
    return {
        "name": "KUBE_NODE_NAME",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
    }


def driver_name_env(cfg: DeploymentConfig) -> dict[str, Any]:
    return {"name": "PMEM_CSI_DRIVER_NAME", "value": cfg.name}


# Go 1.15 stopped accepting certificates that only carry the name in the CN; the reference
# re-enabled that for certificates created by older releases.
GODEBUG_ENV = {"name": "GODEBUG", "value": "x509ignoreCN=0"}
TERMINATION_ENV = {"name": "TERMINATION_LOG_PATH", "value": TERMINATION_LOG}


def controller_command(cfg: DeploymentConfig) -> list[str]:
    return [
        DRIVER_BINARY,
        f"-v={cfg.log_level}",
        "-mode=controller",
        f"-endpoint=unix://{CONTROLLER_SOCKET}",
        f"-registryEndpoint=tcp://0.0.0.0:{CONTROLLER_SERVICE_PORT}",
        "-nodeid=$(KUBE_NODE_NAME)",
        "-caFile=/certs/ca.crt",
        "-certFile=/certs/tls.crt",
        "-keyFile=/certs/tls.key",
        "-drivername=$(PMEM_CSI_DRIVER_NAME)",
        f"-metricsListen=:{CONTROLLER_METRICS_PORT}",
    ]


def provisioner_args(cfg: DeploymentConfig) -> list[str]:
    return [
        f"-v={cfg.log_level}",
        f"--csi-address={CONTROLLER_SOCKET}",
        "--feature-gates=Topology=true",
        "--strict-topology=true",
        "--timeout=5m",
        "--default-fstype=ext4",
        f"--metrics-address=:{PROVISIONER_METRICS_PORT}",
    ]


def controller_container(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "name": "pmem-driver",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": controller_command(cfg),
        "env": [node_name_env(), TERMINATION_ENV, driver_name_env(cfg), GODEBUG_ENV],
        "volumeMounts": [
            {"name": "registry-cert", "mountPath": "/certs"},
            {"name": "plugin-socket-dir", "mountPath": "/csi"},
            {"name": "tmp-dir", "mountPath": "/tmp"},
        ],
        "ports": metrics_ports(CONTROLLER_METRICS_PORT),
        "resources": cfg.controller_resources.to_k8s(),
        "terminationMessagePath": TERMINATION_LOG,
        "securityContext": {"readOnlyRootFilesystem": True},
    }


def provisioner_container(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "name": "external-provisioner",
        "image": cfg.provisioner_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "args": provisioner_args(cfg),
        "volumeMounts": [{"name": "plugin-socket-dir", "mountPath": "/csi"}],
        "ports": metrics_ports(PROVISIONER_METRICS_PORT, PROVISIONER_METRICS_PORT_NAME),
        "resources": cfg.controller_resources.to_k8s(),
        "securityContext": {"readOnlyRootFilesystem": True},
    }


def controller_affinity() -> dict[str, Any]:
    """Anywhere, except on nodes labelled ``pmem-csi.intel.com/controller`` no or false."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": CONTROLLER_NODE_LABEL,
                                "operator": "NotIn",
                                "values": ["no", "false"],
                            }
                        ]
                    }
                ]
            }
        }
    }


def controller_tolerations() -> list[dict[str, Any]]:
    """The reference tolerated the ``master`` taint; current clusters use ``control-plane``."""
    return [
        {"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
    ]


def build_controller_statefulset(cfg: DeploymentConfig) -> dict[str, Any]:
    n = cfg.names
    app = lbl.controller_app(cfg)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": lbl.metadata(cfg, n.controller_driver, lbl.COMPONENT_CONTROLLER),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "serviceName": n.controller_service,
            "template": {
                "metadata": lbl.pod_template_metadata(cfg, lbl.COMPONENT_CONTROLLER, app),
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": CONTROLLER_USER},
                    "serviceAccountName": n.service_account,
                    "containers": [controller_container(cfg), provisioner_container(cfg)],
                    "affinity": controller_affinity(),
                    "tolerations": controller_tolerations(),
                    "volumes": [
                        {"name": "plugin-socket-dir", "emptyDir": {}},
                        {"name": "registry-cert", "secret": {"secretName": n.registry_secret}},
                        {"name": "tmp-dir", "emptyDir": {}},
                    ],
                },
            },
        },
    }
