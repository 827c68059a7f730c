"""The Deployment CRD in crd/: names, versions, schema, status and printer columns."""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import names
from pmem_components.manifests.crd import CRD_FILE, load_crd

CRD = load_crd()
VERSIONS = {v["name"]: v for v in CRD["spec"]["versions"]}


def schema(version: str = "v1beta1") -> dict[str, Any]:
    return VERSIONS[version]["schema"]["openAPIV3Schema"]


def test_file_location_and_identity() -> None:
    assert CRD_FILE.name == "pmem-csi.intel.com_deployments.yaml"
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == names.CRD_NAME == "deployments.pmem-csi.intel.com"
    spec = CRD["spec"]
    assert spec["group"] == "pmem-csi.intel.com"
    assert spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "Deployment",
        "listKind": "DeploymentList",
        "plural": "deployments",
        "singular": "deployment",
    }
    assert spec["conversion"] == {"strategy": "None"}


def test_versions() -> None:
    assert set(VERSIONS) == {"v1beta1", "v1alpha1"}
    assert VERSIONS["v1beta1"]["served"] and VERSIONS["v1beta1"]["storage"]
    assert VERSIONS["v1alpha1"]["served"] and not VERSIONS["v1alpha1"]["storage"]
    assert sum(v["storage"] for v in VERSIONS.values()) == 1
    # Without a conversion webhook both versions must be identical.
    assert schema("v1alpha1") == schema("v1beta1")
    for v in VERSIONS.values():
        assert v["subresources"] == {"status": {}}


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha1"])
def test_printer_columns(version: str) -> None:
    cols = [
        (c["name"], c["type"], c["jsonPath"]) for c in VERSIONS[version]["additionalPrinterColumns"]
    ]
    assert cols == [
        ("DeviceMode", "string", ".spec.deviceMode"),
        ("NodeSelector", "string", ".spec.nodeSelector"),
        ("Image", "string", ".spec.image"),
        ("Status", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


def _assert_structural(node: dict[str, Any], path: str) -> None:
    """Every node has a type (or int-or-string / preserve-unknown), recursively."""
    assert (
        "type" in node
        or node.get("x-kubernetes-int-or-string")
        or node.get("x-kubernetes-preserve-unknown-fields")
    ), path
    for key, child in node.get("properties", {}).items():
        _assert_structural(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        _assert_structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _assert_structural(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    _assert_structural(schema(), "")


def test_spec_has_every_config_field() -> None:
    props = schema()["properties"]["spec"]["properties"]
    assert set(props) == {
        "namespace",
        "image",
        "imagePullPolicy",
        "provisionerImage",
        "nodeRegistrarImage",
        "controllerResources",
        "nodeResources",
        "deviceMode",
        "logLevel",
        "pmemPercentage",
        "nodeSelector",
        "labels",
        "kubeletDir",
        "caCert",
        "registryCert",
        "registryKey",
        "nodeControllerCert",
        "nodeControllerKey",
        "patches",
        "reporter",
    }
    assert props["deviceMode"]["enum"] == ["lvm", "direct"]
    assert props["imagePullPolicy"]["enum"] == ["Always", "Never", "IfNotPresent"]
    assert (props["pmemPercentage"]["minimum"], props["pmemPercentage"]["maximum"]) == (1, 100)
    for key in ("caCert", "registryCert", "nodeControllerCert"):
        assert props[key] == {**props[key], "type": "string", "format": "byte"}
    for key in ("nodeSelector", "labels"):
        assert props[key]["additionalProperties"] == {"type": "string"}
    quantity = props["controllerResources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True
    assert props["nodeResources"] == props["controllerResources"]
    patch = props["patches"]["items"]
    assert patch["required"] == ["kind"]
    assert patch["properties"]["mergePatch"]["x-kubernetes-preserve-unknown-fields"] is True
    assert set(props["reporter"]["properties"]) == {"enabled", "image", "replicas", "logLevel"}


def test_status_schema() -> None:
    status = schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["", "Running", "Progressing", "Failed"]
    assert status["reason"]["type"] == "string"
    assert status["lastUpdated"]["format"] == "date-time"
    assert status["observedGeneration"]["type"] == "integer"
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    cond = conditions["items"]
    assert set(cond["properties"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
        "observedGeneration",
    }
    assert cond["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert cond["properties"]["lastTransitionTime"]["format"] == "date-time"
    # List map keys must be required.
    assert "type" in cond["required"]
    comp = status["driverComponents"]["items"]
    assert set(comp["properties"]) == {"component", "status", "reason", "lastUpdated"}
    assert comp["properties"]["component"]["enum"] == ["Controller", "Node"]
    assert comp["properties"]["status"]["enum"] == ["Ready", "NotReady"]
    assert comp["properties"]["lastUpdated"]["format"] == "date-time"
    assert set(status["driverComponents"]["x-kubernetes-list-map-keys"]) <= set(comp["required"])


def test_load_crd_rejects_other_documents(tmp_path: Any) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\n---\nkind: Secret\n")
    with pytest.raises(ValueError, match="exactly one CustomResourceDefinition"):
        load_crd(bad)
