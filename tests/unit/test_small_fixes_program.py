"""Small fixes of the program's checks: a rename from a deployment still configured
(``config.py``), the component URN of a library instance whose name has colons
(``preflight.py``), label rules on patched objects (``patches.py``), and the real node's
components entering their cgroup without a fork (``tools/realnode.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from pmem_components.config import ConfigError, load_config


def _problems(raw: dict[str, Any]) -> list[str]:
    """The problems ``load_config`` raises for ``raw``."""
    with pytest.raises(ConfigError) as info:
        load_config(raw, check_certificates=False)
    return info.value.problems


# --------------------------------------------------------------------------- renamedFrom


def test_a_rename_from_a_deployment_still_configured_is_refused_by_the_config() -> None:
    """Both the old and the new name configured: the rename would remove the old driver
    (the preflight plans it as a move) while the config still deploys it. Refused by the
    config's own cross-entry rules, which run before the preflight and any cluster change
    (also with ``preflight: false``)."""
    found = _problems(
        {
            "deployments": [
                {"name": "old.example.com", "namespace": "old"},
                {"name": "new.example.com", "renamedFrom": "old.example.com"},
            ]
        }
    )
    assert found == [
        'pmem-csi:deployments[1].renamedFrom: "old.example.com" is still configured '
        "(pmem-csi:deployments[0].name); a rename replaces the old deployment, so remove "
        "it from the config in the same update to rename it, or drop renamedFrom to run "
        "both"
    ]


def test_a_rename_from_the_default_name_of_an_entry_without_a_name_is_refused() -> None:
    """An entry without ``name`` is the default driver name: naming it in renamedFrom is
    renaming a deployment still configured."""
    found = _problems(
        {"deployments": [{"name": "new.example.com", "renamedFrom": "pmem-csi.intel.com"}, {}]}
    )
    assert [p.split(":", 2)[1] for p in found] == ["deployments[0].renamedFrom"]
    assert "(pmem-csi:deployments[1].name)" in found[0]


def test_a_rename_from_a_name_no_longer_configured_is_fine() -> None:
    stack = load_config(
        {
            "deployments": [
                {"name": "other.example.com", "namespace": "other"},
                {"name": "new.example.com", "renamedFrom": "old.example.com"},
            ]
        },
        check_certificates=False,
    )
    assert [d.renamed_from for d in stack.deployments] == [None, "old.example.com"]
