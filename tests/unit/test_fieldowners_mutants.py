"""Field paths and owner descriptions (:mod:`pmem_components.fieldowners`): the cases that
mutation testing found open in test_fieldowners.py (odd fieldsV1 keys, the "and N more" edge,
several managers in one line).
"""

from __future__ import annotations

import pytest

from pmem_components.fieldowners import (
    ALLOWED_ENV,
    Allowance,
    ForeignOwner,
    describe,
    field_paths,
    foreign_owners,
    is_foreign,
    parse_allowed,
    split_entry,
)


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


def test_an_edit_entry_that_owns_no_field_is_still_an_edit() -> None:
    """``kubectl edit`` can leave an Update entry with no (or empty, or odd) fieldsV1: it is
    still someone writing behind Pulumi's back, so it counts as foreign."""
    base = {"manager": "kubectl-edit", "operation": "Update"}
    for fields in ({}, None, [], "odd"):
        assert is_foreign({**base, "fieldsV1": fields}, ()), fields
    assert is_foreign(base, ())


def test_a_leaf_that_is_not_a_mapping_is_split_like_an_empty_one() -> None:
    """The policy split reads leaves as field_paths does: ``None`` or ``True`` is a field, so
    the rollout stamp stays allowed and the manager's other fields are still drift."""
    stamp = "f:kubectl.kubernetes.io/restartedAt"
    rollout = {
        "manager": "kubectl-rollout",
        "fieldsV1": {
            "f:spec": {
                "f:template": {"f:metadata": {"f:annotations": {stamp: None}}},
                "f:replicas": True,
            }
        },
    }
    rest, kept = split_entry(rollout, ())
    assert rest == {"f:spec": {"f:replicas": {}}}
    assert kept == {"f:spec": {"f:template": {"f:metadata": {"f:annotations": {stamp: {}}}}}}
    assert is_foreign(rollout, ())


STAMP = "f:kubectl.kubernetes.io/restartedAt"


def test_a_nodes_own_marker_stays_with_the_part_that_holds_its_fields() -> None:
    """The take-over writes both parts back to managedFields: a node's ``.`` goes with the
    fields it holds, to the kept part only when nothing of that node is taken."""
    rollout = {
        "manager": "kubectl-rollout",
        "fieldsV1": {
            "f:spec": {
                ".": {},
                "f:template": {
                    ".": {},
                    "f:metadata": {"f:annotations": {".": {}, STAMP: {}}},
                },
                "f:replicas": {},
            }
        },
    }
    rest, kept = split_entry(rollout, ())
    assert rest == {"f:spec": {".": {}, "f:replicas": {}}}
    assert kept == {
        "f:spec": {"f:template": {".": {}, "f:metadata": {"f:annotations": {".": {}, STAMP: {}}}}}
    }


def test_a_node_owned_as_a_whole_outside_the_allowance_is_drift() -> None:
    """An allowance covers its paths only: the rollout manager owning the labels map as a whole
    (only its ``.``) has changed something Pulumi declares."""
    rollout = {"manager": "kubectl-rollout", "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}
    assert split_entry(rollout, ()) == ({"f:metadata": {"f:labels": {".": {}}}}, {})
    assert is_foreign(rollout, ())


def test_an_allowed_path_covers_the_fields_and_list_entries_below_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An administrator allows a subtree by its root: fields (``.``) and list entries (``[``)
    below it are allowed, a sibling whose name merely starts the same is not."""
    monkeypatch.delenv(ALLOWED_ENV, raising=False)
    allowed = [Allowance("team-tool", ("spec.template.spec.containers", "metadata.labels"), "r")]
    below = {
        "f:metadata": {"f:labels": {"f:team": {}}},
        "f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"a"}': {"f:args": {}}}}}},
    }
    tool = {"manager": "team-tool", "operation": "Update", "fieldsV1": below}
    assert not is_foreign(tool, allowed)
    assert foreign_owners([tool], allowed) == []
    sibling = {"f:metadata": {"f:labelsExtra": {}}}
    assert is_foreign({**tool, "fieldsV1": sibling}, allowed)


def test_an_entry_without_fields_or_operation_is_read_without_inventing_any() -> None:
    """The reporter reads whatever managedFields hold: an entry without fieldsV1 names no
    field, and a foreign owner without an operation is shown with an empty one."""
    assert foreign_owners([{"manager": "kubectl-edit", "fieldsV1": None}], ()) == []
    assert split_entry({"manager": "kubectl-edit"}, ()) == ({}, {})
    bare = {"manager": "kubectl-edit", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    assert foreign_owners([bare], ()) == [ForeignOwner("kubectl-edit", "", ("spec.replicas",))]


KEY = "pmem-csi:allowedFieldOwners"
GOOD = {"manager": "team-tool", "paths": ["metadata.labels.team"], "reason": "ours"}
# (what is wrong, the entries, the problems named)
BAD_ENTRIES = [
    (
        "not a mapping, and every later item is still checked",
        ["x", {**GOOD, "paths": []}],
        [
            f"{KEY}[0]: must be a mapping with manager, paths and reason",
            f"{KEY}[1].paths: must be a non-empty list of field paths",
        ],
    ),
    (
        "two unknown keys, named in order",
        [{**GOOD, "zeta": 1, "alpha": 2}],
        [f"{KEY}[0]: unknown key(s) alpha, zeta"],
    ),
    (
        "a manager that is no name",
        [{**GOOD, "manager": 5}],
        [f"{KEY}[0].manager: must be a field manager's name"],
    ),
    (
        "an empty manager",
        [{**GOOD, "manager": ""}],
        [f"{KEY}[0].manager: must be a field manager's name"],
    ),
    (
        "an empty path",
        [{**GOOD, "paths": ["metadata.labels.team", ""]}],
        [f"{KEY}[0].paths: must be a non-empty list of field paths"],
    ),
    (
        "a path that is no string",
        [{**GOOD, "paths": [7]}],
        [f"{KEY}[0].paths: must be a non-empty list of field paths"],
    ),
]


@pytest.mark.parametrize(("wrong", "raw", "problems"), BAD_ENTRIES, ids=[c[0] for c in BAD_ENTRIES])
def test_a_bad_policy_entry_is_refused_naming_what_is_wrong(
    wrong: str, raw: list[object], problems: list[str]
) -> None:
    """The stack setting is refused with one line per mistake, so the administrator can fix
    every one in one go; no bad entry becomes an allowance."""
    allowed, found = parse_allowed(raw, KEY)
    assert found == problems, wrong
    assert allowed == []


def test_an_allowed_label_does_not_cover_a_longer_label_whose_key_starts_with_it() -> None:
    """Label and annotation keys hold dots: allowing a manager the label ``app`` must not
    allow it ``app.kubernetes.io/name`` too, a label Pulumi declares on every object."""
    allowed = [Allowance("team-labeller", ("metadata.labels.app",), "r")]
    labels = {"f:app": {}, "f:app.kubernetes.io/name": {}}
    labeller = {"manager": "team-labeller", "fieldsV1": {"f:metadata": {"f:labels": labels}}}
    assert foreign_owners([labeller], allowed) == [
        ForeignOwner("team-labeller", "", ("metadata.labels.app.kubernetes.io/name",))
    ]
    assert is_foreign(labeller, allowed)
