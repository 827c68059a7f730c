"""Two served components in one namespace, from one YAML program (issue 19), with the real
CLI and the real YAML host on the local cluster.

The set-up is served_package.py's: a fresh YAML project, ``pulumi package add
<checkout>/provider``, a backend of this module's own. Two ``PmemCsiDeployment`` resources
with different driver names in one namespace:

- both with the default ``createNamespace: true``: ``preview`` fails on the second, naming its
  ``createNamespace`` field and the first component, and nothing is created;
- the documented way, the second with ``createNamespace: false`` and ``dependsOn`` the first:
  ``up`` deploys both in the one namespace, a second ``up`` changes nothing; removing the
  second from the program removes its driver only; removing the creator keeps the namespace
  (``retainNamespace`` default true) and the other driver in it, untouched; ``destroy``
  removes the drivers and keeps the namespace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pmem_components import names
from tests.e2e import served_package
from tests.e2e.served_package import Cli, controller, cr, kubectl

pytestmark = pytest.mark.timeout(900)

NAMESPACE = "yaml-shared"


def drivers(namespace: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Driver A's and B's properties in ``namespace``, and B the documented way: creating
    no namespace, registered after the creator (``dependsOn``)."""
    a = {"name": "shared-a.example.org", "namespace": namespace, "await": {"enabled": False}}
    b = {"name": "shared-b.example.org", "namespace": namespace, "await": {"enabled": False}}
    after_a = {
        "properties": {**b, "createNamespace": False},
        "options": {"dependsOn": ["${driverA}"]},
    }
    return a, b, after_a


