"""Patches (:mod:`pmem_components.patches`): cases that mutation testing found open in
test_patches.py.
"""

from __future__ import annotations

import pytest
from test_patches import WHERE, patchset

from pmem_components.patches import PatchError, changed_paths


def test_the_late_check_names_every_entry_that_selected_nothing_in_one_line() -> None:
    ps = patchset(
        {"kind": "DaemonSet", "mergePatch": {"spec": {"x": 1}}},
        {"kind": "StatefulSet", "mergePatch": {"spec": {"y": 1}}},
    )
    with pytest.raises(PatchError) as err:
        ps.check_all_matched()
    assert str(err.value) == (
        f"patch entries selected no object: {WHERE}[0], {WHERE}[1]"
    )


def _apply_error(ops: list[dict], obj: dict) -> str:
    ps = patchset({"kind": "Secret", "jsonPatch": ops})
    with pytest.raises(PatchError) as err:
        ps.entries[0].apply(obj)
    return str(err.value)


SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "s"},
    "data": {"tls.key": "S3CRET", "ca.crt": "x"},
}


def test_a_failing_json_patch_names_the_object_but_never_its_content() -> None:
    failed_test = _apply_error([{"op": "test", "path": "/data/tls.key", "value": "x"}], SECRET)
    assert failed_test == (
        f"{WHERE}[0]: cannot apply jsonPatch to Secret 's': a 'test' operation did not match"
    )
    # jsonpointer appends the document it searched ("... not found in {...}"): cut.
    missing = _apply_error([{"op": "remove", "path": "/data/nope/x"}], SECRET)
    assert missing == f"{WHERE}[0]: cannot apply jsonPatch to Secret 's': member 'nope' not found"
    nameless = {k: v for k, v in SECRET.items() if k != "metadata"}
    assert _apply_error([{"op": "remove", "path": "/data/nope/x"}], nameless) == (
        f"{WHERE}[0]: cannot apply jsonPatch to Secret: member 'nope' not found"
    )


def test_library_errors_lose_every_document_excerpt_and_stay_short() -> None:
    from jsonpatch import JsonPointerException

    from pmem_components.patches import _describe

    assert _describe(JsonPointerException("member 'a' not found in ['S3CRET'] in {'b': 1}")) == (
        "member 'a' not found"
    )
    assert _describe(JsonPointerException("member 'a' not found in {'k': 1} in {'S3CRET': 2}")) == (
        "member 'a' not found"
    )
    assert _describe(JsonPointerException("x" * 300)) == "x" * 200


def test_changed_paths_names_each_changed_leaf_once_and_lists_whole() -> None:
    """``changed_paths``: dotted paths in first-seen order (``before``'s keys, then keys only
    ``after`` has), a key added or removed as one path, a list compared whole."""
    before = {
        "spec": {"podManagementPolicy": "OrderedReady", "replicas": 1, "keep": {"a": 1}},
        "roleRef": {"name": "old"},
        "gone": True,
        "list": [1, 2],
    }
    after = {
        "spec": {"podManagementPolicy": "Parallel", "replicas": 1, "keep": {"a": 1}},
        "roleRef": {"name": "new"},
        "list": [1, 3],
        "added": {"x": None, "y": 2},
    }
    assert changed_paths(before, after) == [
        "spec.podManagementPolicy",
        "roleRef.name",
        "gone",
        "list",
        "added",
    ]
    assert changed_paths(before, before) == []
    assert changed_paths({"a": 1}, {"a": 2}, "metadata") == ["metadata.a"]
    assert changed_paths(1, 2, "x") == ["x"]
