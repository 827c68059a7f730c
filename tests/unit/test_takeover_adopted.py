"""The hooks that leave an adopted object with this stack's field manager only (issue 14, 4).

Driven in-process with a fake API, as ``test_takeover_transform_mutants.py`` does: the
transform sees the object before the create (it exists: an adoption), the ``after_create``
hook gets the manager the provider created it under, and merges the earlier stack's entry
into it; a namespace keeps an administrator's entry; an object that did not exist before the
create is not touched.
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import pulumi
import pytest

from pmem_components import takeover_transform

MINE = "pulumi-kubernetes-aaaa1111"
EARLIER = "pulumi-kubernetes-bbbb2222"
LABELS = {"f:metadata": {"f:labels": {"f:app": {}}}}
ADMIN = {"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {}}}


class FakeApi:
    """One object; before the create it carries the earlier stack's entry (and an admin's)."""

    def __init__(self, exists: bool = True, annotations: dict[str, str] | None = None) -> None:
        self.entries: list[dict[str, Any]] = (
            [{"manager": EARLIER, "operation": "Apply", "fieldsV1": LABELS}, ADMIN]
            if exists
            else []
        )
        self.exists = exists
        self.annotations = annotations or {}
        self.calls: list[tuple[str, Any]] = []
        self.applied: list[dict[str, Any]] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("get", path))
        if not self.exists:
            return None
        meta = {"resourceVersion": "7", "managedFields": copy.deepcopy(self.entries)}
        return {"metadata": {**meta, "annotations": dict(self.annotations)}}

    def json_patch(self, path: str, ops: Any, manager: str) -> None:
        self.calls.append(("json_patch", [e["manager"] for e in ops[1]["value"]]))

    def apply(self, path: str, obj: dict[str, Any], manager: str) -> None:
        self.calls.append(("apply", manager))
        self.applied.append(copy.deepcopy(obj))


class FakeSource:
    name = "the fake provider"

    def __init__(self, api: FakeApi) -> None:
        self._api = api

    async def target(self) -> Any:
        return SimpleNamespace(makes_requests=True, description="the fake cluster")

    async def api(self) -> FakeApi:
        return self._api


OBJECTS = {
    "kubernetes:core/v1:Namespace": {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "pmem-csi"},
    },
    "kubernetes:apps/v1:DaemonSet": {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "pmem-csi"},
    },
}


def registered(
    monkeypatch: pytest.MonkeyPatch, api: FakeApi, type_: str, stale_only: bool
) -> takeover_transform.TakeOver:
    """The take-over after the transform saw the object at its registration (not a preview)."""
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: False)
    take = takeover_transform.TakeOver(
        source=FakeSource(api),  # type: ignore[arg-type]
        log=lambda _m: None,
        stale_only=stale_only,
        skipped_types=frozenset(),
    )
    args = pulumi.ResourceTransformArgs(
        custom=True, type_=type_, name="x", props=copy.deepcopy(OBJECTS[type_]),
        opts=pulumi.ResourceOptions(),
    )  # fmt: skip
    asyncio.run(take.transform(args))
    return take


def adopt(monkeypatch: pytest.MonkeyPatch, api: FakeApi, type_: str, stale_only: bool) -> None:
    """Register (transform), then the provider's create under MINE (after_create)."""
    take = registered(monkeypatch, api, type_, stale_only)
    # The provider created (applied) it under a manager of this stack's.
    api.entries.append({"manager": MINE, "operation": "Apply", "fieldsV1": LABELS})
    hook_args = SimpleNamespace(type=type_, name="x", new_outputs={"__fieldManager": MINE})
    asyncio.run(take.after_create(hook_args))  # type: ignore[arg-type]


def test_an_adopted_workload_keeps_only_this_stacks_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeApi()
    adopt(monkeypatch, api, "kubernetes:apps/v1:DaemonSet", stale_only=False)
    patches = [c[1] for c in api.calls if c[0] == "json_patch"]
    assert patches == [[MINE]], "the earlier stack's and the admin's entries merged into MINE"
    assert ("apply", MINE) in api.calls


def test_an_adopted_namespace_keeps_the_administrators_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeApi()
    adopt(monkeypatch, api, "kubernetes:core/v1:Namespace", stale_only=True)
    patches = [c[1] for c in api.calls if c[0] == "json_patch"]
    assert patches == [["kubectl-label", MINE]]
    assert not [c for c in api.calls if c[0] == "apply"], "the provider has just applied it"


def test_the_adoptions_apply_keeps_the_take_over_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """D3: the object carries the stamp of an earlier take-over; the transform keeps it in the
    inputs the provider creates with, so the forced apply after the create must carry it too:
    dropping it makes the next `pulumi up` see a change (one spurious update)."""
    stamp = {takeover_transform.TAKEN_OVER_ANNOTATION: "5"}
    api = FakeApi(annotations=stamp)
    api.entries = [api.entries[0]]  # the earlier stack's entry only: nothing foreign to take
    adopt(monkeypatch, api, "kubernetes:apps/v1:DaemonSet", stale_only=False)
    (applied,) = api.applied
    assert applied["metadata"].get("annotations") == stamp


def test_a_new_object_is_not_touched_after_its_create(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi(exists=False)
    adopt(monkeypatch, api, "kubernetes:apps/v1:DaemonSet", stale_only=False)
    assert [c[0] for c in api.calls] == ["get"], "read at registration, nothing after"


PLATFORM = "pulumi-kubernetes-cccc3333"


def update(
    monkeypatch: pytest.MonkeyPatch, entries: list[dict[str, Any]], type_: str, stale_only: bool
) -> FakeApi:
    """Register (transform) an object this stack holds, then the provider's update
    (before_update, with the state's field manager MINE)."""
    api = FakeApi()
    api.entries = entries
    take = registered(monkeypatch, api, type_, stale_only)
    hook_args = SimpleNamespace(type=type_, name="x", old_outputs={"__fieldManager": MINE})
    asyncio.run(take.before_update(hook_args))  # type: ignore[arg-type]
    return api


def test_an_update_leaves_another_pulumi_stacks_entry_alongside_this_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review of issue 14 item 4: a platform stack's NamespacePatch labels (its own Pulumi
    manager) next to this stack's entry are co-owned, not stale: an ordinary update of the
    namespace leaves them to it."""
    entries = [
        {"manager": MINE, "operation": "Apply", "fieldsV1": LABELS},
        {"manager": PLATFORM, "operation": "Apply", "fieldsV1": {"f:metadata": {}}},
    ]
    api = update(monkeypatch, entries, "kubernetes:core/v1:Namespace", stale_only=True)
    assert [c for c in api.calls if c[0] != "get"] == []


def test_an_update_takes_back_an_object_whose_entry_another_stack_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = [{"manager": PLATFORM, "operation": "Apply", "fieldsV1": LABELS}]
    api = update(monkeypatch, entries, "kubernetes:core/v1:Namespace", stale_only=True)
    assert [c[1] for c in api.calls if c[0] == "json_patch"] == [[MINE]]
