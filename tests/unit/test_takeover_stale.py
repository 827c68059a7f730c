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
