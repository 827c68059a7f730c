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

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pmem_components import names
from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION
from tools import langhost, localenv, toolchain

pytestmark = pytest.mark.timeout(600)

PROVIDER_DIR = toolchain.PROJECT_DIR / "provider"
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
# What the served component does not do itself (the Python program's stack-level settings).
STACK_SETTINGS = {"manageCrd": False}


def program(deployments: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "pmem-yaml",
        "runtime": "yaml",
        # As docs/yaml-and-other-languages.md says a project needs: certificate renewal
        # updates the Secrets in place (the component refuses the default provider without).
        "config": {"kubernetes:enableSecretMutable": {"value": True}},
        "resources": {
            name: {"type": "pmem-csi:index:PmemCsiDeployment", "properties": props}
            for name, props in deployments.items()
        },
        "outputs": {
            "aNamespace": "${driverA.namespace}",
            "aObjectNames": "${driverA.objectNames}",
            "bCaCert": "${driverB.caCert}",
        },
    }


class Cli:
    """The pulumi CLI in the YAML project directory, with a backend of this module's own."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.calls: list[str] = []

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        localenv.forget_served_schema(self.env)
        start = time.monotonic()
        done = subprocess.run(
            [str(toolchain.bin_path("pulumi")), *args, "--non-interactive"],
            cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        # Where the module's time goes, and which RPCs the command made of the Python host
        # (pytest -s, or the output of a failed test).
        log = Path(self.env[langhost.CALL_LOG_ENV])
        calls = log.read_text().split() if log.exists() else []
        new, self.calls = calls[len(self.calls) :], calls
        print(
            f"[yaml] pulumi {' '.join(args)}: {time.monotonic() - start:.1f}s; "
            f"Python host: {', '.join(new) or '-'}",
            flush=True,
        )
        if check:
            assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    if not toolchain.GROUPS["pulumi-yaml"].is_built():
        pytest.fail("tool group pulumi-yaml is not built: run `make tools`")
    project = tmp_path_factory.mktemp("yaml-program")
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(program(RESOURCES), sort_keys=False))
    env = {**os.environ, **localenv.pulumi_env()}
    env["PULUMI_BACKEND_URL"] = tmp_path_factory.mktemp("backend").as_uri()
    env["KUBECONFIG"] = str(local_cluster)
    # This checkout's stand-in Python host, first on PATH (the CLI prefers a plugin found
    # there): the copy next to the CLI is in the tools cache that every checkout shares, and
    # holds whatever version the checkout that last ran installed.
    host_bin = tmp_path_factory.mktemp("language-host")
    toolchain.install_language_host(host_bin)
    env["PATH"] = os.pathsep.join([str(host_bin), env["PATH"]])
    env[langhost.CALL_LOG_ENV] = str(project.parent / "langhost-calls.log")
    return Cli(project, env)


def kubectl(cli: Cli, *args: str) -> dict[str, Any] | None:
    done = subprocess.run(
        [str(toolchain.bin_path("kubectl")), *args, "-o", "json"],
        env=cli.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    return json.loads(done.stdout)


# Under mocks the engine runs no resource transforms, so the script applies the component's
# own (PmemCsiDeployment: the await settings, then the deployment's patches) to each object,
# in that order, as the engine does.
_PYTHON_PROGRAM = """
import json, sys
sys.path.insert(0, "tests/unit")  # bad_input imports its neighbours as pytest has them
import pulumi
from tests.unit.bad_input import run_program
from pmem_components import awaiting, config, names
from pmem_components.patches import PatchSet

raw = json.loads(sys.argv[1])
error, resources = run_program(raw)
stack = config.load_config(raw)
by_instance = {d.names.hyphened: (i, d) for i, d in enumerate(stack.deployments)}
out = []
for r in resources:
    props = dict(r.inputs)
    labels = (props.get("metadata") or {}).get("labels") or {}
    if r.typ.startswith("kubernetes:") and labels.get(names.LABEL_INSTANCE) in by_instance:
        i, dep = by_instance[labels[names.LABEL_INSTANCE]]
        patches = PatchSet.for_deployment(i, dep.patches)
        for transform in (awaiting.transform(dep), patches.transform):
            opts = pulumi.ResourceOptions()
            result = transform(pulumi.ResourceTransformArgs(True, r.typ, r.name, props, opts))
            if result is not None:
                props = dict(result.props)
    out.append({"type": r.typ, "inputs": props})
print(json.dumps({"error": error, "resources": out}, default=str))
"""


def python_program_objects() -> dict[tuple[str, str, str], dict[str, Any]]:
    """The Kubernetes objects the Python program registers for DEPLOYMENTS (under mocks).

    In a process of its own: Pulumi's mocks are process-wide settings.
    """
    raw = {"deployments": DEPLOYMENTS, **STACK_SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", _PYTHON_PROGRAM, json.dumps(raw)],
        cwd=toolchain.PROJECT_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == ""
    return _by_object(result["resources"])


def _by_object(resources: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for res in resources:
        if not res["type"].startswith("kubernetes:"):
            continue
        inputs = res["inputs"]
        meta = inputs.get("metadata") or {}
        key = (inputs["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, key
        out[key] = _comparable(inputs)
    return out


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what depends on the stack's name or on the certificates' values."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: walk(v)
                for k, v in value.items()
                if k not in (names.STACK_ANNOTATION, CERTIFICATES_HASH_ANNOTATION)
            }
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and "-----BEGIN" in value:
            return "<pem>"
        if isinstance(value, float) and value.is_integer():
            return int(value)  # the mocks' numbers are floats, the state's integers
        return value

    out = walk(obj)
    if out["kind"] == "Secret":
        out.pop("data", None)
        out.pop("stringData", None)
    return out


def test_a_yaml_program_deploys_checks_repairs_and_removes_the_driver(cli: Cli, crd: None) -> None:
    added = cli.run("package", "add", str(PROVIDER_DIR))
    assert "pmem-csi" in (cli.cwd / "Pulumi.yaml").read_text(), added.stdout
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
        h = names.DeploymentNames(dep["name"]).hyphened
        assert kubectl(cli, "get", "statefulset", "-n", dep["namespace"], f"{h}-controller")
        cr = kubectl(cli, "get", "deployments.pmem-csi.intel.com", dep["name"])
        assert cr is not None and "PRIVATE KEY" not in json.dumps(cr)
    outputs = json.loads(cli.run("stack", "output", "--json").stdout)
    assert outputs["aNamespace"] == "yaml-a"
    assert outputs["aObjectNames"]
    assert outputs["bCaCert"].startswith("-----BEGIN CERTIFICATE-----")

    # ---- the same objects as the Python program's, object for object.
    state = json.loads(cli.run("stack", "export").stdout)
    custom = [r for r in state["deployment"]["resources"] if r.get("custom")]
    deployed = _by_object([{"type": r["type"], "inputs": r.get("inputs", {})} for r in custom])
    expected = python_program_objects()
    assert sorted(deployed) == sorted(expected)
    for key, obj in expected.items():
        assert deployed[key] == obj, key

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
        assert kubectl(cli, "get", "deployments.pmem-csi.intel.com", dep["name"]) is None
        h = names.DeploymentNames(dep["name"]).hyphened
        assert kubectl(cli, "get", "statefulset", "-n", dep["namespace"], f"{h}-controller") is None
    cli.run("stack", "rm", "--yes", "yaml")

    # The provider ran through the Python host's RunPlugin (the official host's path).
    calls = Path(cli.env[langhost.CALL_LOG_ENV]).read_text().split()
    assert "RunPlugin" in calls, calls
