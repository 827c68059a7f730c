"""Registering builder dicts as typed ``pulumi_kubernetes`` resources.

The manifest builders return plain Kubernetes objects; this module maps each
``apiVersion``/``kind`` to its typed resource class, so the engine gets the schema-aware
resource (diffs, await logic, secret handling of Secret data) instead of a generic YAML
object. Kinds without a typed class (our own CR) become ``apiextensions.CustomResource``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

_CLASSES: dict[tuple[str, str], Callable[..., pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("storage.k8s.io/v1", "CSIDriver"): k8s.storage.v1.CSIDriver,
    ("coordination.k8s.io/v1", "Lease"): k8s.coordination.v1.Lease,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): (
        k8s.apiextensions.v1.CustomResourceDefinition
    ),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def resource_name(obj: dict[str, Any]) -> str:
    """Pulumi name of an object: ``namespace/name`` or ``name``.

    Unique within a stack because Kubernetes names are unique per kind and namespace and the
    URN includes the resource type.
    """
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def type_token(obj: dict[str, Any]) -> str:
    """Pulumi type of an object: ``kubernetes:apps/v1:DaemonSet``, ``kubernetes:core/v1:...``.

    Custom resources get the same form (``kubernetes:pmem-csi.intel.com/v1beta1:Deployment``).
    """
    api_version = obj["apiVersion"]
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{obj['kind']}"


def register(
    obj: dict[str, Any], opts: pulumi.ResourceOptions, *, name_prefix: str = ""
) -> pulumi.CustomResource:
    """Create the Pulumi resource for one object dict (top-level keys become arguments).

    ``name_prefix`` goes in front of the resource name (not the object's name): components
    with a name of their own use it so that two instances never share a URN.
    """
    api_version, kind = obj["apiVersion"], obj["kind"]
    args = {_snake(k): v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    cls = _CLASSES.get((api_version, kind))
    rname = f"{name_prefix}{resource_name(obj)}"
    if cls is None:
        extra = set(args) - {"metadata", "spec"}
        if extra:
            raise ValueError(f"{kind}: unsupported top-level fields {sorted(extra)}")
        return k8s.apiextensions.CustomResource(
            rname, api_version=api_version, kind=kind, opts=opts, **args
        )
    return cls(rname, opts=opts, **args)
