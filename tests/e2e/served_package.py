"""The set-up the e2e modules share that drive the served component package with the real CLI.

``pulumi package add <checkout>/provider`` adds the package by path, as a user of another
language does; the CLI starts the provider through the Python language host's ``RunPlugin``
(the stand-in, tools/langhost.py) and the program through the language's host. Used by
``test_yaml_package.py``, ``test_yaml_crd_reporter.py``, ``test_yaml_shared_namespace.py``,
``test_yaml_drift.py``, ``test_yaml_rename.py`` and ``test_typescript_package.py``:

- :class:`Cli`: the pulumi CLI in one project directory, with a backend and a call log of the
  module's own; :func:`yaml_cli` makes one for a YAML program, :func:`module_env` the part of
  the environment any language needs;
- :func:`yaml_program` and :func:`deployments`: a Pulumi.yaml with the config the component
  needs; :func:`kubectl`: one object from the cluster, or None; :func:`assert_deployed` and
  :func:`assert_removed`: a deployment's controller and CR there, or gone;
- the comparison with the Python program: :func:`python_program_objects` (what
  ``pmem_components.program`` registers under Pulumi mocks), :func:`state_objects` (what a
  stack export holds), :func:`assert_same_objects`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pmem_components import names
from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION
from tools import langhost, localenv, toolchain

PROVIDER_DIR = toolchain.PROJECT_DIR / "provider"
PACKAGE = "pmem-csi"
DEPLOYMENT_TYPE = "pmem-csi:index:PmemCsiDeployment"
# As docs/yaml-and-other-languages.md says a project needs: certificate renewal updates the
# Secrets in place (the component refuses the default provider without).
SECRET_MUTABLE = {"kubernetes:enableSecretMutable": {"value": True}}

# The Python program's stack-level settings a served PmemCsiDeployment matches: what the
# component does not do itself (it installs no CRD; field take-over is on in both by default).
STACK_SETTINGS: dict[str, Any] = {"manageCrd": False}

ObjectKey = tuple[str, str, str]  # (kind, namespace or "", name)


class Cli:
    """The pulumi CLI in one project directory, with the environment of its module.

    Every run starts without the CLI's cached schema of the served package (see
    ``localenv.forget_served_schema``) and prints its time and the RPCs the stand-in hosts
    were asked meanwhile (pytest -s, or the output of a failed test): where a module's time
    goes, and which host did what.
    """

    def __init__(self, cwd: Path, env: dict[str, str], label: str, *, timeout: int = 400) -> None:
        self.cwd, self.env, self.label, self.timeout = cwd, env, label, timeout
        self.seen = 0  # call log lines already printed
        self.added: subprocess.CompletedProcess[str] | None = None  # the last `package add`

    def at(self, cwd: Path, **env: str) -> Cli:
        """The CLI of another project directory, with this one's environment and ``env``."""
        other = Cli(cwd, {**self.env, **env}, self.label, timeout=self.timeout)
        other.seen = len(self.calls())
        return other

    def calls(self) -> list[str]:
        """The call log so far: one RPC name a line (``nodejs:<RPC>`` for the Node.js host)."""
        log = Path(self.env[langhost.CALL_LOG_ENV])
        return log.read_text().split() if log.exists() else []

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``pulumi <args> --non-interactive``; with ``check``, a failure fails the test."""
        localenv.forget_served_schema(self.env)
        start = time.monotonic()
        done = subprocess.run(
            [str(toolchain.bin_path("pulumi")), *args, "--non-interactive"],
            cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=self.timeout,
        )  # fmt: skip
        calls = self.calls()
        new, self.seen = calls[self.seen :], len(calls)
        print(
            f"[{self.label}] pulumi {' '.join(args)}: {time.monotonic() - start:.1f}s; "
            f"host calls: {', '.join(new) or '-'}",
            flush=True,
        )
        if check:
            assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    def add_package(self, provider: Path = PROVIDER_DIR) -> subprocess.CompletedProcess[str]:
        """``pulumi package add <provider>``, recorded in Pulumi.yaml (kept in ``added``)."""
        self.added = self.run("package", "add", str(provider))
        assert PACKAGE in (self.cwd / "Pulumi.yaml").read_text(), self.added.stdout
        return self.added

    def write(self, project: dict[str, Any]) -> None:
        """Pulumi.yaml as ``project``, with the package ``pulumi package add`` recorded."""
        path = self.cwd / "Pulumi.yaml"
        packages = (
            (yaml.safe_load(path.read_text()) or {}).get("packages") if path.exists() else None
        )
        body = {**project, **({"packages": packages} if packages else {})}
        path.write_text(yaml.safe_dump(body, sort_keys=False))

    def outputs(self) -> dict[str, Any]:
        """The current stack's outputs (``pulumi stack output --json``), parsed."""
        return json.loads(self.run("stack", "output", "--json").stdout)

    def export(self, *flags: str) -> dict[str, Any]:
        """``pulumi stack export`` of the current stack, parsed."""
        return json.loads(self.run("stack", "export", *flags).stdout)


def require_tools(group: str) -> None:
    """Fail (not skip) without a tool group: these modules are the only e2e check of it."""
    if not toolchain.GROUPS[group].is_built():
        pytest.fail(f"tool group {group} is not built: run `make tools`")


