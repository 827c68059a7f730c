"""The component provider used from a TypeScript program, with the real CLI (issue 19).

A fresh directory holds the TypeScript project of ``tools/nodejs/`` (``package.json`` with
exact versions, the lock file pinning every npm package, ``tsconfig.json``) and a
``Pulumi.yaml`` with ``runtime: nodejs``. ``pulumi package add <checkout>/provider`` adds the
package by path, as docs/yaml-and-other-languages.md tells a TypeScript user: the CLI runs the
provider through the Python host's ``RunPlugin`` for the schema and has the Node.js host
(the stand-in, tools/langhost_nodejs.py) generate the SDK into ``sdks/pmem-csi``, link it into
``package.json`` and ``npm install`` it (the SDK's postinstall compiles it).

Then: the TypeScript example of the doc, taken from the doc itself, type-checks against that
SDK with ``tsc --noEmit`` (and a wrong field name in it does not); and a TypeScript program
deploys one driver with a patch on the local cluster (``up``), a second ``up`` changes nothing,
``destroy`` removes it. What it deployed is compared object for object with what the Python
program registers for the same deployment (tests/e2e/served_package.py's comparison, as
tests/e2e/test_yaml_package.py makes it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pmem_components import names
from tests.e2e import readme, served_package
from tests.e2e.served_package import kubectl
from tools import langhost_nodejs, nodejs_project

pytestmark = pytest.mark.timeout(900)

NODEJS = langhost_nodejs.CALL_LOG_PREFIX  # the Node.js host's lines in the shared call log
TYPESCRIPT_HEADING = "## From TypeScript"  # of docs/yaml-and-other-languages.md
DEPLOYMENT: dict[str, Any] = {
    "name": "ts-a.example.org",
    "namespace": "ts-a",
    "deviceMode": "direct",
    "await": {"enabled": False},
    "patches": [
        {"kind": "DaemonSet", "mergePatch": {"metadata": {"labels": {"patched-by": "typescript"}}}}
    ],
}
PULUMI_YAML = (
    "name: pmem-ts\nruntime: nodejs\nconfig:\n  kubernetes:enableSecretMutable:\n    value: true\n"
)


def doc_typescript_example() -> str:
    """The one ```typescript block of the "From TypeScript" section, as the doc has it."""
    text = readme.doc_of(TYPESCRIPT_HEADING).read_text()
    section = text.split(f"\n{TYPESCRIPT_HEADING}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```typescript\n(.*?)^```", section, flags=re.M | re.S)
    assert len(blocks) == 1, f"{TYPESCRIPT_HEADING}: {len(blocks)} typescript blocks, not 1"
    return blocks[0]


def program(deployment: dict[str, Any]) -> str:
    """A TypeScript program of one PmemCsiDeployment (JSON is a TypeScript object literal)."""
    return (
        'import * as pmemCsi from "@pulumi/pmem-csi";\n\n'
        f'const driver = new pmemCsi.PmemCsiDeployment("driverA", {json.dumps(deployment)});\n\n'
        "export const aNamespace = driver.namespace;\n"
        "export const aObjectNames = driver.objectNames;\n"
        "export const aCaCert = driver.caCert;\n"
    )


class Cli(served_package.Cli):
    """The pulumi CLI in the TypeScript project directory, and the project's ``tsc``."""

    def tsc(self, source: str) -> subprocess.CompletedProcess[str]:
        """``tsc --noEmit`` of the project with ``source`` as its index.ts."""
        (self.cwd / "index.ts").write_text(source)
        return subprocess.run(
            [str(self.cwd / "node_modules" / ".bin" / "tsc"), "--noEmit", "--pretty", "false",
             "-p", "."],
            cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    """The project after ``pulumi package add <checkout>/provider`` (SDK generated, installed)."""
    served_package.require_tools("pulumi-nodejs")
    project = nodejs_project.new_project(tmp_path_factory.mktemp("ts-program"))
    (project / "Pulumi.yaml").write_text(PULUMI_YAML)
    bin_dir = nodejs_project.install_hosts(tmp_path_factory.mktemp("language-hosts"))
    env = nodejs_project.cli_env(os.environ, bin_dir)
    made = Cli(
        project,
        served_package.module_env(env, local_cluster, tmp_path_factory),
        "typescript",
        timeout=600,
    )
    made.add_package(nodejs_project.PROVIDER_DIR)
    return made


def test_package_add_generates_links_and_installs_the_typescript_sdk(cli: Cli) -> None:
    assert cli.added is not None
    out = cli.added.stdout + cli.added.stderr
    assert 'import * as pmemCsi from "@pulumi/pmem-csi";' in out, out
    manifest = json.loads((cli.cwd / "package.json").read_text())
    assert manifest["dependencies"][nodejs_project.SDK_PACKAGE] == f"file:{nodejs_project.SDK_DIR}"
    sdk = json.loads((cli.cwd / nodejs_project.SDK_DIR / "package.json").read_text())
    assert sdk["name"] == nodejs_project.SDK_PACKAGE
    # The SDK's postinstall compiled it where `import ... from "@pulumi/pmem-csi"` finds it.
    installed = cli.cwd / "node_modules" / "@pulumi" / "pmem-csi"
    assert (installed / "bin" / "index.d.ts").is_file()
    # npm installed what the committed lock file pins, and left it as it was.
    lock = (nodejs_project.TEMPLATE_DIR / nodejs_project.LOCK_FILE).read_text()
    assert (cli.cwd / nodejs_project.LOCK_FILE).read_text() == lock, (
        "npm changed the lock file: write it again with `python -m tools.nodejs_project lock`"
    )
    pulumi_sdk = json.loads((cli.cwd / "node_modules/@pulumi/pulumi/package.json").read_text())
    assert pulumi_sdk["version"] == manifest["dependencies"]["@pulumi/pulumi"]
    calls = cli.calls()
    for call in ("GeneratePackage", "Link", "InstallDependencies"):
        assert NODEJS + call in calls, calls
    assert "RunPlugin" in calls, calls  # the provider, through the Python host, for the schema


def test_the_documented_typescript_example_type_checks_against_the_generated_sdk(
    cli: Cli,
) -> None:
    done = cli.tsc(doc_typescript_example())
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("written", "wrong"),
    [("deviceMode:", "deviceMod:"), ("timeout:", "timeOut:")],
    ids=["argument", "nested-field"],
)
def test_a_wrong_field_name_in_the_example_fails_the_type_check(
    cli: Cli, written: str, wrong: str
) -> None:
    example = doc_typescript_example()
    assert example.count(written) == 1, example
    done = cli.tsc(example.replace(written, wrong))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    field = wrong.rstrip(":")
    assert f"'{field}' does not exist in type" in out, out


def test_a_typescript_program_deploys_and_removes_the_driver(cli: Cli, crd: None) -> None:
    (cli.cwd / "index.ts").write_text(program(DEPLOYMENT))
    cli.run("stack", "init", "ts")

    # ---- up: the driver, the patch applied, the outputs.
    cli.run("up", "--yes", "--skip-preview")
    hyphened = names.DeploymentNames(DEPLOYMENT["name"]).hyphened
    ds = kubectl(cli, "get", "daemonset", "-n", "ts-a", f"{hyphened}-node")
    assert ds is not None and ds["metadata"]["labels"]["patched-by"] == "typescript"
    served_package.assert_deployed(cli, DEPLOYMENT)
    outputs = cli.outputs()
    assert outputs["aNamespace"] == "ts-a"
    assert outputs["aObjectNames"]
    assert outputs["aCaCert"].startswith("-----BEGIN CERTIFICATE-----")

    # ---- the same objects as the Python program's, object for object.
    deployed = served_package.state_objects(cli.export())
    expected = served_package.python_program_objects([DEPLOYMENT])
    served_package.assert_same_objects(deployed, expected)

    # ---- a second up changes nothing.
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")

    # ---- destroy removes the driver (the namespace is kept, as in Python).
    cli.run("destroy", "--yes", "--skip-preview")
    served_package.assert_removed(cli, DEPLOYMENT)
    cli.run("stack", "rm", "--yes", "ts")

    # The program ran through the Node.js host's Run, the provider through the Python host.
    calls = cli.calls()
    assert calls.count(NODEJS + "Run") == 2, calls  # the two ups (destroy runs no program)
    assert "RunPlugin" in calls, calls
