"""The CLI's schema cache of the served package is removed before a CLI run that loads it.

The CLI serves ``$PULUMI_HOME/schemas/<name>-<version>.json`` while it is newer than the
plugin's directory; a checkout's ``provider/`` does not change with ``pmem_components``, so a
schema cached from other code (another branch) would be used: an e2e run on one branch after
another failed with "Property takeOverFields does not exist" that way.
"""

from __future__ import annotations

from pathlib import Path

from pmem_components import provider_face
from tools import localenv


def test_the_served_package_name_is_the_providers() -> None:
    assert localenv.SERVED_PACKAGE == provider_face.PACKAGE_NAME


def test_the_cached_schema_of_the_served_package_is_removed_and_nothing_else(
    tmp_path: Path,
) -> None:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    cached = ("pmem-csi-0.1.0.json", "pmem-csi-0.2.0-abcdef012345.json", "kubernetes-4.25.0.json")
    for name in cached:
        (schemas / name).write_text("{}")
    localenv.forget_served_schema({"PULUMI_HOME": str(tmp_path)})
    assert sorted(p.name for p in schemas.iterdir()) == ["kubernetes-4.25.0.json"]


def test_a_home_without_a_schema_cache_is_no_error(tmp_path: Path) -> None:
    localenv.forget_served_schema({"PULUMI_HOME": str(tmp_path / "new-home")})
