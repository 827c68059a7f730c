"""The node DaemonSet: the PMEM-CSI node driver plus the kubelet's driver registrar.

The node driver must run privileged as root: it manages PMEM namespaces (``/dev``, ``/sys``)
and mounts volumes that the kubelet and pods must see, hence ``Bidirectional`` mount
propagation on the kubelet directories and the driver's state directory.
"""

from __future__ import annotations

from typing import Any

from pmem_components.config import DeploymentConfig
from pmem_components.manifests import labels as lbl
from pmem_components.manifests.controller import (
    DRIVER_BINARY,
    GODEBUG_ENV,
    TERMINATION_ENV,
    TERMINATION_LOG,
    driver_name_env,
    node_name_env,
)
from pmem_components.manifests.ports import (
    CONTROLLER_SERVICE_PORT,
    NODE_CONTROLLER_PORT,
    NODE_METRICS_PORT,
    metrics_ports,
)

NODE_SOCKET = "/csi/csi.sock"
BIDIRECTIONAL = "Bidirectional"


def state_dir(cfg: DeploymentConfig) -> str:
    """Where the driver keeps its state on the host (and in the container)."""
    return f"/var/lib/{cfg.name}"


def node_command(cfg: DeploymentConfig) -> list[str]:
    cmd = [
        DRIVER_BINARY,
        f"-deviceManager={cfg.device_mode}",
        f"-v={cfg.log_level}",
        "-mode=node",
        f"-endpoint=unix://{NODE_SOCKET}",
        "-nodeid=$(KUBE_NODE_NAME)",
        f"-controllerEndpoint=tcp://$(KUBE_POD_IP):{NODE_CONTROLLER_PORT}",
        # The controller Service's DNS name within the namespace.
        f"-registryEndpoint=tcp://{cfg.names.controller_service}:{CONTROLLER_SERVICE_PORT}",
        "-caFile=/certs/ca.crt",
        "-certFile=/certs/tls.crt",
        "-keyFile=/certs/tls.key",
        "-statePath=/var/lib/$(PMEM_CSI_DRIVER_NAME)",
        "-drivername=$(PMEM_CSI_DRIVER_NAME)",
    ]
    if cfg.device_mode == "lvm":
        # Only the LVM device manager reserves a share of each region.
        cmd.append(f"-pmemPercentage={cfg.pmem_percentage}")
    cmd.append(f"-metricsListen=:{NODE_METRICS_PORT}")
    return cmd


def node_driver_container(cfg: DeploymentConfig) -> dict[str, Any]:
    kubelet = cfg.kubelet_dir
    return {
        "name": "pmem-driver",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": node_command(cfg),
        "env": [
            node_name_env(),
            {
                "name": "KUBE_POD_IP",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
            },
            driver_name_env(cfg),
            TERMINATION_ENV,
            GODEBUG_ENV,
        ],
        "volumeMounts": [
            {
                "name": "mountpoint-dir",
                "mountPath": f"{kubelet}/plugins/kubernetes.io/csi",
                "mountPropagation": BIDIRECTIONAL,
            },
            {
                "name": "pods-dir",
                "mountPath": f"{kubelet}/pods",
                "mountPropagation": BIDIRECTIONAL,
            },
            {"name": "node-cert", "mountPath": "/certs"},
            {"name": "dev-dir", "mountPath": "/dev"},
            {"name": "sys-dir", "mountPath": "/sys"},
            {"name": "socket-dir", "mountPath": "/csi"},
            {
                "name": "pmem-state-dir",
                "mountPath": state_dir(cfg),
                "mountPropagation": BIDIRECTIONAL,
            },
        ],
        "ports": metrics_ports(NODE_METRICS_PORT),
        "resources": cfg.node_resources.to_k8s(),
        "securityContext": {"privileged": True, "runAsUser": 0},
        "terminationMessagePath": TERMINATION_LOG,
    }


def registrar_container(cfg: DeploymentConfig) -> dict[str, Any]:
    return {
        "name": "driver-registrar",
        "image": cfg.node_registrar_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "args": [
            f"-v={cfg.log_level}",
            f"--kubelet-registration-path={cfg.kubelet_dir}/plugins/$(PMEM_CSI_DRIVER_NAME)"
            "/csi.sock",
            f"--csi-address={NODE_SOCKET}",
        ],
        "securityContext": {"readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "socket-dir", "mountPath": "/csi"},
            {"name": "registration-dir", "mountPath": "/registration"},
        ],
        "env": [driver_name_env(cfg)],
        "resources": cfg.node_resources.to_k8s(),
    }


def _host_path(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def node_volumes(cfg: DeploymentConfig) -> list[dict[str, Any]]:
    kubelet = cfg.kubelet_dir
    return [
        _host_path("socket-dir", f"{kubelet}/plugins/{cfg.name}"),
        _host_path("registration-dir", f"{kubelet}/plugins_registry/"),
        _host_path("mountpoint-dir", f"{kubelet}/plugins/kubernetes.io/csi"),
        _host_path("pods-dir", f"{kubelet}/pods"),
        {"name": "node-cert", "secret": {"secretName": cfg.names.node_secret}},
        _host_path("pmem-state-dir", state_dir(cfg)),
        _host_path("dev-dir", "/dev"),
        _host_path("sys-dir", "/sys"),
    ]


def build_node_daemonset(cfg: DeploymentConfig) -> dict[str, Any]:
    app = lbl.node_app(cfg)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": lbl.metadata(cfg, cfg.names.node_driver, lbl.COMPONENT_NODE),
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": lbl.pod_template_metadata(cfg, lbl.COMPONENT_NODE, app),
                "spec": {
                    "nodeSelector": dict(cfg.node_selector),
                    "containers": [node_driver_container(cfg), registrar_container(cfg)],
                    "volumes": node_volumes(cfg),
                },
            },
        },
    }
