"""Who, besides Pulumi, owns fields of an object: read from ``metadata.managedFields``.

Server-side apply records, for every field of an object, the field manager that set it. The
Pulumi Kubernetes provider applies under a manager whose name starts with
``pulumi-kubernetes``; Kubernetes' own controllers write under theirs. Anything else owning a
field of the object itself (not of its ``status`` subresource) means someone changed it behind
Pulumi's back: ``kubectl edit`` (``kubectl-edit``), ``kubectl patch`` (``kubectl-patch``),
``kubectl label``, a controller or script doing a PUT. An Update that changes a value moves the
field's ownership to its writer, so this is also how a changed declared value shows.

Two users, one rule: the reporter names those objects and fields in the CR's status, and the
Pulumi program takes the fields over on ``pulumi up`` so that the declared state wins again (the
"override manager" idea of Flux's controllers). Pure and free of Pulumi and client imports, so
both can use it and unit tests need no cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

# The provider's managers: "pulumi-kubernetes" (client-side apply) and
# "pulumi-kubernetes-<random suffix>" (server-side apply, one per stack resource).
PULUMI_MANAGER_PREFIX = "pulumi-kubernetes"

# Kubernetes' own components: what they write belongs to the object's normal life.
CONTROL_PLANE_MANAGERS = frozenset(
    {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}
)


class ForeignOwner(NamedTuple):
    """One field manager that is neither Pulumi nor the control plane, with its fields."""

    manager: str
    operation: str
    paths: tuple[str, ...]


def is_pulumi_manager(manager: str) -> bool:
    return manager.startswith(PULUMI_MANAGER_PREFIX)


def is_foreign(entry: Mapping[str, Any]) -> bool:
    """A managedFields entry of someone else on the object itself (not a subresource)."""
    if entry.get("subresource"):
        return False
    manager = str(entry.get("manager") or "")
    return not is_pulumi_manager(manager) and manager not in CONTROL_PLANE_MANAGERS


def _key_label(raw: str) -> str:
    """``{"name":"x"}`` (a list entry's key fields) as ``name=x``."""
    try:
        key = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(key, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(key.items()))
    return str(key)


def _value_label(raw: str) -> str:
    try:
        return str(json.loads(raw))
    except ValueError:
        return raw


def field_paths(fields: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The leaf fields of a ``fieldsV1`` tree as dotted paths, in a stable order.

    ``f:name`` is a field, ``k:{...}`` a list entry by its key fields, ``v:...`` a set entry,
    ``i:N`` a list entry by index, ``.`` the node itself (implied by its children).
    """
    paths: list[str] = []
    children = [k for k in fields if k != "."]
    if not children:
        return [prefix] if prefix else []
    for key in sorted(children):
        kind, _, rest = key.partition(":")
        if kind == "f":
            step = f"{prefix}.{rest}" if prefix else rest
        elif kind == "k":
            step = f"{prefix}[{_key_label(rest)}]"
        elif kind == "v":
            step = f"{prefix}[={_value_label(rest)}]"
        elif kind == "i":
            step = f"{prefix}[{rest}]"
        else:
            step = f"{prefix}.{key}" if prefix else key
        sub = fields.get(key)
        paths.extend(field_paths(sub if isinstance(sub, Mapping) else {}, step))
    return paths


def foreign_owners(managed_fields: Iterable[Mapping[str, Any]] | None) -> list[ForeignOwner]:
    """Every foreign manager owning at least one field, in the order the API lists them."""
    owners: list[ForeignOwner] = []
    for entry in managed_fields or ():
        if not isinstance(entry, Mapping) or not is_foreign(entry):
            continue
        fields = entry.get("fieldsV1")
        paths = field_paths(fields) if isinstance(fields, Mapping) else []
        if paths:
            owners.append(
                ForeignOwner(
                    str(entry.get("manager")), str(entry.get("operation") or ""), tuple(paths)
                )
            )
    return owners


def describe(owners: Sequence[ForeignOwner], max_paths: int = 3) -> str:
    """``kubectl-edit (spec.replicas, metadata.labels.x and 2 more)``, one part per manager."""
    parts = []
    for owner in owners:
        shown = ", ".join(owner.paths[:max_paths])
        more = len(owner.paths) - max_paths
        if more > 0:
            shown += f" and {more} more"
        parts.append(f"{owner.manager} ({shown})")
    return "; ".join(parts)
