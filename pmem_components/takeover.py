"""Field ownership take-over: what makes ``pulumi up`` win over edits made behind its back.

Why: the Kubernetes provider creates and updates by server-side apply under a field manager
of its own (``pulumi-kubernetes-<random>``, one per resource). When someone changes a field
with a PUT (``kubectl edit``, ``kubectl replace``, any client that reads, edits and writes
back) or a patch, the API server moves that field's ownership to *their* manager. The
provider's next apply then either fails with a server-side-apply conflict (a manager it does
not know; pulumi/pulumi-kubernetes#2404) or, for what it does not see in its diff (a label or
a list item someone added), leaves their change in place for good.

The cure is Flux's "override manager" (fluxcd/helm-controller PR #1365): before applying,
move every field owned by a foreign manager into Pulumi's own apply entry, then apply with
force. Pulumi then owns what others touched: fields it declares get the declared value back,
fields it does not declare are removed by the apply (server-side apply deletes a field its
only owner stops applying).

This module is the pure half: managedFields in, the JSON Patch that rewrites them out. The
API calls are in :mod:`pmem_components.takeover_transform`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Who is foreign is fieldowners' rule, shared with the reporter, which names the same
# managers and fields in the CR's status until `pulumi up` takes them over.
from pmem_components.fieldowners import Allowance, is_foreign, is_pulumi_manager, split_entry

__all__ = ["TakeOver", "is_foreign", "merge_fields", "plan", "pulumi_entry"]


def merge_fields(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """The union of two ``fieldsV1`` trees (each a set of field paths as nested keys)."""
    out = copy.deepcopy(dict(ours))
    for key, sub in theirs.items():
        if key in out and isinstance(out[key], Mapping) and isinstance(sub, Mapping):
            out[key] = merge_fields(out[key], sub)
        else:
            out[key] = copy.deepcopy(sub)
    return out


@dataclass(frozen=True)
class TakeOver:
    """What :func:`plan` decided for one object."""

    manager: str  # Pulumi's manager that receives the fields
    foreign: tuple[str, ...]  # the managers whose entries go, in managedFields order
    patch: tuple[dict[str, Any], ...]  # RFC 6902 operations for the object


def pulumi_entry(managed_fields: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Pulumi's apply entry of the main resource (the newest, should there be several)."""
    applies = [
        e
        for e in managed_fields
        if is_pulumi_manager(str(e.get("manager", "")))
        and e.get("operation") == "Apply"
        and not e.get("subresource")
    ]
    return max(applies, key=lambda e: str(e.get("time") or "")) if applies else None


def stale_pulumi_entries(
    managed_fields: Sequence[Mapping[str, Any]], own_manager: str
) -> list[Mapping[str, Any]]:
    """Entries of Pulumi managers other than this stack's own (``own_manager``, which its
    state records per object): what an earlier stack, or a same-named stack elsewhere, left
    on an object this stack adopted. Kept, such an entry co-owns every field it set, so the
    first change of one of them fails with a server-side apply conflict (the provider forces
    only with ``pulumi.com/patchForce``), and a field this stack stops declaring stays."""
    return [
        e
        for e in managed_fields
        if is_pulumi_manager(str(e.get("manager", "")))
        and str(e.get("manager", "")) != own_manager
        and not e.get("subresource")
    ]


def plan(
    managed_fields: Sequence[Mapping[str, Any]],
    resource_version: str,
    allowed: Sequence[Allowance] = (),
    own_manager: str | None = None,
    stale_only: bool = False,
) -> TakeOver | None:
    """The take-over for an object with these managedFields, or None when there is nothing to
    take (no foreign entry) or nobody to give it to (Pulumi has not applied the object yet:
    then the provider creates or adopts it, see ``adoptExisting``).

    The patch first tests ``resourceVersion``: if someone writes the object in between, the
    patch fails instead of dropping their new entry unseen.

    Fields the ownership policy allows their manager (``allowed``: the administrator's
    entries, on top of :data:`pmem_components.fieldowners.BUILT_IN_ALLOWED`) stay with it: its
    entry is kept with just those fields.

    ``own_manager``: this stack's field manager for the object, when known (the state's, or
    the provider's answer to a create): then it receives the fields, and every other Pulumi
    manager's entry is taken too (:func:`stale_pulumi_entries`). ``stale_only``: take only
    those (namespaces, whose other managers' labels stay theirs).
    """
    foreign = [] if stale_only else [e for e in managed_fields if is_foreign(e, allowed)]
    if own_manager:
        own = [
            e
            for e in managed_fields
            if e.get("manager") == own_manager
            and e.get("operation") == "Apply"
            and not e.get("subresource")
        ]
        # None of ours: another stack took the object over, and this one takes it back
        # (pmem-csi:adopt); the newest Pulumi entry becomes this stack's.
        ours = own[0] if own else pulumi_entry(managed_fields)
        stale = stale_pulumi_entries(managed_fields, own_manager)
        foreign += [e for e in stale if e is not ours and not any(e is f for f in foreign)]
        if ours is not None and not own:
            foreign.append(ours)
    else:
        ours = pulumi_entry(managed_fields)
    if not foreign or ours is None:
        return None
    merged = dict(ours)
    if own_manager:
        merged["manager"] = own_manager
    fields: Mapping[str, Any] = ours.get("fieldsV1") or {}
    entries: list[dict[str, Any]] = []
    for e in managed_fields:
        if e is ours:
            entries.append(merged)
        elif any(e is f for f in foreign) and is_pulumi_manager(str(e.get("manager", ""))):
            fields = merge_fields(fields, e.get("fieldsV1") or {})  # a stale Pulumi entry
        elif any(e is f for f in foreign):
            rest, kept = split_entry(e, allowed)
            fields = merge_fields(fields, rest)
            if kept:
                entries.append({**e, "fieldsV1": kept})
        else:
            entries.append(dict(e))
    merged["fieldsV1"] = fields
    patch = (
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "replace", "path": "/metadata/managedFields", "value": entries},
    )
    names = tuple(dict.fromkeys(str(e.get("manager", "")) for e in foreign))
    return TakeOver(manager=str(merged["manager"]), foreign=names, patch=patch)
