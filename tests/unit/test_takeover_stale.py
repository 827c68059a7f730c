"""Another stack's Pulumi field manager on an adopted object (issue 14, item 4).

A stack that adopts an object (``pmem-csi:adopt``: retained by an earlier stack of its name,
or a same-named stack's on another backend) applies it under a manager of its own; the
earlier stack's ``pulumi-kubernetes-<random>`` entry stays and co-owns every field it set. The
take-over, told this stack's manager (its state records it), merges such entries into it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components import takeover
from pmem_components.fieldowners import Allowance
from tests.unit.test_takeover import EDIT, entry

MINE = "pulumi-kubernetes-aaaa1111"
EARLIER = "pulumi-kubernetes-bbbb2222"
LABELS = {"f:metadata": {"f:labels": {"f:app": {}, "f:tier": {}}}}
OWN = entry(MINE, LABELS, operation="Apply", time="2026-12-01T10:00:00Z")
OLD = entry(EARLIER, LABELS, operation="Apply", time="2026-11-01T10:00:00Z")
STATUS = entry(EARLIER, {"f:status": {}}, subresource="status")


def managers(plan: takeover.TakeOver) -> list[tuple[str, dict[str, Any]]]:
    ops = {op["path"]: op for op in plan.patch}
    return [(e["manager"], e["fieldsV1"]) for e in ops["/metadata/managedFields"]["value"]]


# (situation, managedFields, own manager, stale_only, foreign expected or None)
CASES = [
    ("adopted: the earlier stack's entry goes", [OLD, OWN], MINE, False, (EARLIER,)),
    ("namespaces: only Pulumi entries are taken", [OLD, OWN, EDIT], MINE, True, (EARLIER,)),
    ("namespace with an admin's label only: nothing", [OWN, EDIT], MINE, True, None),
    ("own manager unknown: every Pulumi entry is Pulumi's", [OLD, OWN], None, False, None),
    ("an earlier entry newer than ours", [OWN, {**OLD, "time": "2027"}], MINE, False, (EARLIER,)),
    ("a status entry of that manager is not the object's", [OWN, STATUS], MINE, False, None),
    ("taken back: another stack's entry replaced ours", [OLD], MINE, False, (EARLIER,)),
]


@pytest.mark.parametrize(
    ("situation", "managed", "own", "stale_only", "foreign"), CASES, ids=[c[0] for c in CASES]
)
def test_stale_pulumi_managers(
    situation: str,
    managed: list[dict[str, Any]],
    own: str | None,
    stale_only: bool,
    foreign: tuple[str, ...] | None,
) -> None:
    plan = takeover.plan(managed, "7", own_manager=own, stale_only=stale_only)
    if foreign is None:
        assert plan is None, situation
        return
    assert plan is not None and plan.foreign == foreign and plan.manager == MINE
    kept = managers(plan)
    assert [m for m, _ in kept if m.startswith("pulumi-kubernetes")] == [MINE]
    if stale_only:
        assert ("kubectl-edit", EDIT["fieldsV1"]) in kept, "an administrator's entry stays"


def test_the_merged_entry_holds_the_earlier_stacks_fields() -> None:
    old = entry(EARLIER, {"f:metadata": {"f:labels": {"f:gone": {}}}}, operation="Apply")
    plan = takeover.plan([old, OWN], "7", own_manager=MINE)
    assert plan is not None
    ((manager, fields),) = managers(plan)
    assert manager == MINE
    assert fields == {"f:metadata": {"f:labels": {"f:app": {}, "f:tier": {}, "f:gone": {}}}}


def test_the_stale_entries_are_the_other_pulumi_managers_object_entries_only() -> None:
    """``stale_pulumi_entries`` itself: this stack's own entry, a person's edit and another
    Pulumi manager's status entry are not stale; another Pulumi manager's entry is."""
    assert takeover.stale_pulumi_entries([OLD, OWN, EDIT, STATUS], MINE) == [OLD]
    assert takeover.stale_pulumi_entries([OWN, EDIT], MINE) == []


def test_an_edit_and_an_earlier_stacks_entry_on_one_object_are_both_taken() -> None:
    """A person's edit must not shield the earlier stack's entry: left, it co-owns the fields
    and the next change of one of them fails with a server-side apply conflict."""
    plan = takeover.plan([OLD, OWN, EDIT], "7", own_manager=MINE)
    assert plan is not None
    assert plan.foreign == ("kubectl-edit", EARLIER)
    ((manager, fields),) = managers(plan)
    assert manager == MINE
    assert fields == {"f:metadata": {"f:labels": {"f:app": {}, "f:tier": {}, "f:extra": {}}}}


def test_this_stacks_status_entry_does_not_receive_the_objects_fields() -> None:
    """Taking an object back from another stack gives its fields to this stack's entry of the
    object itself; an Apply entry of this manager on the status subresource stays as it was."""
    own_status = entry(MINE, {"f:status": {}}, operation="Apply", subresource="status")
    plan = takeover.plan([OLD, own_status], "7", own_manager=MINE)
    assert plan is not None
    assert plan.foreign == (EARLIER,)
    entries = dict(zip(("object", "status"), next(
        op["value"] for op in plan.patch if op["path"] == "/metadata/managedFields"
    ), strict=True))
    assert entries["object"]["manager"] == MINE and "subresource" not in entries["object"]
    assert entries["object"]["fieldsV1"] == LABELS
    assert entries["status"] == own_status


def test_an_earlier_stacks_entry_goes_whole_even_if_an_allowance_names_its_manager() -> None:
    """The allow-list keeps fields with people and controllers, never with another Pulumi
    manager: a kept part of the earlier stack's entry would co-own them and conflict."""
    allowance = Allowance(EARLIER, ("metadata.labels.tier",), "a test's reason")
    plan = takeover.plan([OLD, OWN], "7", [allowance], own_manager=MINE)
    assert plan is not None
    assert managers(plan) == [(MINE, LABELS)]


def test_this_stacks_own_update_entry_is_never_taken_as_stale() -> None:
    """Only other managers' entries are stale: an Update entry under this stack's own manager
    stays its own entry while the earlier stack's entry is merged away."""
    own_update = entry(MINE, {"f:spec": {"f:replicas": {}}})
    plan = takeover.plan([OLD, OWN, own_update], "7", own_manager=MINE)
    assert plan is not None
    assert plan.foreign == (EARLIER,)
    assert managers(plan) == [(MINE, LABELS), (MINE, own_update["fieldsV1"])]
