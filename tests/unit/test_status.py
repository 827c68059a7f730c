"""Table-driven tests of the reporter's pure status computation (reporter.status).

Objects are built as the camelCase JSON the API server returns, exactly what the watch caches
hand to ``compute_status``; certificates are real ones made with ``cryptography`` so the
CertsVerified rules run against the actual verifier, handshake included.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime as dt
import functools
from typing import Any

import pytest

from pmem_components import certs
from pmem_components.names import DeploymentNames
from reporter import status as st
from reporter.certcheck import CertVerifier
from reporter.model import (
    DAEMON_SET,
    SECRET,
    STATEFUL_SET,
    ExpectedObject,
    Observed,
    expected_objects,
)

NAME = "pmem-csi.intel.com"
NAMES = DeploymentNames(NAME)
NS = "pmem-csi"
# The verifier's TLS handshake uses the real clock (OpenSSL's), so the tests' "now" must be
# close to it for certificates made relative to NOW to be valid in both checks.
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
LATER = NOW + dt.timedelta(minutes=5)
NOW_S = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
LATER_S = LATER.strftime("%Y-%m-%dT%H:%M:%SZ")

Obj = dict[str, Any]


# ------------------------------------------------------------------------------ certificates


@functools.cache
def _pki() -> dict[str, certs.IssuedCertificate]:
    """One good CA with both leaves, plus a leaf from an unrelated CA (RSA keygen is slow)."""
    start = NOW - dt.timedelta(days=1)
    ca = certs.generate_ca(now=start)
    other_ca = certs.generate_ca(now=start)
    return {
        "ca": ca,
        "registry": certs.generate_leaf(ca, certs.REGISTRY_NAME, now=start),
        "node": certs.generate_leaf(ca, certs.NODE_CONTROLLER_NAME, now=start),
        "foreign_node": certs.generate_leaf(other_ca, certs.NODE_CONTROLLER_NAME, now=start),
        "other_ca": other_ca,
        "short_node": certs.generate_leaf(
            ca,
            certs.NODE_CONTROLLER_NAME,
            not_before=start,
            not_after=NOW + dt.timedelta(days=10),
        ),
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, leaf: str, *, drop: str | None = None) -> Obj:
    pki = _pki()
    data = {
        "ca.crt": _b64(pki["ca"].cert_pem),
        "tls.crt": _b64(pki[leaf].cert_pem),
        "tls.key": _b64(pki[leaf].key_pem),
    }
    if drop:
        del data[drop]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}


# ------------------------------------------------------------------------------ objects


def daemonset(
    desired: int = 3,
    ready: int | None = None,
    *,
    available: int | None = None,
    updated: int | None = None,
    current: int | None = None,
    generation: int = 2,
    observed_generation: int | None = None,
) -> Obj:
    ready = desired if ready is None else ready
    return {
        "metadata": {"name": NAMES.node_driver, "namespace": NS, "generation": generation},
        "spec": {},
        "status": {
            "observedGeneration": generation
            if observed_generation is None
            else observed_generation,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired if current is None else current,
            "updatedNumberScheduled": desired if updated is None else updated,
            "numberAvailable": ready if available is None else available,
            "numberReady": ready,
        },
    }


def statefulset(
    replicas: int = 1,
    ready: int | None = None,
    *,
    updated: int | None = None,
    current_revision: str = "ctrl-1",
    update_revision: str = "ctrl-1",
    generation: int = 1,
    observed_generation: int | None = None,
) -> Obj:
    ready = replicas if ready is None else ready
    return {
        "metadata": {"name": NAMES.controller_driver, "namespace": NS, "generation": generation},
        "spec": {"replicas": replicas, "updateStrategy": {"type": "RollingUpdate"}},
        "status": {
            "observedGeneration": generation
            if observed_generation is None
            else observed_generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "currentReplicas": replicas,
            "updatedReplicas": replicas if updated is None else updated,
            "currentRevision": current_revision,
            "updateRevision": update_revision,
        },
    }


def pod(
    name: str,
    node: str | None,
    *,
    ready: bool = True,
    waiting: str | None = None,
    unschedulable: str | None = None,
    phase: str = "Running",
) -> Obj:
    conditions: list[Obj] = [
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    if unschedulable is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        )
        phase = "Pending"
    else:
        conditions.append({"type": "PodScheduled", "status": "True"})
    state: Obj = {"running": {"startedAt": NOW_S}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "details"}}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": "pmem-driver", "ready": ready, "state": state}],
        },
    }


def node_pods(n: int = 3) -> list[Obj]:
    return [pod(f"{NAMES.hyphened}-node-{i}", f"worker-{i}") for i in range(n)]


def controller_pods() -> list[Obj]:
    return [pod(f"{NAMES.controller_driver}-0", "worker-0")]


def good_objects() -> dict[str, dict[str, Obj | None]]:
    objects: dict[str, dict[str, Obj | None]] = {}
    for kind, _, name in expected_objects(NAMES):
        objects.setdefault(kind, {})[name] = {"kind": kind, "metadata": {"name": name}}
    objects[SECRET][NAMES.registry_secret] = secret(NAMES.registry_secret, "registry")
    objects[SECRET][NAMES.node_secret] = secret(NAMES.node_secret, "node")
    objects[DAEMON_SET][NAMES.node_driver] = daemonset()
    objects[STATEFUL_SET][NAMES.controller_driver] = statefulset()
    return objects


def cr(status: Obj | None = None, generation: int = 4) -> Obj:
    obj: Obj = {
        "apiVersion": "pmem-csi.intel.com/v1beta1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "generation": generation},
        "spec": {"namespace": NS},
    }
    if status is not None:
        obj["status"] = status
    return obj


def observed(
    objects: dict[str, dict[str, Obj | None]] | None = None,
    *,
    nodes: list[Obj] | None = None,
    ctrl_pods: list[Obj] | None = None,
    nodepods: list[Obj] | None = None,
    status: Obj | None = None,
) -> Observed:
    return Observed(
        cr=cr(status),
        objects=good_objects() if objects is None else objects,
        controller_pods=controller_pods() if ctrl_pods is None else ctrl_pods,
        node_pods=node_pods() if nodepods is None else nodepods,
        nodes=nodes,
    )


def cond(status: Obj, ctype: str) -> Obj:
    (found,) = [c for c in status["conditions"] if c["type"] == ctype]
    return found


def comp(status: Obj, component: str) -> Obj:
    (found,) = [c for c in status["driverComponents"] if c["component"] == component]
    return found


def with_changes(**changes: Any) -> dict[str, dict[str, Obj | None]]:
    """good_objects() with ``Kind=obj`` replacements for the DaemonSet/StatefulSet."""
    objects = good_objects()
    if "ds" in changes:
        objects[DAEMON_SET][NAMES.node_driver] = changes["ds"]
    if "ss" in changes:
        objects[STATEFUL_SET][NAMES.controller_driver] = changes["ss"]
    return objects


# ------------------------------------------------------------------------------ model


def test_expected_objects_cover_every_sub_object() -> None:
    got = expected_objects(NAMES)
    assert all(isinstance(e, ExpectedObject) for e in got)
    kinds = sorted(e.kind for e in got)
    assert kinds == sorted(
        [
            "Secret",
            "Secret",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "Service",
            "CSIDriver",
            "StatefulSet",
            "DaemonSet",
        ]
    )
    cluster_scoped = {e.kind for e in got if not e.namespaced}
    assert cluster_scoped == {"ClusterRole", "ClusterRoleBinding", "CSIDriver"}
    assert ("DaemonSet", True, NAMES.node_driver) in got


def test_observed_defaults() -> None:
    o = Observed(cr={"metadata": {"name": NAME, "generation": 7}, "spec": {}})
    assert o.namespace == "pmem-csi"
    assert o.generation == 7
    assert o.current_status == {}
    assert o.get(DAEMON_SET, NAMES.node_driver) is None


# ------------------------------------------------------------------------------ all good


def test_all_good_is_running_with_reference_messages() -> None:
    s = st.compute_status(observed(), NOW)
    assert s["phase"] == "Running"
    assert s["reason"] == "All driver components are deployed successfully"
    assert s["lastUpdated"] == NOW_S
    assert s["observedGeneration"] == 4
    for ctype in ("CertsReady", "CertsVerified", "DriverDeployed"):
        c = cond(s, ctype)
        assert c["status"] == "True", c
        assert c["observedGeneration"] == 4
        assert c["lastTransitionTime"] == NOW_S
        assert c["reason"].isidentifier() and c["reason"][0].isupper()
    assert comp(s, "Controller") == {
        "component": "Controller",
        "status": "Ready",
        "reason": "1 instance(s) of controller driver is running successfully",
        "lastUpdated": NOW_S,
    }
    assert comp(s, "Node") == {
        "component": "Node",
        "status": "Ready",
        "reason": "All 3 node driver pod(s) running successfully",
        "lastUpdated": NOW_S,
    }
    assert [c["component"] for c in s["driverComponents"]] == ["Controller", "Node"]


def test_four_nodes_changes_the_node_message() -> None:
    s = st.compute_status(observed(with_changes(ds=daemonset(4)), nodepods=node_pods(4)), NOW)
    assert comp(s, "Node")["reason"] == "All 4 node driver pod(s) running successfully"


# ------------------------------------------------------------------------------ node component

BAD = f"{NAMES.hyphened}-node-2"


@pytest.mark.parametrize(
    ("ds", "pods", "nodes", "expected"),
    [
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False)],
            None,
            ["2 out of 3 driver pods are ready", f"{BAD} on worker-2: container(s) pmem-driver"],
            id="one-pod-not-ready",
        ),
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False, waiting="CrashLoopBackOff")],
            None,
            [
                f"2 out of 3 driver pods are ready; {BAD} on worker-2: CrashLoopBackOff "
                "(container pmem-driver)"
            ],
            id="crash-loop",
        ),
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False, waiting="ImagePullBackOff")],
            None,
            [f"{BAD} on worker-2: ImagePullBackOff"],
            id="image-pull-backoff",
        ),
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False, waiting="ErrImagePull")],
            None,
            [f"{BAD} on worker-2: ErrImagePull"],
            id="err-image-pull",
        ),
        pytest.param(
            daemonset(3, 2),
            [
                *node_pods(2),
                pod(
                    BAD,
                    None,
                    ready=False,
                    unschedulable="0/3 nodes are available: 3 Insufficient memory.",
                ),
            ],
            None,
            [
                f"{BAD} (not scheduled): Unschedulable: 0/3 nodes are available: "
                "3 Insufficient memory."
            ],
            id="unschedulable",
        ),
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False, phase="Pending")],
            None,
            [f"{BAD} on worker-2: Pending"],
            id="pending",
        ),
        pytest.param(
            daemonset(3, 2),
            [*node_pods(2), pod(BAD, "worker-2", ready=False)],
            [
                {
                    "metadata": {"name": "worker-2"},
                    "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
                }
            ],
            [f"{BAD} on worker-2 (node not ready)"],
            id="node-not-ready",
        ),
        pytest.param(
            daemonset(3, 3, updated=1),
            node_pods(3),
            None,
            ["Rollout in progress: 1 of 3 node driver pod(s) updated"],
            id="rollout-updated-behind",
        ),
        pytest.param(
            daemonset(3, generation=3, observed_generation=2),
            node_pods(3),
            None,
            ["Rollout in progress", "has not observed generation 3"],
            id="rollout-generation-behind",
        ),
        pytest.param(
            daemonset(3, 3, available=2),
            node_pods(3),
            None,
            ["2 out of 3 driver pods are ready"],
            id="ready-but-not-available",
        ),
        pytest.param(
            daemonset(3, 2, current=2),
            node_pods(2),
            None,
            ["2 of 3 nodes run a node driver pod"],
            id="not-scheduled-everywhere",
        ),
        pytest.param(
            None,
            [],
            None,
            [f"Node driver DaemonSet {NS}/{NAMES.node_driver} is missing"],
            id="missing-daemonset",
        ),
    ],
)
def test_node_not_ready(
    ds: Obj | None,
    pods: list[Obj],
    nodes: list[Obj] | None,
    expected: list[str],
    request: pytest.FixtureRequest,
) -> None:
    s = st.compute_status(observed(with_changes(ds=ds), nodepods=pods, nodes=nodes), NOW)
    node = comp(s, "Node")
    assert node["status"] == "NotReady"
    for text in expected:
        assert text in node["reason"], node["reason"]
    # A missing object is a failure; one broken pod of three is progress (2 nodes serve), Failed
    # only after the progress deadline (issue 16; test_status_scale.py has the rules).
    failing = request.node.callspec.id in NODE_FAILING_CASES
    assert s["phase"] == ("Failed" if failing else "Progressing")
    assert "Node driver is NotReady" in s["reason"]
    assert comp(s, "Controller")["status"] == "Ready"


NODE_FAILING_CASES = {"missing-daemonset"}
FAILING_CASES = {
    "crash-loop",
    "image-pull-backoff",
    "err-image-pull",
    "unschedulable",
    "missing-daemonset",
    "missing-statefulset",
}


def test_daemonset_that_selects_no_node_is_ready() -> None:
    """kstatus: a DaemonSet with nothing to schedule is Current, not 'not started'."""
    s = st.compute_status(observed(with_changes(ds=daemonset(0))), NOW)
    assert comp(s, "Node")["status"] == "Ready"
    assert "No node is selected" in comp(s, "Node")["reason"]
    assert s["phase"] == "Running"


def test_healthy_pods_are_not_named() -> None:
    pods = [*node_pods(2), pod(BAD, "worker-2", ready=False, waiting="CrashLoopBackOff")]
    reason = comp(
        st.compute_status(observed(with_changes(ds=daemonset(3, 2)), nodepods=pods), NOW), "Node"
    )["reason"]
    assert f"{NAMES.hyphened}-node-0" not in reason


def test_many_failing_pods_are_capped() -> None:
    pods = [pod(f"p{i}", f"w{i}", ready=False) for i in range(9)]
    s = st.compute_status(observed(with_changes(ds=daemonset(9, 0)), nodepods=pods), NOW)
    reason = comp(s, "Node")["reason"]
    assert "p4 on w4" in reason and "p5 on w5" not in reason
    assert reason.endswith("and 4 more")


# ------------------------------------------------------------------------------ controller


@pytest.mark.parametrize(
    ("ss", "pods", "expected"),
    [
        pytest.param(
            statefulset(1, 0),
            [
                pod(
                    f"{NAMES.controller_driver}-0",
                    "worker-1",
                    ready=False,
                    waiting="CrashLoopBackOff",
                )
            ],
            [
                "Waiting for stateful set to be ready: 0 of 1 replicas are ready",
                f"{NAMES.controller_driver}-0 on worker-1: CrashLoopBackOff",
            ],
            id="crash-loop",
        ),
        pytest.param(
            statefulset(1, 1, updated=0, update_revision="ctrl-2"),
            controller_pods(),
            ["Rollout in progress: 0 of 1 controller pod(s) updated"],
            id="rollout-updated-behind",
        ),
        pytest.param(
            statefulset(1, 1, update_revision="ctrl-2"),
            controller_pods(),
            ["Rollout in progress: waiting for revision ctrl-2"],
            id="rollout-revision",
        ),
        pytest.param(
            statefulset(1, generation=5, observed_generation=4),
            controller_pods(),
            ["Rollout in progress", "has not observed generation 5"],
            id="rollout-generation-behind",
        ),
        pytest.param(
            None,
            [],
            [f"Controller driver StatefulSet {NS}/{NAMES.controller_driver} is missing"],
            id="missing-statefulset",
        ),
        pytest.param(
            statefulset(0),
            [],
            ["scaled to 0 replicas"],
            id="scaled-to-zero",
        ),
    ],
)
def test_controller_not_ready(
    ss: Obj | None, pods: list[Obj], expected: list[str], request: pytest.FixtureRequest
) -> None:
    s = st.compute_status(observed(with_changes(ss=ss), ctrl_pods=pods), NOW)
    ctrl = comp(s, "Controller")
    assert ctrl["status"] == "NotReady"
    for text in expected:
        assert text in ctrl["reason"], ctrl["reason"]
    failing = request.node.callspec.id in FAILING_CASES
    assert s["phase"] == ("Failed" if failing else "Progressing")
    assert comp(s, "Node")["status"] == "Ready"


# ------------------------------------------------------------------------------ DriverDeployed


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(("DaemonSet", NAMES.node_driver), id="daemonset"),
        pytest.param(("CSIDriver", NAMES.csi_driver), id="csidriver"),
        pytest.param(("ClusterRoleBinding", NAMES.provisioner_cluster_role_binding), id="crb"),
        pytest.param(("Service", NAMES.metrics_service), id="metrics-service"),
    ],
)
def test_missing_object_makes_driver_deployed_false(missing: tuple[str, str]) -> None:
    kind, name = missing
    objects = good_objects()
    objects[kind][name] = None
    s = st.compute_status(observed(objects), NOW)
    c = cond(s, "DriverDeployed")
    assert c["status"] == "False"
    assert c["reason"] == "ObjectsMissing"
    assert f"{kind}/{name}" in c["message"]
    assert "pulumi up --refresh" in c["message"]
    assert s["phase"] == "Failed"
    assert "DriverDeployed is False" in s["reason"]


def test_absent_kind_counts_as_missing_and_all_are_named() -> None:
    objects = good_objects()
    del objects["ServiceAccount"]
    objects["Role"][NAMES.provisioner_role] = None
    message = cond(st.compute_status(observed(objects), NOW), "DriverDeployed")["message"]
    assert f"ServiceAccount/{NAMES.service_account}" in message
    assert f"Role/{NAMES.provisioner_role}" in message


def _edited(obj: Obj | None, manager: str, fields: Obj, **extra: str) -> Obj:
    obj = copy.deepcopy(obj or {})
    entry = {"manager": manager, "operation": "Update", "fieldsV1": fields, **extra}
    obj.setdefault("metadata", {}).setdefault("managedFields", []).append(entry)
    return obj


def test_an_object_changed_by_another_manager_makes_driver_deployed_false_naming_it() -> None:
    objects = good_objects()
    ds = NAMES.node_driver
    args = {"f:spec": {"f:template": {"f:spec": {"f:containers": {
        'k:{"name":"pmem-driver"}': {"f:args": {}}}}}}}  # fmt: skip
    objects[DAEMON_SET][ds] = _edited(objects[DAEMON_SET][ds], "kubectl-edit", args)
    role = NAMES.provisioner_cluster_role
    objects["ClusterRole"][role] = _edited(
        objects["ClusterRole"][role], "e2e.test", {"f:rules": {}}
    )
    s = st.compute_status(observed(objects), NOW)
    c = cond(s, "DriverDeployed")
    assert c["status"] == "False"
    assert c["reason"] == "ObjectsModified"
    assert (
        f"ClusterRole/{role} by e2e.test (rules); DaemonSet/{ds} by kubectl-edit "
        "(spec.template.spec.containers[name=pmem-driver].args)"
    ) in c["message"]
    assert "pulumi up --refresh" in c["message"]
    assert s["phase"] == "Failed"


def test_missing_is_the_reason_when_objects_are_missing_and_modified() -> None:
    objects = good_objects()
    objects["Role"][NAMES.provisioner_role] = None
    svc = NAMES.controller_service
    objects["Service"][svc] = _edited(objects["Service"][svc], "kubectl-patch", {"f:spec": {}})
    c = cond(st.compute_status(observed(objects), NOW), "DriverDeployed")
    assert c["reason"] == "ObjectsMissing"
    assert f"Missing Role/{NAMES.provisioner_role}" in c["message"]
    assert f"Service/{svc} by kubectl-patch" in c["message"]


def test_writes_by_pulumi_the_control_plane_and_to_status_are_not_changes() -> None:
    objects = good_objects()
    ds = NAMES.node_driver
    obj = _edited(objects[DAEMON_SET][ds], "pulumi-kubernetes-0a1b2c3d", {"f:spec": {}})
    obj = _edited(obj, "kube-controller-manager", {"f:metadata": {"f:annotations": {}}})
    objects[DAEMON_SET][ds] = _edited(obj, "kubectl-edit", {"f:status": {}}, subresource="status")
    c = cond(st.compute_status(observed(objects), NOW), "DriverDeployed")
    assert (c["status"], c["reason"]) == ("True", "AllObjectsExist")


def test_many_changed_objects_are_capped_in_the_message() -> None:
    objects = good_objects()
    for kind, _, name in expected_objects(NAMES):
        objects[kind][name] = _edited(objects[kind][name], "kubectl-label", {"f:metadata": {}})
    message = cond(st.compute_status(observed(objects), NOW), "DriverDeployed")["message"]
    assert message.count("by kubectl-label") == 3
    assert f"and {len(expected_objects(NAMES)) - 3} more" in message


# ------------------------------------------------------------------------------ certificates


@pytest.mark.parametrize(
    ("which", "drop", "expected_reason", "expected_text"),
    [
        pytest.param("registry", "tls.key", "SecretKeyMissing", "lacks tls.key", id="no-key"),
        pytest.param("node", "ca.crt", "SecretKeyMissing", "lacks ca.crt", id="no-ca"),
        pytest.param("node", None, "SecretMissing", "does not exist", id="no-secret"),
    ],
)
def test_certs_ready_false(
    which: str, drop: str | None, expected_reason: str, expected_text: str
) -> None:
    objects = good_objects()
    name = NAMES.registry_secret if which == "registry" else NAMES.node_secret
    objects[SECRET][name] = secret(name, which, drop=drop) if drop else None
    s = st.compute_status(observed(objects), NOW)
    ready = cond(s, "CertsReady")
    assert ready["status"] == "False"
    assert ready["reason"] == expected_reason
    assert f"Secret {NS}/{name}" in ready["message"]
    assert expected_text in ready["message"]
    verified = cond(s, "CertsVerified")
    assert verified["status"] == "Unknown"
    assert s["phase"] == "Failed"


def test_undecodable_secret_value_is_not_ready() -> None:
    objects = good_objects()
    bad = secret(NAMES.node_secret, "node")
    bad["data"]["tls.crt"] = "!!!not base64"
    objects[SECRET][NAMES.node_secret] = bad
    ready = cond(st.compute_status(observed(objects), NOW), "CertsReady")
    assert ready["status"] == "False"
    assert "tls.crt (not base64" in ready["message"]


def _node_secret_with(leaf: str) -> dict[str, dict[str, Obj | None]]:
    objects = good_objects()
    objects[SECRET][NAMES.node_secret] = secret(NAMES.node_secret, leaf)
    return objects


def test_cert_from_another_ca_is_not_verified() -> None:
    s = st.compute_status(observed(_node_secret_with("foreign_node")), NOW)
    verified = cond(s, "CertsVerified")
    assert verified["status"] == "False"
    assert verified["reason"] == "WrongCA"
    assert "nodeControllerCert" in verified["message"]
    assert cond(s, "CertsReady")["status"] == "True"
    assert s["phase"] == "Failed"
    assert "CertsVerified is False (WrongCA)" in s["reason"]


def test_different_ca_in_the_two_secrets_is_reported() -> None:
    """The node side trusts another CA only: the node drivers would reject the registry."""
    objects = good_objects()
    node = secret(NAMES.node_secret, "node")
    node["data"]["ca.crt"] = _b64(_pki()["other_ca"].cert_pem)
    objects[SECRET][NAMES.node_secret] = node
    verified = cond(st.compute_status(observed(objects), NOW), "CertsVerified")
    assert verified["status"] == "False"
    assert verified["reason"] == "CAMismatch"
    assert "not signed by any CA in the node side's ca.crt" in verified["message"]


def test_a_trust_bundle_on_one_side_only_is_accepted() -> None:
    """Stage 1 of a CA change, half applied (the registry Secret updated, the node Secret
    not yet): each side still accepts the other, so the driver works and CertsVerified is
    True. The old rule (both ca.crt must be equal) reported CAMismatch here."""
    pki = _pki()
    bundle = pki["ca"].cert_pem + pki["other_ca"].cert_pem
    for side in (NAMES.registry_secret, NAMES.node_secret):
        objects = good_objects()
        changed = secret(side, "registry" if side == NAMES.registry_secret else "node")
        changed["data"]["ca.crt"] = _b64(bundle)
        objects[SECRET][side] = changed
        verified = cond(st.compute_status(observed(objects), NOW), "CertsVerified")
        assert (verified["status"], verified["reason"]) == ("True", "CertsValid"), verified


def test_cert_expiring_soon_is_true_with_warning() -> None:
    s = st.compute_status(observed(_node_secret_with("short_node")), NOW)
    verified = cond(s, "CertsVerified")
    assert verified["status"] == "True"
    assert verified["reason"] == "ExpiringSoon"
    assert "within 30 days" in verified["message"]
    assert s["phase"] == "Running"


def test_expired_cert_is_not_verified() -> None:
    s = st.compute_status(observed(_node_secret_with("short_node")), NOW + dt.timedelta(days=11))
    verified = cond(s, "CertsVerified")
    assert verified["status"] == "False"
    assert verified["reason"] == "Expired"


# ------------------------------------------------------------------------------ timestamps


def test_last_transition_time_kept_without_flip_and_moved_on_flip() -> None:
    first = st.compute_status(observed(), NOW)
    # Same state later: every timestamp except lastUpdated is carried over.
    again = st.compute_status(observed(status=first), LATER)
    assert [c["lastTransitionTime"] for c in again["conditions"]] == [NOW_S] * 3
    assert [c["lastUpdated"] for c in again["driverComponents"]] == [NOW_S] * 2
    assert again["lastUpdated"] == LATER_S
    assert st.status_equal_ignoring_time(first, again)

    # DaemonSet vanishes: DriverDeployed flips, Node changes; the others keep their times.
    objects = good_objects()
    objects[DAEMON_SET][NAMES.node_driver] = None
    flipped = st.compute_status(observed(objects, status=again), LATER)
    assert cond(flipped, "DriverDeployed")["lastTransitionTime"] == LATER_S
    assert cond(flipped, "CertsReady")["lastTransitionTime"] == NOW_S
    assert cond(flipped, "CertsVerified")["lastTransitionTime"] == NOW_S
    assert comp(flipped, "Node")["lastUpdated"] == LATER_S
    assert comp(flipped, "Controller")["lastUpdated"] == NOW_S
    assert not st.status_equal_ignoring_time(again, flipped)


def test_message_change_without_flip_keeps_transition_time() -> None:
    pods = [*node_pods(2), pod(BAD, "worker-2", ready=False, waiting="ErrImagePull")]
    first = st.compute_status(observed(with_changes(ds=daemonset(3, 2)), nodepods=pods), NOW)
    pods[2] = pod(BAD, "worker-2", ready=False, waiting="ImagePullBackOff")
    second = st.compute_status(
        observed(with_changes(ds=daemonset(3, 2)), nodepods=pods, status=first), LATER
    )
    # The Node reason changed, but only in the pod's problem text (the kubelet's back-off),
    # which is no progress: its lastUpdated stays (test_status_scale.py); no condition flipped.
    assert comp(second, "Node")["reason"] != comp(first, "Node")["reason"]
    assert comp(second, "Node")["lastUpdated"] == NOW_S
    assert [c["lastTransitionTime"] for c in second["conditions"]] == [NOW_S] * 3
    assert not st.status_equal_ignoring_time(first, second)


def test_naive_now_is_treated_as_utc() -> None:
    s = st.compute_status(observed(), NOW.replace(tzinfo=None))
    assert s["lastUpdated"] == NOW_S


# ------------------------------------------------------------------------------ equality


def test_equality_ignores_only_timestamps() -> None:
    a = st.compute_status(observed(), NOW)
    b = copy.deepcopy(a)
    b["lastUpdated"] = LATER_S
    for c in b["conditions"]:
        c["lastTransitionTime"] = LATER_S
    for c in b["driverComponents"]:
        c["lastUpdated"] = LATER_S
    assert st.status_equal_ignoring_time(a, b)
    assert st.semantic_key(a) == st.semantic_key(b)
    b["driverComponents"][1]["reason"] = "something else"
    assert not st.status_equal_ignoring_time(a, b)
    c = copy.deepcopy(a)
    c["observedGeneration"] = 5
    assert not st.status_equal_ignoring_time(a, c)


def test_equality_against_unobserved_status() -> None:
    assert st.status_equal_ignoring_time(None, {})
    assert not st.status_equal_ignoring_time({}, st.compute_status(observed(), NOW))


# ------------------------------------------------------------------------------ events


def _failed() -> Obj:
    objects = good_objects()
    objects[DAEMON_SET][NAMES.node_driver] = None
    return st.compute_status(observed(objects), NOW)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            {},
            "running",
            ("Normal", "Running", "Driver deployment successful"),
            id="new-to-running",
        ),
        pytest.param(None, "failed", ("Warning", "Failed", None), id="new-to-failed"),
        pytest.param("running", "failed", ("Warning", "Failed", None), id="running-to-failed"),
        pytest.param(
            "failed",
            "running",
            ("Normal", "Running", "Driver deployment successful"),
            id="failed-to-running",
        ),
        pytest.param("running", "running", None, id="running-stays"),
        pytest.param("failed", "failed", None, id="failed-stays"),
    ],
)
def test_phase_event(old: Any, new: str, expected: tuple[str, str, str | None] | None) -> None:
    statuses = {"running": st.compute_status(observed(), NOW), "failed": _failed()}
    old_status = statuses[old] if isinstance(old, str) else old
    new_status = statuses[new]
    event = st.phase_event(old_status, new_status)
    if expected is None:
        assert event is None
        return
    assert event is not None
    etype, reason, message = expected
    assert event[:2] == (etype, reason)
    if message is None:
        assert "DaemonSet/" in event[2] or "Node driver" in event[2]
        assert event[2] == new_status["reason"]
    else:
        assert event[2] == message


def test_no_event_for_unobserved_new_status() -> None:
    assert st.phase_event({"phase": "Running"}, {"phase": ""}) is None


# ------------------------------------------------------------------------------ verifier memo


def test_verifier_runs_once_per_content_and_time_interval() -> None:
    verifier = CertVerifier()
    o = observed(_node_secret_with("short_node"))
    first = st.compute_status(o, NOW, verify_certs=verifier)
    st.compute_status(o, LATER, verify_certs=verifier)
    assert verifier.calls == 1
    assert cond(first, "CertsVerified")["reason"] == "ExpiringSoon"
    # Crossing the certificate's expiry re-runs the verifier and changes the answer.
    expired = st.compute_status(o, NOW + dt.timedelta(days=11), verify_certs=verifier)
    assert verifier.calls == 2
    assert cond(expired, "CertsVerified")["reason"] == "Expired"
    # Different Secret contents are a different entry.
    st.compute_status(observed(), NOW, verify_certs=verifier)
    assert verifier.calls == 3


def test_verifier_crash_is_reported_not_raised() -> None:
    def broken(*_: Any, **__: Any) -> list[certs.CertProblem]:
        raise RuntimeError("boom")

    verified = cond(
        st.compute_status(observed(), NOW, verify_certs=CertVerifier(broken)), "CertsVerified"
    )
    # Nothing is known about the certificates: Unknown (issue 16), not False.
    assert verified["status"] == "Unknown"
    assert verified["reason"] == "VerificationFailed"
    assert "boom" in verified["message"]


# ------------------------------------------------------------------------------ kstatus phases


def test_finished_partitioned_statefulset_rollout_is_ready() -> None:
    """Pods below the partition stay at the old revision by design (kstatus: Current)."""
    ss = statefulset(2, 2, updated=1, update_revision="ctrl-2")
    ss["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    ss["status"]["currentReplicas"] = 1
    s = st.compute_status(observed(with_changes(ss=ss)), NOW)
    assert comp(s, "Controller")["status"] == "Ready", comp(s, "Controller")["reason"]
    assert s["phase"] == "Running"


def test_partitioned_rollout_not_yet_done_is_progressing() -> None:
    ss = statefulset(3, 3, updated=0, update_revision="ctrl-2")
    ss["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    s = st.compute_status(observed(with_changes(ss=ss)), NOW)
    assert "0 of 2 controller pod(s) updated" in comp(s, "Controller")["reason"]
    assert s["phase"] == "Progressing"


def test_progressing_turns_failed_after_the_progress_deadline() -> None:
    """No change of the unready component's reason for longer than the deadline: Failed."""
    objects = with_changes(ds=daemonset(3, 2))
    first = st.compute_status(observed(objects, nodepods=node_pods(2)), NOW)
    assert first["phase"] == "Progressing"
    deadline = st.DEFAULT_PROGRESS_DEADLINE
    same = observed(objects, nodepods=node_pods(2), status=first)
    assert st.compute_status(same, NOW + deadline)["phase"] == "Progressing"
    late = st.compute_status(same, NOW + deadline + dt.timedelta(seconds=1))
    assert late["phase"] == "Failed"
    assert late["reason"].startswith("No progress for more than 10 minute(s)")
    # Progress (another pod ready) restarts the clock.
    moved = observed(with_changes(ds=daemonset(3, 1)), nodepods=node_pods(1), status=first)
    assert st.compute_status(moved, NOW + deadline * 2)["phase"] == "Progressing"


