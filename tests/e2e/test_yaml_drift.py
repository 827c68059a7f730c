"""A YAML program's ``pulumi up --refresh`` restores what kubectl changed (issue 19).

The served component (``pmem-csi:index:PmemCsiDeployment`` from ``provider/``, with the real
CLI and YAML host as in ``tests/e2e/served_package.py``) deploys the deployments of
``tests/unit/test_yaml_parity.py``. Then:

- its state (``pulumi stack export``) holds every child with the resource options, hooks and
  secret inputs the Python program registers for the same deployments (under mocks, the
  unit module's records), and no private key in plain text or base64;
- the live objects are changed the ways an administrator does it, each under its own field
  manager: ``kubectl label`` (a declared label changed, the patch's removed, one added) and
  ``kubectl patch`` (the driver image, a sidecar argument added) of the node DaemonSet, a
  server-side apply of another manager (``kubectl apply --server-side --field-manager``: the
  driver's command) and ``kubectl scale`` of the controller StatefulSet, ``kubectl replace``
  (what ``kubectl edit`` sends) of the controller Service's port, and ``kubectl scale`` alone
  of the other deployment's StatefulSet;
- one ``pulumi up --refresh`` from the YAML program restores exactly the declared state, as
  the Python program does (``tests/e2e/test_drift.py``), naming each object taken over, and
  leaves no field to another manager; the next ``pulumi up`` changes nothing.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pmem_components import names
from tests.e2e import served_package
from tests.e2e.served_package import Cli
from tests.e2e.served_package import kubectl as get_json
from tests.unit import test_yaml_parity as parity
from tools import toolchain

pytestmark = pytest.mark.timeout(900)

RESOURCES = {name: dict(parity.DEPLOYMENTS[i]) for i, name in enumerate(parity.FACE_NAMES)}
DEP = parity.DEPLOYMENTS[0]  # driverA: the one changed behind Pulumi's back
NS = DEP["namespace"]
H = names.DeploymentNames(DEP["name"]).hyphened
DS, STS, SVC = f"{H}-node", f"{H}-controller", f"{H}-controller"
# driverB's controller: scaled with kubectl and nothing else.
NS_B = parity.DEPLOYMENTS[1]["namespace"]
STS_B = f"{names.DeploymentNames(parity.DEPLOYMENTS[1]['name']).hyphened}-controller"
KUBERNETES_MANAGERS = {"kube-controller-manager", "kube-apiserver", "kube-scheduler", "kubelet"}
ADDED_LABEL = "drift.example.com/added"
MALFORMED = ["malformed", "options"]


def program() -> dict[str, Any]:
    return served_package.yaml_program("pmem-yaml-drift", served_package.deployments(RESOURCES))


@dataclass
class Deployed:
    cli: Cli
    declared: dict[str, dict[str, Any]]  # DS, STS, Service as the first up left them


def _live(cli: Cli, kind: str, name: str, ns: str = NS) -> dict[str, Any]:
    obj = get_json(cli, "get", kind, "-n", ns, name, "--show-managed-fields")
    assert obj is not None, (kind, name)
    return obj


@pytest.fixture(scope="module")
def deployed(
    pulumi_ready: dict[str, str],
    local_cluster: Path,
    crd: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployed]:
    cli = served_package.yaml_cli(tmp_path_factory, local_cluster, "yaml-drift", program(), "drift")
    cli.add_package()
    cli.run("stack", "init", "drift")
    try:
        cli.run("up", "--yes", "--skip-preview")
        declared = {
            kind: _live(cli, kind, name)
            for kind, name in (("daemonset", DS), ("statefulset", STS), ("service", SVC))
        }
        yield Deployed(cli, declared)
    finally:
        cli.run("destroy", "--yes", "--skip-preview", check=False)
        cli.run("stack", "rm", "--yes", "drift", check=False)


# --------------------------------------------------------------------------- parity


_PROGRAM_RECORDS = """
import json, sys
sys.path.insert(0, "tests/unit")  # the unit modules import their neighbours as pytest has them
from tests.unit import test_yaml_parity as parity
regs = parity.program_registrations(json.loads(sys.argv[1]))
print(json.dumps({"comparable": parity.comparable(regs),
                  "data_keys": {parity.role(r.urn, {}): parity._data_keys(r.inputs)
                                for r in regs if r.type == "kubernetes:core/v1:Secret"}}))
