"""Review of the change 48eb603..2fd9f23 (HTTP/2 watch fixes, program fixes): each test is a
neighbour of one of its fixes that the same guard missed."""

from __future__ import annotations

import pytest

from pmem_components.config import ConfigError, load_config

# --------------------------------------------------------------------------- renamedFrom


def test_two_deployments_renamed_from_the_same_old_one_are_refused() -> None:
    """A rename moves one deployment to one new name. Two entries with the same
    ``renamedFrom`` both got the old deployment as their ``Previous`` from the preflight:
    both components alias the old component's URN (and both bundles the old objects'), which
    the engine refuses as duplicate aliases in the middle of ``pulumi up``, and the old
    driver would be "replaced" twice. Refused with the other cross-entry rename rule."""
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "deployments": [
                    {"name": "a.example.com", "namespace": "a", "renamedFrom": "old.example.com"},
                    {"name": "b.example.com", "namespace": "b", "renamedFrom": "old.example.com"},
                ]
            },
            check_certificates=False,
        )
    assert info.value.problems == [
        'pmem-csi:deployments[1].renamedFrom: "old.example.com" is already renamed by '
        "pmem-csi:deployments[0].renamedFrom; a deployment is renamed to one new name, so "
        "set renamedFrom on one of them only"
    ]
