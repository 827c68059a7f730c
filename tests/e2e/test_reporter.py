"""The status reporter on the local cluster, under its own ServiceAccount's credentials.

Each test deploys its own driver (unique CR name and namespace) from the pure builders, runs
``python -m reporter`` as a subprocess with a TokenRequest token of the reporter's
ServiceAccount (so the least-privilege RBAC we ship is what the API server enforces), changes
something, and polls the CR until the status says what the issue promises. Every object is
deleted afterwards. See ``reporter_helpers`` for why the objects are not deployed with Pulumi;
the one test whose recovery is ``pulumi up --refresh`` (objects changed by other field managers,
taken back) deploys a stack with the real engine instead (``stack_driver``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pulumi import automation as auto

from pmem_components import certs as certs_mod
from pmem_components.certs import DriverCertificates
from pmem_components.names import CLUSTER_EVENT_NAMESPACE
from reporter.kubeapi import RawApi, Resource
from reporter.leader import LEASE
from reporter.observe import POD
from tests.e2e.reporter_helpers import (
    AS_PULUMI,
    CR_RESOURCE,
    REPORTER_IMAGE,
    Driver,
    ReporterProcess,
    component,
    condition,
    container_status_patch,
    delete_object,
    deploy_driver,
    driver_config,
    reporter_starter,
)
from tests.e2e.test_program import dispose, make_stack, parsed, stack_config
from tests.e2e.waiting import wait_for
from tools import cluster
from tools import pulumi_stack as ps

# Reporter start + first list + first write; kwok makes pods Ready within a second or two.
SKIP_AWAIT = "pulumi.com/skipAwait"
STATUS_TIMEOUT = 60.0
# The issue wants a new leader within 15 s of the old one's death. That bound is a property of
# the election's timing (lease duration, retry periods) and is pinned with a fake clock in
# tests/unit/test_reporter_leader.py::test_takeover_after_expiry_within_15_seconds; here the
# Lease must carry the duration that test assumes, and the handover is waited for, not timed
# (on a loaded 2-core machine the follower's next try can come late).
LEASE_DURATION_SECONDS = 10
TAKEOVER_TIMEOUT = 60.0
CONDITIONS = ("CertsReady", "CertsVerified", "DriverDeployed")
WRITES = "pmem_csi_reporter_status_writes_total"
RECONCILES = "pmem_csi_reporter_reconciles_total"
APPS_DAEMONSET = Resource("DaemonSet", "apps/v1", "daemonsets", True)
SERVICE = Resource("Service", "v1", "services", True)


@pytest.fixture
def driver(raw: RawApi, crd: None, driver_certs: DriverCertificates) -> Iterator[Driver]:
    """A fresh driver deployment per test; destructive tests cannot affect each other."""
    suffix = uuid.uuid4().hex[:6]
    cfg = driver_config(f"rt-{suffix}.pmem-csi.intel.com", f"rt-{suffix}")
    drv = deploy_driver(raw, cfg, driver_certs)
    try:
        yield drv
    finally:
        drv.delete()


@pytest.fixture
def start_reporter(
    api_client: Any, local_cluster: Path, driver: Driver, tmp_path: Path
) -> Iterator[Callable[..., ReporterProcess]]:
    """Factory starting reporter processes for ``driver``; all are stopped afterwards."""
    with reporter_starter(api_client, local_cluster, driver, tmp_path) as start:
        yield start


def _running(driver: Driver) -> dict[str, Any]:
    """The status once it says Running (falsy until then)."""
    status = driver.status()
    return status if status.get("phase") == "Running" else {}


def wait_running(driver: Driver) -> dict[str, Any]:
    return wait_for(lambda: _running(driver), STATUS_TIMEOUT, f"{driver.name} phase Running")


def test_after_deploy_all_conditions_true_components_ready_and_kubectl_shows_running(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], kubectl: Callable[..., Any]
) -> None:
    start_reporter()
    status = wait_running(driver)
    for ctype in CONDITIONS:
        cond = condition(status, ctype)
        assert cond.get("status") == "True", cond
        assert cond.get("lastTransitionTime"), cond
    assert component(status, "Controller")["status"] == "Ready"
    assert (
        component(status, "Controller")["reason"]
        == "1 instance(s) of controller driver is running successfully"
    )
    assert component(status, "Node")["status"] == "Ready"
    assert component(status, "Node")["reason"] == "All 3 node driver pod(s) running successfully"
    assert status["reason"] == "All driver components are deployed successfully"

    out = kubectl("get", "deployments.pmem-csi.intel.com", driver.name, "--no-headers").stdout
    columns = out.split()
    # NAME DEVICEMODE NODESELECTOR IMAGE STATUS AGE
    assert columns[0] == driver.name
    assert columns[1] == driver.cfg.device_mode == "lvm"
    assert columns[2] == '{"storage":"pmem"}'
    assert columns[3] == driver.cfg.image
    assert columns[4] == "Running"


def test_adding_a_labelled_node_changes_node_message_to_four_pods(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], api_client: Any
) -> None:
    start_reporter()
    wait_running(driver)
    node = f"rt-node-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    cluster.add_node(node, dict(cluster.PMEM_LABEL))
    try:
        wait_for(
            lambda: (
                component(driver.status(), "Node").get("reason")
                == "All 4 node driver pod(s) running successfully"
            ),
            STATUS_TIMEOUT,
            "Node message naming 4 pods",
        )
        assert component(driver.status(), "Node")["status"] == "Ready"
        # A node joining is progress, not a failure: no Warning Event (kstatus phases).
        assert driver.status()["phase"] == "Running"
        assert ("Warning", "Failed") not in _events(api_client, driver)
    finally:
        # Other tests count 3 PMEM nodes: remove the node and, without waiting for the pod
        # garbage collector, the pods bound to it.
        core.delete_node(node)
        for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                )


def _break_pod(api_client: Any, pod: dict[str, Any], reason: str) -> None:
    """Make a Running pod not Ready with a waiting container, as a crash-looping one looks.

    The phase stays Running on purpose: kwok's pod-ready stage only selects Pending pods whose
    Ready condition is not True, so it leaves this status alone (a Failed phase would make
    the DaemonSet controller replace the pod instead).
    """
    patch = container_status_patch(pod, reason, "back-off restarting")
    client.CoreV1Api(api_client).patch_namespaced_pod_status(
        pod["metadata"]["name"], pod["metadata"]["namespace"], patch
    )


def test_node_pod_not_ready_makes_node_not_ready_naming_pod_and_node(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], api_client: Any
) -> None:
    reporter = start_reporter(resync_seconds=1.0)
    wait_running(driver)
    pod = sorted(driver.node_pods(), key=lambda p: p["metadata"]["name"])[0]
    pod_name, node_name = pod["metadata"]["name"], pod["spec"]["nodeName"]
    _break_pod(api_client, pod, "CrashLoopBackOff")

    def node_not_ready() -> dict[str, Any]:
        comp = component(driver.status(), "Node")
        return comp if comp.get("status") == "NotReady" and pod_name in comp["reason"] else {}

    comp = wait_for(node_not_ready, STATUS_TIMEOUT, f"Node NotReady naming {pod_name}")
    assert f"{pod_name} on {node_name}: CrashLoopBackOff" in comp["reason"], comp
    assert "2 out of 3 driver pods are ready" in comp["reason"], comp
    # Two of three nodes serve: progress, Failed only after the progress deadline (issue 16).
    assert driver.status()["phase"] == "Progressing"
    # kwok does not flip the pod back (see _break_pod): two resyncs later nothing changed.
    seen = reporter.metric(RECONCILES)
    wait_for(lambda: reporter.metric(RECONCILES) >= seen + 2, 30, "two more reconciles")
    pod_now = driver.raw.get(POD, pod_name, driver.namespace) or {}
    ready = [c for c in pod_now["status"]["conditions"] if c.get("type") == "Ready"]
    assert [c["status"] for c in ready] == ["False"]
    assert component(driver.status(), "Node") == comp


def test_deleting_daemonset_makes_driver_deployed_false_naming_it(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], raw: RawApi
) -> None:
    start_reporter()
    wait_running(driver)
    delete_object(raw, APPS_DAEMONSET, driver.names.node_driver, driver.namespace)

    def deployed_false() -> dict[str, Any]:
        cond = condition(driver.status(), "DriverDeployed")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(deployed_false, STATUS_TIMEOUT, "DriverDeployed False")
    assert f"DaemonSet/{driver.names.node_driver}" in cond["message"], cond
    assert "pulumi up --refresh" in cond["message"], cond
    assert cond["reason"] == "ObjectsMissing"
    assert driver.status()["phase"] == "Failed"


@dataclass
class StackDriver:
    """A driver deployed by ``pulumi up`` of the project's program, and its reporters."""

    stack: auto.Stack
    driver: Driver
    start_reporter: Callable[..., ReporterProcess]


