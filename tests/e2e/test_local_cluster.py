"""The local control plane and the offline Pulumi engine do what the other tests rely on."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.waiting import wait_for
from tools import cluster


@pytest.fixture
def namespace(api_client: Any) -> Any:
    core = client.CoreV1Api(api_client)
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _pmem_nodes(api_client: Any) -> set[str]:
    nodes = client.CoreV1Api(api_client).list_node(label_selector="storage=pmem").items
    return {n.metadata.name for n in nodes}


def test_daemonset_gets_one_ready_pod_per_pmem_node(api_client: Any, namespace: str) -> None:
    apps = client.AppsV1Api(api_client)
    core = client.CoreV1Api(api_client)
    labels = {"app": "smoke-ds"}
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "metadata": {"name": "smoke-ds"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"storage": "pmem"},
                        "containers": [{"name": "c", "image": "example.invalid/none:1"}],
                    },
                },
            },
        },
    )
    expected = _pmem_nodes(api_client)
    assert len(expected) == cluster.DEFAULT_PMEM_NODES
    assert len(client.CoreV1Api(api_client).list_node().items) > len(expected)

    def ready_count() -> int:
        ds = apps.read_namespaced_daemon_set_status("smoke-ds", namespace)
        return ds.status.number_ready == len(expected) and ds.status.number_ready

    assert wait_for(ready_count, 90, "DaemonSet numberReady") == len(expected)
    pods = core.list_namespaced_pod(namespace, label_selector="app=smoke-ds").items
    ready_nodes = [
        p.spec.node_name
        for p in pods
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    assert sorted(ready_nodes) == sorted(expected)


def test_statefulset_with_one_replica_becomes_ready(api_client: Any, namespace: str) -> None:
    apps = client.AppsV1Api(api_client)
    labels = {"app": "smoke-sts"}
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": "smoke-sts"},
            "spec": {
                "replicas": 1,
                "serviceName": "smoke-sts",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "example.invalid/none:1"}]},
                },
            },
        },
    )

    def ready() -> bool:
        sts = apps.read_namespaced_stateful_set_status("smoke-sts", namespace)
        return sts.status.ready_replicas == 1

    wait_for(ready, 90, "StatefulSet readyReplicas == 1")


def _configmap_program() -> None:
    import pulumi
    import pulumi_kubernetes as k8s

    cm = k8s.core.v1.ConfigMap(
        "smoke",
        metadata={"name": "pulumi-smoke", "namespace": "default"},
        data={"hello": "world"},
    )
    pulumi.export("name", cm.metadata["name"])


def test_offline_pulumi_up_refresh_restores_and_destroy_removes(
    pulumi_stack: Callable[..., Any], api_client: Any, kubectl: Callable[..., Any]
) -> None:
    core = client.CoreV1Api(api_client)
    stack = pulumi_stack(_configmap_program)
    up = stack.up()
    assert up.summary.result == "succeeded"
    assert core.read_namespaced_config_map("pulumi-smoke", "default").data == {"hello": "world"}

    kubectl("delete", "configmap", "pulumi-smoke", "-n", "default")
    refresh = stack.refresh()
    assert refresh.summary.resource_changes.get("delete", 0) == 1, refresh.summary
    up = stack.up()
    assert up.summary.resource_changes.get("create", 0) == 1, up.summary
    assert core.read_namespaced_config_map("pulumi-smoke", "default").data == {"hello": "world"}

    stack.destroy()
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("pulumi-smoke", "default")
    assert err.value.status == 404


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.example.com"},
    "spec": {
        "group": "smoke.example.com",
        "scope": "Cluster",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "string", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "string"}}},
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_with_status_subresource_and_printer_columns(
    api_client: Any, kubectl: Callable[..., Any]
) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    ext.create_custom_resource_definition(CRD)
    try:

        def established() -> bool:
            crd = ext.read_custom_resource_definition("widgets.smoke.example.com")
            return any(
                c.type == "Established" and c.status == "True"
                for c in crd.status.conditions or []
            )

        wait_for(established, 30, "CRD Established")
        custom.create_cluster_custom_object(
            "smoke.example.com",
            "v1",
            "widgets",
            {
                "apiVersion": "smoke.example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w1"},
                "spec": {"size": "large"},
                "status": {"phase": "ignored-on-create"},
            },
        )
        # The status subresource: status is dropped on create and only written through /status.
        obj = custom.get_cluster_custom_object("smoke.example.com", "v1", "widgets", "w1")
        assert "status" not in obj or not obj["status"].get("phase")
        custom.patch_cluster_custom_object_status(
            "smoke.example.com", "v1", "widgets", "w1", {"status": {"phase": "Running"}}
        )
        out = kubectl("get", "widgets.smoke.example.com", "w1").stdout.splitlines()
        assert out[0].split() == ["NAME", "SIZE", "PHASE"]
        assert out[1].split() == ["w1", "large", "Running"]
    finally:
        ext.delete_custom_resource_definition("widgets.smoke.example.com")


def test_a_controller_manager_that_exited_is_started_again_by_the_next_start(
    api_client: Any,
) -> None:
    """kube-controller-manager exits when the API server is slow to be healthy at its start,
    and kwokctl never restarts it; ``tools.cluster start`` does, and the controllers work."""
    pid_file = cluster._component_pids_dir() / "kube-controller-manager.pid"
    old = int(pid_file.read_text())
    core = client.CoreV1Api(api_client)
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    try:
        # The creation lock held while its port is free, as the start holds it to restart.
        with cluster.one_create_at_a_time():
            os.kill(old, signal.SIGKILL)
            wait_for(lambda: cluster.dead_components() == ["kube-controller-manager"], 30, "gone")
            cluster.start()
        assert cluster.dead_components() == []
        new = int(pid_file.read_text())
        assert Path(f"/proc/{new}/cmdline").read_bytes().startswith(
            str(cluster.cluster_dir() / "bin" / "kube-controller-manager").encode()
        )
        # Its service-account controller at work: a new namespace gets its default account.
        core.create_namespace({"metadata": {"name": name}})

        def has_default_account() -> bool:
            try:
                core.read_namespaced_service_account("default", name)
            except ApiException as err:
                if err.status == 404:
                    return False
                raise
            return True

        wait_for(has_default_account, 120, "default ServiceAccount in a new namespace")
    finally:
        # The worker's later modules share this cluster: never leave it without controllers.
        cluster.ensure_controllers()
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