def test_crash_loop_on_every_node_is_failed_at_once_and_names_the_pod() -> None:
    """No node serves: Failed at once (one crash loop of three is progress, issue 16)."""
    pods = [
        pod(f"{BAD}-{i}", f"worker-{i}", ready=False, waiting="CrashLoopBackOff") for i in range(3)
    ]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 0)), nodepods=pods), NOW)
    assert s["phase"] == "Failed"
    assert s["reason"].startswith(f"Node driver: pod {BAD}-0 on worker-0: CrashLoopBackOff")


def test_progressing_records_no_event_and_failed_still_warns() -> None:
    progressing = {"phase": "Progressing", "reason": "rollout"}
    assert st.phase_event({"phase": "Running"}, progressing) is None
    assert st.phase_event({"phase": ""}, progressing) is None
    assert st.phase_event(progressing, {"phase": "Running"})[:2] == ("Normal", "Running")
    assert st.phase_event(progressing, {"phase": "Failed", "reason": "x"})[:2] == (
        "Warning",
        "Failed",
    )


def test_crd_phase_enum_lists_exactly_the_phases() -> None:
    import pathlib

    import yaml

    crd = yaml.safe_load(
        (pathlib.Path(__file__).parents[2] / "crd/pmem-csi.intel.com_deployments.yaml").read_text()
    )
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions] == ["v1beta1", "v1alpha1"]
    for version in versions:  # both are served, so both carry the status schema
        props = version["schema"]["openAPIV3Schema"]["properties"]
        assert props["status"]["properties"]["phase"]["enum"] == list(st.PHASES), version["name"]


# ------------------------------------------------------------------------------ failed reads


def test_unreadable_secrets_are_unknown_not_missing() -> None:
    o = observed()
    o = dataclasses.replace(
        o,
        objects={**o.objects, "Secret": {}},
        unreadable={"Secret": "403 Forbidden"},
    )
    s = st.compute_status(o, NOW)
    ready = cond(s, "CertsReady")
    assert (ready["status"], ready["reason"]) == ("Unknown", "SecretsUnreadable")
    assert "403 Forbidden" in ready["message"] and "does not exist" not in ready["message"]
    assert cond(s, "CertsVerified")["status"] == "Unknown"
    assert cond(s, "DriverDeployed")["status"] == "Unknown"
    assert s["phase"] == "Progressing"
    assert st.phase_event({"phase": "Running"}, s) is None


def test_unreadable_kind_does_not_hide_a_readable_missing_object() -> None:
    objects = good_objects()
    objects["CSIDriver"][NAMES.csi_driver] = None
    o = dataclasses.replace(observed(objects), unreadable={"Service": "401 Unauthorized"})
    s = st.compute_status(o, NOW)
    assert cond(s, "DriverDeployed")["status"] == "False"
    assert s["phase"] == "Failed"