@pytest.fixture
def stack_driver(
    pulumi_ready: dict[str, str],
    api_client: Any,
    local_cluster: Path,
    raw: RawApi,
    crd: None,
    tmp_path: Path,
) -> Iterator[StackDriver]:
    """For the tests that need the engine itself (the take-back by ``pulumi up --refresh``):
    a stack of its own, destroyed afterwards, whatever the test did to its objects."""
    suffix = uuid.uuid4().hex[:6]
    spec = {
        "name": f"rs-{suffix}.pmem-csi.intel.com",
        "namespace": f"rs-{suffix}",
        "reporter": {"image": REPORTER_IMAGE},
    }
    cfg = parsed(spec)
    stack = make_stack(tmp_path, stack_config(spec))
    try:
        assert stack.up(on_output=ps.printer("[up] ")).summary.result == "succeeded"
        drv = Driver(cfg, raw)  # the stack owns the objects: no delete() of ours
        with reporter_starter(api_client, local_cluster, drv, tmp_path) as start:
            yield StackDriver(stack, drv, start)
    finally:
        dispose(stack)


def _foreign_managers(live: dict[str, Any]) -> list[str]:
    """Field managers of the object itself (not a subresource) other than the provider's."""
    return sorted(
        e["manager"]
        for e in live["metadata"].get("managedFields") or []
        if not e.get("subresource") and not e["manager"].startswith("pulumi-kubernetes")
    )