def program(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A YAML program of ``resources`` (name -> ``properties`` and optional ``options``)."""
    return served_package.yaml_program(
        "pmem-yaml-shared",
        {
            name: {"type": served_package.DEPLOYMENT_TYPE, **spec}
            for name, spec in resources.items()
        },
    )


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    made = served_package.yaml_cli(
        tmp_path_factory, local_cluster, "yaml-shared-program", program({}), "yaml-shared"
    )
    made.add_package()
    return made


def uid(cli: Cli, *what: str) -> str | None:
    obj = kubectl(cli, "get", *what)
    return None if obj is None else obj["metadata"]["uid"]


def test_two_drivers_share_a_namespace_created_by_one_of_them(cli: Cli, crd: None) -> None:
    a, b, b_after_a = drivers(NAMESPACE)
    cli.run("stack", "init", "shared")

    # ---- both create the namespace: preview fails on the second, naming the first.
    cli.write(program({"driverA": {"properties": a}, "driverB": {"properties": b}}))
    failed = cli.run("preview", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out
    # Which of the two registers second is the engine's order; the message names the other.
    refused_b = "'driverB' (1 problem" in out
    second, first = ("driverB", "driverA") if refused_b else ("driverA", "driverB")
    assert f"invalid args of PmemCsiDeployment {second!r} (1 problem(s))" in out, out
    assert (
        f"createNamespace: component {first!r} of this program already creates namespace "
        f"'{NAMESPACE}'"
    ) in out, out
    assert f"Set createNamespace: false on {second!r} and make it depend on {first!r}" in out, out
    assert f"options: dependsOn: [${{{first}}}]" in out, out
    assert kubectl(cli, "get", "namespace", NAMESPACE) is None

    # ---- the documented way: one creator, the other depends on it.
    cli.write(program({"driverA": {"properties": a}, "driverB": b_after_a}))
    cli.run("up", "--yes")
    namespace = kubectl(cli, "get", "namespace", NAMESPACE)
    assert namespace is not None
    assert (
        namespace["metadata"]["labels"][names.LABEL_INSTANCE]
        == names.DeploymentNames(a["name"]).hyphened
    )
    for dep in (a, b):
        assert kubectl(cli, "get", *controller(dep)) is not None, dep["name"]
        assert kubectl(cli, "get", *cr(dep)) is not None, dep["name"]
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")
    state = cli.export()
    owners = [
        r["urn"]
        for r in state["deployment"]["resources"]
        if r["type"] == "kubernetes:core/v1:Namespace"
    ]
    assert len(owners) == 1 and owners[0].endswith(f"::{NAMESPACE}"), owners

    # ---- removing the second removes its driver only.
    ns_uid, a_uid = uid(cli, "namespace", NAMESPACE), uid(cli, *controller(a))
    cli.write(program({"driverA": {"properties": a}}))
    cli.run("up", "--yes")
    assert kubectl(cli, "get", *controller(b)) is None
    assert kubectl(cli, "get", *cr(b)) is None
    assert uid(cli, "namespace", NAMESPACE) == ns_uid
    assert uid(cli, *controller(a)) == a_uid

    # ---- back again, then destroy: the drivers go, the namespace stays (retainNamespace).
    cli.write(program({"driverA": {"properties": a}, "driverB": b_after_a}))
    cli.run("up", "--yes", "--skip-preview")
    assert kubectl(cli, "get", *controller(b)) is not None
    cli.run("destroy", "--yes", "--skip-preview")
    for dep in (a, b):
        assert kubectl(cli, "get", *controller(dep)) is None, dep["name"]
        assert kubectl(cli, "get", *cr(dep)) is None, dep["name"]
    assert uid(cli, "namespace", NAMESPACE) == ns_uid
    cli.run("stack", "rm", "--yes", "shared")


def test_removing_the_creator_keeps_the_namespace_and_the_other_driver(cli: Cli, crd: None) -> None:
    """The creator's namespace is released from the state, not deleted (retainNamespace
    default true): the driver that lives there beside it is not touched."""
    namespace = f"{NAMESPACE}-2"
    a, _, b_after_a = drivers(namespace)
    cli.run("stack", "init", "creator")
    cli.write(program({"driverA": {"properties": a}, "driverB": b_after_a}))
    cli.run("up", "--yes", "--skip-preview")
    ns_uid = uid(cli, "namespace", namespace)
    b_uid = uid(cli, *controller(b_after_a["properties"]))
    assert ns_uid is not None and b_uid is not None
    cli.write(program({"driverB": {"properties": b_after_a["properties"]}}))
    cli.run("up", "--yes")
    assert kubectl(cli, "get", *controller(a)) is None
    assert kubectl(cli, "get", *cr(a)) is None
    assert uid(cli, "namespace", namespace) == ns_uid
    assert uid(cli, *controller(b_after_a["properties"])) == b_uid
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")
    cli.run("destroy", "--yes", "--skip-preview")
    assert kubectl(cli, "get", *controller(b_after_a["properties"])) is None
    assert uid(cli, "namespace", namespace) == ns_uid
    cli.run("stack", "rm", "--yes", "creator")


def test_a_deleting_creator_is_refused_and_the_namespace_is_handed_over_with_adopt(
    cli: Cli, crd: None
) -> None:
    """Review of ns19: a creator with ``retainNamespace: false`` beside another component of
    its namespace fails ``preview`` naming that field, before anything is created; and once
    the creator is removed, the other component takes the namespace over with
    ``createNamespace: true`` + ``adoptExisting: true`` (same UID, one owner in the state)."""
    namespace = f"{NAMESPACE}-3"
    a, b, b_after_a = drivers(namespace)
    cli.run("stack", "init", "handover")
    cli.write(
        program({"driverA": {"properties": {**a, "retainNamespace": False}}, "driverB": b_after_a})
    )
    refused = cli.run("preview", check=False)
    assert refused.returncode != 0
    assert (
        "retainNamespace: false on 'driverA' deletes namespace" in refused.stdout + refused.stderr
    )
    assert kubectl(cli, "get", "namespace", namespace) is None
    cli.write(program({"driverA": {"properties": a}, "driverB": b_after_a}))
    cli.run("up", "--yes", "--skip-preview")
    ns_uid = uid(cli, "namespace", namespace)
    assert ns_uid is not None
    cli.write(program({"driverB": {"properties": b_after_a["properties"]}}))
    cli.run("up", "--yes", "--skip-preview")
    cli.write(
        program({"driverB": {"properties": {**b, "createNamespace": True, "adoptExisting": True}}})
    )
    cli.run("up", "--yes")
    assert uid(cli, "namespace", namespace) == ns_uid
    state = cli.export()
    owners = [
        r["urn"]
        for r in state["deployment"]["resources"]
        if r["type"] == "kubernetes:core/v1:Namespace"
        and r["urn"].split("::")[-1].split(":")[-1] == namespace
    ]
    assert len(owners) == 1, owners
    assert next(
        r["parent"] for r in state["deployment"]["resources"] if r["urn"] == owners[0]
    ).endswith("::driverB"), owners
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")
    cli.run("destroy", "--yes", "--skip-preview")
    cli.run("stack", "rm", "--yes", "handover")
