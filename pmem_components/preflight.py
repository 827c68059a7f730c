"""Preflight: read the cluster before registering anything, and refuse unsafe day-2 changes.

Why the cluster and not the previous stack outputs: the state can be lost (``pulumi stack
rm``), stale (objects changed by hand) or another stack's; the cluster is what the change would
act on. The state answers one question only, read synchronously before registration with the
engine's ``readStackResourceOutputs`` invoke (:mod:`pmem_components.identity`; a
``StackReference`` to itself would resolve only as an Output, after registration has begun):
which of the annotated objects are this stack's. The ``Deployment``
CRs record, per driver, its namespace and device mode, and carry ``names.STACK_ANNOTATION``
naming the stack that owns them (the stack's own state, read with the engine's
``readStackResourceOutputs``, tells whether that is this stack or a same-named one);
objects show who created them (labels, ownerReferences).
So this module answers, before anything changes:

* Is a namespace the stack would create already there and not ours? Adoption is explicit
  (``adoptNamespace``), or the administrator uses it as it is (``createNamespace: false``).
* Whose are the namespaces and ``Deployment`` CRs that carry a stack's identity? This
  stack's when its own state holds them (:mod:`pmem_components.identity`), whatever the
  annotation says; one the state does not hold (retained by an earlier stack of this name,
  or managed by a same-named stack on another backend, or by another stack) is refused,
  naming it and the identity it carries, until ``pmem-csi:adopt`` names it (and only with
  ``takeOverFields: true``, whose hooks merge the earlier owner's field manager away).
* Would this update drop from the state a deployment or namespace that another stack has
  taken over since (its Pulumi field manager replaced this stack's)? The engine would delete
  it by name, the other stack's now: refused, naming the ``pulumi state delete`` that makes
  this stack forget it without deleting anything.
* Does a configured deployment move namespace, change its device mode, or replace another
  deployment of this stack (a rename)? Each is refused with the reason and the flag that
  allows it (``allowReinstall``, ``allowDeviceModeChange``, ``renamedFrom``); an allowed move
  is returned as :class:`~pmem_components.components.PreviousDeployment` so the component
  replaces the objects (old workloads deleted first) instead of running two drivers.
* Are there objects with the deployment's names that this program did not create, above all
  the PMEM-CSI operator's (ownerReferences to a ``deployments.pmem-csi.intel.com`` CR), or a
  node driver of the same CSI driver name in another namespace? The message says what to do.
* Does a driver that would be renamed or removed still have volumes (PersistentVolumes,
  VolumeAttachments, StorageClasses naming its CSI driver)? Kubernetes finds the driver of a
  volume by that name only, so they would be left with no driver that can mount, unmount or
  delete them; refused, listing them. A device mode change is judged by what runs (the node
  DaemonSet's ``-deviceManager=``) as well as by the CR, which may be gone.
* Would a move's delete of the old node DaemonSet not be awaited (``pulumi.com/skipAwait``
  makes the provider return from the delete at once)? Then two node drivers would overlap.
* Which namespaces did this stack create that configured deployments still use although no
  deployment creates them any more (``createNamespace: false``)? Returned in
  :attr:`Plan.keep_namespaces`, so the program keeps them instead of deleting them.
* Would a patch make the provider replace an object (delete it and create it anew)? It does
  so when the update changes a field Kubernetes does not let change in place. Rather than a
  list of such fields kept here, each object a patch selects that exists is applied in a
  server-side dry run against the live one, as the provider applies it (its field manager),
  with and without the patches: a refusal only with them is a config error naming the
  patch entry and the fields (:class:`Rejection`).

:func:`plan` is pure (observations in, problems and moves out) and unit tested;
:func:`observe` does the reads with the Kubernetes client (``get``/``list`` only), which the
program makes for the default provider's cluster (:mod:`pmem_components.kubetarget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pmem_components import identity, kubecall, kubetarget, names
from pmem_components.awaiting import SKIP_AWAIT_ANNOTATION
from pmem_components.config import DEVICE_MODE_ALIASES, DeploymentConfig, StackConfig, key_path
from pmem_components.manifests import bundle

OPERATOR_GROUP = names.CRD_GROUP
RUNBOOK = "see docs/day2.md: migrate from the PMEM-CSI operator"


@dataclass(frozen=True)
class Previous:
    """Where a deployment ran before (the CR's name and ``spec.namespace``)."""

    name: str
    namespace: str


@dataclass(frozen=True)
class ObservedObject:
    """What the preflight needs of one live object."""

    kind: str
    name: str
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[tuple[str, str, str], ...] = ()  # (apiVersion, kind, name)
    spec: Mapping[str, Any] = field(default_factory=dict)
    uid: str = ""
    api_version: str = ""
    # The Pulumi managers with an apply entry on the object itself (managedFields).
    pulumi_managers: tuple[str, ...] = ()
    # The managers whose entry owns the stack annotation (names.STACK_ANNOTATION): who
    # wrote the identity it carries. Empty: not known (no managedFields).
    identity_writers: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    @property
    def operator_owner(self) -> str | None:
        """Name of the pmem-csi ``Deployment`` CR this object belongs to, if any."""
        for api_version, kind, name in self.owners:
            if api_version.split("/")[0] == OPERATOR_GROUP and kind == names.CRD_KIND:
                return name
        return None

    @property
    def ours(self) -> bool:
        return self.labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY

    @property
    def key(self) -> identity.ObjectKey:
        """Its key in the stack's state (:class:`pmem_components.identity.StackState`)."""
        api_version = self.api_version or _API_VERSIONS.get(self.kind, "v1")
        return identity.object_key(api_version, self.kind, self.namespace, self.name)

    @property
    def stack_owner(self) -> str | None:
        """The stack identity it is annotated with (``names.STACK_ANNOTATION``)."""
        return self.annotations.get(names.STACK_ANNOTATION)


# The API version of the kinds the preflight judges by ownership, when not observed.
_API_VERSIONS = {names.CRD_KIND: f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"}


@dataclass(frozen=True)
class Rejection:
    """The API server refused a deployment's patched object in a dry run (not unpatched)."""

    index: int  # the deployment
    labels: tuple[str, ...]  # the patch entries that select the object
    ref: str  # "StatefulSet ns/name"
    fields: tuple[str, ...]  # the changed fields the refusal is about
    reason: str  # the API server's words (no object content for Secrets)


@dataclass
class Observed:
    """The cluster as far as the preflight looks at it."""

    crs: dict[str, ObservedObject] = field(default_factory=dict)
    namespaces: dict[str, ObservedObject] = field(default_factory=dict)
    # Per deployment index: live objects with the names the deployment would use.
    same_named: dict[int, list[ObservedObject]] = field(default_factory=dict)
    # DaemonSets anywhere in the cluster (node drivers are what must never run twice).
    daemon_sets: list[ObservedObject] = field(default_factory=list)
    # PersistentVolumes, VolumeAttachments and StorageClasses that name one of the drivers
    # the plan judges (``spec`` holds the field that names it, see :func:`volume_driver`).
    volumes: list[ObservedObject] = field(default_factory=list)
    patch_rejections: list[Rejection] = field(default_factory=list)


@dataclass
class Plan:
    problems: list[str] = field(default_factory=list)
    previous: dict[int, Previous] = field(default_factory=dict)
    # Namespaces this stack created that configured deployments still use, though none of
    # them creates it any more: the program registers them once more, kept on delete and no
    # longer annotated as the stack's, so that leaving the stack never deletes them.
    keep_namespaces: set[str] = field(default_factory=set)
    # Per deployment index: the certificate fingerprints of its running driver pods
    # (pmem_components.certrollout, read by program.preflight); None: not read.
    running_certificates: dict[int, Any] | None = None  # certrollout.Rollout per index
    # Objects another (or an earlier) stack made that this update takes over because
    # pmem-csi:adopt names them ("Namespace <name>", "Deployment <name>").
    adopted: list[str] = field(default_factory=list)


# Where each kind names its CSI driver.
_VOLUME_DRIVER_FIELD = {
    "PersistentVolume": ("csi", "driver"),
    "VolumeAttachment": ("attacher",),
    "StorageClass": ("provisioner",),
}


def volume_driver(obj: ObservedObject) -> str | None:
    """The CSI driver a PersistentVolume, VolumeAttachment or StorageClass is bound to."""
    value: Any = obj.spec
    for part in _VOLUME_DRIVER_FIELD.get(obj.kind, ("-",)):
        value = value.get(part) if isinstance(value, Mapping) else None
    return str(value) if value else None


def _volumes_of(observed: Observed, driver: str) -> list[ObservedObject]:
    return [v for v in observed.volumes if volume_driver(v) == driver]


def _running_modes(observed: Observed, driver: str) -> list[tuple[ObservedObject, str]]:
    """(DaemonSet, device mode) of every node DaemonSet running ``driver``, from its
    ``-deviceManager=`` argument: what manages the PMEM now, whatever the CR says."""
    out = []
    for ds in observed.daemon_sets:
        if _driver_name_of(ds) != driver:
            continue
        pod = ((ds.spec.get("template") or {}).get("spec")) or {}
        for container in pod.get("containers") or []:
            words = [*(container.get("command") or []), *(container.get("args") or [])]
            for word in words:
                if isinstance(word, str) and word.lstrip("-").startswith("deviceManager="):
                    mode = word.split("=", 1)[1]
                    out.append((ds, DEVICE_MODE_ALIASES.get(mode, mode)))
    return out


def _driver_name_of(ds: ObservedObject) -> str | None:
    """The CSI driver name a DaemonSet's pods run with (``PMEM_CSI_DRIVER_NAME``)."""
    pod = ((ds.spec.get("template") or {}).get("spec")) or {}
    for container in pod.get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "PMEM_CSI_DRIVER_NAME" and env.get("value"):
                return str(env["value"])
    return None


_WORKLOADS_FIRST = {
    "DaemonSet": 0,
    "StatefulSet": 1,
    "Deployment": 2,
    "PersistentVolume": 3,
    "VolumeAttachment": 4,
    "StorageClass": 5,
}


def _listing(objs: list[ObservedObject], most: int = 5) -> str:
    """The objects for a message: workloads first, then the rest, at most ``most`` by name."""
    ordered = sorted(objs, key=lambda o: _WORKLOADS_FIRST.get(o.kind, 9))
    text = ", ".join(o.ref for o in ordered[:most])
    return text + (f" and {len(ordered) - most} more" if len(ordered) > most else "")


def plan(
    stack: StackConfig,
    observed: Observed,
    stack_id: str,
    state: identity.StackState | None = None,
) -> Plan:
    """Problems (by config key) and allowed moves for applying ``stack`` to the cluster.

    ``state``: the Kubernetes objects this stack's state holds (:mod:`pmem_components.
    identity`). With it, a namespace or CR is this stack's when the state holds it; one a
    pmem-csi-pulumi stack made that the state does not hold is adopted only when
    ``pmem-csi:adopt`` names it. Without it (library use, old callers) the annotation
    decides, as before the state was read.
    """
    out = Plan()
    deps = stack.deployments
    configured = {d.name for d in deps}

    # Namespaces the stack would create.
    for ns in dict.fromkeys(d.namespace for d in deps if d.create_namespace):
        live = observed.namespaces.get(ns)
        if live is None:
            continue
        owner = live.stack_owner
        i = next(i for i, d in enumerate(deps) if d.namespace == ns and d.create_namespace)
        key = key_path(("deployments", i, "createNamespace"))
        if state is not None:
            if state.holds(live.key, live.uid):
                problem = _taken_away(stack, out, live, state, key)
                if problem:
                    out.problems.append(problem)
                continue  # this stack's, whatever its annotation says (an older form)
            if owner is not None or live.ours:
                problem = _unheld(stack, out, live, stack_id, key, "createNamespace: false")
                if problem:
                    out.problems.append(problem)
                continue
        elif identity.names_this_stack(owner, stack_id) or (owner is None and live.ours):
            continue  # created by this stack (or by this program before stack annotations)
        if owner is not None:
            out.problems.append(
                f"{key}: namespace {ns!r} is "
                f"managed by stack {owner!r}; set createNamespace: false to deploy into it "
                "without managing it"
            )
        elif not any(d.adopt_namespace for d in deps if d.namespace == ns):
            out.problems.append(
                f"{key}: namespace {ns!r} "
                "already exists and was not created by this stack; set "
                f"{key_path(('deployments', i, 'adoptNamespace'))}: true to manage it from now "
                "on (it is kept on destroy unless pmem-csi:retainNamespaces is false), or "
                "createNamespace: false to use it as it is"
            )

    # This stack's deployments as the cluster records them: the CRs its state holds (without
    # the state, e.g. in library use: by annotation; CRs made by this program before it
    # annotated them count as this stack's).
    def is_mine(cr: ObservedObject) -> bool:
        if state is not None:
            return state.holds(cr.key, cr.uid)
        owner = cr.stack_owner
        return identity.names_this_stack(owner, stack_id) or (owner is None and cr.ours)

    mine = {name: cr for name, cr in observed.crs.items() if is_mine(cr)}
    if state is not None:
        for i, d in enumerate(deps):
            cr = mine.get(d.name)
            taken = cr and _taken_away(stack, out, cr, state, key_path(("deployments", i, "name")))
            if taken:
                out.problems.append(taken)
    renamed = {d.renamed_from for d in deps if d.renamed_from}
    for i, d in enumerate(deps):
        cr = observed.crs.get(d.name)
        if cr is not None and d.name not in mine:
            owner = cr.stack_owner
            key = key_path(("deployments", i, "name"))
            if state is not None and (owner is not None or cr.ours):
                problem = _unheld(
                    stack, out, cr, stack_id, key, "another driver name (one driver name is "
                    "managed by one stack)"
                )
                if problem:
                    out.problems.append(problem)
                else:
                    mine[d.name] = cr  # adopted: judged as this stack's from now on
            elif owner is not None:
                out.problems.append(
                    f"{key}: the Deployment CR {d.name!r} "
                    f"belongs to stack {owner!r}; one driver name is managed by one stack"
                )
            elif not d.adopt_existing:
                out.problems.append(
                    f"{key}: a Deployment CR {d.name!r} exists "
                    "that this stack did not create (the PMEM-CSI operator's?); to take the "
                    "deployment over, stop the operator, remove the old CR with "
                    f"`kubectl delete deployments.{names.CRD_GROUP} {d.name} --cascade=orphan` "
                    "(the driver keeps running) and set "
                    f"{key_path(('deployments', i, 'adoptExisting'))}: true; {RUNBOOK}"
                )
        if cr is not None and d.name in mine:
            old_ns = str(cr.spec.get("namespace") or "")
            if old_ns and old_ns != d.namespace:
                if d.allow_reinstall:
                    out.previous[i] = Previous(d.name, old_ns)
                else:
                    out.problems.append(
                        f"{key_path(('deployments', i, 'namespace'))}: changing it from "
                        f"{old_ns!r} to {d.namespace!r} reinstalls the driver (every object is "
                        "deleted and created anew; the driver is down meanwhile, volumes stay); "
                        f"set {key_path(('deployments', i, 'allowReinstall'))}: true to do it"
                    )
        if not d.allow_device_mode_change:
            problem = _device_mode_problem(i, d.name, d.device_mode, cr, observed)
            if problem:
                out.problems.append(problem)
        if d.renamed_from and d.renamed_from in mine and d.name not in mine:
            old = mine[d.renamed_from]
            out.previous[i] = Previous(d.renamed_from, str(old.spec.get("namespace") or ""))
            stranded = _volumes_of(observed, d.renamed_from)
            if stranded:
                out.problems.append(
                    f"{key_path(('deployments', i, 'renamedFrom'))}: renaming "
                    f"{d.renamed_from!r} to {d.name!r} would strand its volumes: "
                    f"{_listing(stranded)} name the CSI driver {d.renamed_from!r}, and "
                    f"Kubernetes finds a volume's driver by that name only (the node state "
                    f"directory /var/lib/{d.renamed_from} would be left behind too). A rename "
                    "is refused while the old driver has volumes: keep the name "
                    f"{d.renamed_from!r} (a namespace change with allowReinstall keeps the "
                    "volumes), or first delete the PersistentVolumeClaims and StorageClasses "
                    "that use it while it runs, then rename"
                )
        if i in out.previous:
            problem = _unawaited_move_problem(i, d, out.previous[i], observed)
            if problem:
                out.problems.append(problem)

    gone = sorted(n for n in mine if n not in configured and n not in renamed)
    if state is not None:
        for g in gone:
            problem = _dropped_taken(mine[g], state)
            if problem:
                out.problems.append(problem)
        created_here = {d.namespace for d in deps if d.create_namespace}
        for ns in state.namespaces():
            live = observed.namespaces.get(ns)
            if ns in created_here or live is None or not state.holds(live.key, live.uid):
                continue
            problem = _dropped_taken(live, state)
            if problem:
                out.problems.append(problem)
    for g in gone:
        stranded = _volumes_of(observed, g)
        if stranded:
            out.problems.append(
                f"{key_path(('deployments',))}: {g!r} (deployed by this stack) is no longer "
                f"configured but still has volumes: {_listing(stranded)} name its CSI "
                "driver; removing it would leave them without a driver (they could no longer "
                "be mounted, unmounted or deleted). Keep it configured and first delete the "
                "PersistentVolumeClaims (their volumes are deleted by the running driver) "
                "and StorageClasses that use it, then remove it"
            )
    new = [(i, d) for i, d in enumerate(deps) if d.name not in observed.crs]
    new = [(i, d) for i, d in new if i not in out.previous]
    if gone and new:
        i, d = new[0]
        out.problems.append(
            f"{key_path(('deployments', i, 'name'))}: {d.name!r} is new while "
            f"{', '.join(repr(g) for g in gone)} (deployed by this stack) is no longer "
            f"configured. If it replaces it, set {key_path(('deployments', i, 'renamedFrom'))}"
            f": {gone[0]!r} (the old driver is removed before the new one starts); if not, "
            "remove the old deployment in one pulumi up and add the new one in the next, so "
            "that two node drivers never run on the same nodes"
        )

    # Objects with our names that someone else created (the operator, above all).
    for i, d in enumerate(deps):
        foreign = [o for o in observed.same_named.get(i, []) if not o.ours]
        owned = [o for o in foreign if o.operator_owner]
        if owned:
            cr_name = owned[0].operator_owner
            listed = _listing(owned)
            out.problems.append(
                f"{key_path(('deployments', i))}: {listed} belong to the PMEM-CSI operator "
                f"(ownerReference to Deployment {cr_name!r}); deleting that CR would "
                "garbage-collect them even after Pulumi took them over. Next step: stop the "
                "operator, run `kubectl delete deployments."
                f"{names.CRD_GROUP} {cr_name} --cascade=orphan` (Kubernetes removes the "
                "ownerReferences, the driver keeps running), then set "
                f"{key_path(('deployments', i, 'adoptExisting'))}: true and run pulumi up "
                f"again; {RUNBOOK}"
            )
        elif foreign and not d.adopt_existing:
            listed = _listing(foreign)
            out.problems.append(
                f"{key_path(('deployments', i))}: {listed} already exist and were not created "
                f"by pmem-csi-pulumi; set {key_path(('deployments', i, 'adoptExisting'))}: true "
                "to take them over (server-side apply with force), or remove them"
            )
        prev = out.previous.get(i)
        for ds in observed.daemon_sets:
            if _driver_name_of(ds) != d.name or ds.namespace == d.namespace:
                continue
            if prev is not None and ds.namespace == prev.namespace:
                continue  # the reinstall replaces it, old one first
            if d.name in mine and ds.ours:
                continue
            out.problems.append(
                f"{key_path(('deployments', i, 'namespace'))}: {ds.ref} runs node drivers "
                f"for {d.name!r} in another namespace; a second node driver of the same name "
                "would run on the same nodes. Remove it first"
                + (f" ({RUNBOOK})" if ds.operator_owner or not ds.ours else "")
            )

    for r in observed.patch_rejections:
        out.problems.append(
            f"{', '.join(r.labels)}: changes {', '.join(r.fields)} of {r.ref}, which the API "
            f"server refuses to change in place ({r.reason}); the provider would delete the "
            "object and create it anew. Leave that field out of the patch (to change it "
            "anyway, delete the object first and run pulumi up again)"
        )

    if out.adopted and not stack.take_over_fields:
        # The take-over's hooks are what merge the earlier owner's field manager into this
        # stack's (pmem_components.takeover_transform); without them both stacks' managers
        # stay on the objects and both would apply them.
        out.problems.append(
            f"{key_path(('adopt',))}: adopting {', '.join(out.adopted)} with "
            f"{key_path(('takeOverFields',))}: false would leave the field manager the "
            "earlier owner left on them next to this stack's: two stacks managing one object "
            "(and a later update that changes a field both set fails with a server-side "
            f"apply conflict). Set {key_path(('takeOverFields',))}: true (the default) for the "
            "pulumi up that adopts them (it may be false again afterwards)"
        )

    # Namespaces this stack created that a deployment still uses, though no one creates it.
    created = {d.namespace for d in deps if d.create_namespace}
    for ns in dict.fromkeys(d.namespace for d in deps if not d.create_namespace):
        live = observed.namespaces.get(ns)
        if ns in created or live is None:
            continue
        if state is not None:
            # The engine would delete it otherwise. Without any stack annotation it was
            # released by the last update (program.deploy): this one drops it from the state.
            # Not one another stack took over since (refused above): keeping it would write it.
            if (
                state.holds(live.key, live.uid)
                and live.stack_owner is not None
                and _taker(live, state) is None
            ):
                out.keep_namespaces.add(ns)
        elif identity.names_this_stack(live.stack_owner, stack_id):
            out.keep_namespaces.add(ns)
    return out


def _unheld(
    stack: StackConfig,
    out: Plan,
    live: ObservedObject,
    stack_id: str,
    key: str,
    alternative: str,
) -> str | None:
    """The decision on a live object a pmem-csi-pulumi stack made that this stack's state does
    not hold: adopted (``pmem-csi:adopt`` names it, recorded in :attr:`Plan.adopted`), or the
    refusal naming the object, the identity it carries and the settings that resolve it."""
    ref = adopt_ref(live)
    if stack.adopts(ref):
        out.adopted.append(ref)
        return None
    kind = "the Deployment CR" if live.kind == names.CRD_KIND else live.kind.lower()
    what = f"{kind} {live.name!r}"
    owner = live.stack_owner
    if identity.names_this_stack(owner, stack_id):
        whose = (
            f"carries this stack's identity {owner!r} ({names.STACK_ANNOTATION}), but this "
            "stack's state does not hold it: an earlier stack of this name kept it (pulumi "
            "stack rm after destroy with retainNamespaces, or without destroy), a stack "
            "of the same name on another backend manages it, or a pulumi up of this stack "
            "that was interrupted (Ctrl-C, killed) created it and did not record it; that "
            "run's recovery takes it over with pmem-csi:adopt as well"
        )
    elif owner is not None:
        whose = (
            f"is managed by stack {owner!r} ({names.STACK_ANNOTATION}), and this stack's "
            "state does not hold it"
        )
    else:
        whose = (
            f"was made by {names.MANAGED_BY} ({names.LABEL_MANAGED_BY}) but carries no stack "
            "identity, and this stack's state does not hold it"
        )
    return (
        f"{key}: {what} {whose}. If no other stack manages it any more (or it is to move to "
        f"this one), set pmem-csi:adopt: [\"{ref}\"] (or true) to take it over (its fields "
        f"and field managers become this stack's); otherwise use {alternative}"
    )


def _taken_away(
    stack: StackConfig, out: Plan, live: ObservedObject, state: identity.StackState, key: str
) -> str | None:
    """The decision on an object this stack's state holds that another stack has adopted
    since: its Pulumi apply entry is another manager's, and this stack's (the one the state
    records) is gone, merged away by that stack's adoption. Applying it again would make two
    stacks fight over it; taking it back needs the same consent as any adoption."""
    own = _taker(live, state)
    if own is None:
        return None
    ref = adopt_ref(live)
    if stack.adopts(ref):
        out.adopted.append(ref)
        return None
    kind = "the Deployment CR" if live.kind == names.CRD_KIND else live.kind.lower()
    return (
        f"{key}: {kind} {live.name!r} is in this stack's state, but another stack has taken "
        f"it over since: {_whose(live, own, 'its field manager is ')} (a stack of the same "
        f"name on another backend, or one that adopted "
        f"it with pmem-csi:adopt). To leave it to that stack, remove it from this stack's config "
        "(pulumi up then names the pulumi state delete that forgets it without deleting "
        f"anything); if this stack is to manage it again, set pmem-csi:adopt: [\"{ref}\"] "
        "(and remove it from the other stack)"
    )


def _taker(live: ObservedObject, state: identity.StackState) -> str | None:
    """This stack's field manager of ``live`` (the state's) when another stack has taken
    ``live`` over since: its Pulumi apply entries are others', none is this stack's; or it
    carries another stack's identity (:attr:`identity.StackState.stack_id`) that another
    manager wrote -- an adoption with ``takeOverFields: false``, which leaves this stack's
    entry in place (review of issue 14's tail, item 7).

    An identity this stack's own manager wrote is not a take-over, whatever it says: after
    ``pulumi stack rename`` (or an organisation or project rename) every object carries the
    old identity until this stack applies it again (review of the tail, finding 1)."""
    own = state.field_manager(live.key)
    if not own:
        return None
    owner = live.stack_owner
    foreign = bool(state.stack_id and owner) and not identity.names_this_stack(
        owner, state.stack_id
    )
    if own not in live.pulumi_managers:
        # Others' entries only: taken. No Pulumi entry at all: only the identity tells.
        return own if live.pulumi_managers or foreign else None
    writers = live.identity_writers
    return own if foreign and writers and own not in writers else None


def _whose(live: ObservedObject, own: str, lead: str) -> str:
    """How the refusals say who has ``live`` now (``lead`` introduces the managers)."""
    managers = ", ".join(live.pulumi_managers) or "none"
    if own in live.pulumi_managers:
        return (
            f"it carries the stack identity {live.stack_owner!r} ({names.STACK_ANNOTATION}), "
            f"which that stack's apply wrote; field managers {managers}"
        )
    return f"{lead}{managers}, not this stack's {own}"


def _dropped_taken(live: ObservedObject, state: identity.StackState) -> str | None:
    """The refusal for an object this stack's state holds, that another stack took over
    since, and that this update would drop from the state: a deployment no longer
    configured (its CR), a namespace no deployment creates any more.

    The engine deletes what the program no longer registers, and the Kubernetes provider
    deletes by name: the other stack's objects would go (review of issue 14, item 4, D1).
    Registering them once more, kept on delete, would apply this stack's declared state to
    them. So the update stops, and names how to make this stack forget them without
    deleting anything: ``pulumi state delete``, which never calls the provider."""
    own = _taker(live, state)
    if own is None:
        return None
    command = forget_command(live.kind, state.urn(live.key))
    if live.kind == names.CRD_KIND:
        what = f"{live.name!r} (in this stack's state) is no longer configured"
        objects = "the driver's objects"
    else:
        what = f"namespace {live.name!r} (in this stack's state) is created by no deployment"
        objects = "the namespace (unless kept on delete: retainNamespaces) and all in it"
    return (
        f"{key_path(('deployments',))}: {what}, but another stack has taken it over since "
        f"({_whose(live, own, 'field manager ')}): "
        f"dropping it would delete {objects}, which that stack manages now, by name. To "
        f"leave it to that stack, make this one forget it without deleting anything: "
        f"{command}, then pulumi up; or, if this stack is to manage it again, configure it "
        f'and set pmem-csi:adopt: ["{adopt_ref(live)}"]'
    )


def forget_command(kind: str, urn: str | None) -> str:
    """The ``pulumi state delete`` that makes this stack forget a dropped object (its URN
    in the state) without deleting anything: for a Deployment CR its whole
    ``PmemCsiDeployment`` component (the driver's objects with it)."""
    if kind == names.CRD_KIND:
        component = _component_urn(urn) if urn else None
        return (
            f"pulumi state delete --target-dependents --yes '{component}'"
            if component
            else "pulumi state delete --target-dependents --yes <the URN of its "
            "PmemCsiDeployment component (pulumi stack --show-urns)>"
        )
    return f"pulumi state delete --yes '{urn or '<its URN (pulumi stack --show-urns)>'}'"


def _component_urn(child_urn: str) -> str | None:
    """The URN of the ``PmemCsiDeployment`` component whose child (its CR) has ``child_urn``:
    the parent's type is the child's type chain but its last, its name the child's name
    without its last ``:<driver name>`` (library use names children ``<name>:<object>``) or,
    without a colon, the child's name (the driver name).

    ``urn:pulumi:<stack>::<project>::<type chain>::<name>``: the name is everything after
    the third ``::`` (stack, project and type hold none; a name may hold ``:``, even ``::``),
    and the driver name (a DNS subdomain) holds no colon, so the component's name is all
    before the last one. Cut at the first colon, ``a:b`` gave a URN that does not exist.
    """
    parts = child_urn.split("::", 3)
    if len(parts) != 4 or "$" not in parts[2]:
        return None
    parent_type = parts[2].rsplit("$", 1)[0]
    if "$" in parent_type:
        return None  # not a top-level component's child
    name = parts[3].rsplit(":", 1)[0]
    return "::".join([parts[0], parts[1], parent_type, name])


def adopt_ref(live: ObservedObject) -> str:
    """How ``pmem-csi:adopt`` names an object: ``"Namespace <name>"``, ``"Deployment <name>"``."""
    return f"{live.kind} {live.name}"


def _device_mode_problem(
    i: int, driver: str, mode: str, cr: ObservedObject | None, observed: Observed
) -> str | None:
    """A device mode change of ``driver`` to ``mode``, judged by the CR and by what runs.

    The CR may be gone (deleted by hand, or with the CRD) or edited; the node DaemonSet's
    ``-deviceManager=`` is what manages the PMEM of the existing volumes.
    """
    old: list[tuple[str, str]] = []  # (mode, where it was read)
    cr_mode = cr.spec.get("deviceMode") if cr is not None else None
    if cr_mode:
        old.append((DEVICE_MODE_ALIASES.get(str(cr_mode), str(cr_mode)), "the Deployment CR"))
    for ds, running in _running_modes(observed, driver):
        old.append((running, f"{ds.ref} runs -deviceManager={running}"))
    differing = [(m, where) for m, where in old if m != mode]
    if not differing:
        return None
    volumes = _volumes_of(observed, driver)
    return (
        f"{key_path(('deployments', i, 'deviceMode'))}: changing it from "
        f"{differing[0][0]!r} to {mode!r} makes the existing volumes unusable (their PMEM "
        f"is managed the other way; {'; '.join(w for _, w in differing)}"
        + (f"; volumes: {_listing(volumes)}" if volumes else "")
        + "); delete or back up the volumes first, then set "
        f"{key_path(('deployments', i, 'allowDeviceModeChange'))}: true"
    )


def _unawaited_move_problem(
    i: int, d: DeploymentConfig, prev: Previous, observed: Observed
) -> str | None:
    """Why the old node DaemonSet's delete in a move would not be awaited, if it would not.

    A move deletes the old DaemonSet (foreground, with its pods) before the new one is
    created. ``pulumi.com/skipAwait`` also makes the provider return from that delete at
    once, so the new pods would start while the old ones still hold the node's sockets and
    host paths. The provider reads the annotation of the object it deletes, i.e. as it was
    last applied: turning await on in the same update does not help.
    """
    key = key_path(("deployments", i, "await", "enabled"))
    if not d.await_.enabled:
        return (
            f"{key}: false sets pulumi.com/skipAwait, with which the provider does not wait "
            "for a delete either: the old node DaemonSet of this "
            f"{'rename' if prev.name != d.name else 'reinstall'} would still run its pods "
            "when the new one starts, two node drivers on the same nodes. Set "
            "await.enabled: true for the update that moves the deployment"
        )
    old_ds = names.DeploymentNames(prev.name).node_driver
    for ds in observed.daemon_sets:
        if ds.namespace != prev.namespace or ds.name != old_ds:
            continue
        if str(ds.annotations.get(SKIP_AWAIT_ANNOTATION, "")).lower() == "true":
            return (
                f"{key}: {ds.ref} carries {SKIP_AWAIT_ANNOTATION} (from await.enabled: false), "
                "which the provider reads when it deletes it, so the move would not wait for "
                "the old node driver's pods to go: two node drivers on the same nodes; "
                "first run pulumi up with await.enabled: true and the deployment where it is "
                f"(name {prev.name!r}, namespace {prev.namespace!r}), then move it"
            )
    return None


# --------------------------------------------------------------------------------------------
# reading the cluster

_PLURALS = {
    "Namespace": "namespaces",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Service": "services",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "StatefulSet": "statefulsets",
    "DaemonSet": "daemonsets",
    "Deployment": "deployments",
    "CSIDriver": "csidrivers",
    "Lease": "leases",
    "ConfigMap": "configmaps",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PersistentVolume": "persistentvolumes",
    "VolumeAttachment": "volumeattachments",
    "StorageClass": "storageclasses",
}


class PreflightError(RuntimeError):
    """The cluster could not be read; the message says how to skip the checks."""


def _path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{_PLURALS.get(kind, kind.lower() + 's')}"
    return f"{base}/{name}" if name else base


def _observed(obj: Mapping[str, Any], kind: str) -> ObservedObject:
    meta = obj.get("metadata") or {}
    owners = tuple(
        (str(o.get("apiVersion", "")), str(o.get("kind", "")), str(o.get("name", "")))
        for o in meta.get("ownerReferences") or []
    )
    return ObservedObject(
        kind=kind,
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        owners=owners,
        spec=dict(obj.get("spec") or {}),
        uid=str(meta.get("uid") or ""),
        api_version=str(obj.get("apiVersion") or ""),
        pulumi_managers=tuple(
            str(e.get("manager"))
            for e in meta.get("managedFields") or []
            if str(e.get("manager") or "").startswith("pulumi-kubernetes")
            and e.get("operation") == "Apply"
            and not e.get("subresource")
        ),
        identity_writers=_identity_writers(meta.get("managedFields") or []),
    )


def _identity_writers(entries: list[Any]) -> tuple[str, ...]:
    """The managers whose managedFields entry owns the stack annotation."""
    field_name = f"f:{names.STACK_ANNOTATION}"

    def owns(entry: Any) -> bool:
        fields = entry.get("fieldsV1") if isinstance(entry, Mapping) else None
        meta = fields.get("f:metadata") if isinstance(fields, Mapping) else None
        ann = meta.get("f:annotations") if isinstance(meta, Mapping) else None
        return isinstance(ann, Mapping) and field_name in ann

    return tuple(str(e.get("manager")) for e in entries if owns(e) and not e.get("subresource"))


class _Reader:
    def __init__(self, api_client: Any) -> None:
        self.api = api_client

    def dry_apply(
        self, path: str, obj: Mapping[str, Any], manager: str
    ) -> tuple[int, dict[str, Any]]:
        """Server-side apply ``obj`` at ``path`` in a dry run (nothing is written): the
        status and the response (the object, or the API server's Status on a refusal)."""
        import json

        query = [("dryRun", "All"), ("fieldManager", manager), ("force", "true")]
        resp = kubecall.request(
            self.api,
            "PATCH",
            path,
            timeout=15,
            body=dict(obj),
            content_type="application/apply-patch+yaml",
            query=query,
        )
        try:
            body = json.loads(resp.body or b"{}")
        except ValueError:
            body = {}
        return resp.status, body if isinstance(body, dict) else {}

    def get(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as JSON; None on 404 (through the client's auth and TLS settings)."""
        import json

        from kubernetes.client.exceptions import ApiException

        resp = kubecall.request(self.api, "GET", path, timeout=15)
        if resp.status == 404:
            return None
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=resp.reason)
        return json.loads(resp.body or b"{}")


# Below the client's connection pool (10 by default), so no connection is thrown away.
_PARALLEL_GETS = 8


def observe(
    api_client: Any, stack: StackConfig, state: identity.StackState | None = None
) -> Observed:
    """Read what :func:`plan` needs: CRs, the namespaces (the configured ones and those the
    stack's ``state`` holds), same-named objects, DaemonSets."""
    reader = _Reader(api_client)
    out = Observed()
    cr_api = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
    crs = reader.get(_path(cr_api, names.CRD_KIND, None)) or {}
    for item in crs.get("items") or []:
        o = _observed(item, names.CRD_KIND)
        out.crs[o.name] = o
    held = state.namespaces() if state is not None else []
    for ns in dict.fromkeys([*(d.namespace for d in stack.deployments), *held]):
        live = reader.get(_path("v1", "Namespace", None, ns))
        if live is not None:
            out.namespaces[ns] = _observed(live, "Namespace")
    wanted: list[tuple[int, str, str]] = []  # (deployment index, kind, path)
    for i, d in enumerate(stack.deployments):
        out.same_named[i] = []
        for obj in bundle.build_deployment_objects(d, create_namespace=False).all():
            if obj["kind"] == names.CRD_KIND and obj["apiVersion"] == cr_api:
                continue  # the CR is judged above
            meta = obj["metadata"]
            path = _path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            wanted.append((i, obj["kind"], path))
    # About 20 GETs per deployment, each a round trip to a remote API server: in parallel.
    with ThreadPoolExecutor(max_workers=_PARALLEL_GETS) as pool:
        lives = list(pool.map(lambda w: reader.get(w[2]), wanted))
    by_path: dict[str, dict[str, Any]] = {}
    for (i, kind, path), live in zip(wanted, lives, strict=True):
        if live is not None:
            out.same_named[i].append(_observed(live, kind))
            by_path[path] = live
    out.patch_rejections = patch_rejections(reader, stack, by_path)
    daemon_sets = reader.get(_path("apps/v1", "DaemonSet", None)) or {}
    out.daemon_sets = [_observed(d, "DaemonSet") for d in daemon_sets.get("items") or []]
    # Volumes of the drivers that could be renamed or removed or change device mode: this
    # stack's CRs (a removed deployment is known only by its CR) and the configured names.
    drivers = set(out.crs) | {d.name for d in stack.deployments}
    drivers |= {d.renamed_from for d in stack.deployments if d.renamed_from}
    for api_version, kind in (
        ("v1", "PersistentVolume"),
        ("storage.k8s.io/v1", "VolumeAttachment"),
        ("storage.k8s.io/v1", "StorageClass"),
    ):
        for item in (reader.get(_path(api_version, kind, None)) or {}).get("items") or []:
            if kind == "StorageClass":  # its provisioner is a top-level field
                item = {**item, "spec": {"provisioner": item.get("provisioner")}}
            o = _observed(item, kind)
            if volume_driver(o) in drivers:
                out.volumes.append(o)
    return out


# Managers for the dry run when the live object has no entry of the provider's.
DRY_RUN_MANAGER = "pmem-csi-preflight"


def _provider_manager(live: Mapping[str, Any]) -> str:
    """The provider's field manager of ``live`` (server-side apply), so that the dry run
    applies as the provider will: fields it owns and the object no longer has are removed."""
    from pmem_components.fieldowners import is_pulumi_manager

    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        manager = str(entry.get("manager") or "")
        if entry.get("operation") == "Apply" and is_pulumi_manager(manager):
            return manager
    return DRY_RUN_MANAGER


def _refusal(status: Mapping[str, Any], secret: bool) -> tuple[list[str], str]:
    """(fields, reason) of an API server Status. For a Secret only the fields and the
    reasons (``FieldValueInvalid``), never the messages: they may quote values."""
    causes = [c for c in (status.get("details") or {}).get("causes") or [] if c.get("field")]
    fields = [str(c["field"]) for c in causes]
    word = "reason" if secret else "message"
    reason = "; ".join(f"{c['field']}: {c.get(word) or ''}" for c in causes)
    if not reason:
        reason = str(status.get("reason" if secret else "message") or status.get("reason") or "")
    return fields, reason[:300]


def _same_field(changed: str, refused: str) -> bool:
    """Whether a changed path and a field the API server refused are one, or one holds the
    other: ``a.b`` holds ``a.b.c`` and the list entry's ``a.b[0].c`` (the API server names list
    entries with ``[``; a changed list is one path)."""
    return any(
        inner == outer or inner.startswith((outer + ".", outer + "["))
        for inner, outer in ((changed, refused), (refused, changed))
    )


def patch_rejections(
    reader: Any, stack: StackConfig, lives: Mapping[str, Mapping[str, Any]]
) -> list[Rejection]:
    """Dry-run every live object a patch selects, patched and as built (see module doc).

    ``reader.dry_apply(path, obj, manager)`` returns (HTTP status, body). Only a refusal of
    the patched object that the unpatched one does not get counts: the patch is its cause.
    """
    from pmem_components.patches import PatchSet, changed_paths

    out: list[Rejection] = []
    for i, d in enumerate(stack.deployments):
        if not d.patches:
            continue
        patch_set = PatchSet.for_deployment(i, d.patches)
        for obj in bundle.build_deployment_objects(d, create_namespace=False).all():
            meta = obj["metadata"]
            path = _path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            live = lives.get(path)
            kind, api_version = obj["kind"], obj["apiVersion"]
            labels = tuple(
                e.label for e in patch_set.entries if e.selects(kind, obj, api_version)
            )
            if live is None or not labels:
                continue
            patched = patch_set.apply(f"kubernetes:{api_version}:{kind}", obj) or obj
            manager = _provider_manager(live)
            status, body = reader.dry_apply(path, patched, manager)
            if 200 <= status <= 299:
                continue
            if status != 422:
                raise RuntimeError(f"dry-run apply of {path}: HTTP {status}")
            plain_status, _ = reader.dry_apply(path, obj, manager)
            if plain_status != 200 and plain_status != 201:
                continue  # refused without the patches too: not theirs to answer for
            fields, reason = _refusal(body, secret=kind == "Secret")
            changed = changed_paths(obj, patched)
            named = [c for c in changed if any(_same_field(c, f) for f in fields)]
            ns = meta.get("namespace")
            out.append(
                Rejection(
                    index=i,
                    labels=labels,
                    ref=f"{kind} {ns + '/' if ns else ''}{meta['name']}",
                    fields=tuple(named or fields or changed),
                    reason=reason,
                )
            )
    return out


def run(
    stack: StackConfig,
    stack_id: str,
    api_client: Any,
    state: identity.StackState | None = None,
) -> Plan:
    """Observe and plan; cluster errors become :class:`PreflightError` with the way out."""
    try:
        observed = observe(api_client, stack, state)
    except Exception as err:  # any failure to read must stop the update, with the reason
        raise PreflightError(
            f"pmem-csi:preflight: cannot read the cluster ({kubetarget.error_text(err)}); "
            "the preflight checks need get/list on Deployment CRs, "
            "namespaces, DaemonSets, PersistentVolumes, VolumeAttachments, StorageClasses and "
            "the deployment's objects, and patch (server-side dry run) on the objects patches "
            "select. Set pmem-csi:preflight: "
            "false to skip them (adoption, rename and migration are then not checked)"
        ) from None
    return plan(stack, observed, stack_id, state)
