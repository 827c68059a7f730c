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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pulumi
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret, wrap_rpc_secret

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
        for obj in objs:
            current: Mapping[str, Any] = obj
            kind = kind_of("", obj)
            for entry in self.entries:
                if entry.selects(kind, current):
                    try:
                        before, current = current, entry.apply(current)
                    except PatchError as e:
                        problems.append(str(e))
                        break
                    problems += [
                        f"{entry.label}: {p}" for p in fixed_field_changes(before, current)
                    ]
        if problems:
            # One line per mistake, not per object it hits (an entry may select several).
            problems = list(dict.fromkeys(problems))
            raise PatchError("patches cannot be applied:\n  " + "\n  ".join(problems))

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
