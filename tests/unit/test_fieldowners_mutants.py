"""Field paths and owner descriptions (:mod:`pmem_components.fieldowners`): the cases that
mutation testing found open in test_fieldowners.py (odd fieldsV1 keys, the "and N more" edge,
several managers in one line).
"""

from __future__ import annotations

from pmem_components.fieldowners import ForeignOwner, describe, field_paths


def test_a_list_entry_keyed_by_a_plain_value_shows_the_value() -> None:
    assert field_paths({"f:spec": {"f:ports": {"k:8080": {}}}}) == ["spec.ports[8080]"]


def test_an_unknown_key_kind_is_kept_as_it_is() -> None:
    assert field_paths({"f:spec": {"odd": {}}}) == ["spec.odd"]
    assert field_paths({"odd": {}}) == ["odd"]


def test_a_leaf_that_is_not_a_mapping_is_a_field() -> None:
    assert field_paths({"f:spec": {"f:replicas": None, "f:paused": True}}) == [
        "spec.paused",
        "spec.replicas",
    ]


def test_one_path_over_the_limit_is_one_more() -> None:
    owner = ForeignOwner("kubectl-edit", "Update", ("a", "b", "c", "d"))
    assert describe([owner]) == "kubectl-edit (a, b, c and 1 more)"
    exact = ForeignOwner("kubectl-edit", "Update", ("a", "b", "c"))
    assert describe([exact]) == "kubectl-edit (a, b, c)"


def test_several_managers_are_separated_by_semicolons() -> None:
    owners = [
        ForeignOwner("kubectl-edit", "Update", ("spec.replicas",)),
        ForeignOwner("kubectl-label", "Update", ("metadata.labels.x",)),
    ]
    assert describe(owners) == "kubectl-edit (spec.replicas); kubectl-label (metadata.labels.x)"
