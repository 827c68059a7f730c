"""The CRD and the status reporter from a YAML program, with the real CLI and YAML host (issue 19).

A YAML program installs the CRD (``pmem-csi:index:PmemCsiCrd``), two
``PmemCsiDeployment`` resources that depend on it, and one ``pmem-csi:index:PmemCsiReporter``
serving both (named by name and namespace, depending on both). The set-up is
``tests/e2e/served_package.py``'s: ``pulumi package add <checkout>/provider``, the stand-in
Python host first on ``PATH``, a backend of this module's own. One lifecycle:

- a reporter naming a deployment it cannot serve fails ``preview``, naming the YAML field;
- ``up``; every Kubernetes object is compared with what the Python program
  (``pmem_components.program`` under Pulumi mocks) registers for the same deployments with
  ``manageCrd: true`` and the reporter enabled, object for object -- the CR's
  ``spec.reporter`` apart, which records the deployment's own (refused) reporter settings;
- the reporter Deployment, its ServiceAccount and RBAC exist in the cluster; kwok runs no
  container, so the reporter is run as a process with the Deployment's own arguments and a
  token of its ServiceAccount (so the API server enforces exactly its RBAC), and both CRs'
  status reaches ``Running``;
- a second ``up`` changes nothing; ``destroy`` removes drivers and reporter and keeps the CRD
  (``retain`` unset: true); a program with ``retain: false`` then deletes it on ``destroy``
  (the module puts the CRD back for the modules after it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from pmem_components import names
from reporter.kubeapi import RawApi
from tests.e2e import served_package
from tests.e2e.reporter_helpers import (
    REPORTER_IMAGE,
    ReporterProcess,
    ensure_crd,
    token_kubeconfig,
)
from tests.e2e.served_package import Cli, kubectl
from tests.e2e.waiting import wait_for
from tools import toolchain

pytestmark = pytest.mark.timeout(900)

STATUS_TIMEOUT = 120.0
DEPLOYMENTS: list[dict[str, Any]] = [
    {
        "name": "served-a.example.org",
        "namespace": "served-a",
        "labels": {"team": "storage"},
        "await": {"enabled": False},
    },
    {
        "name": "served-b.example.org",
        "namespace": "served-b",
        "deviceMode": "direct",
        "await": {"enabled": False},
    },
]
# What the reporter and the deployments' take-over leave to another manager (the Python
# program's pmem-csi:allowedFieldOwners): given to both, as docs/yaml-and-other-languages.md says.
ALLOWED = [
    {"manager": "team-labeller", "paths": ["metadata.labels.owner-team"], "reason": "ours"}
]
REPORTER: dict[str, Any] = {
    "deployments": [{"name": d["name"], "namespace": d["namespace"]} for d in DEPLOYMENTS],
    "image": REPORTER_IMAGE,
    # As the Python program's reporter takes them from its first deployment.
    "labels": {"team": "storage"},
    "await": {"enabled": False},
    "allowedFieldOwners": ALLOWED,
}
# The Python program's stack-level settings the YAML program matches: the CRD installed by
# the stack, no field take-over (the served reporter does none; the YAML deployments turn
# theirs off, a component field of the served args, so that the two programs' objects compare
# equal).
STACK_SETTINGS = {"manageCrd": True, "takeOverFields": False, "allowedFieldOwners": ALLOWED}


def _copy(value: Any) -> Any:
    """A copy of its own: one object in two places of Pulumi.yaml would be dumped as a YAML
    anchor and alias, which the YAML host refuses."""
    return json.loads(json.dumps(value))


def program(*, retain: bool | None = None, with_drivers: bool = True) -> dict[str, Any]:
    crd: dict[str, Any] = {"type": "pmem-csi:index:PmemCsiCrd"}
    if retain is not None:
        crd["properties"] = {"retain": retain}
    resources: dict[str, Any] = {"crd": crd}
    outputs: dict[str, Any] = {"crdName": "${crd.crdName}"}
    if with_drivers:
        for key, props in zip(("driverA", "driverB"), DEPLOYMENTS, strict=True):
            resources[key] = {
                "type": served_package.DEPLOYMENT_TYPE,
                "properties": {
                    **props,
                    "takeOverFields": False,
                    "allowedFieldOwners": _copy(ALLOWED),
                },
                "options": {"dependsOn": ["${crd}"]},
            }
        resources["reporter"] = {
            "type": "pmem-csi:index:PmemCsiReporter",
            "properties": _copy(REPORTER),
            "options": {"dependsOn": ["${driverA}", "${driverB}"]},
        }
        outputs["reporterName"] = "${reporter.deploymentName}"
        outputs["reporterNamespace"] = "${reporter.namespace}"
    return served_package.yaml_program("pmem-yaml-served", resources, outputs)


@pytest.fixture(scope="module")
def cli(
    pulumi_ready: dict[str, str], local_cluster: Path, tmp_path_factory: pytest.TempPathFactory
) -> Cli:
    return served_package.yaml_cli(
        tmp_path_factory, local_cluster, "yaml-served", program(), "yaml served"
    )


@pytest.fixture(scope="module")
def cleanup(cli: Cli, api_client: Any) -> Iterator[None]:
    """After the module: the stack destroyed if a failure left it, and the shared CRD, which
    the module ends by deleting (``retain: false``), put back once no deletion of it is under
    way, for the modules that run after it on this cluster."""
    yield
    cli.run("destroy", "--yes", "--skip-preview", check=False)
    ext = client.ApiextensionsV1Api(api_client)

    def settled() -> bool:
        try:
            obj = ext.read_custom_resource_definition(names.CRD_NAME)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return obj.metadata.deletion_timestamp is None

    wait_for(settled, 120, "the CRD present, or its deletion done")
    ensure_crd(RawApi(api_client))


def python_program_objects() -> dict[tuple[str, str, str], dict[str, Any]]:
    """The Kubernetes objects the Python program registers for DEPLOYMENTS with the reporter
    enabled (under mocks)."""
    with_reporter = [{**d, "reporter": {"image": REPORTER_IMAGE}} for d in DEPLOYMENTS]
    return served_package.python_program_objects(with_reporter, STACK_SETTINGS)


def _without_reporter_record(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the CR's ``spec.reporter`` and what follows from it: the digest of
    the CR spec on the workloads (``names.SPEC_DIGEST_ANNOTATION``, checked on its own)."""
    if obj["apiVersion"].startswith(f"{names.CRD_GROUP}/"):
        return {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "reporter"}}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if names.SPEC_DIGEST_ANNOTATION not in annotations:
        return obj
    kept = {k: v for k, v in annotations.items() if k != names.SPEC_DIGEST_ANNOTATION}
    return {**obj, "metadata": {**obj["metadata"], "annotations": kept}}


