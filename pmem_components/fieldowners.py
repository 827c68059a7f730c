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

**The policy: what others may own without it being drift.** Some writes by other actors are
part of operating the objects, and taking them back would undo the operator's action:
:data:`BUILT_IN_ALLOWED` lists them, each with its reason. An administrator extends the list
with the stack setting ``pmem-csi:allowedFieldOwners`` (``[{manager, paths, reason}]``); the
program passes the same entries to the reporter in :data:`ALLOWED_ENV` (JSON), so both judge
by one list. A field so allowed is neither reported (``ObjectsModified``) nor taken over, and
the provider's server-side apply leaves it alone because Pulumi does not own it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

# The provider's managers: "pulumi-kubernetes" (client-side apply) and
# "pulumi-kubernetes-<random suffix>" (server-side apply, one per stack resource).
PULUMI_MANAGER_PREFIX = "pulumi-kubernetes"

# Kubernetes' own components: what they write belongs to the object's normal life.
CONTROL_PLANE_MANAGERS = frozenset(
    {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}
)


class Allowance(NamedTuple):
    """Fields a manager other than Pulumi may own: ``paths`` as :func:`field_paths` writes
    them (a path also covers everything below it), and why."""

    manager: str
    paths: tuple[str, ...]
    reason: str


BUILT_IN_ALLOWED: tuple[Allowance, ...] = (
    Allowance(
        "kubectl-rollout",
        ("spec.template.metadata.annotations.kubectl.kubernetes.io/restartedAt",),
        "`kubectl rollout restart` restarts a workload's pods by stamping the pod template; "
        "removing the stamp would roll every pod a second time, and the restart is an "
        "operator's action, not a change of the declared state",
    ),
)
# The reporter's copy of the administrator's entries (set on its container by the program).
ALLOWED_ENV = "PMEM_CSI_ALLOWED_FIELD_OWNERS"


def parse_allowed(raw: Any, key: str) -> tuple[list[Allowance], list[str]]:
    """Administrator entries (``[{manager, paths, reason}]``) and the problems, by ``key``."""
    allowed: list[Allowance] = []
    problems: list[str] = []
    if raw is None:
        return allowed, problems
    if not isinstance(raw, list):
        return allowed, [f"{key}: must be a list of {{manager, paths, reason}}"]
    for i, item in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{where}: must be a mapping with manager, paths and reason")
            continue
        unknown = sorted(set(item) - {"manager", "paths", "reason"})
        if unknown:
            problems.append(f"{where}: unknown key(s) {', '.join(unknown)}")
        manager, paths, reason = item.get("manager"), item.get("paths"), item.get("reason")
        if not isinstance(manager, str) or not manager:
            problems.append(f"{where}.manager: must be a field manager's name")
        elif is_pulumi_manager(manager):
            problems.append(f"{where}.manager: {manager!r} is Pulumi's own manager")
        if (
            not isinstance(paths, list)
            or not paths
            or not all(isinstance(p, str) and p for p in paths)
        ):
            problems.append(f"{where}.paths: must be a non-empty list of field paths")
        elif isinstance(paths, list):
            problems.extend(
                f"{where}.paths[{j}]: {problem}"
                for j, path in enumerate(paths)
                if (problem := _path_problem(path))
            )
        if not isinstance(reason, str) or not reason.strip():
            problems.append(f"{where}.reason: say why this manager may own these fields")
        if not problems:
            allowed.append(Allowance(str(manager), tuple(paths), str(reason)))  # type: ignore[arg-type]
    return allowed, problems


def _path_problem(path: str) -> str | None:
    """Why an allowance path can match no field (None: it can). Paths are compared whole
    with :func:`field_paths`' form (:func:`_covers`), so a path in ``fieldsV1`` notation or
    with an empty step is accepted by nothing and would leave the fields it means drift."""
    example = "spec.template.metadata.annotations.kubectl.kubernetes.io/restartedAt"
    if re.search(r"(^|\.)[fkvi]:", path):
        return (
            f"{path!r} is in managedFields (fieldsV1) notation, which no field path has; "
            f"write the path as the reporter names fields, e.g. {example}"
        )
    if path.startswith(".") or path.endswith(".") or ".." in path:
        return f"{path!r} has an empty step; write e.g. {example}"
    return None


def policy(extra: Iterable[Allowance] | None = None) -> tuple[Allowance, ...]:
    """The built-in entries, plus ``extra`` or else those in :data:`ALLOWED_ENV`."""
    if extra is None:
        text = os.environ.get(ALLOWED_ENV)
        raw = json.loads(text) if text else None
        extra, _ = parse_allowed(raw, ALLOWED_ENV)
    return (*BUILT_IN_ALLOWED, *extra)


