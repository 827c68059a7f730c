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

Kept free of ``pulumi`` like the preflight: plain reads through :mod:`kubecall`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from pmem_components import kubecall
from pmem_components.config import DeploymentConfig, StackConfig
from pmem_components.manifests.bundle import CERTIFICATES_HASH_ANNOTATION


class RolloutReadError(RuntimeError):
    """The driver pods could not be listed; the message names the namespace and status."""


def _owned_by_driver(pod: Mapping[str, Any], cfg: DeploymentConfig) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    wanted = {
        ("StatefulSet", cfg.names.controller_driver),
        ("DaemonSet", cfg.names.node_driver),
    }
    return any((o.get("kind"), o.get("name")) in wanted for o in owners)


def pod_fingerprints(pods: list[Mapping[str, Any]], cfg: DeploymentConfig) -> list[str]:
    """The certificate fingerprint of every driver pod of ``cfg`` among ``pods`` ("" when a
    pod carries none), in the pods' order."""
    out = []
    for pod in pods:
        if not _owned_by_driver(pod, cfg):
            continue
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        out.append(str(annotations.get(CERTIFICATES_HASH_ANNOTATION, "")))
    return out


def running_fingerprints(api_client: Any, stack: StackConfig) -> dict[int, list[str]]:
    """Per deployment index with generated certificates: its driver pods' fingerprints.

    Raises :class:`RolloutReadError` when a list fails (the caller then treats the rollout
    as unknown, so no CA change advances).
    """
    out: dict[int, list[str]] = {}
    for i, cfg in enumerate(stack.deployments):
        if cfg.certificates.provided:
            continue  # nothing is staged for provided certificates
        selector = ",".join(f"{k}={v}" for k, v in cfg.names.selector_labels().items())
        path = f"/api/v1/namespaces/{quote(cfg.namespace)}/pods"
        resp = kubecall.request(
            api_client, "GET", path, timeout=15, query=[("labelSelector", selector)]
        )
        if resp.status == 404:
            out[i] = []
            continue
        if not 200 <= resp.status <= 299:
            raise RolloutReadError(
                f"listing pods in namespace {cfg.namespace}: {resp.status} {resp.reason}"
            )
        items = (json.loads(resp.body or b"{}") or {}).get("items") or []
        out[i] = pod_fingerprints(items, cfg)
    return out
