"""Trimmed objects give exactly the status full objects give (reporter.trim keeps what is read).

Every pod shape the status tests use is decorated with the bulk a real API object carries
(managedFields, spec.containers, annotations, IPs), then the status is computed from the full
and from the trimmed objects: any field the status rules read but trim drops shows up here.
"""

from __future__ import annotations

import copy
import json

import test_status as ts

from reporter import status as st
from reporter import trim
from reporter.model import Observed


def bulky(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    meta["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:x": {}}}}]
    meta["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{" * 500}
    meta.setdefault("labels", {})["app.kubernetes.io/instance"] = ts.NAMES.hyphened
    obj.setdefault("spec", {})["containers"] = [
        {"name": "pmem-driver", "image": "x", "env": [{"name": f"E{i}"} for i in range(50)]}
    ]
    obj.setdefault("status", {})["podIP"] = "10.0.0.1"
    return obj


POD_CASES = [
    ts.node_pods(3),
    [*ts.node_pods(2), ts.pod(ts.BAD, "worker-2", ready=False, waiting="CrashLoopBackOff")],
    [*ts.node_pods(2), ts.pod(ts.BAD, "worker-2", ready=False, waiting="ErrImagePull")],
    [*ts.node_pods(2), ts.pod(ts.BAD, None, ready=False, unschedulable="0/3 nodes: memory")],
    [*ts.node_pods(2), ts.pod(ts.BAD, "worker-2", ready=False, phase="Pending")],
    [*ts.node_pods(2), ts.pod(ts.BAD, "worker-2", ready=False, phase="Failed")],
    [*ts.node_pods(2), ts.pod(ts.BAD, "worker-2", ready=False)],
]


def test_status_from_trimmed_objects_equals_status_from_full_objects() -> None:
    for pods in POD_CASES:
        objects = ts.with_changes(ds=ts.daemonset(3, 2))
        full = Observed(
            cr=ts.cr(),
            objects={
                k: {n: bulky(o) if o else o for n, o in v.items()} for k, v in objects.items()
            },
            controller_pods=[bulky(p) for p in ts.controller_pods()],
            node_pods=[bulky(p) for p in pods],
        )
        trimmed = Observed(
            cr=trim.custom_resource(full.cr),
            objects={
                k: {n: trim.BY_KIND[k](o) if o else o for n, o in v.items()}
                for k, v in full.objects.items()
            },
            controller_pods=[trim.pod(p) for p in full.controller_pods],
            node_pods=[trim.pod(p) for p in full.node_pods],
        )
        a = st.compute_status(full, ts.NOW)
        b = st.compute_status(trimmed, ts.NOW)
        assert a == b


def test_trimmed_objects_keep_only_the_field_owners_that_are_changes() -> None:
    """Drift shows the same from trimmed objects; Pulumi's and the kubelet's entries go."""
    objects = ts.good_objects()
    for kind, _, name in ts.expected_objects(ts.NAMES):
        obj = bulky(objects[kind][name] or {})
        obj["metadata"]["managedFields"] += [
            {"manager": "pulumi-kubernetes-1", "operation": "Apply", "fieldsV1": {"f:spec": {}}},
            {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {}}},
        ]
        objects[kind][name] = obj
    full = Observed(cr=ts.cr(), objects=objects, controller_pods=ts.controller_pods())
    trimmed_objects = {
        k: {n: trim.BY_KIND[k](o) for n, o in v.items() if o} for k, v in objects.items()
    }
    for by_name in trimmed_objects.values():
        for obj in by_name.values():
            assert [e["manager"] for e in obj["metadata"]["managedFields"]] == ["kubectl-edit"]
    trimmed = Observed(cr=ts.cr(), objects=trimmed_objects, controller_pods=ts.controller_pods())
    a = st.compute_status(full, ts.NOW)
    assert st.compute_status(trimmed, ts.NOW) == a
    assert ts.cond(a, "DriverDeployed")["reason"] == "ObjectsModified"


def test_a_trimmed_pod_is_a_small_fraction_of_the_full_one() -> None:
    full = bulky(ts.pod(ts.BAD, "worker-2", ready=False, waiting="CrashLoopBackOff"))
    assert len(json.dumps(trim.pod(full))) * 4 < len(json.dumps(full))
