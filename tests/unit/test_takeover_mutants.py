"""The take-over's pure half (:mod:`pmem_components.takeover`): decisions that mutation
testing found open in test_takeover.py.
"""

from __future__ import annotations

import copy

import pytest
from test_takeover import EDIT, OURS, PULUMI, entry

from pmem_components import takeover
from pmem_components.fieldowners import ALLOWED_ENV, Allowance


def test_the_union_is_a_new_tree_that_shares_nothing_with_its_inputs() -> None:
    """The plan's patch is built from the live managedFields; editing it must not edit them."""
    ours = {"f:metadata": {"f:labels": {"f:app": {}}}}
    theirs = {"f:spec": {"f:template": {"f:spec": {}}}}
    ours_before, theirs_before = copy.deepcopy(ours), copy.deepcopy(theirs)
    union = takeover.merge_fields(ours, theirs)
    union["f:metadata"]["f:labels"]["f:new"] = {}
    union["f:spec"]["f:template"]["f:new"] = {}
    assert ours == ours_before
    assert theirs == theirs_before


def test_pulumis_status_entry_never_receives_the_fields() -> None:
    status = entry(PULUMI, {"f:status": {}}, operation="Apply", subresource="status",
                   time="2026-12-01T00:00:00Z")
    assert takeover.pulumi_entry([OURS, status]) is OURS
    result = takeover.plan([OURS, status, EDIT], "5")
    assert result is not None
    entries = result.patch[1]["value"]
    # The main entry got the foreign fields; the status entry is kept as it was.
    assert entries[0]["fieldsV1"]["f:metadata"]["f:labels"] == {"f:app": {}, "f:extra": {}}
    assert entries[1] == status


def test_an_apply_entry_with_a_time_is_newer_than_one_without() -> None:
    untimed = {k: v for k, v in entry(PULUMI, {}, operation="Apply").items() if k != "time"}
    timed = entry("pulumi-kubernetes-other", {}, operation="Apply", time="2026-01-01T00:00:00Z")
    assert takeover.pulumi_entry([timed, untimed]) is timed
    assert takeover.pulumi_entry([untimed, timed]) is timed


def test_a_foreign_entry_without_a_manager_is_named_by_the_empty_name() -> None:
    nameless = {k: v for k, v in EDIT.items() if k != "manager"}
    result = takeover.plan([OURS, nameless], "5")
    assert result is not None
    assert result.foreign == ("",)


# The administrator's entry of the ownership policy, as the program passes it to ``plan``.
EDIT_MAY_OWN_EXTRA = Allowance("kubectl-edit", ("metadata.labels.extra",), "a test's reason")


def test_a_manager_owning_only_what_the_administrator_allows_it_is_not_taken_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ALLOWED_ENV, raising=False)
    assert takeover.plan([OURS, EDIT], "5", [EDIT_MAY_OWN_EXTRA]) is None
    assert takeover.plan([OURS, EDIT], "5") is not None  # without the entry it is


def test_the_administrators_allowed_fields_stay_with_their_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ALLOWED_ENV, raising=False)
    edit = entry("kubectl-edit", {"f:metadata": {"f:labels": {"f:extra": {}}}, "f:spec": {}})
    result = takeover.plan([OURS, edit], "5", [EDIT_MAY_OWN_EXTRA])
    assert result is not None
    entries = result.patch[1]["value"]
    assert [e["manager"] for e in entries] == [PULUMI, "kubectl-edit"]
    assert entries[1]["fieldsV1"] == {"f:metadata": {"f:labels": {"f:extra": {}}}}
    assert entries[0]["fieldsV1"]["f:spec"] == {"f:replicas": {}}
