"""Registering builder dicts as Kubernetes resources of the Pulumi Kubernetes provider.

The manifest builders return plain Kubernetes objects; each becomes a custom resource of the
``kubernetes`` package with the type token the provider's typed classes use
(``kubernetes:apps/v1:DaemonSet``), so the engine and the provider treat it exactly like one:
schema-aware diffs, await logic, server-side apply. What the typed classes add is done here
too: the provider version of the installed ``pulumi_kubernetes`` package, and Secret data as
secrets (inputs wrapped, outputs marked).

Why not the typed classes themselves: importing them costs about a quarter of a second on
every ``pulumi`` command (``pulumi_kubernetes.core.v1`` alone loads ~40,000 lines of input
types), a sixth of a no-op ``pulumi up``, for properties this program passes as plain dicts.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

import pulumi

# Fields the provider reports back and that hold key material (the typed Secret class's list).
_SECRET_FIELDS = {("v1", "Secret"): ("data", "stringData")}


@functools.cache
def provider_version() -> str:
    """The provider plugin the installed SDK package was generated for (as its classes ask)."""
    return importlib.metadata.version("pulumi_kubernetes")


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
    """Create the Pulumi resource for one object dict (its top-level fields are the inputs).

    ``name_prefix`` goes in front of the resource name (not the object's name): components
    with a name of their own use it so that two instances never share a URN.
    """
    props: dict[str, Any] = dict(obj)
    secret_fields = _SECRET_FIELDS.get((obj["apiVersion"], obj["kind"]), ())
    for key in secret_fields:
        if props.get(key) is not None:
            props[key] = pulumi.Output.secret(props[key])
    defaults = pulumi.ResourceOptions(
        version=provider_version(), additional_secret_outputs=list(secret_fields) or None
    )
    return pulumi.CustomResource(
        type_token(obj),
        f"{name_prefix}{resource_name(obj)}",
        props,
        pulumi.ResourceOptions.merge(defaults, opts),
    )
