"""Renaming a served component's resource key in a YAML program keeps its objects (issue 19).

A review found that renaming the key of a ``PmemCsiReporter`` (or a ``PmemCsiDeployment``)
gave "+N created, -N deleted": the children were named ``<key>:<object>``, so each got a new
URN; the creates upserted the existing objects, the deletes of the old URNs then deleted
them, and the state still listed them. Here, with the real CLI and YAML host (the set-up of
``tests/e2e/served_package.py``): ``up``, rename both keys, ``up``: nothing deleted,
every object keeps its UID, and a further ``preview`` expects no changes. And a stack made by
the code before the fix (children ``<key>:<object>``; commit ``OLD_REF``, run from a
``git archive`` of it) moves to the new names in one ``up``: aliases, nothing deleted.
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from reporter.kubeapi import RawApi
from tests.e2e import served_package
from tests.e2e.reporter_helpers import REPORTER_IMAGE, ensure_crd
from tests.e2e.served_package import Cli, kubectl
from tools import localenv, toolchain

pytestmark = pytest.mark.timeout(900)

DRIVER = {"name": "renamed.example.org", "namespace": "renamed", "await": {"enabled": False}}
REPORTER = {
    "deployments": [{"name": DRIVER["name"], "namespace": DRIVER["namespace"]}],
    "image": REPORTER_IMAGE,
    "await": {"enabled": False},
}
# (kind, namespace or "", name) of objects whose UIDs must survive the rename.
OBJECTS = [
    ("statefulset", "renamed", "renamed-example-org-controller"),
    ("daemonset", "renamed", "renamed-example-org-node"),
    ("deployment", "renamed", "renamed-example-org-reporter"),
    ("serviceaccount", "renamed", "renamed-example-org-reporter"),
    ("csidriver", "", "renamed.example.org"),
]


# int before issue 19's rename fix: the served components' children prefixed "<key>:".
OLD_REF = "36af8c8"
MIGRATED = {"name": "migrated.example.org", "namespace": "migrated", "await": {"enabled": False}}


def program(driver_key: str, reporter_key: str, driver: dict[str, Any] = DRIVER) -> dict[str, Any]:
    reporter = {
        **REPORTER,
        "deployments": [{"name": driver["name"], "namespace": driver["namespace"]}],
    }
    resources = served_package.deployments({driver_key: driver})
    resources[reporter_key] = {
        "type": "pmem-csi:index:PmemCsiReporter",
        "properties": reporter,
        "options": {"dependsOn": [f"${{{driver_key}}}"]},
    }
    return served_package.yaml_program("pmem-yaml-rename", resources)


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str],
    local_cluster: Path,
    api_client: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cli]:
    ensure_crd(RawApi(api_client))
    project = program("driverA", "reporter")
    cli = served_package.yaml_cli(tmp_path_factory, local_cluster, "yaml-rename", project, "rename")
    cli.add_package()
    cli.run("stack", "init", "dev")
    yield cli
    cli.run("destroy", "--yes", "--skip-preview", check=False)


def uids(cli: Cli, objects: list[tuple[str, str, str]] = OBJECTS) -> dict[Any, str]:
    out = {}
    for kind, ns, name in objects:
        obj = kubectl(cli, "get", kind, name, *(["-n", ns] if ns else []))
        assert obj is not None, f"{kind} {ns}/{name} is not in the cluster"
        out[(kind, ns, name)] = obj["metadata"]["uid"]
    return out


def test_renaming_the_keys_of_served_components_deletes_nothing(cli: Cli) -> None:
    cli.run("up", "--yes", "--skip-preview")
    before = uids(cli)
    cli.write(program("driverX", "statusReporter"))
    done = cli.run("up", "--yes", "--skip-preview")
    summary = done.stdout[done.stdout.rfind("Resources:") :]
    print(summary)
    assert uids(cli) == before, "objects were deleted and created again"
    # Only the two components themselves are replaced (new URNs, no cluster objects).
    assert "2 created" in summary and "2 deleted" in summary, summary
    cli.run("preview", "--expect-no-changes")


def test_the_cluster_keeps_the_renamed_objects(cli: Cli, api_client: Any) -> None:
    apps = client.AppsV1Api(api_client)
    assert apps.read_namespaced_deployment("renamed-example-org-reporter", "renamed")
    assert apps.read_namespaced_daemon_set("renamed-example-org-node", "renamed")


def _old_checkout(dest: Path) -> Path:
    """``OLD_REF``'s tree (the code before the fix) with this checkout's virtualenv."""
    archive = dest / "old.tar"
    subprocess.run(
        ["git", "-C", str(toolchain.PROJECT_DIR), "archive", "-o", str(archive), OLD_REF],
        check=True,
    )
    root = dest / "old"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    (root / ".venv").symlink_to(toolchain.PROJECT_DIR / ".venv")
    return root


def test_a_stack_made_with_prefixed_children_moves_without_deleting(
    cli: Cli, tmp_path: Path
) -> None:
    old = _old_checkout(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(program("driverM", "reporterM", MIGRATED)))
    # A PULUMI_HOME of its own: the old code's schema, cached there under the same version,
    # is never seen by the other modules' CLI runs (xdist workers share the session's home).
    old_home = tmp_path / "pulumi-home-old"
    localenv.ensure_kubernetes_plugin(old_home)
    old_cli = cli.at(project, PYTHONPATH=str(old), PULUMI_HOME=str(old_home))
    old_cli.add_package(old / "provider")
    old_cli.run("stack", "init", "old")
    try:
        old_cli.run("up", "--yes", "--skip-preview")
        state = old_cli.run("stack", "export").stdout
        assert "::driverM:migrated" in state and "::reporterM:" in state, "not the old layout"
        objects = [(k, "migrated" if ns else "", n.replace("renamed", "migrated"))
                   for k, ns, n in OBJECTS]  # fmt: skip
        before = uids(cli, objects)
        new_cli = cli.at(project)
        new_cli.run("stack", "select", "old")  # selected in the old home only
        new_cli.add_package()
        done = new_cli.run("up", "--yes", "--skip-preview")
        summary = done.stdout[done.stdout.rfind("Resources:") :]
        print(summary)
        assert "deleted" not in summary and "created" not in summary, summary
        assert uids(cli, objects) == before
        state = new_cli.run("stack", "export").stdout
        assert "::driverM:" not in state and "::reporterM:" not in state
        new_cli.run("preview", "--expect-no-changes")
    finally:
        cli.at(project).run("destroy", "--yes", "--skip-preview", "--stack", "old", check=False)
