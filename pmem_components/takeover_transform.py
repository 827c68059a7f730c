"""Field take-over: writes only for what the update changes, only to the provider's cluster.

For every Kubernetes object of a deployment, when it is registered (a transform runs then,
with the final, resolved inputs), this reads the live object from the cluster the object's
Kubernetes provider uses (:class:`ClusterSource`, :mod:`pmem_components.kubetarget`) and
looks for fields owned by field managers other than Pulumi's and Kubernetes' own that the
ownership policy does not allow them (:mod:`pmem_components.fieldowners`). Nothing is
written then: a transform runs for every resource, also for those that ``--target`` /
``--exclude`` leave out and in a preview, and the program is not told which those are.

The writes happen in a ``before_update`` resource hook, which the engine runs only for a
resource it is about to update (never in a preview, never for a resource left out):

1. ``metadata.managedFields`` is rewritten with a JSON Patch: the foreign entries' fields
   are merged into Pulumi's apply entry (guarded by a ``resourceVersion`` test), fields the
   policy allows stay with their manager;
2. the declared object is applied with ``force`` under Pulumi's own field manager, so
   declared values come back and whatever others added is removed.

The provider's own update then finds the declared state and no conflict. In the update
hook, Pulumi's entry is the one of the manager the stack's state records for the resource
(``__fieldManager``), and entries of *other* Pulumi managers count as foreign: another or an
earlier stack's, left on an object this stack adopted (``pmem-csi:adopt``).

An ``after_create`` hook does the same for a create of an object that already existed (an
adoption: ``pmem-csi:adopt``, ``adoptExisting``, or what a cut-short create left), with the
manager the provider just created it under: the entries the earlier owner left are merged
into it at once. Left in place, an earlier stack's ``pulumi-kubernetes-<random>`` entry
co-owns every field it set, and the first later update that changes one of them without
``pulumi.com/patchForce`` fails with a server-side apply conflict (measured on a namespace
label, ``tests/e2e/test_identity.py``). Stack namespaces get these hooks with ``stale_only``:
only other Pulumi managers' entries go, administrators' labels stay theirs. So that a resource
whose *declared* fields someone changed is updated at all (its inputs did not change), the
transform sets :data:`TAKEN_OVER_ANNOTATION` to the live object's ``resourceVersion``: a new
input value, so the engine updates it -- only if it is not left out. A resource where others
own only fields the stack does not declare (a label they added) is not updated for that; the
fields go the next time the resource is updated. In a preview the annotation is unknown, so
the preview shows the update without the provider's dry run against the object as it is
(see :func:`_marked`); the CLI output names what ``pulumi up`` would take over.

Where the program cannot know for certain which cluster the provider uses (an explicit
provider whose kubeconfig is not known before the update, say), it sends nothing and says so.
With ``renderYamlToDirectory`` it sends nothing at all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import rpc

from pmem_components import fieldowners, kubecall, kubetarget, takeover

# Left alone: the CRD (the provider replaces it with a PUT and forces already) and
# namespaces, which administrators label for others' sake (pod security, network policies).
SKIPPED_TYPES = frozenset(
    {
        "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition",
        "kubernetes:core/v1:Namespace",
    }
)
REQUEST_TIMEOUT = 15
# Reads and patches of one object when someone else writes it in between.
ATTEMPTS = 5
# The resourceVersion at which `pulumi up` last took the object's declared fields back: a new
# value makes the engine update the object (see the module doc); unknown in a preview.
TAKEN_OVER_ANNOTATION = "pmem-csi.intel.com/fields-taken-over"


class TakeOverError(RuntimeError):
    """A take-over that could not be done (the update stops before the provider applies)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