def _covers(allowed: str, path: str) -> bool:
    """The node at ``path`` is the allowed one. What is below it is covered with it:
    :func:`_split` tests every node's path on the way down and keeps an allowed node whole.
    No prefix test: keys hold dots, and ``metadata.labels.app`` must not cover the label
    ``app.kubernetes.io/name``."""
    return path == allowed


def _allowed_paths(manager: str, allowed: Iterable[Allowance]) -> tuple[str, ...]:
    return tuple(p for a in allowed if a.manager == manager for p in a.paths)


def _split(
    fields: Mapping[str, Any], allowed: tuple[str, ...], prefix: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``fields`` as (not allowed, allowed) trees; each leaf goes to exactly one of them, and
    a node's own ``.`` marker to the first of them that holds anything below it."""
    children = [k for k in fields if k != "."]
    if not allowed or not children:
        return dict(fields), {}
    rest: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for key in children:
        step = _step(prefix, key)
        sub = fields.get(key)
        sub = sub if isinstance(sub, Mapping) else {}
        if any(_covers(a, step) for a in allowed):
            kept[key] = dict(sub)
            continue
        r, k = _split(sub, allowed, step)
        if r or not sub:
            rest[key] = r
        if k:
            kept[key] = k
    if "." in fields:
        (rest if rest else kept)["."] = {}
    return rest, kept


def split_entry(
    entry: Mapping[str, Any], allowed: Iterable[Allowance] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An entry's ``fieldsV1`` as (fields it may not own, fields the policy allows it)."""
    fields = entry.get("fieldsV1")
    fields = fields if isinstance(fields, Mapping) else {}
    return _split(fields, _allowed_paths(str(entry.get("manager") or ""), policy(allowed)))


class ForeignOwner(NamedTuple):
    """One field manager that is neither Pulumi nor the control plane, with its fields."""

    manager: str
    operation: str
    paths: tuple[str, ...]


def is_pulumi_manager(manager: str) -> bool:
    return manager.startswith(PULUMI_MANAGER_PREFIX)


def is_other_manager(entry: Mapping[str, Any]) -> bool:
    """A managedFields entry of someone else on the object itself (not a subresource)."""
    if entry.get("subresource"):
        return False
    manager = str(entry.get("manager") or "")
    return not is_pulumi_manager(manager) and manager not in CONTROL_PLANE_MANAGERS


def is_foreign(entry: Mapping[str, Any], allowed: Iterable[Allowance] | None = None) -> bool:
    """An entry of someone else (:func:`is_other_manager`) owning a field the policy does not
    allow them (``allowed``: the administrator's entries; None reads :data:`ALLOWED_ENV`).

    An entry that owns no field at all counts as foreign (an empty Update entry of
    ``kubectl-edit`` is still an edit); one that owns only allowed fields does not.
    """
    if not is_other_manager(entry):
        return False
    fields = entry.get("fieldsV1")
    if not isinstance(fields, Mapping) or not fields:
        return True
    rest, _ = split_entry(entry, allowed)
    return bool(rest)


def _step(prefix: str, key: str) -> str:
    """The path of child ``key`` (a fieldsV1 key) below ``prefix``, as :func:`field_paths`."""
    kind, _, rest = key.partition(":")
    if kind == "f":
        return f"{prefix}.{rest}" if prefix else rest
    if kind == "k":
        return f"{prefix}[{_key_label(rest)}]"
    if kind == "v":
        return f"{prefix}[={_value_label(rest)}]"
    if kind == "i":
        return f"{prefix}[{rest}]"
    return f"{prefix}.{key}" if prefix else key


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
        step = _step(prefix, key)
        sub = fields.get(key)
        paths.extend(field_paths(sub if isinstance(sub, Mapping) else {}, step))
    return paths


def foreign_owners(
    managed_fields: Iterable[Mapping[str, Any]] | None,
    allowed: Iterable[Allowance] | None = None,
) -> list[ForeignOwner]:
    """Every foreign manager owning at least one field the policy does not allow them, with
    those fields, in the order the API lists them."""
    owners: list[ForeignOwner] = []
    for entry in managed_fields or ():
        if not isinstance(entry, Mapping) or not is_other_manager(entry):
            continue
        rest, _ = split_entry(entry, allowed)
        paths = field_paths(rest)
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
