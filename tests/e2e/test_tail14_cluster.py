"""Issue 14's tail against the real things: the local API server and the locally built kubectl.

* kubeconfig content (tests/unit/test_tail14.py :data:`LOAD_CASES`): kubectl, whose
  ``--kubeconfig`` file goes through client-go's ``clientcmd.Load`` as the provider's
  ``kubernetes:kubeconfig`` content does, chooses the server the table names (or refuses),
  so the table is client-go's behaviour, which kubetarget.parse is tested against;
* a container port and a Service port declared without ``protocol``: the managedFields the
  API server records for a ``kubectl edit`` of them key the entries with ``protocol: TCP``,
  and ``owns_declared`` sees them as the declared ones (the take-over then updates the
  object).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from pmem_components import fieldowners
from pmem_components.takeover_transform import owns_declared
from tests.unit.test_tail14 import LOAD_CASES
from tools import toolchain


@pytest.mark.parametrize("name", list(LOAD_CASES))
def test_kubectl_reads_kubeconfig_content_as_the_table_says(
    name: str, tmp_path: Path, local_cluster: Path
) -> None:
    text, expected = LOAD_CASES[name]
    path = tmp_path / "content"
    path.write_bytes(text.encode())
    result = subprocess.run(
        [str(toolchain.bin_path("kubectl")), "--kubeconfig", str(path), "get", "--raw",
         "/version", "--request-timeout=10s"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0  # nothing listens on the table's servers (port 1)
    contacted = re.findall(r"127\.0\.0\.\d+:1\b", result.stderr)
    if expected is None or not expected[1]:
        assert not contacted, result.stderr
    else:
        assert set(contacted) == {expected[1].removeprefix("https://")}, result.stderr


def _apply(api_client: Any, obj: dict[str, Any], manager: str) -> None:
    from kubernetes.dynamic import DynamicClient

    res = DynamicClient(api_client).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    res.server_side_apply(
        body=obj, namespace="default", field_manager=manager, force_conflicts=True
    )


def _edit(api_client: Any, obj: dict[str, Any], change: Any) -> dict[str, Any]:
    """A PUT of the live object after ``change(live)``, as ``kubectl edit`` sends it; read
    and sent again when a controller wrote the object in between (409 Conflict: the
    Deployment controller records its status right after the create)."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ConflictError

    res = DynamicClient(api_client).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    for attempt in range(5):
        live = res.get(name=obj["metadata"]["name"], namespace="default").to_dict()
        change(live)
        live["metadata"].pop("managedFields", None)
        try:
            out = res.replace(body=live, namespace="default", field_manager="kubectl-edit")
            return dict(out.to_dict())
        except ConflictError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _edit_entry(live: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [e for e in live["metadata"]["managedFields"] if e["manager"] == "kubectl-edit"]
    return entry


def test_a_port_declared_without_protocol_is_seen_as_declared(api_client: Any) -> None:
    name = f"tail14-{uuid.uuid4().hex[:6]}"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.invalid/x:1",
                            "ports": [{"containerPort": 9090, "name": "metrics"}],
                        }
                    ]
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 9090}]},
    }
    manager = "pulumi-kubernetes-tail14"
    try:
        for obj in (deployment, service):
            _apply(api_client, obj, manager)

        def rename_port(live: dict[str, Any]) -> None:
            live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = "other"

        def retarget(live: dict[str, Any]) -> None:
            live["spec"]["ports"][0]["targetPort"] = 9091

        for obj, change, key in (
            (deployment, rename_port, '"containerPort":9090,"protocol":"TCP"'),
            (service, retarget, '"port":80,"protocol":"TCP"'),
        ):
            entry = _edit_entry(_edit(api_client, obj, change))
            assert key in str(entry["fieldsV1"]).replace(" ", ""), entry  # the server's key
            assert fieldowners.is_foreign(entry)
            rest, _ = fieldowners.split_entry(entry)
            assert owns_declared(rest, obj), (obj["kind"], entry["fieldsV1"])
    finally:
        from kubernetes import client

        client.AppsV1Api(api_client).delete_namespaced_deployment(name, "default")
        client.CoreV1Api(api_client).delete_namespaced_service(name, "default")