def test_objects_changed_by_other_managers_are_named_until_pulumi_takes_them_back(
    stack_driver: StackDriver, raw: RawApi
) -> None:
    """A PUT as `kubectl edit` sends it and a patch as `kubectl patch` sends it are named in
    the status; the real `pulumi up --refresh` takes the fields back and the status says so."""
    driver, stack = stack_driver.driver, stack_driver.stack
    stack_driver.start_reporter()
    wait_running(driver)
    ds_name, svc_name = driver.names.node_driver, driver.names.controller_service
    ds = raw.get(APPS_DAEMONSET, ds_name, driver.namespace)
    assert ds is not None
    ds["spec"]["template"]["spec"]["containers"][0]["command"].append("-v=9")
    raw.request_json(
        "PUT",
        APPS_DAEMONSET.path(driver.namespace, ds_name),
        body=ds,
        query=[("fieldManager", "kubectl-edit")],
    )
    raw.request_json(
        "PATCH",
        SERVICE.path(driver.namespace, svc_name),
        # A field the stack declares: `pulumi up` takes back only what it declares (fields
        # someone merely added go when the object is next updated; docs/day2.md, "Changed
        # behind Pulumi's back").
        body={"metadata": {"annotations": {SKIP_AWAIT: "false"}}},
        query=[("fieldManager", "kubectl-patch")],
        content_type="application/merge-patch+json",
    )

    def modified() -> dict[str, Any]:
        cond = condition(driver.status(), "DriverDeployed")
        return (
            cond
            if cond.get("reason") == "ObjectsModified" and "Service/" in cond["message"]
            else {}
        )

    cond = wait_for(modified, STATUS_TIMEOUT, "DriverDeployed False naming both objects")
    container = ds["spec"]["template"]["spec"]["containers"][0]["name"]
    assert (
        f"DaemonSet/{ds_name} by kubectl-edit "
        f"(spec.template.spec.containers[name={container}].command)"
    ) in cond["message"], cond
    assert (
        f"Service/{svc_name} by kubectl-patch (metadata.annotations.{SKIP_AWAIT})"
        in cond["message"]
    ), cond
    assert cond["status"] == "False"
    assert driver.status()["phase"] == "Failed"

    # The recovery docs/day2.md gives: `pulumi up --refresh` of the project's program.
    lines: list[str] = []
    result = stack.up(refresh=True, on_output=lines.append)
    assert result.summary.result == "succeeded", "".join(lines)[-3000:]
    diagnostics = "".join(lines).split("Diagnostics:", 1)[-1]
    for what in (
        f"DaemonSet {driver.namespace}/{ds_name}",
        f"Service {driver.namespace}/{svc_name}",
    ):
        assert f"took over fields of {what} and applied it (" in diagnostics, diagnostics
    status = wait_running(driver)
    assert condition(status, "DriverDeployed")["reason"] == "AllObjectsExist"
    live_ds = raw.get(APPS_DAEMONSET, ds_name, driver.namespace)
    live_svc = raw.get(SERVICE, svc_name, driver.namespace)
    assert live_ds is not None and live_svc is not None
    assert "-v=9" not in live_ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert live_svc["metadata"]["annotations"][SKIP_AWAIT] == "true", live_svc["metadata"]
    assert "kubectl-edit" not in _foreign_managers(live_ds), live_ds["metadata"]
    assert "kubectl-patch" not in _foreign_managers(live_svc), live_svc["metadata"]


