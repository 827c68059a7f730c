"""The field ownership take-over's pure half (:mod:`pmem_components.takeover`) and its
stack-config key. The API calls are shown in ``tests/e2e/test_drift.py``."""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import takeover
from pmem_components.config import ConfigError, load_config

PULUMI = "pulumi-kubernetes-1a2b3c4d"


def entry(manager: str, fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": extra.pop("operation", "Update"),
        "apiVersion": "apps/v1",
        "time": extra.pop("time", "2026-11-30T08:00:00Z"),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        **extra,
    }


OURS = entry(
    PULUMI,
    {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:replicas": {}}},
    operation="Apply",
)
EDIT = entry("kubectl-edit", {"f:metadata": {"f:labels": {"f:extra": {}}}})
GO = entry(
    "my-controller",
    {"f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"a"}': {"f:args": {}}}}}}},
)
KCM = entry("kube-controller-manager", {"f:metadata": {"f:annotations": {"f:rev": {}}}})
STATUS = entry("pmem-csi-reporter", {"f:status": {"f:phase": {}}}, subresource="status")


def test_merge_fields_is_the_union_of_both_trees() -> None:
    a = {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {}}
    b = {"f:metadata": {"f:labels": {"f:extra": {}}, "f:annotations": {"f:x": {}}}}
    merged = takeover.merge_fields(a, b)
    assert merged == {
        "f:metadata": {"f:labels": {"f:app": {}, "f:extra": {}}, "f:annotations": {"f:x": {}}},
        "f:spec": {},
    }
    assert a == {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {}}, "inputs unchanged"


@pytest.mark.parametrize(
    ("e", "foreign"),
    [
        (OURS, False),
        (entry("pulumi-kubernetes-ffff", {}, operation="Update"), False),
        (KCM, False),
        (entry("kubelet", {}), False),
        (entry("kube-scheduler", {}), False),
        (entry("kube-apiserver", {}), False),
        (STATUS, False),  # the reporter's status writes: a subresource
        (EDIT, True),
        (entry("kubectl-patch", {}), True),
        (entry("kubectl", {}, operation="Apply"), True),
        (GO, True),
    ],
)
def test_foreign_is_anyone_but_pulumi_and_kubernetes_on_the_main_resource(
    e: dict[str, Any], foreign: bool
) -> None:
    assert takeover.is_foreign(e) is foreign


def test_plan_merges_every_foreign_entry_into_pulumis_and_keeps_the_rest() -> None:
    plan = takeover.plan([OURS, KCM, EDIT, STATUS, GO], "42")
    assert plan is not None
    assert plan.manager == PULUMI
    assert plan.foreign == ("kubectl-edit", "my-controller")
    test_op, replace_op = plan.patch
    assert test_op == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert replace_op["op"] == "replace" and replace_op["path"] == "/metadata/managedFields"
    entries = replace_op["value"]
    managers = [e["manager"] for e in entries]
    assert managers == [PULUMI, "kube-controller-manager", "pmem-csi-reporter"]
    assert entries[0]["operation"] == "Apply"
    assert entries[0]["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:app": {}, "f:extra": {}}},
        "f:spec": {
            "f:replicas": {},
            "f:template": {"f:spec": {"f:containers": {'k:{"name":"a"}': {"f:args": {}}}}},
        },
    }
    assert entries[1] == KCM and entries[2] == STATUS
    assert OURS["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {"f:replicas": {}},
    }, "the input is not changed"


def test_nothing_to_take_without_foreign_entries() -> None:
    assert takeover.plan([OURS, KCM, STATUS], "1") is None


def test_nobody_to_give_to_before_pulumi_applied_the_object() -> None:
    """An object Pulumi never applied (someone else's, same name) is left to the provider's
    create/adopt rules (``adoptExisting``)."""
    assert takeover.plan([EDIT, GO], "1") is None
    update_only = entry(PULUMI, {"f:spec": {}}, operation="Update")
    assert takeover.plan([update_only, EDIT], "1") is None


def test_the_newest_pulumi_apply_entry_receives_the_fields() -> None:
    old = entry(
        "pulumi-kubernetes-old", {"f:a": {}}, operation="Apply", time="2026-01-01T00:00:00Z"
    )
    plan = takeover.plan([old, OURS, EDIT], "7")
    assert plan is not None and plan.manager == PULUMI


def test_take_over_fields_is_a_stack_setting_on_by_default() -> None:
    assert load_config({}).take_over_fields is True
    assert load_config({"takeOverFields": False}).take_over_fields is False


def test_a_bad_take_over_fields_value_names_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"takeOverFields": "sometimes"})
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("pmem-csi:takeOverFields: ")


# --------------------------------------------------------------------------------------------
# takeover_transform.correct with a fake API: what is read and written, in which order


class FakeApi:
    """Serves one object; ``races`` JSON patches fail as a resourceVersion test would."""

    def __init__(self, live: dict[str, Any] | None, races: int = 0) -> None:
        self.live = live
        self.races = races
        self.calls: list[tuple[str, Any]] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.calls.append(("get", path))
        return self.live

    def json_patch(self, path: str, ops: Any, manager: str) -> None:
        from pmem_components.takeover_transform import TakeOverError

        self.calls.append(("json_patch", manager))
        if self.races:
            self.races -= 1
            raise TakeOverError("test failed", 422)

    def apply(self, path: str, obj: dict[str, Any], manager: str) -> None:
        self.calls.append(("apply", manager))


DECLARED = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "d", "namespace": "ns"},
}
LIVE = {
    **DECLARED,
    "metadata": {**DECLARED["metadata"], "resourceVersion": "9", "managedFields": [OURS, EDIT]},
}


def test_correct_patches_managed_fields_then_applies_as_pulumi() -> None:
    from pmem_components.takeover_transform import correct

    api = FakeApi(LIVE)
    outcome = correct(api, DECLARED, dry_run=False)
    assert outcome is not None
    assert outcome.message == (
        "took over fields of DaemonSet ns/d and applied it"
        " (kubectl-edit (metadata.labels.extra))"
    )
    path = "/apis/apps/v1/namespaces/ns/daemonsets/d"
    assert api.calls == [("get", path), ("json_patch", PULUMI), ("apply", PULUMI)]


def test_correct_in_a_preview_only_reads() -> None:
    from pmem_components.takeover_transform import correct

    api = FakeApi(LIVE)
    outcome = correct(api, DECLARED, dry_run=True)
    assert outcome is not None and outcome.message.startswith("pulumi up would take over")
    assert [c[0] for c in api.calls] == ["get"]


def test_correct_reads_again_when_the_object_changed_in_between() -> None:
    from pmem_components.takeover_transform import correct

    api = FakeApi(LIVE, races=2)
    assert correct(api, DECLARED, dry_run=False) is not None
    assert [c[0] for c in api.calls] == ["get", "json_patch"] * 3 + ["apply"]


def test_correct_leaves_missing_and_clean_objects_alone() -> None:
    from pmem_components.takeover_transform import correct

    missing = FakeApi(None)
    assert correct(missing, DECLARED, dry_run=False) is None
    clean = FakeApi({**LIVE, "metadata": {**LIVE["metadata"], "managedFields": [OURS, KCM]}})
    assert correct(clean, DECLARED, dry_run=False) is None
    assert [c[0] for c in missing.calls + clean.calls] == ["get", "get"]