def _cr_running(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    obj = custom.get_cluster_custom_object("pmem-csi.intel.com", "v1beta1", "deployments", name)
    status = obj.get("status") or {}
    fresh = status.get("observedGeneration") == obj["metadata"]["generation"]
    return status if fresh and status.get("phase") == "Running" else {}


def _run_reporter_as_its_pod(
    cli: Cli, api_client: Any, local_cluster: Path, tmp_path: Path, dep: dict[str, Any]
) -> None:
    """The reporter as its pod would run: the Deployment's arguments, its ServiceAccount's
    token, a local port and a short resync; both CRs' status then reaches Running."""
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = list(container["args"])
    namespace, sa = (
        dep["metadata"]["namespace"],
        dep["spec"]["template"]["spec"]["serviceAccountName"],
    )
    kubeconfig = token_kubeconfig(api_client, local_cluster, sa, namespace, tmp_path / "kubeconfig")
    i = args.index("--metrics-port")
    del args[i : i + 2]
    first = DEPLOYMENTS[0]["name"]
    proc = ReporterProcess(
        kubeconfig,
        first,
        namespace,
        "served-0",
        tmp_path / "reporter.log",
        resync_seconds=2.0,
        extra_args=tuple(x for x in args if x not in ("--namespace", namespace)),
        extra_env={e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
    )
    try:
        custom = client.CustomObjectsApi(api_client)
        for d in DEPLOYMENTS:
            wait_for(
                lambda d=d: _cr_running(custom, d["name"]),
                STATUS_TIMEOUT,
                f"{d['name']}: Running, written by the served reporter",
            )
        assert "403" not in proc.log(), proc.log()[-3000:]
        _allowed_owners_are_no_drift(cli, custom)
    finally:
        proc.stop()


def _allowed_owners_are_no_drift(cli: Cli, custom: Any) -> None:
    """The reporter judges drift by the allowedFieldOwners it was given (review of merge19:
    the served reporter had none): a label the allowed manager set on the DaemonSet is not
    named, a label kubectl set on a Service afterwards is."""
    d = DEPLOYMENTS[0]
    h, ns = names.DeploymentNames(d["name"]), d["namespace"]
    for kind, name, manager in (
        ("daemonset", f"{h.hyphened}-node", "team-labeller"),
        ("service", h.metrics_service, "kubectl-label"),
    ):
        label = "owner-team=storage" if manager == "team-labeller" else "drift=yes"
        done = subprocess.run(
            [str(toolchain.bin_path("kubectl")), "label", kind, name, "-n", ns, label,
             f"--field-manager={manager}"],
            env=cli.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def modified() -> dict[str, Any]:
        obj = custom.get_cluster_custom_object(
            "pmem-csi.intel.com", "v1beta1", "deployments", d["name"]
        )
        (cond,) = [
            c for c in (obj.get("status") or {}).get("conditions", [])
            if c["type"] == "DriverDeployed"
        ]  # fmt: skip
        return cond if cond["status"] == "False" else {}

    cond = wait_for(modified, STATUS_TIMEOUT, "DriverDeployed False for the Service's label")
    assert f"Service/{h.metrics_service}" in cond["message"], cond
    assert "DaemonSet/" not in cond["message"], cond


def test_a_yaml_program_installs_the_crd_and_one_reporter_for_two_deployments(
    cli: Cli, api_client: Any, local_cluster: Path, tmp_path: Path, cleanup: None
) -> None:
    cli.add_package()
    cli.run("stack", "init", "served")
    good = program()

    # ---- a reporter naming a deployment it cannot serve fails preview, by the YAML field.
    bad = json.loads(json.dumps(good))
    bad["resources"]["reporter"]["properties"]["deployments"][1]["namespace"] = "kube-system"
    cli.write(bad)
    failed = cli.run("preview", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out
    assert "invalid args of PmemCsiReporter 'reporter' (1 problem(s))" in out, out
    assert 'deployments[1].namespace: "kube-system" belongs to Kubernetes itself' in out, out
    assert "pmem-csi:deployments" not in out, out
    cli.write(good)

    # ---- up: the CRD, both drivers, one reporter serving both.
    cli.run("up", "--yes", "--skip-preview")
    outputs = cli.outputs()
    first = names.DeploymentNames(DEPLOYMENTS[0]["name"])
    assert outputs == {
        "crdName": names.CRD_NAME,
        "reporterName": first.reporter,
        "reporterNamespace": DEPLOYMENTS[0]["namespace"],
    }

    # ---- the same objects as the Python program's, object for object.
    state = cli.export()
    deployed = served_package.state_objects(state)
    served_package.assert_same_objects(
        deployed, python_program_objects(), normalize=_without_reporter_record
    )
    # The CRs record the deployments' own reporter settings: none (a PmemCsiReporter serves).
    # Their workloads carry the digest of that spec, as the reporter compares it.
    for d in DEPLOYMENTS:
        cr = deployed[(names.CRD_KIND, "", d["name"])]
        assert cr["spec"]["reporter"] == {"enabled": False, "replicas": 2, "logLevel": 3}
        h = names.DeploymentNames(d["name"]).hyphened
        for kind, suffix in (("StatefulSet", "controller"), ("DaemonSet", "node")):
            workload = deployed[(kind, d["namespace"], f"{h}-{suffix}")]
            digest = workload["metadata"]["annotations"][names.SPEC_DIGEST_ANNOTATION]
            assert digest == names.spec_digest(cr["spec"]), (kind, d["name"])
    (crd_state,) = [
        r
        for r in state["deployment"]["resources"]
        if r.get("custom") and r["type"].endswith(":CustomResourceDefinition")
    ]
    assert crd_state.get("retainOnDelete") is True
    # dependsOn as written: the deployments after the CRD, the reporter after both.
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in state["deployment"]["resources"]:
        by_type.setdefault(r["type"].rsplit(":", 1)[-1], []).append(r)
    (crd_component,) = by_type["PmemCsiCrd"]
    drivers = by_type["PmemCsiDeployment"]
    (reporter,) = by_type["PmemCsiReporter"]
    assert len(drivers) == 2
    assert all(crd_component["urn"] in d.get("dependencies", []) for d in drivers)
    assert {d["urn"] for d in drivers} <= set(reporter.get("dependencies", []))

    # ---- in the cluster: the reporter Deployment, its ServiceAccount and its grants.
    ns_a = DEPLOYMENTS[0]["namespace"]
    dep = kubectl(cli, "get", "deployment", "-n", ns_a, first.reporter)
    assert dep is not None
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, x in enumerate(args) if x == "--deployment"] == [
        d["name"] for d in DEPLOYMENTS
    ]
    assert kubectl(cli, "get", "serviceaccount", "-n", ns_a, first.reporter)
    role = kubectl(cli, "get", "clusterrole", f"{first.reporter}-stack")
    assert role is not None
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert all(sorted(r["resourceNames"]) == sorted(d["name"] for d in DEPLOYMENTS) for r in named)
    for d in DEPLOYMENTS:
        assert kubectl(cli, "get", "role", "-n", d["namespace"], f"{first.reporter}-stack")
    _run_reporter_as_its_pod(cli, api_client, local_cluster, tmp_path, dep)

    # ---- a second up changes nothing.
    cli.run("up", "--yes", "--skip-preview", "--expect-no-changes")

    # ---- destroy: drivers and reporter gone, the CRD kept (retain unset: true).
    cli.run("destroy", "--yes", "--skip-preview")
    assert kubectl(cli, "get", "deployment", "-n", ns_a, first.reporter) is None
    assert kubectl(cli, "get", "clusterrole", f"{first.reporter}-stack") is None
    for d in DEPLOYMENTS:
        assert kubectl(cli, "get", "deployments.pmem-csi.intel.com", d["name"]) is None
    assert kubectl(cli, "get", "crd", names.CRD_NAME) is not None

    # ---- retain: false: the CRD goes with destroy.
    cli.write(program(retain=False, with_drivers=False))
    cli.run("up", "--yes", "--skip-preview")
    state = cli.export()
    (crd_state,) = [
        r
        for r in state["deployment"]["resources"]
        if r["type"].endswith(":CustomResourceDefinition")
    ]
    assert not crd_state.get("retainOnDelete")
    cli.run("destroy", "--yes", "--skip-preview")

    def crd_gone() -> bool:
        return kubectl(cli, "get", "crd", names.CRD_NAME) is None

    wait_for(crd_gone, 120, "the CRD deleted by destroy (retain: false)")
    cli.run("stack", "rm", "--yes", "served")
    calls = cli.calls()
    assert "RunPlugin" in calls, calls
