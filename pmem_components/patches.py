"""User patches (``pmem-csi:deployments[i].patches``) applied through Pulumi resource transforms.

The operator offered no way to adjust the objects it created; administrators worked around
it. Here each deployment may list patch entries that select Kubernetes objects by kind (and
optionally apiVersion, name and namespace) and change them with an RFC 7396 JSON merge patch or an
RFC 6902 JSON patch, just before Pulumi registers them.

Two moments matter:

* **Before anything is registered**, :meth:`PatchSet.dry_run` (or :func:`select`) runs the
  selectors (and the patches) against the builder output. The builders are pure, so the
  program knows every object in advance and can fail the preview on an entry that selects
  nothing, naming ``pmem-csi:deployments[i].patches[j]``, before it creates any resource.
* **While resources register**, :attr:`PatchSet.transform` rewrites the properties. It also
  counts matches, so :meth:`PatchSet.unmatched` can serve as a second, late safety net.

Transforms see properties in their wire form (``apiVersion``, ``metadata.name``...), the same
shape as the builders' dicts, so one selector works for both. Secret values arrive wrapped by
the SDK; their secretness is preserved per top-level property (``data``, ``stringData``...):
a property that held a secret before patching is secret after it.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pulumi
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret, wrap_rpc_secret

from pmem_components import patchtypes
from pmem_components.config import label_key_problem, label_value_problem
from pmem_components.names import SPEC_DIGEST_ANNOTATION

DEFAULT_WHERE = "pmem-csi:patches"
# The workloads the program stamps with ``names.SPEC_DIGEST_ANNOTATION`` (components.py).
DIGEST_KINDS = ("StatefulSet", "DaemonSet")


class PatchError(ValueError):
    """A patch entry is malformed, selects nothing, or cannot be applied."""


@dataclass(frozen=True)
class PatchEntry:
    """One normalised patch entry; ``label`` is its config key path for messages."""

    label: str
    kind: str
    name: str | None = None
    api_version: str | None = None
    namespace: str | None = None
    merge_patch: dict[str, Any] | None = None
    json_patch: list[dict[str, Any]] | None = None

    @classmethod
    def from_config(cls, raw: Any, label: str) -> PatchEntry:
        """Accept a ``config.Patch`` model or a raw config mapping (camelCase keys)."""

        def get(*keys: str) -> Any:
            for k in keys:
                if isinstance(raw, Mapping):
                    if raw.get(k) is not None:
                        return raw[k]
                elif getattr(raw, k, None) is not None:
                    return getattr(raw, k)
            return None

        kind = get("kind")
        api_version = get("api_version", "apiVersion")
        merge = get("merge_patch", "mergePatch")
        ops = get("json_patch", "jsonPatch")
        if not isinstance(kind, str) or not kind:
            raise PatchError(f"{label}.kind: must be a non-empty string")
        if api_version is not None and (not isinstance(api_version, str) or not api_version):
            raise PatchError(f"{label}.apiVersion: must be a non-empty string like apps/v1")
        if (merge is None) == (ops is None):
            raise PatchError(f"{label}: set exactly one of mergePatch and jsonPatch")
        if merge is not None and not isinstance(merge, Mapping):
            raise PatchError(f"{label}.mergePatch: must be an object")
        if ops is not None:
            if not isinstance(ops, Sequence) or isinstance(ops, str | bytes):
                raise PatchError(f"{label}.jsonPatch: must be a list of operations")
            try:
                jsonpatch.JsonPatch([dict(op) for op in ops])
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise PatchError(f"{label}.jsonPatch: {_describe(e)}") from None
            except (TypeError, ValueError):
                raise PatchError(f"{label}.jsonPatch: each operation must be an object") from None
        return cls(
            label=label,
            kind=kind,
            api_version=api_version,
            name=get("name"),
            namespace=get("namespace"),
            merge_patch=copy.deepcopy(dict(merge)) if merge is not None else None,
            json_patch=[copy.deepcopy(dict(op)) for op in ops] if ops is not None else None,
        )

    def selects(
        self, kind: str | None, obj: Mapping[str, Any], api_version: str | None = None
    ) -> bool:
        """Kind (and apiVersion when the entry names one), then name and namespace."""
        if kind != self.kind:
            return False
        if self.api_version is not None:
            got = api_version or obj.get("apiVersion")
            if got != self.api_version:
                return False
        meta = obj.get("metadata")
        meta = unwrap_rpc_secret(meta) if is_rpc_secret(meta) else meta
        if not isinstance(meta, Mapping):
            meta = {}
        if self.name is not None and meta.get("name") != self.name:
            return False
        return self.namespace is None or meta.get("namespace") == self.namespace

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The patched copy of ``obj``; ``obj`` itself is never modified."""
        try:
            if self.merge_patch is not None:
                result = merge_patch(obj, self.merge_patch)
            else:
                patch = jsonpatch.JsonPatch(copy.deepcopy(self.json_patch or []))
                result = patch.apply(_plain_copy(obj), in_place=True)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise PatchError(
                f"{self.label}: cannot apply jsonPatch to {self._what(obj)}: {_describe(e)}"
            ) from None
        except (KeyError, IndexError, TypeError) as e:
            raise PatchError(
                f"{self.label}: cannot apply patch to {self._what(obj)}: {type(e).__name__}: {e}"
            ) from None
        if not isinstance(result, dict):
            raise PatchError(f"{self.label}: patch replaced {self._what(obj)} by a non-object")
        return result

    def _what(self, obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return f"{self.kind} {name!r}" if name else self.kind


def _describe(err: Exception) -> str:
    """The library's error without the document excerpts it likes to append.

    jsonpointer says "member 'x' not found in {...}" and a failed ``test`` prints both values;
    the object may be a Secret, so neither may reach a message.
    """
    if isinstance(err, jsonpatch.JsonPatchTestFailed):
        return "a 'test' operation did not match"
    text = str(err)
    for marker in (" in {", " in ["):
        text = text.split(marker, 1)[0]
    return text[:200]


# A replayed step: (entry, operation index or None, the mismatches after it).
Step = tuple[PatchEntry | None, int | None, list[patchtypes.Mismatch]]


def _steps(obj: Mapping[str, Any], entries: Sequence[PatchEntry]) -> list[Step]:
    """The mismatches of ``obj`` and after each entry (each operation of a JSON patch):
    (entry, operation index or None, mismatches after it); the first is (None, None, ...)."""
    out: list[Step] = [(None, None, patchtypes.mismatches(obj))]
    current: Any = obj
    for entry in entries:
        if entry.merge_patch is not None:
            current = merge_patch(current, entry.merge_patch)
            out.append((entry, None, patchtypes.mismatches(current)))
            continue
        current = _plain_copy(current)
        for k, op in enumerate(entry.json_patch or []):
            current = jsonpatch.JsonPatch([copy.deepcopy(op)]).apply(current, in_place=True)
            out.append((entry, k, patchtypes.mismatches(current)))
    return out


def _blame(
    obj: Mapping[str, Any], entries: Sequence[PatchEntry], final: list[patchtypes.Mismatch]
) -> list[tuple[patchtypes.Mismatch, patchtypes.Source]]:
    """Each mismatch of the final object with the entry (operation) that wrote its value.

    A later patch may shift list items (an insert or a remove before them), so a value is
    followed by its :func:`patchtypes.shape` (path without list indices, type, value), not by
    its path: it was written by the step after which one more mismatch of that shape exists
    than before. Mismatches the builders' output had already are not the patches' (a unit
    test says there are none).
    """
    steps = _steps(obj, entries)
    counts = [Counter(patchtypes.shape(m) for m in ms) for _e, _k, ms in steps]
    out: list[tuple[patchtypes.Mismatch, patchtypes.Source]] = []
    groups: dict[tuple[Any, ...], list[patchtypes.Mismatch]] = {}
    for m in final:
        groups.setdefault(patchtypes.shape(m), []).append(m)
    for sh, members in groups.items():
        intros = [
            s
            for s in range(1, len(steps))
            for _ in range(counts[s][sh] - counts[s - 1][sh])
        ]
        # The newest writes are the ones that survive; fewer than the members: the rest
        # were there before any patch.
        intros = intros[-len(members) :]
        for m, s in zip(members[len(members) - len(intros) :], intros, strict=True):
            out.append((m, _step_source(steps, counts, s, sh)))
    return sorted(out, key=lambda pair: final.index(pair[0]))


def _step_source(
    steps: Sequence[Step], counts: Sequence[Counter[Any]], s: int, sh: tuple[Any, ...]
) -> patchtypes.Source:
    """Where step ``s`` (an entry, or operation of one) wrote the value of shape ``sh``.

    A copied (moved) value names the operation, where it was copied from and, when a patch
    wrote the value there, that patch's key (the one to fix).
    """
    entry, k, after = steps[s]
    assert entry is not None
    old = {m.path for m in steps[s - 1][2] if patchtypes.shape(m) == sh}
    cands = [m for m in after if patchtypes.shape(m) == sh]
    cands = [m for m in cands if m.path not in old] or cands
    found: list[tuple[patchtypes.Source, patchtypes.Mismatch]] = []
    for m in cands:
        if k is None:
            src = patchtypes.merge_source(entry.label, entry.merge_patch or {}, m.path)
        else:
            src = patchtypes.op_source(entry.label, k, (entry.json_patch or [])[k], m.path)
        if src is not None:
            found.append((src, m))
    if not found:
        return patchtypes.Source(
            entry.label if k is None else f"{entry.label}.jsonPatch[{k}]",
            False,
            "the value came from an earlier patch",
        )
    src, m = next((f for f in found if f[0].exact), found[0])
    if k is None or src.exact:
        return src
    op = (entry.json_patch or [])[k]
    if op.get("op") not in ("copy", "move"):
        return src
    # The value where it was copied from, in the object before this operation.
    rest = [str(p) for p in m.path[len(patchtypes.pointer(str(op.get("path", "")))) :]]
    origin = patchtypes.pointer(str(op.get("from", ""))) + rest
    there = next((x for x in steps[s - 1][2] if [str(p) for p in x.path] == origin), None)
    if there is None:
        return src
    sh2 = patchtypes.shape(there)
    wrote = [t for t in range(1, s) if counts[t][sh2] > counts[t - 1][sh2]]
    if not wrote:
        return src
    by = _step_source(steps, counts, wrote[-1], sh2)
    return patchtypes.Source(src.key, False, f"{src.note}, where {by.key} wrote it")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch; returns a new value and shares nothing with ``patch``.

    ``null`` in the patch deletes a key, objects merge recursively, anything else (lists
    included) replaces the target value. A non-object target is replaced by an object when
    the patch is one, as the RFC demands.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# What a patch may not change. The identity (apiVersion, kind, name, namespace) ties an object
# to its Pulumi resource and to the names the reporter looks for; a workload's selector is
# immutable in the API (an update is refused half way through ``pulumi up``) and must keep
# matching the pod template's labels, or the API server rejects the object on create.
IDENTITY_FIELDS = (("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"))
WORKLOAD_KINDS = frozenset({"DaemonSet", "StatefulSet", "Deployment", "ReplicaSet"})


def _at(obj: Any, path: Sequence[str]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def fixed_field_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Why ``after`` (a patched ``before``) is not acceptable; empty when it is."""
    problems = [
        f"{'.'.join(path)} cannot be patched ({_at(before, path)!r} -> {_at(after, path)!r})"
        for path in IDENTITY_FIELDS
        if _at(before, path) != _at(after, path)
    ]
    if before.get("kind") not in WORKLOAD_KINDS:
        return problems
    digest_path = ("metadata", "annotations", SPEC_DIGEST_ANNOTATION)
    if before.get("kind") in DIGEST_KINDS and _at(before, digest_path) != _at(after, digest_path):
        # The reporter tells by it which CR spec a workload has rolled out: without it
        # Running came too early, with another value never (review of issue 16).
        problems.append(
            f"metadata.annotations[{SPEC_DIGEST_ANNOTATION}] cannot be patched "
            f"({_at(before, digest_path)!r} -> {_at(after, digest_path)!r}): the status "
            "reporter reads it to tell which spec the workload has rolled out"
        )
    selector = _at(after, ("spec", "selector"))
    if selector != _at(before, ("spec", "selector")):
        problems.append(f"spec.selector cannot be patched on a {before.get('kind')} (immutable)")
    elif isinstance(selector, Mapping):
        labels = _at(after, ("spec", "template", "metadata", "labels"))
        labels = labels if isinstance(labels, Mapping) else {}
        wanted = selector.get("matchLabels")
        if isinstance(wanted, Mapping) and any(labels.get(k) != v for k, v in wanted.items()):
            problems.append("spec.template.metadata.labels must keep matching spec.selector")
    return problems


# Where an object (and a workload's pod template) carries the labels and annotations whose
# keys (and label values) the API server validates.
METADATA_PATHS = (("metadata",), ("spec", "template", "metadata"))
# Maps the API server checks with the same label rule (ValidateLabels): a pod's nodeSelector
# (the config's own nodeSelector has that check too) and a Service's selector. A workload's
# spec.selector is a LabelSelector object, and immutable (``fixed_field_changes``).
SELECTOR_PATHS: dict[str | None, tuple[tuple[str, ...], ...]] = {
    None: (("spec", "template", "spec", "nodeSelector"),),
    "Service": (("spec", "selector"),),
}
_ABSENT = object()


def _label_maps(kind: Any) -> list[tuple[tuple[str, ...], str, bool]]:
    """(path, what its keys are, whether its values are label values) of ``kind``."""
    maps = []
    for meta in METADATA_PATHS:
        maps.append(((*meta, "labels"), "label key", True))
        maps.append(((*meta, "annotations"), "annotation key", False))
    for path in (*SELECTOR_PATHS[None], *SELECTOR_PATHS.get(kind, ())):
        maps.append((path, "label key", True))
    return maps


def _entry(obj: Any, path: Sequence[str], key: Any) -> Any:
    found = _at(obj, path)
    return found.get(key, _ABSENT) if isinstance(found, Mapping) else _ABSENT


def label_problems(
    obj: Mapping[str, Any], states: Sequence[tuple[PatchEntry, Mapping[str, Any]]]
) -> list[str]:
    """The labels, annotation keys and selectors (a pod's nodeSelector, a Service's selector)
    of the patched ``obj`` the API server would refuse.

    ``states`` are the entries that selected ``obj``, each with the object after it. Only
    the final object counts (a later entry may repair a value); a bad key or value is blamed
    on the last entry that wrote it, and one the builders wrote is not a patch's (the
    configured labels have their config check). The rule is the config's
    (:func:`config.label_key_problem`): refused here, before anything is registered, not by
    the API server in the middle of ``pulumi up``.
    """
    if not states:
        return []
    final = states[-1][1]
    problems: list[str] = []
    for path, what, label_values in _label_maps(final.get("kind")):
        found = _at(final, path)
        if not isinstance(found, Mapping):
            continue  # a wrong type: patchtypes names it
        for key, value in found.items():
            # The API server lowers annotation keys before it checks them.
            text = str(key) if label_values else str(key).lower()
            wrong = [label_key_problem(text, what)]
            if label_values and isinstance(value, str):
                wrong.append(label_value_problem(value))
            if not any(wrong):
                continue
            writer, before = None, obj
            for entry, after in states:
                if _entry(before, path, key) != _entry(after, path, key):
                    writer = entry
                before = after
            if writer is None:
                continue
            where = f"{'.'.join(path)}[{json.dumps(str(key))}]"
            problems += [f"{writer.label}: {where}: {w}" for w in wrong if w]
    return problems


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted paths (``spec.podManagementPolicy``, ``roleRef.name``) where ``after`` differs.

    Lists are compared whole (a changed list is one path): that is how the API server names
    fields in its validation errors too, down to the list.
    """
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: list[str] = []
        for key in dict.fromkeys([*before, *after]):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += changed_paths(before.get(key), after.get(key), path)
        return out
    return [] if before == after else [prefix]


def _plain_copy(value: Any) -> Any:
    """Copy containers, share leaves (which may be Outputs that must not be deep-copied)."""
    if isinstance(value, Mapping):
        return {k: _plain_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_copy(v) for v in value]
    return value


def kind_of(type_: str, props: Mapping[str, Any]) -> str | None:
    """``kubernetes:apps/v1:DaemonSet`` -> ``DaemonSet``; other types fall back to props."""
    parts = type_.split(":")
    if len(parts) == 3 and parts[0] == "kubernetes" and "/" in parts[1]:
        return parts[2]
    kind = props.get("kind")
    return kind if isinstance(kind, str) else None


def api_version_of(type_: str, props: Mapping[str, Any]) -> str | None:
    """``kubernetes:apps/v1:DaemonSet`` -> ``apps/v1``, ``kubernetes:core/v1:Secret`` -> ``v1``.

    The props' own ``apiVersion`` wins (custom resources carry it, typed resources too).
    """
    value = props.get("apiVersion")
    if isinstance(value, str) and value:
        return value
    parts = type_.split(":")
    if len(parts) == 3 and parts[0] == "kubernetes" and "/" in parts[1]:
        group, version = parts[1].split("/", 1)
        return version if group == "core" else parts[1]
    return None


def _unwrap_top(props: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    secret_keys = {k for k, v in props.items() if is_rpc_secret(v)}
    plain = {k: unwrap_rpc_secret(v) if k in secret_keys else v for k, v in props.items()}
    return plain, secret_keys


def _rewrap_top(props: dict[str, Any], secret_keys: set[str]) -> dict[str, Any]:
    return {k: wrap_rpc_secret(v) if k in secret_keys else v for k, v in props.items()}


def _label_prefix(where: str) -> str:
    return where.rstrip(".")


@dataclass
class PatchSet:
    """The patches of one deployment: dry run, transform and bookkeeping of matches.

    ``where`` is the config path of the list, e.g. ``pmem-csi:deployments[0].patches``;
    entry ``j`` is reported as ``{where}[j]``.
    """

    entries: list[PatchEntry]
    matches: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, patches: Iterable[Any], where: str = DEFAULT_WHERE) -> PatchSet:
        """Normalise config entries; every malformed entry is reported in one error."""
        entries: list[PatchEntry] = []
        problems: list[str] = []
        for j, raw in enumerate(patches):
            try:
                entries.append(PatchEntry.from_config(raw, f"{_label_prefix(where)}[{j}]"))
            except PatchError as e:
                problems.append(str(e))
        if problems:
            raise PatchError("invalid patches:\n  " + "\n  ".join(problems))
        return cls(entries)

    @classmethod
    def for_deployment(cls, index: int, patches: Iterable[Any]) -> PatchSet:
        return cls.from_config(patches, f"pmem-csi:deployments[{index}].patches")

    # -- before registration ----------------------------------------------------------------

    def select(self, objects: Iterable[Mapping[str, Any]]) -> list[int]:
        """Indices of entries that select none of ``objects`` (builder output dicts)."""
        objs = list(objects)
        return [
            j
            for j, entry in enumerate(self.entries)
            if not any(entry.selects(kind_of("", o), o) for o in objs)
        ]

    def dry_run(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Fail early: raise :class:`PatchError` for entries that select nothing or fail.

        Call this with the builder output before registering any resource. Patches are
        applied to copies, so ``objects`` stay untouched; errors of all entries are collected.
        """
        objs = list(objects)
        problems = [
            f"{self.entries[j].label}: selects no object (kind={self.entries[j].kind!r}"
            + (
                f", apiVersion={self.entries[j].api_version!r}"
                if self.entries[j].api_version
                else ""
            )
            + (f", name={self.entries[j].name!r}" if self.entries[j].name else "")
            + (f", namespace={self.entries[j].namespace!r}" if self.entries[j].namespace else "")
            + ")"
            for j in self.select(objs)
        ]
        for entry in self.entries:
            if entry.api_version is not None:
                continue
            versions = sorted(
                {str(o.get("apiVersion")) for o in objs if entry.selects(kind_of("", o), o)}
            )
            if len(versions) > 1:
                problems.append(
                    f"{entry.label}: kind {entry.kind!r} selects objects of several "
                    f"apiVersions ({', '.join(versions)}); add apiVersion to choose"
                )
        # A wrong type in an entry that selects several objects is one mistake: one line.
        typed: dict[tuple[patchtypes.Source, patchtypes.Mismatch, bool], list[str]] = {}
        for obj in objs:
            found, mismatched = self._object_problems(obj)
            problems += found
            for src, m, secret in mismatched:
                typed.setdefault((src, m, secret), []).append(patchtypes.object_ref(obj))
        problems += [
            patchtypes.problem(src, ", ".join(refs), m, secret)
            for (src, m, secret), refs in typed.items()
        ]
        if problems:
            # One line per mistake, not per object it hits (an entry may select several).
            problems = list(dict.fromkeys(problems))
            raise PatchError("patches cannot be applied:\n  " + "\n  ".join(problems))

    def _object_problems(
        self, obj: Mapping[str, Any]
    ) -> tuple[list[str], list[tuple[patchtypes.Source, patchtypes.Mismatch, bool]]]:
        """What the entries selecting ``obj`` do wrong to it: failed applies, changed fixed
        fields and labels the API server refuses (as lines), values of the wrong type
        (:mod:`pmem_components.patchtypes`) as (where the value was written, mismatch, object
        is a Secret).

        Only the final object's types are checked (a later entry may repair a value). Only
        when something is wrong are the entries replayed, see :meth:`_blame`.
        """
        problems: list[str] = []
        current: Mapping[str, Any] = obj
        kind = kind_of("", obj)
        applied: list[PatchEntry] = []
        states: list[tuple[PatchEntry, Mapping[str, Any]]] = []
        for entry in self.entries:
            if not entry.selects(kind, current):
                continue
            try:
                before, current = current, entry.apply(current)
            except PatchError as e:
                return [*problems, str(e)], []
            applied.append(entry)
            states.append((entry, current))
            problems += [f"{entry.label}: {p}" for p in fixed_field_changes(before, current)]
        problems += label_problems(obj, states)
        final = patchtypes.mismatches(current) if applied else []
        if not final:
            return problems, []
        return problems, [(src, m, kind == "Secret") for m, src in _blame(obj, applied, final)]

    # -- during registration ----------------------------------------------------------------

    def apply(self, type_: str, props: Mapping[str, Any]) -> dict[str, Any] | None:
        """Patched props for a resource of type ``type_``, or None when no entry selects it."""
        kind = kind_of(type_, props)
        if kind is None:
            return None
        plain, secret_keys = _unwrap_top(props)
        api_version = api_version_of(type_, plain)
        changed = False
        for j, entry in enumerate(self.entries):
            if entry.selects(kind, plain, api_version):
                self.matches[j] = self.matches.get(j, 0) + 1
                plain = entry.apply(plain)
                changed = True
        if not changed:
            return None
        return _rewrap_top(plain, secret_keys)

    def transform(
        self, args: pulumi.ResourceTransformArgs
    ) -> pulumi.ResourceTransformResult | None:
        """A ``pulumi.ResourceTransform``: pass as ``ResourceOptions(transforms=[ps.transform])``.

        Only custom resources are patched; components (``ConfigGroup``, our own) pass through
        and their children are transformed one by one.
        """
        if not args.custom:
            return None
        props = self.apply(args.type_, args.props)
        if props is None:
            return None
        return pulumi.ResourceTransformResult(props=props, opts=args.opts)

    def unmatched(self) -> list[str]:
        """Labels of entries the transform has not applied to anything (so far)."""
        return [e.label for j, e in enumerate(self.entries) if not self.matches.get(j)]

    def check_all_matched(self) -> None:
        """Raise :class:`PatchError` naming every entry the transform never applied."""
        missing = self.unmatched()
        if missing:
            raise PatchError("patch entries selected no object: " + ", ".join(missing))


def select(patches: Iterable[Any], objects: Iterable[Mapping[str, Any]]) -> list[int]:
    """Indices of ``patches`` (config entries) that select none of ``objects``."""
    return PatchSet.from_config(patches).select(objects)
