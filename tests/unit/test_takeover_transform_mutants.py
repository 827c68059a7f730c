"""The take-over transform (:mod:`pmem_components.takeover_transform`) end to end in-process:
which resource types it touches and what a preview gets back.

Why here: mutation testing found that the unit suite let through a transform that takes over
Namespaces and the CRD (``SKIPPED_TYPES`` emptied) and one that marks the update instead of
the preview (the ``dry_run`` test inverted). These tests drive the take-over's transform and
update hook with a fake API behind it, so they pin both decisions without a cluster.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
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


class FakeSource:
    """A cluster source whose cluster is known and whose API is the fake."""

    name = "the fake provider"

    def __init__(self, api: FakeApi) -> None:
        self._api = api

    async def target(self) -> Any:
        return SimpleNamespace(makes_requests=True, description="the fake cluster")

    async def api(self) -> FakeApi:
        return self._api


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def declared(type_: str, *, team_label: bool = False) -> dict[str, Any]:
    """The declared object of ``type_``; ``team_label``: it declares the label others own."""
    obj = copy.deepcopy(DECLARED[type_])
    if team_label:
        obj["metadata"]["labels"] = {"team": "storage"}
    return obj


def run_transform(
    monkeypatch: pytest.MonkeyPatch,
    api: FakeApi,
    type_: str,
    *,
    dry_run: bool,
    team_label: bool = False,
) -> tuple[pulumi.ResourceTransformResult | None, list[str], takeover_transform.TakeOver]:
    """The transform's result for one object of ``type_``, what it logged, and the take-over."""
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: dry_run)
    logged: list[str] = []
    take = takeover_transform.TakeOver(source=FakeSource(api), log=logged.append)  # type: ignore[arg-type]
    args = pulumi.ResourceTransformArgs(
        custom=True,
        type_=type_,
        name="x",
        props=declared(type_, team_label=team_label),
        opts=pulumi.ResourceOptions(),
    )
    return asyncio.run(take.transform(args)), logged, take


def run_before_update(take: takeover_transform.TakeOver, type_: str) -> None:
    asyncio.run(take.before_update(SimpleNamespace(type=type_, name="x")))  # type: ignore[arg-type]


@pytest.mark.parametrize("dry_run", [False, True], ids=["up", "preview"])
@pytest.mark.parametrize("type_", [CRD_TYPE, NAMESPACE_TYPE], ids=["crd", "namespace"])
def test_namespaces_and_the_crd_are_never_taken_over(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi, type_: str, dry_run: bool
) -> None:
    result, logged, take = run_transform(monkeypatch, api, type_, dry_run=dry_run)
    run_before_update(take, type_)
    assert result is None
    assert logged == []
    assert take.pending == {}
    assert api.calls == []  # not even read


def test_a_deployment_object_with_foreign_fields_is_taken_over_in_the_update_hook(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi
) -> None:
    """The counterpart of the test above: the same live state on a DaemonSet is taken."""
    result, logged, take = run_transform(monkeypatch, api, DAEMONSET_TYPE, dry_run=False)
    path = "/apis/apps/v1/namespaces/pmem-csi/daemonsets/d"
    assert api.calls == [("get", path)]  # the transform only reads
    # Others own only a field the stack does not declare: no new input, so no update for it.
    assert result is None
    run_before_update(take, DAEMONSET_TYPE)
    # The hook reads again (its JSON Patch is guarded by that resourceVersion), then writes.
    assert api.calls == [("get", path), ("get", path), ("json_patch", path), ("apply", path)]
    assert logged == [
        "took over fields of DaemonSet pmem-csi/d and applied it"
        " (kubectl-label (metadata.labels.team))"
    ]


def test_a_declared_field_others_own_stamps_the_update_with_the_live_resource_version(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi
) -> None:
    result, _, _ = run_transform(monkeypatch, api, DAEMONSET_TYPE, dry_run=False, team_label=True)
    assert result is not None
    annotations = result.props["metadata"]["annotations"]
    assert annotations == {takeover_transform.TAKEN_OVER_ANNOTATION: "7"}


def test_only_the_preview_marks_an_object_that_up_will_take_over(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi
) -> None:
    result, logged, _ = run_transform(
        monkeypatch, api, DAEMONSET_TYPE, dry_run=True, team_label=True
    )
    assert [c[0] for c in api.calls] == ["get"]  # a preview writes nothing
    assert logged == [
        "pulumi up would take over fields of DaemonSet pmem-csi/d"
        " (kubectl-label (metadata.labels.team))"
    ]
    assert result is not None
    annotations = result.props["metadata"]["annotations"]
    assert annotations == {takeover_transform.TAKEN_OVER_ANNOTATION: rpc.UNKNOWN}
    # The rest of the declared object is passed on as it was.
    assert result.props["metadata"]["name"] == "d"
    assert result.props["kind"] == "DaemonSet"