"""


def program_records() -> dict[str, Any]:
    """The unit module's records of the Python program, in a process of its own (Pulumi's
    mocks are process-wide settings)."""
    raw = {"deployments": parity.DEPLOYMENTS, "manageCrd": False}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM_RECORDS, json.dumps(raw)],
        cwd=toolchain.PROJECT_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _state_data_keys(export: dict[str, Any]) -> dict[str, list[str]]:
    """The Secrets' data keys, from an export with ``--show-secrets``."""
    out = {}
    for res in export["deployment"]["resources"]:
        if res["type"] != "kubernetes:core/v1:Secret":
            continue
        # The provider's checked inputs hold the component's stringData as data.
        inputs = res.get("inputs") or {}
        data = inputs.get("data") or inputs.get(parity.SECRET_DATA) or {}
        if data.get(parity.SECRET_SIG[0]) == parity.SECRET_SIG[1]:
            data = json.loads(data["plaintext"])
        out[parity.role(res["urn"], parity.FACE_NAMES)] = sorted(data)
    return out


def test_the_state_holds_the_programs_options_hooks_and_secrets(deployed: Deployed) -> None:
    """Every child of the YAML stack with the options, hooks and secret inputs the Python
    program registers (apart from what ``parity.BY_DESIGN`` names); the Secrets' data with
    the program's keys, secret in the state, and no private key readable anywhere in it."""
    export = deployed.cli.export()
    served = parity.comparable(parity.state_registrations(export), parity.FACE_NAMES)
    records = program_records()
    program_side = records["comparable"]
    for opts in program_side.values():
        opts.pop("deleteBeforeReplace")  # not in the state; compared in the unit test
    # The state records a Secret's secret inputs as the provider checked them: stringData
    # becomes data.
    for key, opts in served.items():
        if key.startswith("kubernetes:core/v1:Secret::"):
            opts["secrets"] = [parity.SECRET_DATA if p == "data" else p for p in opts["secrets"]]
    served, program_side = parity.by_design(served, program_side)
    assert parity._differences(served, program_side) == []
    # Every Kubernetes child deploys through the stack's default provider, as the program's.
    for res in export["deployment"]["resources"]:
        if res.get("custom") and res["type"].startswith("kubernetes:"):
            assert "::pulumi:providers:kubernetes::default" in res["provider"], res["urn"]
    # The Secrets: their data secret in the state, with the program's keys.
    secrets = {k: v for k, v in served.items() if k.startswith("kubernetes:core/v1:Secret::")}
    assert len(secrets) == 4 and all(
        v["secrets"] == [parity.SECRET_DATA] for v in secrets.values()
    )
    shown = deployed.cli.export("--show-secrets")
    assert _state_data_keys(shown) == records["data_keys"]
    # No private key in text or base64 anywhere in the state (inputs, outputs, the
    # certificates resource), while shown (--show-secrets) they are there.
    assert parity.plaintext_private_keys(export) == []
    assert "PRIVATE KEY" in json.dumps(shown)  # the control: shown, the keys are there
    assert "PRIVATE KEY" not in json.dumps(export)


# --------------------------------------------------------------------------- drift


def _kubectl(cli: Cli, *args: str, stdin: str | None = None) -> None:
    done = subprocess.run(
        [str(toolchain.bin_path("kubectl")), *args],
        env=cli.env, input=stdin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"


def _change_everything(cli: Cli, declared: dict[str, dict[str, Any]]) -> None:
    ds_labels = declared["daemonset"]["metadata"]["labels"]
    assert ds_labels["team"] == "storage" and ds_labels["patched-by"] == "yaml"
    _kubectl(cli, "label", "daemonset", "-n", NS, DS, "--overwrite", "team=changed",
             "patched-by-", f"{ADDED_LABEL}=yes")  # fmt: skip
    ops = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image",
         "value": "intel/pmem-csi-driver:drifted"},
        {"op": "add", "path": "/spec/template/spec/containers/1/args/-", "value": "--added"},
    ]  # fmt: skip
    _kubectl(cli, "patch", "daemonset", "-n", NS, DS, "--type=json", "-p", json.dumps(ops))
    applied = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": STS, "namespace": NS},
        "spec": {
            "template": {"spec": {"containers": [{"name": "pmem-driver", "command": MALFORMED}]}}
        },
    }
    _kubectl(cli, "apply", "--server-side", "--field-manager=drift-x", "--force-conflicts",
             "-f", "-", stdin=json.dumps(applied))  # fmt: skip
    _kubectl(cli, "scale", "statefulset", "-n", NS, STS, "--replicas=3")
    _kubectl(cli, "scale", "statefulset", "-n", NS_B, STS_B, "--replicas=2")
    svc = _live(cli, "service", SVC)
    svc["spec"]["ports"][0]["port"] = 1111
    _kubectl(cli, "replace", "-f", "-", stdin=json.dumps(svc))