async def _plain(value: Any) -> Any:
    """Resolved transform inputs as a plain object: secrets (wrapped or Outputs) unwrapped;
    raises :class:`_Unknown` for a value not known yet (a preview)."""
    if isinstance(value, pulumi.Output):
        if not await value.is_known():
            raise _Unknown
        value = await value.future()
    value = rpc.unwrap_rpc_secret(value)
    if value == rpc.UNKNOWN:
        raise _Unknown
    if isinstance(value, dict):
        # None means "not set" in the inputs; in an apply it would mean something else.
        return {k: await _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [await _plain(v) for v in value]
    return value


class _Unknown(Exception):
    pass


class KubeApi:
    """The three calls the take-over needs, through the Kubernetes client's auth and TLS."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any] | None:
        status, _, data = kubecall.request(
            self.api,
            method,
            path,
            timeout=REQUEST_TIMEOUT,
            body=body,
            content_type=content_type,
            query=query,
        )
        if status == 404 and method == "GET":
            return None
        if not 200 <= status <= 299:
            # The API server's reason, unless the object is a Secret: never risk echoing
            # key material into the CLI output.
            text = "" if "/secrets/" in path else f": {data[:300].decode(errors='replace')}"
            raise TakeOverError(f"{method} {path}: HTTP {status}{text}", status)
        return json.loads(data or b"{}")

    def get(self, path: str) -> dict[str, Any] | None:
        return self._call("GET", path)

    def json_patch(self, path: str, ops: Any, manager: str) -> dict[str, Any] | None:
        return self._call(
            "PATCH", path, list(ops), "application/json-patch+json", [("fieldManager", manager)]
        )

    def apply(self, path: str, obj: dict[str, Any], manager: str) -> dict[str, Any] | None:
        query = [("fieldManager", manager), ("force", "true")]
        return self._call("PATCH", path, obj, "application/apply-patch+yaml", query)


def object_path(obj: dict[str, Any]) -> str:
    from pmem_components.preflight import _path

    meta = obj.get("metadata") or {}
    return _path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{meta.get('name')}"


@dataclass(frozen=True)
class Outcome:
    """What :func:`correct` did (or, in a dry run, would do) to one object."""

    plan: takeover.TakeOver
    message: str  # the CLI line


def correct(
    api: KubeApi,
    obj: dict[str, Any],
    dry_run: bool,
    allowed: Sequence[fieldowners.Allowance] = (),
    own_manager: str | None = None,
    stale_only: bool = False,
    apply: bool = True,
) -> Outcome | None:
    """Take over one object (see the module docstring); returns what was taken, if anything.

    In a dry run nothing is written; the message says what ``pulumi up`` would do.
    ``own_manager`` (this stack's field manager of the object) and ``stale_only``: see
    :func:`pmem_components.takeover.plan`. ``apply`` False: only the managedFields are
    rewritten (the provider applies next, or has just applied).
    """
    path = object_path(obj)
    for attempt in range(ATTEMPTS):
        live = api.get(path)
        if live is None:
            return None  # not there: the provider creates it
        meta = live.get("metadata") or {}
        managed = meta.get("managedFields") or []
        version = str(meta.get("resourceVersion", ""))
        plan = takeover.plan(
            managed, version, allowed, own_manager=own_manager, stale_only=stale_only
        )
        if plan is None:
            return None
        owners = [] if stale_only else fieldowners.foreign_owners(managed, allowed)
        what = fieldowners.describe(owners) or ", ".join(plan.foreign)
        if dry_run:
            return Outcome(plan, f"pulumi up would take over fields of {describe(obj)} ({what})")
        try:
            api.json_patch(path, plan.patch, plan.manager)
        except TakeOverError as err:
            # Written in between (a controller's status update, say): the resourceVersion
            # test failed. Read again.
            if err.status in (409, 422) and attempt + 1 < ATTEMPTS:
                continue
            raise
        if not apply:
            return Outcome(plan, f"took over the fields of {describe(obj)} from {what}")
        api.apply(path, obj, plan.manager)
        return Outcome(plan, f"took over fields of {describe(obj)} and applied it ({what})")
    return None


def owns_declared(fields: Any, declared: Any) -> bool:
    """Whether a ``fieldsV1`` tree names a field that the declared object sets.

    Walks both together: ``f:x`` a key, ``k:{...}`` the list item whose fields match, ``v:x``
    a set member, ``i:N`` a list index. Used to tell a changed declared value (the resource
    must be updated) from fields others only added (left until the next update).
    """
    if not isinstance(fields, Mapping):
        return False
    for key, sub in fields.items():
        if key == ".":
            continue
        kind, _, rest = key.partition(":")
        child: Any = _MISSING
        if kind == "f" and isinstance(declared, Mapping):
            child = declared.get(rest, _MISSING)
        elif kind == "k" and isinstance(declared, list):
            try:
                want = json.loads(rest)
            except ValueError:
                continue
            child = next(
                (i for i in declared if isinstance(i, Mapping) and _key_matches(i, want)),
                _MISSING,
            )
        elif kind == "v" and isinstance(declared, list):
            try:
                if json.loads(rest) in declared:
                    return True
            except ValueError:
                continue
        elif (
            kind == "i"
            and isinstance(declared, list)
            and rest.isdigit()
            and (int(rest) < len(declared))
        ):
            child = declared[int(rest)]
        if child is _MISSING:
            continue
        leaf = not [k for k in (sub or {}) if k != "."]
        if leaf or not isinstance(child, Mapping | list) or owns_declared(sub, child):
            return True
    return False


_MISSING = object()
# List-map key fields the API server defaults when the declared entry leaves them out, and
# their defaults: container and Service ports are keyed by port and protocol, and a port
# declared without protocol is recorded as ``k:{"containerPort":9090,"protocol":"TCP"}``.
KEY_DEFAULTS: Mapping[str, Any] = {"protocol": "TCP"}


def _key_matches(item: Mapping[str, Any], want: Any) -> bool:
    """Whether the declared list entry ``item`` is the one a ``k:{...}`` key names."""
    if not isinstance(want, Mapping):
        return False
    return all(str(item.get(k, KEY_DEFAULTS.get(k))) == str(v) for k, v in want.items())


_EXECUTORS: list[concurrent.futures.ThreadPoolExecutor] = []


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """Threads of our own for the blocking API calls. Not the event loop's default executor:
    the Pulumi SDK blocks its threads in RegisterResource calls, which wait for this
    transform; with many resources they are all taken and the update would hang."""
    if not _EXECUTORS:
        _EXECUTORS.append(
            concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="takeover")
        )
    return _EXECUTORS[0]


class UnknownCluster(Exception):
    """The program cannot tell for certain which cluster the provider uses."""


# The explicit provider's arguments that choose its cluster, as the Python SDK names them.
_PROVIDER_ARGS = {
    "kubeconfig": "kubeconfig",
    "context": "context",
    "cluster": "cluster",
    "render_yaml_to_directory": "renderYamlToDirectory",
}


class ClusterSource:
    """The cluster of the Kubernetes provider a component deploys through, resolved once.

    ``provider`` None: the default provider, configured by the stack config ``kubernetes:*``
    (``default_settings``). An explicit ``kubernetes.Provider``: its arguments, as the engine
    returns them once the provider is registered. A value not known then (computed by another
    resource in a preview, or a provider object without those arguments) raises
    :class:`UnknownCluster`: the program does not guess.
    """

    def __init__(
        self,
        provider: pulumi.ProviderResource | None,
        default_settings: Callable[[], kubetarget.ProviderSettings],
    ) -> None:
        self.provider = provider
        self.default_settings = default_settings
        self._target: list[kubetarget.Target] = []
        self._client: list[KubeApi] = []
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        if self.provider is None:
            return "the default Kubernetes provider (stack config kubernetes:*)"
        return f"Kubernetes provider {self.provider._name!r}"

    async def settings(self) -> kubetarget.ProviderSettings:
        if self.provider is None:
            return self.default_settings()
        values: dict[str, Any] = {}
        for attr, arg in _PROVIDER_ARGS.items():
            out = self.provider.__dict__.get(attr, _MISSING)
            if out is _MISSING:
                raise UnknownCluster(f"{self.name} does not show its argument {arg}")
            if isinstance(out, pulumi.Output):
                if not await out.is_known():
                    raise UnknownCluster(f"{self.name}'s argument {arg} is not known yet")
                out = await out.future()
            out = rpc.unwrap_rpc_secret(out)
            if out is not None and not isinstance(out, str):
                raise UnknownCluster(f"{self.name}'s argument {arg} is not a string")
            values[attr] = out or None
        return kubetarget.ProviderSettings(**values, origin=f"provider {self.provider._name}")

    async def target(self) -> kubetarget.Target:
        async with self._lock:
            if not self._target:
                self._target.append(kubetarget.resolve(await self.settings()))
            return self._target[0]

    async def api(self) -> KubeApi:
        target = await self.target()
        async with self._lock:
            if not self._client:
                self._client.append(KubeApi(kubetarget.api_client(target)))
            return self._client[0]


@dataclass
class TakeOver:
    """The transform and the ``before_update`` hook of one component (see the module doc).

    ``allowed``: the administrator's ownership policy entries (stack config
    ``pmem-csi:allowedFieldOwners``), on top of the built-in ones.
    """

    source: ClusterSource
    allowed: Sequence[fieldowners.Allowance] = ()
    log: Callable[[str], None] | None = None
    # Only the entries other Pulumi managers left (another or an earlier stack's, on an
    # adopted object); for namespaces, whose labels administrators set for others' sake.
    stale_only: bool = False
    skipped_types: frozenset[str] = SKIPPED_TYPES
    # Objects whose fields others own, seen at registration: (type, name) -> declared object.
    pending: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Objects that exist: (type, name) -> (declared object, how many Pulumi managers have an
    # entry on it). A create of one adopts it (after_create); an update of one with such an
    # entry may find another stack's there (before_update).
    existing: dict[tuple[str, str], tuple[dict[str, Any], int]] = field(default_factory=dict)
    _warned: list[str] = field(default_factory=list)

    def info(self, message: str) -> None:
        (self.log or pulumi.log.info)(message)

    def _cannot(self, why: str) -> None:
        """Say once per component why nothing is taken over, and what resolves it."""
        if self._warned:
            return
        self._warned.append(why)
        pulumi.log.warn(
            f"fields other field managers own are not taken over: cannot tell for certain "
            f"which cluster {self.source.name} uses ({why}); nothing is sent to any cluster "
            "for it. Give the provider kubeconfig, context and cluster as values known "
            "before the update, or set take_over_fields=False (pmem-csi:takeOverFields: "
            "false) to leave such fields to their owners"
        )

    async def _target(self) -> kubetarget.Target | None:
        try:
            target = await self.source.target()
        except UnknownCluster as err:
            self._cannot(str(err))
            return None
        except kubetarget.TargetError as err:
            self._cannot(str(err))
            return None
        return target if target.makes_requests else None

    async def transform(
        self, args: pulumi.ResourceTransformArgs
    ) -> pulumi.ResourceTransformResult | None:
        if not args.custom or not args.type_.startswith("kubernetes:"):
            return None
        if args.type_ in self.skipped_types:
            return None
        try:
            obj = await _plain(dict(args.props))
        except _Unknown:
            return None  # a preview with inputs not known yet: nothing to compare with
        if await self._target() is None:
            return None
        dry_run = pulumi.runtime.is_dry_run()
        try:
            api = await self.source.api()
        except Exception as err:  # its text may hold a proxy URL or a credential
            detail = str(err) if isinstance(err, kubetarget.TargetError) else type(err).__name__
            raise TakeOverError(
                f"cannot build a client for the cluster to take over fields of {describe(obj)} "
                f"({detail}); fix the kubeconfig's proxy or credential settings, or set "
                "pmem-csi:takeOverFields: false"
            ) from None
        try:
            loop = asyncio.get_running_loop()
            live = await loop.run_in_executor(_executor(), api.get, object_path(obj))
        except Exception as err:
            message = (
                f"cannot read {describe(obj)} to take over its fields: "
                f"{kubetarget.error_text(err, 400)}"
            )
            if dry_run:
                pulumi.log.warn(f"{message} (pulumi up will try again)")
                return None
            raise TakeOverError(
                f"{message}; set pmem-csi:takeOverFields: false to leave fields that other "
                "field managers own to them"
            ) from None
        if live is None:
            return None
        meta = live.get("metadata") or {}
        managed = meta.get("managedFields") or []
        pulumi_entries = takeover.stale_pulumi_entries(managed, own_manager="")
        managers = tuple(str(e.get("manager", "")) for e in pulumi_entries)
        self.existing[(args.type_, args.name)] = (obj, managers)
        if self.stale_only:
            return None
        stamp = (meta.get("annotations") or {}).get(TAKEN_OVER_ANNOTATION)
        plan = takeover.plan(managed, str(meta.get("resourceVersion", "")), self.allowed)
        if plan is None:
            # Keep the stamp of an earlier take-over: dropping it would be a change. The
            # object after_create applies is the one the provider creates: with it too.
            if stamp:
                self.existing[(args.type_, args.name)] = (_stamped(obj, stamp), managers)
            return _result(args, _stamped(args.props, stamp)) if stamp else None
        declared = any(
            fieldowners.is_foreign(e, self.allowed)
            and owns_declared(fieldowners.split_entry(e, self.allowed)[0], obj)
            for e in managed
        )
        what = fieldowners.describe(fieldowners.foreign_owners(managed, self.allowed))
        if declared and not dry_run:
            stamp = str(meta.get("resourceVersion", ""))
        self.pending[(args.type_, args.name)] = _stamped(obj, stamp) if stamp else obj
        if dry_run:
            when = "" if declared else " when it next updates it"
            self.info(f"pulumi up would take over fields of {describe(obj)}{when} ({what})")
            if declared:
                return _result(args, _marked(args.props))
        return _result(args, _stamped(args.props, stamp)) if stamp else None

    async def before_update(self, args: pulumi.ResourceHookArgs) -> None:
        """The writes, for a resource the engine is about to update."""
        key = (args.type, args.name)
        obj = self.pending.get(key)
        own = _field_manager(getattr(args, "old_outputs", None))
        seen, managers = self.existing.get(key, ({}, ()))
        taken_away = bool(own) and bool(managers) and own not in managers
        if obj is None and taken_away:
            # Another Pulumi manager's entry in place of this stack's: taken back.
            obj = seen
        if obj is None:
            return
        obj = await self._applied(args, obj)
        if obj is None:
            return
        # Only then are other Pulumi managers' entries merged into this stack's: next to this
        # stack's own entry they are co-owners (a platform stack's NamespacePatch labels).
        await self._correct(obj, own if taken_away else None, apply=not self.stale_only)

    async def after_create(self, args: pulumi.ResourceHookArgs) -> None:
        """A create of an object that existed adopted it (``pmem-csi:adopt``, ``adoptExisting``
        or an object a cut-short create left): merge what other managers own, the earlier
        stack's Pulumi manager above all, into the entry the provider just made.

        Without this, that manager keeps co-owning every field it set: the first later
        ``pulumi up`` that changes one of them fails with a server-side apply conflict
        (e.g. a namespace label, applied without force), and a field this stack stops
        declaring is kept.
        """
        key = (args.type, args.name)
        seen = self.existing.get(key)
        own = _field_manager(getattr(args, "new_outputs", None))
        if seen is None or not own:
            return
        obj = await self._applied(args, self.pending.get(key) or seen[0])
        if obj is not None:
            await self._correct(obj, own, apply=not self.stale_only)

    async def _applied(
        self, args: pulumi.ResourceHookArgs, fallback: dict[str, Any]
    ) -> dict[str, Any] | None:
        """:func:`_applied`, and None (said in a message) when the provider's inputs name
        another object than the one read: nothing is written to the object of the old name
        then (review of issue 14's tail, finding 8)."""
        obj = await _applied(args, fallback)
        if obj is None:
            self.info(
                f"not taking over fields of {describe(fallback)}: the provider applies "
                "another object in its place (a transform registered after this program's "
                "changed its kind or name)"
            )
        return obj

    async def _correct(self, obj: dict[str, Any], own: str | None, apply: bool) -> None:
        if await self._target() is None:
            return
        api = await self.source.api()
        loop = asyncio.get_running_loop()
        try:
            outcome = await loop.run_in_executor(
                _executor(),
                lambda: correct(api, obj, False, self.allowed, own, self.stale_only, apply),
            )
        except Exception as err:
            raise TakeOverError(
                f"cannot take over fields of {describe(obj)}: "
                f"{kubetarget.error_text(err, 400)}; set "
                "pmem-csi:takeOverFields: false to leave fields that other field managers "
                "own to them"
            ) from None
        if outcome is not None:
            self.info(outcome.message)


async def _applied(
    args: pulumi.ResourceHookArgs, fallback: dict[str, Any]
) -> dict[str, Any] | None:
    """The object the provider applies: the hook's ``new_inputs``, which are the inputs after
    every transform (also those registered after ours) and after the provider's Check
    (its default namespace, its normalisation), secrets resolved. The transform-time object
    can differ from them; force-applying it would make the object go through that state
    (a DaemonSet rolled to an image a later transform replaces, then rolled again).

    ``fallback`` (the transform-time object) only where the inputs are not there or not
    known; None where they name another object (apiVersion, kind, namespace or name): the
    transform-time object is not what the provider applies then, and applying it under the
    old name would write an object the update does not declare. The provider's internal keys
    (``__fieldManager``) are not part of the object."""
    inputs = getattr(args, "new_inputs", None)
    if not inputs:
        return fallback
    try:
        obj = await _plain({k: v for k, v in dict(inputs).items() if not k.startswith("__")})
    except _Unknown:
        return fallback
    meta, before = obj.get("metadata") or {}, fallback.get("metadata") or {}
    # A namespace the provider's Check filled in (its default) is the same object.
    same = (
        all(obj.get(k) == fallback.get(k) for k in ("apiVersion", "kind"))
        and meta.get("name") == before.get("name")
        and before.get("namespace") in (None, "", meta.get("namespace"))
    )
    return obj if same else None


def _field_manager(outputs: Mapping[str, Any] | None) -> str | None:
    """The provider's field manager of a resource, as its outputs record it."""
    from pmem_components.identity import FIELD_MANAGER_KEY

    value = rpc.unwrap_rpc_secret((outputs or {}).get(FIELD_MANAGER_KEY))
    return value if isinstance(value, str) and value else None


def _result(
    args: pulumi.ResourceTransformArgs, props: dict[str, Any]
) -> pulumi.ResourceTransformResult:
    return pulumi.ResourceTransformResult(props=props, opts=args.opts)


def _stamped(props: dict[str, Any], stamp: Any) -> dict[str, Any]:
    """``props`` with :data:`TAKEN_OVER_ANNOTATION` set to ``stamp``."""
    out = dict(props)
    meta = dict(out.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), TAKEN_OVER_ANNOTATION: stamp}
    out["metadata"] = meta
    return out


def _marked(props: dict[str, Any]) -> dict[str, Any]:
    """The preview's inputs of an object that ``up`` will take over: with
    :data:`TAKEN_OVER_ANNOTATION` unknown until the update.

    Why: the provider previews an update with a dry-run apply against the object as it is,
    foreign fields included (a Service port someone added makes the declared ports invalid,
    for example), not as the take-over will leave it. An unknown input makes it show the
    update without that dry run, as for any input computed during the update.
    """
    return _stamped(props, rpc.UNKNOWN)