def test_certificate_from_another_ca_makes_certs_verified_false_wrong_ca(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], api_client: Any
) -> None:
    start_reporter()
    wait_running(driver)
    other = certs_mod.generate_driver_certificates()
    client.CoreV1Api(api_client).patch_namespaced_secret(
        driver.names.node_secret,
        driver.namespace,
        {
            "stringData": {
                "tls.crt": other.node_controller_cert,
                "tls.key": other.node_controller_key,
            }
        },
        field_manager=AS_PULUMI,  # provided certificates, as `pulumi up` writes them
    )

    def verified_false() -> dict[str, Any]:
        cond = condition(driver.status(), "CertsVerified")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(verified_false, STATUS_TIMEOUT, "CertsVerified False")
    assert cond["reason"] == "WrongCA", cond
    assert condition(driver.status(), "CertsReady")["status"] == "True"


def test_restarting_reporter_with_nothing_changed_writes_no_status(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], raw: RawApi
) -> None:
    first = start_reporter("first", resync_seconds=1.0)
    wait_running(driver)
    wait_for(lambda: first.metric(WRITES) >= 1, 10, "first reporter's status write metric")
    first.stop()
    before = driver.cr()

    second = start_reporter("second", resync_seconds=1.0)
    # Leading, caches synced, and several full recomputes (each resync reconciles the CR).
    wait_for(lambda: _lease_holder(raw, driver) == "second", 30, "second reporter leading")
    wait_for(lambda: second.metric(RECONCILES) >= 3, 30, "three reconciles by the new process")
    after = driver.cr()
    assert second.metric(WRITES) == 0
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["metadata"].get("managedFields") == before["metadata"].get("managedFields")
    assert after["status"] == before["status"]


def _lease_spec(raw: RawApi, driver: Driver) -> dict[str, Any]:
    lease = raw.get(LEASE, driver.names.reporter, driver.namespace) or {}
    return dict(lease.get("spec") or {})


def _lease_holder(raw: RawApi, driver: Driver) -> str:
    return str(_lease_spec(raw, driver).get("holderIdentity") or "")


def test_killing_the_leader_hands_over_to_the_other_replica(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], raw: RawApi
) -> None:
    replicas = {p.identity: p for p in (start_reporter("replica-a"), start_reporter("replica-b"))}
    wait_running(driver)
    leader = wait_for(
        lambda: _lease_holder(raw, driver) if _lease_holder(raw, driver) in replicas else "",
        30,
        "a lease holder",
    )
    (follower,) = set(replicas) - {leader}
    assert replicas[follower].metric("pmem_csi_reporter_is_leader") == 0
    held = _lease_spec(raw, driver)
    assert held["leaseDurationSeconds"] == LEASE_DURATION_SECONDS, held

    replicas[leader].kill()
    wait_for(
        lambda: _lease_holder(raw, driver) == follower,
        TAKEOVER_TIMEOUT,
        f"{follower} holding the lease",
        interval=0.1,
    )
    # One handover, from the dead leader to the follower: no flapping, nobody else.
    taken = _lease_spec(raw, driver)
    assert taken["leaseTransitions"] == held["leaseTransitions"] + 1, (held, taken)
    assert taken["leaseDurationSeconds"] == LEASE_DURATION_SECONDS, taken
    wait_for(
        lambda: replicas[follower].metric("pmem_csi_reporter_is_leader") == 1,
        30,
        f"{follower} counting itself leader",
    )

    # The new leader reports a change made after the takeover.
    delete_object(raw, SERVICE, driver.names.metrics_service, driver.namespace)

    def deployed_false() -> dict[str, Any]:
        cond = condition(driver.status(), "DriverDeployed")
        return cond if cond.get("status") == "False" else {}

    cond = wait_for(deployed_false, STATUS_TIMEOUT, "DriverDeployed False after takeover")
    assert f"Service/{driver.names.metrics_service}" in cond["message"], cond
    # The counter goes up after the PATCH returns, so possibly after the status was seen.
    wait_for(lambda: replicas[follower].metric(WRITES) >= 1, 30, "the new leader's write counted")


def _events(api_client: Any, driver: Driver) -> list[tuple[str, str]]:
    items = (
        client.CoreV1Api(api_client)
        .list_namespaced_event(
            CLUSTER_EVENT_NAMESPACE, field_selector=f"involvedObject.name={driver.name}"
        )
        .items
    )
    return [(e.type, e.reason) for e in items if e.involved_object.kind == "Deployment"]


