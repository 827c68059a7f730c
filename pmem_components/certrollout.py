"""Which certificate material the driver pods run now: the signal a CA change waits for.

A CA change goes through three stages (:mod:`pmem_components.cert_resource`), and pods of two
adjacent stages always trust each other, pods two stages apart do not. So a stage may only
follow the previous one once no pod of the stage before that is left. Every driver pod
carries the fingerprint of the material its template was built with
(``bundle.CERTIFICATES_HASH_ANNOTATION``); this module lists the pods of the controller
StatefulSet and the node DaemonSet of each deployment, terminating ones included (they still
serve until they are gone), and returns their fingerprints.

Why the pods and not the workloads' status: a DaemonSet counts a node as updated while the
old pod on it may still be terminating, and a pod that is not owned by the current template
(restarted from the old one) is exactly what the gate must see. A pod without the annotation
(created before fingerprints existed) counts as running unknown material.

What is read, and how much: only deployments whose stored set is in the middle of a CA
change (the stage is in the stack's state, read by the preflight; a stable set's next step
never depends on the pods), their pods as metadata only (``PartialObjectMetadataList``) in
pages of ``PAGE_SIZE``, and the two workloads, whose desired pod counts tell an empty pod
list that means "no pod is wanted" from one that means "the pods are not there (yet)".
A workload whose status is missing or behind its spec (``observedGeneration``) holds the
stage: its count is not known yet. Pods count by their driver labels as well as by owner, so
orphaned ones (``kubectl delete ds --cascade=orphan``) are seen.

Kept free of ``pulumi`` like the preflight: plain reads through :mod:`kubecall`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

from pmem_components import kubecall, names
from pmem_components.config import DeploymentConfig, StackConfig
from pmem_components.manifests import labels as lbl
from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION

# Pods per list request: a page is a few hundred KiB of metadata at most.
PAGE_SIZE = 500
# The pods a stage warning names; the rest are counted.
HOLDING_BACK_LIMIT = 5
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# Stored stages during which the next step waits for the pods (cert_resource.TRUST/SWITCH).
STAGED_PHASES = ("trust", "switch")
# The dynamic resource's name for a deployment of the config face (components._certificates).
CERTIFICATES_RESOURCE_SUFFIX = "-certificates-generated"


class RolloutReadError(RuntimeError):
    """The driver pods could not be listed; the message names the namespace and status."""


@dataclass(frozen=True)
class RunningPod:
    """One driver pod as the gate sees it."""

    name: str
    fingerprint: str  # "" when the pod carries none (made before fingerprints existed)
    deleting_since: str | None = None  # metadata.deletionTimestamp: Terminating


@dataclass(frozen=True)
class Rollout:
    """The driver pods of one deployment, and the workloads that want pods but have none.

    ``missing``: ``"<Kind> <name>"`` with its desired count, for a workload whose pods were
    not listed at all: those pods will run some material, unknown here. ``unsettled``: a
    line per workload whose status is missing or older than its spec
    (``status.observedGeneration`` != ``metadata.generation``): its controller has not yet
    acted on the current template, so its pod count, and which pods it will make, are
    unknown.
    """

    pods: tuple[RunningPod, ...]
    missing: tuple[tuple[str, int], ...] = ()
    unsettled: tuple[str, ...] = ()
    # False: not read this run, since no CA change was under way when it started
    # (:func:`needs_pods`); the pods are then unknown to the gate, which is what a stage
    # taken in this very run needs anyway.
    read: bool = True
    # Why the read failed ("" when it did not): the pods are unknown, and unlike ``read``
    # False this holds the stage; the administrator's ``rolledOut`` does not move it either,
    # since the preflight was meant to see the pods (:func:`read_failed`).
    failed: str = ""
    # The stored stage when the pods were read (None: not known), so that the run which takes
    # the next stage can tell "the pods roll now" from "the pods hold the stage back".
    phase: str | None = None


# A deployment whose pods the preflight did not need to read.
UNREAD = Rollout((), read=False)
# What ``runningFingerprints`` holds for a failed read: one pod of unknown material, which is
# no stage's fingerprint, so the stage waits for the next ``pulumi up`` (cert_resource.next_step).
READ_FAILED_FINGERPRINT = "read-failed"


def read_failed(reason: str) -> Rollout:
    """The rollout of a deployment whose pods the preflight tried and failed to read."""
    return Rollout((), failed=reason or "unknown error")


def _owned_by_driver(pod: Mapping[str, Any], cfg: DeploymentConfig) -> str | None:
    """The kind of the driver workload owning ``pod`` (StatefulSet/DaemonSet), or None."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    wanted = {
        ("StatefulSet", cfg.names.controller_driver),
        ("DaemonSet", cfg.names.node_driver),
    }
    for o in owners:
        if (o.get("kind"), o.get("name")) in wanted:
            return str(o.get("kind"))
    return None


