"""Review findings of issue 14's tail (branch ``tail14``): one section per finding.

Each test shows the defect the review found: it failed before the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pmem_components import identity, preflight
from tests.unit import test_preflight_identity as pid

# --------------------------------------------------------------------------------------------
# finding 1: a stack rename (or an organisation/project rename) is not a take-over

RENAMED = identity.identity(pid.ORG, "pmem-csi-pulumi", "prod2")
OWN, THEIRS_MANAGER = "pulumi-kubernetes-aaaa", "pulumi-kubernetes-bbbb"
THEIRS = "organization/pmem-csi-pulumi/other"


def _live(obj: preflight.ObservedObject, annotation: str, entries: list[tuple[str, bool]]) -> Any:
    """``obj`` as the API server returns it: annotated with ``annotation``, with one Apply
    entry per (manager, whether it owns the stack annotation)."""
    ann = {f"f:{pid.names.STACK_ANNOTATION}": {}}
    meta: dict[str, Any] = {
        "name": obj.name,
        "uid": obj.uid,
        "labels": dict(obj.labels),
        "annotations": {pid.names.STACK_ANNOTATION: annotation},
        "managedFields": [
            {
                "manager": manager,
                "operation": "Apply",
                "fieldsV1": {"f:metadata": {"f:annotations": ann if writes else {}}},
            }
            for manager, writes in entries
        ],
    }
    return preflight._observed(
        {"apiVersion": obj.api_version, "kind": obj.kind, "metadata": meta, "spec": obj.spec},
        obj.kind,
    )


def _observed(annotation: str, entries: list[tuple[str, bool]]) -> Any:
    return pid.Observed(
        namespaces={"pmem-csi": _live(pid.ns(), annotation, entries)},
        crs={pid.DRIVER: _live(pid.cr(), annotation, entries)},
    )


def _renamed_state() -> identity.StackState:
    return dataclasses.replace(pid.state_with_urns(OWN), stack_id=RENAMED)


DEP = {"name": pid.DRIVER, "namespace": "pmem-csi"}


@pytest.mark.parametrize("old", [pid.ME, pid.OLD_FORM, "other-org/other-project/prod"])
def test_after_a_stack_rename_the_next_update_is_not_refused(old: str) -> None:
    """``pulumi stack rename prod prod2``: every object still carries the old identity, and
    this stack's own manager wrote it; nothing has been taken over."""
    observed = _observed(old, [(OWN, True)])
    plan = pid.plan(pid.stack(DEP), observed, RENAMED, _renamed_state())
    assert plan.problems == []
    assert preflight._taker(observed.crs[pid.DRIVER], _renamed_state()) is None


def test_after_a_stack_rename_a_drop_is_not_refused_as_taken_over() -> None:
    observed = _observed(pid.ME, [(OWN, True)])
    plan = pid.plan(pid.stack(), observed, RENAMED, _renamed_state())
    assert not any("taken it over" in p for p in plan.problems), plan.problems


def test_an_adoption_without_take_over_is_still_refused_after_the_fix() -> None:
    """takeOverFields: false leaves this stack's entry, but the other stack's apply wrote
    its identity: taken over."""
    observed = _observed(THEIRS, [(OWN, False), (THEIRS_MANAGER, True)])
    state = dataclasses.replace(pid.state_with_urns(OWN), stack_id=pid.ME)
    problems = pid.plan(pid.stack(), observed, pid.ME, state).problems
    assert len(problems) == 2, problems
    assert all(THEIRS in p and "pulumi state delete" in p for p in problems), problems
    problems = pid.plan(pid.stack(DEP), observed, pid.ME, state).problems
    assert any("another stack has taken it over since" in p for p in problems), problems