def test_phase_changes_produce_events_on_the_cr(
    driver: Driver,
    start_reporter: Callable[..., ReporterProcess],
    raw: RawApi,
    api_client: Any,
) -> None:
    start_reporter()
    wait_running(driver)
    wait_for(
        lambda: ("Normal", "Running") in _events(api_client, driver),
        STATUS_TIMEOUT,
        "a Normal/Running Event",
    )
    delete_object(raw, SERVICE, driver.names.controller_service, driver.namespace)
    wait_for(
        lambda: ("Warning", "Failed") in _events(api_client, driver),
        STATUS_TIMEOUT,
        "a Warning/Failed Event",
    )
    assert driver.status()["phase"] == "Failed"


def test_rollout_is_progressing_and_a_daemonset_selecting_no_node_is_running(
    driver: Driver,
    start_reporter: Callable[..., ReporterProcess],
    raw: RawApi,
    api_client: Any,
) -> None:
    """A node driver rollout that ends with no node selected: never Failed, then Running."""
    reporter = start_reporter()
    wait_running(driver)
    phases: list[str] = []
    client.AppsV1Api(api_client).patch_namespaced_daemon_set(
        driver.names.node_driver,
        driver.namespace,
        {"spec": {"template": {"spec": {"nodeSelector": {"no-such-label": "x"}}}}},
        field_manager=AS_PULUMI,  # a rollout as `pulumi up` starts it
    )

    def no_node_ready() -> dict[str, Any]:
        status = driver.status()
        phases.append(str(status.get("phase")))
        comp = component(status, "Node")
        return status if "No node is selected" in str(comp.get("reason")) else {}

    status = wait_for(no_node_ready, STATUS_TIMEOUT, "Node Ready with no node selected", 0.05)
    assert component(status, "Node")["status"] == "Ready"
    assert status["phase"] == "Running"
    assert "Failed" not in phases
    assert ("Warning", "Failed") not in _events(api_client, driver)
    # The rollout (pods of three nodes going away) took few writes, not one per pod event:
    # counted once the reporter has stopped writing (an upper bound read at once could hold
    # only because writes under way or put off for a token were not counted yet).
    writes = reporter.settled_metrics(
        (WRITES,), lambda: driver.cr()["metadata"]["resourceVersion"]
    )[WRITES]
    assert writes <= 4


def test_a_relabelled_daemonset_is_reported_relabelled_not_missing(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], raw: RawApi
) -> None:
    """Removing the instance label takes the DaemonSet out of the label-selected watch, as a
    deletion would; the reporter looks it up by name and says what happened (issue 16)."""
    start_reporter()
    wait_running(driver)
    raw.request_json(
        "PATCH",
        APPS_DAEMONSET.path(driver.namespace, driver.names.node_driver),
        body={"metadata": {"labels": {"app.kubernetes.io/instance": None}}},
        query=[("fieldManager", "kubectl-label")],
        content_type="application/merge-patch+json",
    )

    def relabelled() -> dict[str, Any]:
        cond = condition(driver.status(), "DriverDeployed")
        return cond if cond.get("reason") == "ObjectsRelabelled" else {}

    cond = wait_for(relabelled, STATUS_TIMEOUT, "DriverDeployed False, ObjectsRelabelled")
    assert f"DaemonSet/{driver.names.node_driver}" in cond["message"], cond
    assert "Missing" not in cond["message"], cond
    assert "is relabelled" in component(driver.status(), "Node")["reason"]


def test_a_kubectl_edit_of_the_cr_spec_is_not_running_at_the_new_generation(
    driver: Driver, start_reporter: Callable[..., ReporterProcess], raw: RawApi
) -> None:
    """Nothing rolls an edited CR spec out: the status says who changed it, never Running."""
    start_reporter()
    wait_running(driver)
    cr = raw.get(CR_RESOURCE, driver.name)
    assert cr is not None
    cr["spec"]["image"] = "intel/pmem-csi-driver:edited"
    raw.request_json(
        "PUT",
        CR_RESOURCE.path(None, driver.name),
        body=cr,
        query=[("fieldManager", "kubectl-edit")],
    )
    generation = (raw.get(CR_RESOURCE, driver.name) or {})["metadata"]["generation"]

    def modified() -> dict[str, Any]:
        status = driver.status()
        cond = condition(status, "DriverDeployed")
        fresh = status.get("observedGeneration") == generation
        return status if fresh and cond.get("reason") == "ObjectsModified" else {}

    status = wait_for(modified, STATUS_TIMEOUT, "the CR edit reported")
    assert (
        f"Deployment/{driver.name} by kubectl-edit (spec.image)"
        in condition(status, "DriverDeployed")["message"]
    )
    assert status["phase"] != "Running"
