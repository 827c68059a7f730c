"""Keep only the fields the status rules read: the reporter's memory is its watch caches.

A full pod is about 65 KiB in Python (``managedFields``, the whole spec, every env var); at
thousands of nodes that alone exceeds the reporter's 256Mi limit, twice during a re-list.
The status computation (``reporter.status``) reads a handful of fields, so each object is cut
down to those on arrival, before it is cached. The result keeps the API's camelCase shape, so
the pure status code and its tests see the same structure as before.

When ``reporter.status`` starts reading a new field, it must be kept here too; the unit test
``tests/unit/test_reporter_trim.py`` computes statuses from trimmed and untrimmed objects and
requires them to be equal.
"""

from __future__ import annotations

from typing import Any

from pmem_components.fieldowners import is_foreign
from pmem_components.names import LABEL_INSTANCE, SPEC_DIGEST_ANNOTATION

Obj = dict[str, Any]

_META_KEYS = ("name", "namespace", "resourceVersion", "generation", "deletionTimestamp", "uid")


def _meta(obj: Obj, *, owners: bool = False, field_owners: bool = False) -> Obj:
    meta = obj.get("metadata") or {}
    out = {k: meta[k] for k in _META_KEYS if k in meta}
    if field_owners:
        # Only the entries of managers that changed the object behind Pulumi's back: usually
        # none, so drift detection costs nothing in the common case.
        foreign = [e for e in meta.get("managedFields") or [] if is_foreign(e)]
        if foreign:
            out["managedFields"] = foreign
    instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    if instance is not None:
        out["labels"] = {LABEL_INSTANCE: instance}
    if owners and meta.get("ownerReferences"):
        out["ownerReferences"] = [
            {"kind": r.get("kind"), "name": r.get("name")} for r in meta["ownerReferences"]
        ]
    return out


def _container_status(cs: Obj) -> Obj:
    state = cs.get("state") or {}
    kept: Obj = {}
    waiting = state.get("waiting")
    if waiting is not None:
        kept["waiting"] = {"reason": waiting.get("reason")}
    terminated = state.get("terminated")
    if terminated is not None:
        kept["terminated"] = {
            "reason": terminated.get("reason"),
            "exitCode": terminated.get("exitCode", 0),
        }
    return {"name": cs.get("name"), "ready": bool(cs.get("ready")), "state": kept}


def pod(obj: Obj) -> Obj:
    """Pod: owner, node, phase, conditions and container states (~1 KiB instead of ~65)."""
    status = obj.get("status") or {}
    out_status: Obj = {}
    for key in ("phase", "reason", "message"):
        if status.get(key):
            out_status[key] = status[key]
    out_status["conditions"] = [
        {k: c[k] for k in ("type", "status", "reason", "message") if c.get(k)}
        for c in status.get("conditions") or []
        if c.get("type") in ("Ready", "PodScheduled")
    ]
    for key in ("initContainerStatuses", "containerStatuses"):
        if status.get(key):
            out_status[key] = [_container_status(cs) for cs in status[key]]
    node = (obj.get("spec") or {}).get("nodeName")
    return {
        "kind": obj.get("kind", "Pod"),
        "metadata": _meta(obj, owners=True),
        "spec": {"nodeName": node} if node else {},
        "status": out_status,
    }


def workload(obj: Obj) -> Obj:
    """DaemonSet/StatefulSet: replicas, update strategy, the status counters and the digest of
    the CR spec they were built from."""
    spec = obj.get("spec") or {}
    kept_spec = {k: spec[k] for k in ("replicas", "updateStrategy") if k in spec}
    meta = _meta(obj, field_owners=True)
    digest = ((obj.get("metadata") or {}).get("annotations") or {}).get(SPEC_DIGEST_ANNOTATION)
    if digest is not None:
        meta["annotations"] = {SPEC_DIGEST_ANNOTATION: digest}
    return {
        "kind": obj.get("kind"),
        "metadata": meta,
        "spec": kept_spec,
        "status": dict(obj.get("status") or {}),
    }


def secret(obj: Obj) -> Obj:
    """Secret: only the three TLS entries the certificate checks read."""
    data = obj.get("data") or {}
    return {
        "kind": "Secret",
        "metadata": _meta(obj, field_owners=True),
        "data": {k: data[k] for k in ("ca.crt", "tls.crt", "tls.key") if k in data},
    }


def existence(obj: Obj) -> Obj:
    """Kinds whose existence and field owners are all the status rules check (RBAC, ...)."""
    return {"kind": obj.get("kind"), "metadata": _meta(obj, field_owners=True)}


def custom_resource(obj: Obj) -> Obj:
    """The Deployment CR: everything but annotations (last-applied copies) and the
    managedFields of Pulumi, the control plane and the status subresource (the reporter's own
    writes): the CR is watched for changes by others like every other object."""
    meta = dict(obj.get("metadata") or {})
    foreign = [e for e in meta.pop("managedFields", None) or [] if is_foreign(e)]
    if foreign:
        meta["managedFields"] = foreign
    meta.pop("annotations", None)
    return {**obj, "metadata": meta}


BY_KIND = {
    "Pod": pod,
    "DaemonSet": workload,
    "StatefulSet": workload,
    "Secret": secret,
    "ServiceAccount": existence,
    "Role": existence,
    "RoleBinding": existence,
    "ClusterRole": existence,
    "ClusterRoleBinding": existence,
    "Service": existence,
    "CSIDriver": existence,
}
