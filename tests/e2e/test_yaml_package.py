"""The component provider used from a YAML program, with the real CLI and the real YAML host.

A fresh directory holds a YAML program (``runtime: yaml``) with two ``PmemCsiDeployment``
resources, one with a patch. ``pulumi package add <checkout>/provider`` adds the package by
path, as a user of another language does; the CLI starts the provider through the Python
language host's ``RunPlugin`` (the stand-in, tools/langhost.py) and the YAML program through
``pulumi-language-yaml`` (built by tools/toolchain.py, group ``pulumi-yaml``). One stack
lifecycle: a bad field fails ``preview`` naming the YAML field, ``up``, a second ``up`` with
no changes, ``up --refresh`` after a kubectl delete, ``destroy``.

What the YAML program deployed is compared, object for object, with what the Python program
(``pmem_components.program``, run under Pulumi mocks) registers for the same deployments with
the same stack-level settings the served component has (CRD installed beforehand; field
take-over on, the default of both): every Kubernetes object's inputs, apart from what depends
on the stack's name or on the generated certificates.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import served_package
from tests.e2e.served_package import Cli, kubectl
from tools import toolchain

pytestmark = pytest.mark.timeout(600)

DEPLOYMENTS: list[dict[str, Any]] = [
    {
        "name": "yaml-a.example.org",
        "namespace": "yaml-a",
        "deviceMode": "direct",
        "await": {"enabled": False},
        "patches": [
            {
                "kind": "DaemonSet",
                "mergePatch": {"metadata": {"labels": {"patched-by": "yaml"}}},
            }
        ],
    },
    {
        "name": "yaml-b.example.org",
        "namespace": "yaml-b",
        "logLevel": 3,
        "labels": {"team": "storage"},
        "await": {"enabled": False},
    },
]
RESOURCES = {"driverA": DEPLOYMENTS[0], "driverB": DEPLOYMENTS[1]}


def program(deployments: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return served_package.yaml_program(
        "pmem-yaml",
        served_package.deployments(deployments),
        outputs={
            "aNamespace": "${driverA.namespace}",
            "aObjectNames": "${driverA.objectNames}",
            "bCaCert": "${driverB.caCert}",
        },
    )


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    return served_package.yaml_cli(
        tmp_path_factory, local_cluster, "yaml-program", program(RESOURCES), "yaml"
    )


def test_a_yaml_program_deploys_checks_repairs_and_removes_the_driver(cli: Cli, crd: None) -> None:
    cli.add_package()
    cli.run("stack", "init", "yaml")

    # ---- a config error fails preview, naming the YAML field, before anything is created.
    good = (cli.cwd / "Pulumi.yaml").read_text()
    bad = yaml.safe_load(good)
    bad["resources"]["driverB"]["properties"]["deviceMode"] = "pmem"
    bad["resources"]["driverB"]["properties"]["patches"] = [{"kind": "DaemonSet"}]
    (cli.cwd / "Pulumi.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    failed = cli.run("preview", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out
    assert "invalid args of PmemCsiDeployment 'driverB' (2 problem(s))" in out, out
    assert 'deviceMode: must be one of lvm, direct (got "pmem")' in out, out
    assert "patches[0]: set exactly one of mergePatch and jsonPatch" in out, out
    assert "pmem-csi:deployments" not in out, out  # named as YAML has it, not as a config key
    assert kubectl(cli, "get", "namespace", "yaml-b") is None
    # The component reads the YAML stack's own config (the engine passes it to the provider's
    # Construct): without enableSecretMutable, generated certificates are refused.
    mutable = yaml.safe_load(good)
    del mutable["config"]
    (cli.cwd / "Pulumi.yaml").write_text(yaml.safe_dump(mutable, sort_keys=False))
    failed = cli.run("preview", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out
    assert "kubernetes:enableSecretMutable: is not set (the provider's default is false)" in out
    assert kubectl(cli, "get", "namespace", "yaml-a") is None
    (cli.cwd / "Pulumi.yaml").write_text(good)

    # ---- up: both drivers, the patch applied.
    cli.run("up", "--yes", "--skip-preview")
    ds = kubectl(cli, "get", "daemonset", "-n", "yaml-a", "yaml-a-example-org-node")
    assert ds is not None and ds["metadata"]["labels"]["patched-by"] == "yaml"
    for dep in DEPLOYMENTS:
        served_package.assert_deployed(cli, dep)
    outputs = cli.outputs()
    assert outputs["aNamespace"] == "yaml-a"
    assert outputs["aObjectNames"]
    assert outputs["bCaCert"].startswith("-----BEGIN CERTIFICATE-----")

    # ---- the same objects as the Python program's, object for object.
    deployed = served_package.state_objects(cli.export())
    expected = served_package.python_program_objects(DEPLOYMENTS)
    served_package.assert_same_objects(deployed, expected)

    # ---- a second up changes nothing.
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")

    # ---- someone deletes a Service; up --refresh notices and restores it.
    svc = kubectl(cli, "get", "service", "-n", "yaml-b", "yaml-b-example-org-controller")
    assert svc is not None
    subprocess.run(
        [str(toolchain.bin_path("kubectl")), "delete", "service", "-n", "yaml-b",
         "yaml-b-example-org-controller"],
        env=cli.env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    repaired = cli.run("up", "--yes", "--skip-preview", "--refresh")
    assert re.search(r"\d+ created", repaired.stdout), repaired.stdout
    restored = kubectl(cli, "get", "service", "-n", "yaml-b", "yaml-b-example-org-controller")
    assert restored is not None and restored["metadata"]["uid"] != svc["metadata"]["uid"]

    # ---- destroy removes the drivers (the namespaces are kept, as in Python).
    cli.run("destroy", "--yes", "--skip-preview")
    for dep in DEPLOYMENTS:
        served_package.assert_removed(cli, dep)
    cli.run("stack", "rm", "--yes", "yaml")

    # The provider ran through the Python host's RunPlugin (the official host's path).
    calls = cli.calls()
    assert "RunPlugin" in calls, calls
