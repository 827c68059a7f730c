"""Reading ``managedFields``: which managers changed an object behind Pulumi's back, and where."""

from __future__ import annotations

from pmem_components.fieldowners import (
    ForeignOwner,
    describe,
    field_paths,
    foreign_owners,
    is_foreign,
)

ARGS_EDIT = {
    "f:spec": {
        "f:template": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"pmem-driver"}': {".": {}, "f:args": {}},
                }
            }
        }
    }
}


def entry(manager: str, fields: dict, operation: str = "Update", **extra: str) -> dict:
    return {"manager": manager, "operation": operation, "fieldsV1": fields, **extra}


def test_paths_name_fields_list_entries_by_key_set_entries_and_indices() -> None:
    fields = {
        **ARGS_EDIT,
        "f:metadata": {"f:labels": {"f:team": {}}, "f:finalizers": {'v:"keep"': {}}},
        "f:rules": {"i:0": {"f:verbs": {}}},
        "f:ports": {'k:{"port":10000,"protocol":"TCP"}': {".": {}, "f:port": {}}},
    }
    assert field_paths(fields) == [
        "metadata.finalizers[=keep]",
        "metadata.labels.team",
        "ports[port=10000,protocol=TCP].port",
        "rules[0].verbs",
        "spec.template.spec.containers[name=pmem-driver].args",
    ]


def test_a_node_owned_as_a_whole_is_its_own_path() -> None:
    assert field_paths({"f:data": {".": {}}}) == ["data"]
    assert field_paths({}) == []


def test_pulumi_control_plane_and_status_writers_are_not_foreign() -> None:
    assert not is_foreign(entry("pulumi-kubernetes-3c4d9a1f", ARGS_EDIT, "Apply"))
    assert not is_foreign(entry("pulumi-kubernetes", ARGS_EDIT))
    assert not is_foreign(entry("kube-controller-manager", ARGS_EDIT))
    assert not is_foreign(entry("kubectl-edit", {"f:status": {}}, subresource="status"))
    assert is_foreign(entry("kubectl-edit", ARGS_EDIT))
    assert is_foreign(entry("pmem-csi-operator", ARGS_EDIT))


def test_foreign_owners_keeps_order_and_drops_managers_owning_nothing() -> None:
    managed = [
        entry("pulumi-kubernetes-1", {"f:metadata": {"f:labels": {"f:app": {}}}}, "Apply"),
        entry("kubectl-patch", {"f:metadata": {"f:labels": {"f:team": {}}}}),
        entry("kubectl-edit", {}),
        entry("kubectl-edit", ARGS_EDIT),
        "not an entry",
    ]
    assert foreign_owners(managed) == [
        ForeignOwner("kubectl-patch", "Update", ("metadata.labels.team",)),
        ForeignOwner(
            "kubectl-edit", "Update", ("spec.template.spec.containers[name=pmem-driver].args",)
        ),
    ]
    assert foreign_owners(None) == []


def test_describe_caps_the_paths_per_manager() -> None:
    owner = ForeignOwner("e2e.test", "Update", ("a", "b", "c", "d", "e"))
    assert describe([owner]) == "e2e.test (a, b, c and 2 more)"
    assert describe([owner], max_paths=5) == "e2e.test (a, b, c, d, e)"
