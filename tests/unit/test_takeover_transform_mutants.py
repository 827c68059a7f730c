"""The take-over transform (:mod:`pmem_components.takeover_transform`) end to end in-process:
which resource types it touches and what a preview gets back.

Why here: mutation testing found that the unit suite let through a transform that takes over
Namespaces and the CRD (``SKIPPED_TYPES`` emptied) and one that marks the update instead of
the preview (the ``dry_run`` test inverted). These tests drive the transform function itself
with a fake API behind it, so they pin both decisions without a cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc

from pmem_components import takeover_transform

PULUMI = "pulumi-kubernetes-1a2b3c4d"

OURS = {
    "manager": PULUMI,
    "operation": "Apply",
    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}},
}
EDIT = {
    "manager": "kubectl-label",
    "operation": "Update",
    "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}},
}

CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
DAEMONSET_TYPE = "kubernetes:apps/v1:DaemonSet"

DECLARED = {
    CRD_TYPE: {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "deployments.pmem-csi.intel.com"},
    },
    NAMESPACE_TYPE: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pmem-csi"}},
    DAEMONSET_TYPE: {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "pmem-csi"},
    },
}


class FakeApi:
    """Every object exists, owned by Pulumi and, for one label, by ``kubectl label``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def get(self, path: str) -> dict[str, Any]:
        self.calls.append(("get", path))
        meta = {"resourceVersion": "7", "managedFields": [OURS, EDIT]}
        return {"metadata": meta}

    def json_patch(self, path: str, ops: Any, manager: str) -> None:
        self.calls.append(("json_patch", path))

    def apply(self, path: str, obj: dict[str, Any], manager: str) -> None:
        self.calls.append(("apply", path))


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    # The transform wraps the client the factory makes; hand it the fake instead.
    monkeypatch.setattr(takeover_transform, "KubeApi", lambda client: fake)
    return fake


def run_transform(
    monkeypatch: pytest.MonkeyPatch, type_: str, *, dry_run: bool
) -> tuple[pulumi.ResourceTransformResult | None, list[str]]:
    """The transform's result for one object of ``type_``, and what it logged."""
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: dry_run)
    logged: list[str] = []
    apply = takeover_transform.transform(lambda: object(), log=logged.append)
    args = pulumi.ResourceTransformArgs(
        custom=True,
        type_=type_,
        name="x",
        props=dict(DECLARED[type_]),
        opts=pulumi.ResourceOptions(),
    )
    return asyncio.run(apply(args)), logged


@pytest.mark.parametrize("dry_run", [False, True], ids=["up", "preview"])
@pytest.mark.parametrize("type_", [CRD_TYPE, NAMESPACE_TYPE], ids=["crd", "namespace"])
def test_namespaces_and_the_crd_are_never_taken_over(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi, type_: str, dry_run: bool
) -> None:
    result, logged = run_transform(monkeypatch, type_, dry_run=dry_run)
    assert result is None
    assert logged == []
    assert api.calls == []  # not even read


def test_a_deployment_object_with_foreign_fields_is_taken_over_on_up(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi
) -> None:
    """The counterpart of the test above: the same live state on a DaemonSet is taken."""
    result, logged = run_transform(monkeypatch, DAEMONSET_TYPE, dry_run=False)
    path = "/apis/apps/v1/namespaces/pmem-csi/daemonsets/d"
    assert api.calls == [("get", path), ("json_patch", path), ("apply", path)]
    assert logged == [
        "took over fields of DaemonSet pmem-csi/d and applied it"
        " (kubectl-label (metadata.labels.team))"
    ]
    # The real update sends the declared inputs unchanged: no preview annotation.
    assert result is None


def test_only_the_preview_marks_an_object_that_up_will_take_over(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi
) -> None:
    result, logged = run_transform(monkeypatch, DAEMONSET_TYPE, dry_run=True)
    assert [c[0] for c in api.calls] == ["get"]  # a preview writes nothing
    assert logged == [
        "pulumi up would take over fields of DaemonSet pmem-csi/d"
        " (kubectl-label (metadata.labels.team))"
    ]
    assert result is not None
    annotations = result.props["metadata"]["annotations"]
    assert annotations == {takeover_transform.PREVIEW_ANNOTATION: rpc.UNKNOWN}
    # The rest of the declared object is passed on as it was.
    assert result.props["metadata"]["name"] == "d"
    assert result.props["kind"] == "DaemonSet"
