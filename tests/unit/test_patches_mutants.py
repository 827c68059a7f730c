"""Patches (:mod:`pmem_components.patches`): cases that mutation testing found open in
test_patches.py.
"""

from __future__ import annotations

import pytest
from test_patches import WHERE, patchset

from pmem_components.patches import PatchError


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