def module_env(
    base: Mapping[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """``base`` with a backend and a call log of the module's own, and the local cluster.

    The call log is the module's own so that what a test asserts of it (``RunPlugin``, the
    Node.js host's ``Run`` count) was asked by this module's CLI runs, not by an earlier one's.
    """
    env = dict(base)
    env["PULUMI_BACKEND_URL"] = tmp_path_factory.mktemp("backend").as_uri()
    env["KUBECONFIG"] = str(local_cluster)
    env[langhost.CALL_LOG_ENV] = str(tmp_path_factory.mktemp("langhost-calls") / "calls.log")
    return env


def yaml_cli(
    tmp_path_factory: pytest.TempPathFactory,
    local_cluster: Path,
    directory: str,
    project: dict[str, Any],
    label: str,
) -> Cli:
    """A fresh YAML project directory holding ``project`` and the CLI of it.

    This checkout's stand-in Python host comes first on PATH (the CLI prefers a plugin found
    there): the copy next to the CLI is in the tools cache that every checkout shares, and
    holds whatever version the checkout that last ran installed.
    """
    require_tools("pulumi-yaml")
    cwd = tmp_path_factory.mktemp(directory)
    (cwd / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    env = {**os.environ, **localenv.pulumi_env()}
    host_bin = tmp_path_factory.mktemp("language-host")
    toolchain.install_language_host(host_bin)
    env["PATH"] = os.pathsep.join([str(host_bin), env["PATH"]])
    return Cli(cwd, module_env(env, local_cluster, tmp_path_factory), label)


def yaml_program(
    name: str, resources: dict[str, Any], outputs: dict[str, str] | None = None
) -> dict[str, Any]:
    """A YAML project ``name`` (Pulumi.yaml) of ``resources``, with the config it needs."""
    body: dict[str, Any] = {
        "name": name,
        "runtime": "yaml",
        "config": json.loads(json.dumps(SECRET_MUTABLE)),
        "resources": resources,
    }
    if outputs:
        body["outputs"] = outputs
    return body


def deployments(props: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """YAML resources: a ``PmemCsiDeployment`` of ``props[key]`` under each key."""
    return {key: {"type": DEPLOYMENT_TYPE, "properties": p} for key, p in props.items()}


def kubectl(cli: Cli, *args: str) -> dict[str, Any] | None:
    """``kubectl <args> -o json`` with the CLI's kubeconfig: the object, or None if NotFound."""
    done = subprocess.run(
        [str(toolchain.bin_path("kubectl")), *args, "-o", "json"],
        env=cli.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    return json.loads(done.stdout)


def controller(dep: dict[str, Any]) -> tuple[str, ...]:
    """kubectl's words for the controller StatefulSet of deployment ``dep``."""
    hyphened = names.DeploymentNames(dep["name"]).hyphened
    return ("statefulset", "-n", dep["namespace"], f"{hyphened}-controller")


def cr(dep: dict[str, Any]) -> tuple[str, ...]:
    """kubectl's words for the Deployment CR of deployment ``dep``."""
    return ("deployments.pmem-csi.intel.com", dep["name"])


def assert_deployed(cli: Cli, dep: dict[str, Any]) -> None:
    """``dep``'s controller and CR are in the cluster, and the CR holds no private key."""
    assert kubectl(cli, "get", *controller(dep))
    found = kubectl(cli, "get", *cr(dep))
    assert found is not None and "PRIVATE KEY" not in json.dumps(found)


def assert_removed(cli: Cli, dep: dict[str, Any]) -> None:
    """``dep``'s CR and controller are gone from the cluster."""
    assert kubectl(cli, "get", *cr(dep)) is None
    assert kubectl(cli, "get", *controller(dep)) is None


# --------------------------------------------------------------------------- the Python program

# Under mocks the engine runs no resource transforms, so the script applies the component's
# own (PmemCsiDeployment: the await settings, then the deployment's patches) to each object
# of a deployment, in that order, as the engine does (a reporter's objects included: they are
# the first deployment's children).
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


def python_program_objects(
    deployments: list[dict[str, Any]], settings: Mapping[str, Any] = STACK_SETTINGS
) -> dict[ObjectKey, dict[str, Any]]:
    """The Kubernetes objects the Python program registers for ``deployments`` with the
    stack-level ``settings`` (under mocks), comparable; in a process of its own: Pulumi's mocks
    are process-wide settings."""
    raw = {"deployments": deployments, **settings}
    done = subprocess.run(
        [sys.executable, "-c", _PYTHON_PROGRAM, json.dumps(raw)],
        cwd=toolchain.PROJECT_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == ""
    return _by_object(result["resources"])


def state_objects(state: dict[str, Any]) -> dict[ObjectKey, dict[str, Any]]:
    """The Kubernetes objects of a stack export (``Cli.export``), comparable."""
    custom = [r for r in state["deployment"]["resources"] if r.get("custom")]
    return _by_object([{"type": r["type"], "inputs": r.get("inputs", {})} for r in custom])


def assert_same_objects(
    deployed: dict[ObjectKey, dict[str, Any]],
    expected: dict[ObjectKey, dict[str, Any]],
    normalize: Callable[[dict[str, Any]], dict[str, Any]] = lambda obj: obj,
) -> None:
    """The same objects, object for object (a failure names the first that differs)."""
    assert sorted(deployed) == sorted(expected)
    for key, obj in expected.items():
        assert normalize(deployed[key]) == normalize(obj), key


def _by_object(resources: list[dict[str, Any]]) -> dict[ObjectKey, dict[str, Any]]:
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

    out: dict[str, Any] = walk(obj)
    if out["kind"] == "Secret":
        out.pop("data", None)
        out.pop("stringData", None)
    return out