# The app.kubernetes.io/component values of driver pods (the reporter's carry the same
# selector labels but no certificates).
DRIVER_COMPONENTS = (lbl.COMPONENT_CONTROLLER, lbl.COMPONENT_NODE)


def _is_driver_pod(pod: Mapping[str, Any], cfg: DeploymentConfig) -> bool:
    """Owned by a driver workload, or labelled as a driver pod of this deployment whoever owns
    it: pods orphaned by ``kubectl delete ds --cascade=orphan`` still serve with the
    material they started with."""
    if _owned_by_driver(pod, cfg) is not None:
        return True
    labels = (pod.get("metadata") or {}).get("labels") or {}
    selector = cfg.names.selector_labels()
    return all(labels.get(k) == v for k, v in selector.items()) and (
        labels.get(names.LABEL_COMPONENT) in DRIVER_COMPONENTS
    )


def pod_fingerprints(pods: list[Mapping[str, Any]], cfg: DeploymentConfig) -> list[str]:
    """The certificate fingerprint of every driver pod of ``cfg`` among ``pods`` ("" when a
    pod carries none), in the pods' order."""
    return [p.fingerprint for p in rollout_of(pods, cfg).pods]


def rollout_of(
    pods: Sequence[Mapping[str, Any]],
    cfg: DeploymentConfig,
    desired: Mapping[str, int] | None = None,
    unsettled: Sequence[str] = (),
) -> Rollout:
    """The driver pods of ``cfg`` among ``pods`` (:func:`_is_driver_pod`); ``desired``: pods
    each workload kind wants (``DaemonSet``/``StatefulSet``), so that a workload wanting pods
    but owning none counts as running unknown material; ``unsettled``: see :class:`Rollout`."""
    out: list[RunningPod] = []
    kinds: set[str] = set()
    for pod in pods:
        if not _is_driver_pod(pod, cfg):
            continue
        kind = _owned_by_driver(pod, cfg)
        if kind is not None:
            kinds.add(kind)
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        out.append(
            RunningPod(
                name=str(meta.get("name") or ""),
                fingerprint=str(annotations.get(CERTIFICATES_HASH_ANNOTATION, "")),
                deleting_since=meta.get("deletionTimestamp") or None,
            )
        )
    workloads = (("StatefulSet", cfg.names.controller_driver), ("DaemonSet", cfg.names.node_driver))
    missing = tuple(
        (f"{kind} {name}", (desired or {}).get(kind, 0))
        for kind, name in workloads
        if (desired or {}).get(kind, 0) > 0 and kind not in kinds
    )
    return Rollout(tuple(out), missing, tuple(unsettled))


def as_fingerprints(running: Rollout | Sequence[str] | None) -> list[str] | None:
    """What the certificate resource gets as ``runningFingerprints``: None for unknown.

    A :class:`Rollout` (read from the cluster) gives its pods' fingerprints plus one unknown
    ("") per workload that wants pods but showed none, so an empty list means that no pod is
    wanted; a failed read gives ``[READ_FAILED_FINGERPRINT]``, which holds the stage (None
    would let ``certificates.rolledOut`` move it). A plain list (library use) carries no
    desired counts: empty is unknown.
    """
    if running is None:
        return None
    if isinstance(running, Rollout):
        if running.failed:
            return [READ_FAILED_FINGERPRINT]
        if not running.read:
            return None
        unknown = len(running.missing) + len(running.unsettled)
        return [p.fingerprint for p in running.pods] + [""] * unknown
    listed = [str(fp) for fp in running]
    return listed or None


def holding_back(rollout: Rollout, current: str, namespace: str) -> list[str]:
    """Lines naming what keeps a stage from its next step: pods not on ``current`` (at most
    ``HOLDING_BACK_LIMIT``, then a count) and workloads whose pods are not there, each with
    what to do."""
    lines = list(rollout.unsettled)
    for workload, count in rollout.missing:
        lines.append(
            f"{workload} wants {count} pod(s) but none is listed: wait until they run "
            f"(kubectl get pods -n {namespace})"
        )
    behind = [p for p in rollout.pods if p.fingerprint != current]
    for pod in behind[:HOLDING_BACK_LIMIT]:
        if pod.deleting_since:
            lines.append(
                f"pod {pod.name}: Terminating since {pod.deleting_since}; if its node is gone "
                f"or it hangs, remove it: kubectl delete pod -n {namespace} {pod.name} "
                "--grace-period=0 --force"
            )
        elif not pod.fingerprint:
            lines.append(
                f"pod {pod.name}: carries no {CERTIFICATES_HASH_ANNOTATION} (made from an older "
                f"template); delete it so that it restarts: kubectl delete pod -n {namespace} "
                f"{pod.name}"
            )
        else:
            lines.append(
                f"pod {pod.name}: runs certificates {pod.fingerprint}; wait for the rollout, or "
                f"with updateStrategy OnDelete delete it: kubectl delete pod -n {namespace} "
                f"{pod.name}"
            )
    if len(behind) > HOLDING_BACK_LIMIT:
        lines.append(f"and {len(behind) - HOLDING_BACK_LIMIT} more pod(s) not on {current}")
    return lines