def _containers(obj: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (c["name"], c.get("image"), c.get("command"), c.get("args"))
        for c in obj["spec"]["template"]["spec"]["containers"]
    ]


def _ports(svc: dict[str, Any]) -> list[dict[str, Any]]:
    ports = copy.deepcopy(svc["spec"]["ports"])
    for port in ports:
        port.pop("nodePort", None)
    return ports


def foreign_managers(live: dict[str, Any]) -> list[str]:
    """Managers of the object itself that are neither Pulumi's nor Kubernetes' own."""
    return [
        e["manager"]
        for e in live["metadata"].get("managedFields") or []
        if not e.get("subresource")
        and not e["manager"].startswith("pulumi-kubernetes")
        and e["manager"] not in KUBERNETES_MANAGERS
    ]


@pytest.fixture(scope="module")
def restored(deployed: Deployed) -> str:
    """The changes, then one ``pulumi up --refresh``: its output."""
    cli = deployed.cli
    _change_everything(cli, deployed.declared)
    # The premise: each object differs and another manager owns fields of it.
    ds, sts = _live(cli, "daemonset", DS), _live(cli, "statefulset", STS)
    svc = _live(cli, "service", SVC)
    assert ds["metadata"]["labels"].get(ADDED_LABEL) == "yes"
    assert _containers(ds) != _containers(deployed.declared["daemonset"])
    assert _containers(sts)[0][2] == MALFORMED and sts["spec"]["replicas"] == 3
    assert svc["spec"]["ports"][0]["port"] == 1111
    assert {"kubectl-label", "kubectl-patch"} <= set(foreign_managers(ds))
    assert "drift-x" in foreign_managers(sts)
    assert "kubectl-replace" in foreign_managers(svc)
    assert _live(cli, "statefulset", STS_B, NS_B)["spec"]["replicas"] == 2
    done = cli.run("up", "--yes", "--skip-preview", "--refresh", check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def test_up_refresh_restores_what_kubectl_changed(deployed: Deployed, restored: str) -> None:
    """Exactly the declared state again, in place, each object named once as taken over,
    and no field left to another manager."""
    cli = deployed.cli
    problems: list[str] = []
    for kind, name in (("daemonset", DS), ("statefulset", STS), ("service", SVC)):
        live, declared = _live(cli, kind, name), deployed.declared[kind]
        key = f"{kind} {NS}/{name}"
        if live["metadata"]["uid"] != declared["metadata"]["uid"]:
            problems.append(f"{key}: re-created")
        if live["metadata"]["labels"] != declared["metadata"]["labels"]:
            problems.append(f"{key}: labels {live['metadata']['labels']}")
        if foreign_managers(live):
            problems.append(f"{key}: still owned by {foreign_managers(live)}")
        if kind == "service":
            if _ports(live) != _ports(declared):
                problems.append(f"{key}: ports {live['spec']['ports']}")
            continue
        if _containers(live) != _containers(declared):
            problems.append(f"{key}: containers {_containers(live)}")
        if live["spec"].get("replicas") != declared["spec"].get("replicas"):
            problems.append(f"{key}: replicas {live['spec'].get('replicas')}")
    assert not problems, "\n".join(problems) + "\n" + restored[-3000:]
    diagnostics = restored.split("Diagnostics:", 1)[-1]
    for kind, name in (("DaemonSet", DS), ("StatefulSet", STS), ("Service", SVC)):
        assert f"took over fields of {kind} {NS}/{name} and applied it" in diagnostics, kind


def test_a_scale_alone_is_restored(deployed: Deployed, restored: str) -> None:
    """``kubectl scale`` writes through the scale subresource, which the take-over leaves
    alone; the forced apply (``pulumi.com/patchForce``) of the update the provider's diff
    finds takes the replica count back."""
    live = _live(deployed.cli, "statefulset", STS_B, NS_B)
    assert live["spec"]["replicas"] == 1, restored[-3000:]


def test_the_next_up_changes_nothing(deployed: Deployed, restored: str) -> None:
    deployed.cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")