def _get(api_client: Any, path: str, what: str) -> dict[str, Any] | None:
    resp = kubecall.request(api_client, "GET", path, timeout=15)
    if resp.status == 404:
        return None
    if not 200 <= resp.status <= 299:
        raise RolloutReadError(f"reading {what}: {resp.status} {resp.reason}")
    return json.loads(resp.body or b"{}") or {}


def _list_pods(api_client: Any, cfg: DeploymentConfig) -> list[dict[str, Any]]:
    selector = cfg.names.label_selector()
    path = f"/api/v1/namespaces/{quote(cfg.namespace)}/pods"
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        query = [("labelSelector", selector), ("limit", str(PAGE_SIZE))]
        if token:
            query.append(("continue", token))
        resp = kubecall.request(
            api_client, "GET", path, timeout=15, query=query, accept=METADATA_LIST
        )
        if resp.status == 404:
            return []
        if not 200 <= resp.status <= 299:
            # 410 included: an expired continue token; the next pulumi up reads afresh.
            raise RolloutReadError(
                f"listing pods in namespace {cfg.namespace}: {resp.status} {resp.reason}"
            )
        page = json.loads(resp.body or b"{}") or {}
        items += page.get("items") or []
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


def read_rollout(api_client: Any, cfg: DeploymentConfig) -> Rollout:
    """The driver pods of one deployment and its workloads' desired pod counts."""
    ns = quote(cfg.namespace)
    sts = _get(
        api_client,
        f"/apis/apps/v1/namespaces/{ns}/statefulsets/{quote(cfg.names.controller_driver)}",
        f"StatefulSet {cfg.names.controller_driver}",
    )
    ds = _get(
        api_client,
        f"/apis/apps/v1/namespaces/{ns}/daemonsets/{quote(cfg.names.node_driver)}",
        f"DaemonSet {cfg.names.node_driver}",
    )
    desired = {
        "StatefulSet": int(((sts or {}).get("spec") or {}).get("replicas", 1) or 0) if sts else 0,
        "DaemonSet": int(((ds or {}).get("status") or {}).get("desiredNumberScheduled") or 0),
    }
    unsettled = [
        line
        for kind, short, name, obj in (
            ("StatefulSet", "sts", cfg.names.controller_driver, sts),
            ("DaemonSet", "ds", cfg.names.node_driver, ds),
        )
        if (line := _unsettled(kind, short, name, obj, cfg.namespace))
    ]
    return rollout_of(_list_pods(api_client, cfg), cfg, desired, unsettled)


def _unsettled(kind: str, short: str, name: str, obj: Any, namespace: str) -> str:
    """A line when the workload's controller has not reported on its current spec ("" when it
    has, or when the workload does not exist: then only its orphaned pods count)."""
    if obj is None:
        return ""
    generation = (obj.get("metadata") or {}).get("generation")
    status = obj.get("status") or {}
    if status and status.get("observedGeneration") == generation:
        return ""
    seen = status.get("observedGeneration") if status else None
    what = "has no status yet" if not status else f"reports on generation {seen}"
    return (
        f"{kind} {name} {what} (its spec is generation {generation}): its pods are unknown "
        f"until its controller catches up; wait (kubectl get {short} -n {namespace} {name})"
    )


def needs_pods(stack: StackConfig, phases: Mapping[str, str] | None) -> list[int]:
    """Indexes of the deployments whose next certificate step depends on the pods.

    ``phases``: the stored stage of each certificate resource in the stack's state, by
    resource name (None: not known, so every deployment with generated certificates). A
    staged set whose name matches no deployment (renamed, or library use with a prefix)
    makes every deployment count: which one it is cannot be told here.
    """
    generated = [i for i, d in enumerate(stack.deployments) if not d.certificates.provided]
    if phases is None:
        return generated
    own = {
        f"{stack.deployments[i].names.hyphened}{CERTIFICATES_RESOURCE_SUFFIX}": i for i in generated
    }
    staged = {name for name, phase in phases.items() if phase in STAGED_PHASES}
    if any(name not in own for name in staged):
        return generated
    return [own[name] for name in staged]


def running_fingerprints(
    api_client: Any, stack: StackConfig, phases: Mapping[str, str] | None = None
) -> dict[int, Rollout]:
    """Per deployment index whose CA change waits for the pods (:func:`needs_pods`): its
    driver pods and workloads. A deployment left out needs no reading.

    Raises :class:`RolloutReadError` when a read fails (the caller then gives each of these
    deployments :func:`read_failed`, which holds its stage).
    """
    out: dict[int, Rollout] = {}
    for i in needs_pods(stack, phases):
        cfg = stack.deployments[i]
        stage = (phases or {}).get(f"{cfg.names.hyphened}{CERTIFICATES_RESOURCE_SUFFIX}")
        out[i] = replace(read_rollout(api_client, cfg), phase=stage)
    return out
