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
  delete them; refused, listing them, and the pods with inline CSI volumes of it (listed only
  when a driver would go: :func:`_leaving`), with per case the way forward (claims to delete,
  PersistentVolumes no claim holds any more). A deployment whose CR (or the CRD) was deleted
  by hand is still known by the stack's state (:func:`_held_without_cr`). A device mode
  change is judged by what runs (the node DaemonSet's ``-deviceManager``, read as Go's flag
  package reads it) as well as by the CR, which may be gone.
* Would a move's delete of the old node DaemonSet not be awaited (``pulumi.com/skipAwait``
  makes the provider return from the delete at once)? Then two node drivers would overlap.
* Which namespaces did this stack create that configured deployments still use although no
  deployment creates them any more (``createNamespace: false``)? Returned in
  :attr:`Plan.keep_namespaces`, so the program keeps them instead of deleting them; so are
  those no configured deployment uses any more while another stack's deployment or another
  driver lives in them (:attr:`Plan.kept_namespaces`). Either way the program registers them
  with the live labels and annotations this stack's field manager applied
  (:attr:`Plan.kept_metadata`, :func:`own_metadata`).
* Would the update make the provider replace an object (delete it and create it anew)? The
  pinned provider decides that alone, from its own list of fields per kind
  (:data:`PROVIDER_FORCE_NEW`, taken from its source) and the inputs it recorded at the last
  update, never asking the API server: so does the preflight, from the same record in the
  stack's state (:meth:`identity.StackState.recorded`), with no request. A changed field on
  the list is refused naming it: the patch entry when the patch makes the difference, else
  the deployment (a removed patch, a config change). Would the API server refuse the update
  (a field it does not let change that is not on the provider's list, an invalid value, an
  admission policy)? Then the provider's update fails. Each other declared object that
  exists and that the update changes (compared locally with the live one first, so an
  unchanged stack sends no request) is applied in a server-side dry run against the live
  one, as the provider applies it (its field manager), with the patches and, when refused,
  without: a refusal only with them is a config error naming the patch entry and the
  fields, one without them too names the deployment (:class:`Rejection`, worded by case in
  :func:`rejection_problem`). A dry run answered with no verdict (403, 409, 5xx, a
  timeout) stops the update naming the patch and the object (:class:`DryRunError`).

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
    # ``status.phase`` (a PersistentVolume's Bound, Released, Available, Failed).
    phase: str = ""
    # A Namespace's labels and annotations per field manager that applied them (managedFields,
    # Apply entries on the object itself): manager -> ("labels"|"annotations") -> keys.
    applied_metadata: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)
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
    # True: a field the provider replaces the object for (:data:`PROVIDER_FORCE_NEW`, judged
    # from the stack's state); False: the API server refused the change in a dry run, so
    # the provider's update would fail.
    replace: bool = False


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
    # Pods with an inline CSI volume (``spec.volumes[].csi``) of such a driver; read only
    # when one would be removed or renamed (see :func:`observe`).
    pods: list[ObservedObject] = field(default_factory=list)
    patch_rejections: list[Rejection] = field(default_factory=list)


@dataclass(frozen=True)
class KeptNamespace:
    """A namespace the stack keeps although none of its deployments uses it any more."""

    reason: str  # what else lives in it: "DaemonSet ns/name, Deployment x"


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
    # Why a namespace in :attr:`keep_namespaces` that no configured deployment uses is kept:
    # what else lives in it ("Deployment x (stack ...)", "DaemonSet ns/name").
    kept_namespaces: dict[str, KeptNamespace] = field(default_factory=dict)
    # Per kept namespace: the labels and annotations this stack's field manager applied, as
    # read (filled by ``run``, :func:`own_metadata`), so that releasing it leaves them as
    # they are (those a ``kind: Namespace`` patch added too) and others' untouched.
    kept_metadata: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)


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
    ``-deviceManager`` flag as the driver reads it: what manages the PMEM now, whatever the
    CR says. A driver container (one with ``-drivername``, or whose command is
    pmem-csi-driver) without the flag runs the flag's default, :data:`DEFAULT_DEVICE_MANAGER`."""
    out = []
    for ds in observed.daemon_sets:
        if not _runs(ds, driver):
            continue
        for container in _containers(ds):
            env = _env_of(container)
            flags = _go_flags(_words(container))
            mode = flags.get("deviceManager")
            if mode is None and (
                _container_driver(container) is not None or _is_driver_program(container)
            ):
                mode = DEFAULT_DEVICE_MANAGER
            if mode is not None:
                # Set from valueFrom/envFrom: not readable here, so not judged (a literal
                # "$(VAR)" would be taken for a mode and refuse every update of the driver).
                mode = _expand(mode, env, bool(container.get("envFrom")))
                if mode is not None:
                    out.append((ds, DEVICE_MODE_ALIASES.get(mode, mode)))
    return out


# pmem-csi-driver's defaults (pkg/pmem-csi-driver/main.go): ``-deviceManager`` and
# ``-drivername`` when not given.
DEFAULT_DEVICE_MANAGER = "lvm"
DRIVER_PROGRAM = "pmem-csi-driver"


# A driver name set through ``valueFrom`` (a ConfigMap, a field): the kubelet resolves it when
# the pod starts; the preflight cannot, so such a DaemonSet counts as the driver whose node
# DaemonSet name it has (see :func:`_runs`).
UNREADABLE = "<unreadable>"
DRIVER_NAME_ENV = "PMEM_CSI_DRIVER_NAME"


def _containers(ds: ObservedObject) -> list[Mapping[str, Any]]:
    pod = ((ds.spec.get("template") or {}).get("spec")) or {}
    return [c for c in pod.get("containers") or [] if isinstance(c, Mapping)]


def _words(container: Mapping[str, Any]) -> list[str]:
    """The arguments the container's program gets: ``command`` without the program itself,
    then ``args``; with no ``command`` the image's entrypoint gets ``args`` alone."""
    command = [str(w) for w in container.get("command") or []]
    return [*command[1:], *(str(w) for w in container.get("args") or [])]


# Boolean flags of pmem-csi-driver and of klog, which it registers: Go's flag package gives
# a boolean flag written without ``=`` no value, so the next word is not its value but an
# argument, where parsing stops (``-testEndpoint x -deviceManager=direct``: not a flag).
BOOLEAN_FLAGS = frozenset(
    {
        "testEndpoint",
        "version",
        "logtostderr",
        "alsologtostderr",
        "skip_headers",
        "skip_log_headers",
        "add_dir_header",
        "one_output",
        "help",
        "h",
    }
)




def _go_flags(words: list[str]) -> dict[str, str]:
    """Flag values as Go's ``flag`` package parses them: ``-f=X``, ``--f=X``, ``-f X`` and
    ``--f X``; the last occurrence wins; parsing stops at ``--`` or at the first word that is
    not a flag. A flag without ``=`` consumes the next word, whatever it is, unless it is one
    of :data:`BOOLEAN_FLAGS` (the driver's and klog's booleans; every other flag the driver
    registers takes a value: pmem-csi d01bc59 ``pkg/pmem-csi-driver/main.go``)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" or len(word) < 2 or not word.startswith("-"):
            break
        name = word[2:] if word.startswith("--") else word[1:]
        if not name or name.startswith("-") or name.startswith("="):
            break  # Go: a bad flag syntax error; the driver would not start
        if "=" in name:
            name, value = name.split("=", 1)
        elif i + 1 < len(words) and name not in BOOLEAN_FLAGS:
            i += 1
            value = words[i]
        else:
            value = "true"  # a boolean flag
        out[name] = value
        i += 1
    return out


def _env_of(container: Mapping[str, Any]) -> dict[str, str | None]:
    """The container's environment as the kubelet builds it: the last entry of a name wins,
    ``$(VAR)`` in a value refers to the entries before it; None: set through ``valueFrom``,
    or referring to a variable only ``envFrom`` can set (its ConfigMap or Secret is not
    read here)."""
    env: dict[str, str | None] = {}
    open_ = _has_env_from(container)
    for entry in container.get("env") or []:
        if not isinstance(entry, Mapping) or not entry.get("name"):
            continue
        if "valueFrom" in entry and entry.get("valueFrom") is not None:
            env[str(entry["name"])] = None
        else:
            env[str(entry["name"])] = _expand(str(entry.get("value") or ""), env, open_)
    return env


def _has_env_from(container: Mapping[str, Any]) -> bool:
    return bool(container.get("envFrom"))


def _expand(
    value: str | None, env: Mapping[str, str | None], env_from: bool = False
) -> str | None:
    """``$(VAR)`` references replaced as the kubelet does (``$$`` escapes, unknown names
    stay as written); None when a referenced variable is set through ``valueFrom``, or is
    unknown while the container has ``envFrom`` (which may set it: not readable here)."""
    if value is None:
        return None
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2 : end]
            if name in env:
                resolved = env[name]
                if resolved is None:
                    return None
                out.append(resolved)
                i = end + 1
                continue
            if env_from:
                return None
        out.append(value[i])
        i += 1
    return "".join(out)


def _container_driver(container: Mapping[str, Any]) -> str | None:
    """The CSI driver name a driver container runs with, from its ``-drivername`` flag;
    :data:`UNREADABLE` when it comes from ``valueFrom`` or ``envFrom``; None: no such flag
    (a sidecar, or a driver that runs the flag's default)."""
    flag = _go_flags(_words(container)).get("drivername")
    if flag is None:
        return None
    name = _expand(flag, _env_of(container), _has_env_from(container))
    return name if name is not None else UNREADABLE


def _is_driver_program(container: Mapping[str, Any]) -> bool:
    """Whether the container's command is pmem-csi-driver (by its file name)."""
    command = [str(w) for w in container.get("command") or []]
    return bool(command) and command[0].rsplit("/", 1)[-1] == DRIVER_PROGRAM


def _driver_name_of(ds: ObservedObject) -> str | None:
    """The CSI driver name a DaemonSet's pods run with: a driver container's ``-drivername``
    (the program sets ``-drivername=$(PMEM_CSI_DRIVER_NAME)``), or without the flag the
    ``PMEM_CSI_DRIVER_NAME`` variable (the sidecars' registration path); with neither, the
    flag's default when a container's command is pmem-csi-driver (a DaemonSet that runs it
    through the image's entrypoint without either setting is not identified);
    :data:`UNREADABLE` when it comes from ``valueFrom`` (or ``envFrom``)."""
    containers = _containers(ds)
    for container in containers:
        name = _container_driver(container)
        if name is not None:
            return name
    for container in containers:
        env = _env_of(container)
        if DRIVER_NAME_ENV in env:
            name = env[DRIVER_NAME_ENV]
            return name if name else UNREADABLE
    if any(_is_driver_program(c) for c in containers):
        return names.DEFAULT_DRIVER_NAME
    return None


def _runs(ds: ObservedObject, driver: str) -> bool:
    """Whether ``ds`` runs node drivers of ``driver``: by its driver name, or, where that is
    unreadable here, by its name (the node DaemonSet's name is derived from the driver's)."""
    name = _driver_name_of(ds)
    if name == UNREADABLE:
        return ds.name == names.DeploymentNames(driver).node_driver
    return name == driver


_WORKLOADS_FIRST = {
    "DaemonSet": 0,
    "StatefulSet": 1,
    "Deployment": 2,
    "PersistentVolume": 3,
    "VolumeAttachment": 4,
    "StorageClass": 5,
    "Pod": 6,
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
    # ... and those whose CR is gone (deleted by hand, or with the CRD): the state still
    # holds them (their CR, their node DaemonSet). Name -> namespace ("" if unknown).
    held_only = _held_without_cr(state, observed)
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
        # Where it runs now: its CR's record, or the state's when the CR is gone.
        old_ns = _namespace_of(d.name, mine, held_only)
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
        old_ns = _namespace_of(d.renamed_from, mine, held_only)
        gone_cr = d.renamed_from not in mine
        if gone_cr and old_ns == "" and d.name not in mine and d.name not in held_only:
            out.problems.append(_rename_from_nowhere(i, str(d.renamed_from), d.name))
        elif old_ns is not None and d.name not in mine and d.name not in held_only:
            out.previous[i] = Previous(str(d.renamed_from), old_ns)
            problem = _stranding_problem(
                key_path(("deployments", i, "renamedFrom")),
                f"renaming {d.renamed_from!r} to {d.name!r} would strand its volumes",
                str(d.renamed_from),
                observed,
                f" (the node state directory /var/lib/{d.renamed_from} would be left behind "
                "too). A rename is refused while the old driver has volumes: keep the name "
                f"{d.renamed_from!r} (a namespace change with allowReinstall keeps the "
                "volumes), or first",
                "then rename",
            )
            if problem:
                out.problems.append(problem)
        if i in out.previous:
            problem = _unawaited_move_problem(i, d, out.previous[i], observed)
            if problem:
                out.problems.append(problem)

    known = [*mine, *(n for n in held_only if n not in mine)]
    gone = sorted(n for n in known if n not in configured and n not in renamed)
    if state is not None:
        for g in gone:
            problem = g in mine and _dropped_taken(mine[g], state)
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
        problem = _stranding_problem(
            key_path(("deployments",)),
            f"{g!r} (deployed by this stack) is no longer configured but still has volumes",
            g,
            observed,
            "; removing it would leave them without a driver (they could no longer be "
            "mounted, unmounted or deleted). Keep it configured and first",
            "then remove it",
        )
        if problem:
            out.problems.append(problem)
    new = [
        (i, d)
        for i, d in enumerate(deps)
        if d.name not in observed.crs and d.name not in held_only
    ]
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
            if not _runs(ds, d.name) or ds.namespace == d.namespace:
                continue
            if prev is not None and ds.namespace == prev.namespace:
                continue  # the reinstall replaces it, old one first
            if (d.name in mine or d.name in held_only) and ds.ours:
                continue  # this stack's own (a refused move says so above)
            out.problems.append(
                f"{key_path(('deployments', i, 'namespace'))}: {ds.ref} runs node drivers "
                f"for {d.name!r} in another namespace; a second node driver of the same name "
                "would run on the same nodes. Remove it first"
                + (f" ({RUNBOOK})" if ds.operator_owner or not ds.ours else "")
            )

    out.problems += [rejection_problem(r) for r in observed.patch_rejections]

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
            if _still_held(live, state):
                out.keep_namespaces.add(ns)
        elif identity.names_this_stack(live.stack_owner, stack_id):
            out.keep_namespaces.add(ns)
    if state is not None:
        used = {d.namespace for d in deps}
        for ns in state.namespaces():
            live = observed.namespaces.get(ns)
            if ns in used or live is None or not _still_held(live, state):
                continue
            others = _others_in(ns, observed, state, set(mine) | set(held_only))
            if others:
                out.keep_namespaces.add(ns)
                out.kept_namespaces[ns] = KeptNamespace(_listing(others, most=3))
    return out


def _still_held(live: ObservedObject, state: identity.StackState) -> bool:
    """Whether a namespace is still this stack's to keep: the state holds it, no other stack
    took it over since (refused above: keeping it would write it), and it is not one the last
    update released. A released one lost the stack annotation (program.deploy) and the next
    update drops it from the state; one registered by a version from before that annotation
    has none either, but the state holds it under its old URN, as a child of the
    PmemCsiDeployment component."""
    if not state.holds(live.key, live.uid) or _taker(live, state) is not None:
        return False
    if live.stack_owner is not None:
        return True
    return _PER_DEPLOYMENT_NAMESPACE in (state.urn(live.key) or "")


# The type of a namespace in the URN it had when each deployment registered its own (before
# the stack annotation): ``...::pmem-csi:index:PmemCsiDeployment$kubernetes:core/v1:Namespace::``.
_PER_DEPLOYMENT_NAMESPACE = "$kubernetes:core/v1:Namespace::"


def _others_in(
    ns: str, observed: Observed, state: identity.StackState, this_stacks: set[str]
) -> list[ObservedObject]:
    """What lives in namespace ``ns`` that is not this stack's and that deleting the
    namespace would delete: other stacks' (or the operator's) Deployment CRs recording it as
    their namespace, DaemonSets the state does not hold (another driver, the operator's).
    A DaemonSet of one of this stack's drivers is this stack's even with another uid (deleted
    and re-created by hand): it goes with its deployment."""
    crs = [
        cr
        for name, cr in observed.crs.items()
        if str(cr.spec.get("namespace") or "") == ns and name not in this_stacks
    ]
    daemon_sets = [
        ds
        for ds in observed.daemon_sets
        if ds.namespace == ns
        and not state.holds(ds.key, ds.uid)
        and not any(_runs(ds, name) for name in this_stacks)
    ]
    return [*daemon_sets, *crs]


def _held_without_cr(state: identity.StackState | None, observed: Observed) -> dict[str, str]:
    """This stack's deployments whose CR is not in the cluster, by the stack's state: the CRs
    it holds and the driver names of the node DaemonSets it holds. Name -> namespace (the
    namespace of its node DaemonSet in the cluster, or of its objects in the state:
    :func:`_held_namespace`; "" if none is known).

    Without them a removal or rename after the CR (or the CRD) was deleted by hand would be
    judged as if the deployment had never been there: no volume guard, no ordered move.
    Without the state (library use) the CR is the only record: DaemonSets carry no stack
    identity."""
    if state is None:
        return {}
    out: dict[str, str] = {}
    for group, kind, _, name in state.objects:
        if (group, kind) == (names.CRD_GROUP, names.CRD_KIND) and name not in observed.crs:
            out[name] = ""
    for ds in observed.daemon_sets:
        driver = _driver_name_of(ds)
        if (
            driver
            and driver != UNREADABLE
            and driver not in observed.crs
            and state.holds(ds.key, ds.uid)
        ):
            out[driver] = ds.namespace
    for name, namespace in out.items():
        if not namespace:
            out[name] = _held_namespace(state, name)
    return out


def _held_namespace(state: identity.StackState, driver: str) -> str:
    """The namespace of ``driver``'s objects in the stack's state: its node DaemonSet's,
    else its controller StatefulSet's, else any namespaced object of its names (Secrets,
    Services, ServiceAccount, Role, reporter); "" when the state holds none."""
    n = names.DeploymentNames(driver)
    preferred = [("apps", "DaemonSet", n.node_driver), ("apps", "StatefulSet", n.controller_driver)]
    own = {
        n.registry_secret, n.node_secret, n.controller_service, n.metrics_service,
        n.service_account, n.provisioner_role, n.provisioner_role_binding, n.reporter,
    }  # fmt: skip
    held = [(g, k, ns, nm) for g, k, ns, nm in state.objects if ns]
    for want in preferred:
        found = next((ns for g, k, ns, nm in held if (g, k, nm) == want), "")
        if found:
            return found
    return next((ns for _, _, ns, nm in held if nm in own), "")


def _rename_from_nowhere(i: int, old: str, new: str) -> str:
    """The refusal of a rename whose old deployment's namespace is unknown: its CR (which
    records it) is gone and the stack's state holds no namespaced object of it, so the
    rename could not delete its old objects (they would be looked for in namespace "")."""
    return (
        f"{key_path(('deployments', i, 'renamedFrom'))}: {old!r} is in this stack's state "
        "but its Deployment CR is gone (deleted by hand, or with the CRD) and the state holds "
        "no object of it with a namespace, so where its old objects are cannot be told. "
        f"Rename in two pulumi ups instead: first one without {old!r} (nor renamedFrom; its "
        f"volumes are checked then), then one that adds {new!r}"
    )


def _namespace_of(
    name: str | None, mine: Mapping[str, ObservedObject], held_only: Mapping[str, str]
) -> str | None:
    """Where this stack's deployment ``name`` runs (its CR's ``spec.namespace``, or by the
    state when the CR is gone); None when it is not this stack's."""
    if not name:
        return None
    if name in mine:
        return str(mine[name].spec.get("namespace") or "")
    return held_only.get(name)


def _unclaimed(volume: ObservedObject) -> bool:
    """A PersistentVolume no claim holds: Released or Failed (its claim was deleted), or
    Available (with a ``claimRef`` it is pre-bound to a claim that does not bind it yet, or
    does not exist). Deleting claims cannot remove it."""
    if volume.kind != "PersistentVolume":
        return False
    return volume.phase in ("Released", "Failed", "Available")


# The annotation the external-provisioner sets on the PersistentVolumes it created: only
# those it deletes (with their volume) when their reclaim policy is Delete.
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def _provisioned(volume: ObservedObject) -> bool:
    return bool(volume.annotations.get(PROVISIONED_BY))


def _retained(volume: ObservedObject) -> bool:
    return volume.spec.get("persistentVolumeReclaimPolicy") == "Retain"


def _claim_of(volume: ObservedObject) -> str | None:
    ref = volume.spec.get("claimRef") or {}
    if not isinstance(ref, Mapping) or not ref.get("name"):
        return None
    return f"{ref.get('namespace') or ''}/{ref['name']}".lstrip("/")


def _names(items: list[str], most: int = 5) -> str:
    text = ", ".join(items[:most])
    return text + (f" and {len(items) - most} more" if len(items) > most else "")


# Phases of a pod whose containers have all ended: the kubelet has unmounted its volumes
# (or will, without the driver's help for an ephemeral volume already torn down).
_COMPLETED = ("Succeeded", "Failed")


def _pods_of(observed: Observed, driver: str) -> list[ObservedObject]:
    """Pods that are not completed (:data:`_COMPLETED`) with an inline CSI ephemeral volume
    of ``driver`` (``spec.volumes[].csi``): a completed pod no longer uses its volume."""
    return [
        p
        for p in observed.pods
        if p.phase not in _COMPLETED
        and any(
            isinstance(v, Mapping) and (v.get("csi") or {}).get("driver") == driver
            for v in p.spec.get("volumes") or []
        )
    ]


_RECLAIM_DELETE = (
    "`kubectl patch pv NAME -p '{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Delete\"}}'`"
)


def _volume_steps(volumes: list[ObservedObject]) -> list[str]:
    """What to do with a driver's PersistentVolumes before it goes, per kind of volume:
    claims to delete; a Retain volume stays (Released) when its claim goes, so the PV is to
    be deleted after it; one no claim holds cannot be removed by deleting claims. Making the
    driver delete a volume by setting the reclaim policy to Delete works only for a PV the
    external-provisioner created (:data:`PROVISIONED_BY`): it deletes no other."""
    steps = []
    claimed = [v for v in volumes if v.kind == "PersistentVolume" and not _unclaimed(v)]
    unclaimed = [v for v in volumes if _unclaimed(v)]
    deleting = [v for v in claimed if not _retained(v)]
    retained = [v for v in claimed if _retained(v)]
    if deleting:
        steps.append(
            "delete the PersistentVolumeClaims"
            + _claims_of(deleting)
            + " (the running driver deletes their volumes)"
        )
    if retained:
        provisioned = [v for v in retained if _provisioned(v)]
        steps.append(
            "delete the PersistentVolumeClaims"
            + _claims_of(retained)
            + f": their PersistentVolumes ({_listing(retained)}) have reclaim policy Retain, "
            "so each stays, Released, when its claim goes: delete the PV after its claim "
            "(`kubectl delete pv NAME`; the data stays on the node)"
            + (
                f", or, for {_listing(provisioned)} (made by the provisioner), first "
                f"{_RECLAIM_DELETE} to make the running driver delete the volume with its claim"
                if provisioned
                else ""
            )
        )
    if unclaimed:
        provisioned = [v for v in unclaimed if v.phase != "Available" and _provisioned(v)]
        steps.append(
            "the PersistentVolumes that no claim holds (Released, Failed, or Available, "
            f"pre-bound or not: {_listing(unclaimed)}) are not removed by deleting claims: "
            "`kubectl delete pv NAME` once its data is no longer needed (with reclaim policy "
            "Retain the data stays on the node)"
            + (
                f"; for {_listing(provisioned)} (made by the provisioner), {_RECLAIM_DELETE} "
                "makes the running driver delete its volume"
                if provisioned
                else ""
            )
        )
    return steps


def _claims_of(volumes: list[ObservedObject]) -> str:
    claims = sorted({c for c in map(_claim_of, volumes) if c})
    return f" {_names(claims)}" if claims else ""


def _stranding_problem(
    key: str, what: str, driver: str, observed: Observed, why: str, then: str
) -> str | None:
    """The refusal of a removal or rename of ``driver`` while it has volumes or pods with its
    inline volumes: what they are, and per kind what to do while the driver still runs."""
    volumes = _volumes_of(observed, driver)
    pods = _pods_of(observed, driver)
    if not volumes and not pods:
        return None
    steps = _volume_steps(volumes)
    if pods:
        steps.append(
            f"delete the pods that use inline volumes of it ({_listing(pods)}, or scale "
            "down their controllers)"
        )
    if any(v.kind == "StorageClass" for v in volumes):
        steps.append("delete the StorageClasses that name it")
    if any(v.kind == "VolumeAttachment" for v in volumes):
        steps.append("its VolumeAttachments go once no pod uses their volumes")
    in_use = [*volumes, *pods]
    return (
        f"{key}: {what}: {_listing(in_use)} name the CSI driver {driver!r}, and Kubernetes "
        f"finds a volume's driver by that name only{why}, while it runs: "
        + "; ".join(steps)
        + f"; {then}"
    )


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
    # Another Pulumi manager that wrote the identity too: it applied the same value (a stack
    # made under the old name of a renamed one, adopting with takeOverFields false), which
    # server-side apply records as shared ownership (re-review of the tail's fixes).
    others = [w for w in writers if w != own and w in live.pulumi_managers]
    return own if foreign and writers and (own not in writers or others) else None


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
    what = "rename" if prev.name != d.name else "reinstall"
    old_ds = names.DeploymentNames(prev.name).node_driver
    carried = next(
        (
            ds
            for ds in observed.daemon_sets
            if ds.namespace == prev.namespace
            and ds.name == old_ds
            and str(ds.annotations.get(SKIP_AWAIT_ANNOTATION, "")).lower() == "true"
        ),
        None,
    )
    off = (
        f"{key}: false sets pulumi.com/skipAwait, with which the provider does not wait "
        f"for a delete either: the old node DaemonSet of this {what} would still run its pods "
        "when the new one starts, two node drivers on the same nodes"
    )
    if carried is None:
        return None if d.await_.enabled else (
            f"{off}. Set await.enabled: true for the update that moves the deployment"
        )
    # Turning await on in the moving update is not enough (the old DaemonSet keeps the
    # annotation until an update without the move rewrites it): say both steps at once, or
    # the administrator following the first refusal meets a second one.
    return (
        (f"{off}; and " if not d.await_.enabled else f"{key}: ")
        + f"{carried.ref} carries {SKIP_AWAIT_ANNOTATION} (from await.enabled: false), "
        "which the provider reads when it deletes it, so the move would not wait for "
        "the old node driver's pods to go: two node drivers on the same nodes; "
        "first run pulumi up with await.enabled: true and the deployment where it is "
        f"(name {prev.name!r}, namespace {prev.namespace!r}), then move it"
    )


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
        phase=str((obj.get("status") or {}).get("phase") or ""),
        applied_metadata=_applied_metadata(meta) if kind == "Namespace" else {},
        identity_writers=_identity_writers(meta.get("managedFields") or []),
    )


# Field managers whose entries the provider renames to its own before each server-side apply
# of an update (pulumi-kubernetes v4.25.0 ``await.fixCSAFieldManagers`` through fluxcd's
# ``ssa.PatchReplaceFieldsManagers``, matched by prefix): (manager prefix, operation). What they
# own becomes this stack's in that very apply, so a key of theirs not sent would be removed.
ABSORBED_MANAGERS = (
    ("kubectl", "Apply"),
    ("kubectl", "Update"),
    ("before-first-apply", "Update"),
    ("pulumi-kubernetes", "Update"),
    ("pulumi-resource-kubernetes", "Update"),
)
# The key under which ``_applied_metadata`` gathers the absorbed entries' keys.
ABSORBED = "\0absorbed"


def _applied_metadata(meta: Mapping[str, Any]) -> dict[str, dict[str, frozenset[str]]]:
    """Per field manager with an Apply entry on the object itself: the label and annotation
    keys it owns (``fieldsV1`` ``f:metadata`` / ``f:labels`` / ``f:<key>``); under
    :data:`ABSORBED`, those of the entries the provider takes over (:data:`ABSORBED_MANAGERS`)."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for entry in meta.get("managedFields") or []:
        if entry.get("subresource"):
            continue
        manager, operation = str(entry.get("manager") or ""), entry.get("operation")
        absorbed = any(
            manager.startswith(prefix) and operation == op for prefix, op in ABSORBED_MANAGERS
        )
        if operation != "Apply" and not absorbed:
            continue
        fields = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        for who in (manager, ABSORBED) if absorbed else (manager,):
            if who == manager and operation != "Apply":
                continue
            owned = out.setdefault(who, {})
            for part in ("labels", "annotations"):
                keys = {k[2:] for k in fields.get(f"f:{part}") or {} if str(k).startswith("f:")}
                owned[part] = owned.get(part, frozenset()) | keys
    return out


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

    def get(self, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any] | None:
        """GET ``path`` as JSON; None on 404 (through the client's auth and TLS settings)."""
        import json

        from kubernetes.client.exceptions import ApiException

        resp = kubecall.request(self.api, "GET", path, timeout=15, query=query)
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
    stack's ``state`` holds), same-named objects, DaemonSets, the volumes of the drivers
    concerned, and, only when a driver would be removed or renamed, pods with inline
    volumes of it."""
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
    out.patch_rejections = patch_rejections(reader, stack, by_path, state)
    daemon_sets = reader.get(_path("apps/v1", "DaemonSet", None)) or {}
    out.daemon_sets = [_observed(d, "DaemonSet") for d in daemon_sets.get("items") or []]
    # Volumes of the drivers that could be renamed or removed or change device mode: the CRs
    # (a removed deployment is known by its CR), the deployments the state holds (whose CR
    # may be gone) and the configured names.
    leaving = _leaving(stack, out, state)
    drivers = set(out.crs) | {d.name for d in stack.deployments} | leaving
    drivers |= {d.renamed_from for d in stack.deployments if d.renamed_from}
    if leaving:
        out.pods = _inline_volume_pods(reader, leaving)
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


def _leaving(stack: StackConfig, out: Observed, state: identity.StackState | None) -> set[str]:
    """The drivers of this stack that this update would remove or rename away: the
    deployments the state holds (their CR, or their node DaemonSet: a CR may be gone), or
    without the state this program's CRs, that are not configured any more."""
    configured = {d.name for d in stack.deployments}
    if state is None:
        held = {name for name, cr in out.crs.items() if cr.ours}
    else:
        held = {
            name
            for group, kind, _, name in state.objects
            if (group, kind) == (names.CRD_GROUP, names.CRD_KIND)
        }
        held |= {
            str(_driver_name_of(ds))
            for ds in out.daemon_sets
            if state.holds(ds.key, ds.uid) and _driver_name_of(ds) not in (None, UNREADABLE)
        }
    return held - configured


# Pods per page when listing every pod of the cluster (as certrollout.PAGE_SIZE).
POD_PAGE = 500


# How often the pod list starts anew when its continue token expired (HTTP 410).
POD_LIST_RESTARTS = 3


def _inline_volume_pods(reader: _Reader, drivers: set[str]) -> list[ObservedObject]:
    """Every pod of the cluster with an inline CSI volume of one of ``drivers``.

    Kubernetes cannot select pods by a volume's driver, so this lists them all, with their
    spec, in pages of :data:`POD_PAGE`: costly on a large cluster, so only when a driver is
    about to be removed or renamed (:func:`_leaving`), never on an ordinary preview. Only the
    inline volumes of those drivers are kept. A continue token expires (410 Gone) when the
    list takes longer than the API server keeps its snapshot (5 minutes by default): the
    list starts anew, at most :data:`POD_LIST_RESTARTS` times, before it counts as not read."""
    from kubernetes.client.exceptions import ApiException

    for attempt in range(POD_LIST_RESTARTS + 1):
        try:
            return _pod_pages(reader, drivers)
        except ApiException as err:
            if err.status != 410 or attempt == POD_LIST_RESTARTS:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


def _pod_pages(reader: _Reader, drivers: set[str]) -> list[ObservedObject]:
    """One paged list of every pod (see :func:`_inline_volume_pods`)."""
    found: list[ObservedObject] = []
    token = ""
    while True:
        query = [("limit", str(POD_PAGE))] + ([("continue", token)] if token else [])
        page = reader.get("/api/v1/pods", query) or {}
        for item in page.get("items") or []:
            volumes = [
                v
                for v in ((item.get("spec") or {}).get("volumes") or [])
                if isinstance(v, Mapping) and (v.get("csi") or {}).get("driver") in drivers
            ]
            if volumes:
                found.append(_observed({**item, "spec": {"volumes": volumes}}, "Pod"))
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return found


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


class DryRunError(PreflightError):
    """A server-side dry run got no answer the preflight can judge (not a refusal)."""


@dataclass(frozen=True)
class _DryRun:
    """One declared object that exists live, to apply in a dry run."""

    index: int  # the deployment
    labels: tuple[str, ...]  # the patch entries that select it (none: config change only)
    path: str
    ref: str  # "StatefulSet ns/name"
    declared: dict[str, Any]  # as built, before the patches
    patched: dict[str, Any]  # as the provider will apply it
    live: Mapping[str, Any]
    # ``takeOverFields``: before the provider applies, the program's hook moves the fields
    # other managers own into the provider's entry (:mod:`pmem_components.takeover`).
    take_over: bool = False


def _contained(declared: Any, live: Any) -> bool:
    """Whether every value ``declared`` sets is the same in ``live`` (lists: same length,
    item by item). The live object has more (defaults, status): those do not count."""
    if isinstance(declared, Mapping):
        return isinstance(live, Mapping) and all(
            _contained(v, live.get(k)) for k, v in declared.items()
        )
    if isinstance(declared, list):
        return (
            isinstance(live, list)
            and len(declared) == len(live)
            and all(_contained(d, x) for d, x in zip(declared, live, strict=True))
        )
    return bool(declared == live)


def _owned_paths(fields: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths a managedFields entry's ``fieldsV1`` owns, down to maps (a list entry
    (``k:``, ``v:``, ``i:``) stands for its list: the list is compared whole)."""
    if not isinstance(fields, Mapping):
        return [prefix] if prefix else []
    keys = [k for k in fields if k != "."]
    if not keys:
        return [prefix] if prefix else []
    if any(not str(k).startswith("f:") for k in keys):
        return [prefix] if prefix else []
    out: list[tuple[str, ...]] = []
    for k in keys:
        out += _owned_paths(fields[k], (*prefix, str(k)[2:]))
    return out


def _dropped(declared: Mapping[str, Any], live: Mapping[str, Any], manager: str) -> list[str]:
    """Fields ``manager`` set on ``live`` (its last apply) that ``declared`` no longer has:
    applying ``declared`` removes them (and the API server may default them anew)."""
    out: list[str] = []
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != manager or entry.get("operation") != "Apply":
            continue
        if entry.get("subresource"):
            continue
        for path in _owned_paths(entry.get("fieldsV1")):
            if _not_judged(declared.get("kind"), path):
                continue
            node: Any = declared
            for part in path:
                if not isinstance(node, Mapping) or part not in node:
                    out.append(".".join(path))
                    break
                node = node[part]
    return out


# Fields whose change the API server never refuses as immutable, and which the program sets
# at registration (the component's annotations: spec digest, certificate hash, deletion
# policy, await) and a Secret's generated data (mutable; the provider updates it in place with
# ``enableSecretMutable``, see secretmutable): the built object differs from the live one
# there on every update, which is neither a change to judge nor a field to name.
_NOT_JUDGED: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("metadata", "annotations")),
    (None, ("spec", "template", "metadata", "annotations")),
    ("Secret", ("data",)),
    ("Secret", ("stringData",)),
)


def _judged(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without the fields of :data:`_NOT_JUDGED`."""
    from pmem_components.patches import _plain_copy

    out: dict[str, Any] = _plain_copy(obj)
    for kind, path in _NOT_JUDGED:
        if kind is not None and obj.get("kind") != kind:
            continue
        node: Any = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def _not_judged(kind: Any, path: tuple[str, ...]) -> bool:
    return any(
        (k is None or k == kind) and path[: len(p)] == p for k, p in _NOT_JUDGED
    )


def _unchanged(run: _DryRun, manager: str) -> bool:
    """Whether applying ``run.patched`` changes nothing the provider's manager set: then no
    field can change, mutable or not, and the dry run is not needed (most objects, most
    updates: the check costs requests only where the config changed something)."""
    # What patches change is the API server's to judge, annotations included (as before
    # this check covered objects without patches): only unpatched objects leave out what
    # the component sets at registration.
    declared, live = (
        (run.patched, run.live) if run.labels else (_judged(run.patched), _judged(run.live))
    )
    return _contained(declared, live) and not _dropped(declared, live, manager)


def _dry_runs(stack: StackConfig, lives: Mapping[str, Mapping[str, Any]]) -> list[_DryRun]:
    """Every declared object of every deployment that exists live, patched as registered."""
    from pmem_components.patches import PatchSet

    out: list[_DryRun] = []
    for i, d in enumerate(stack.deployments):
        patch_set = PatchSet.for_deployment(i, d.patches) if d.patches else None
        for obj in bundle.build_deployment_objects(d, create_namespace=False).all():
            meta = obj["metadata"]
            path = _path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
            live = lives.get(path)
            if live is None:
                continue  # not created yet: nothing to replace
            kind, api_version = obj["kind"], obj["apiVersion"]
            labels: tuple[str, ...] = ()
            patched = obj
            if patch_set is not None:
                labels = tuple(
                    e.label for e in patch_set.entries if e.selects(kind, obj, api_version)
                )
                patched = patch_set.apply(f"kubernetes:{api_version}:{kind}", obj) or obj
            ns = meta.get("namespace")
            ref = f"{kind} {ns + '/' if ns else ''}{meta['name']}"
            out.append(
                _DryRun(i, labels, path, ref, obj, patched, live, stack.take_over_fields)
            )
    return out


def _answer(reader: Any, path: str, obj: Mapping[str, Any], manager: str) -> tuple[int, Any]:
    """(status, body) of a dry run; status 0 and the error's words when none came (a
    timeout, a refused connection): no answer is not an acceptance."""
    try:
        return reader.dry_apply(path, obj, manager)
    except Exception as err:  # judged by the caller: not checked
        return 0, f"{type(err).__name__}: {str(err)[:200]}"


def _changed_fields(run: _DryRun, manager: str) -> list[str]:
    """What the declared object changes on the live one: values it sets differently, and
    fields the provider set before that it no longer sets."""
    from pmem_components.patches import changed_paths

    declared, live = _judged(run.patched), _judged(run.live)
    changed = changed_paths(_projected(live, declared), declared)
    return [*changed, *_dropped(declared, live, manager)]


def _projected(live: Any, declared: Any) -> Any:
    """``live`` cut down to the keys ``declared`` has (lists item by item)."""
    if isinstance(declared, Mapping) and isinstance(live, Mapping):
        return {k: _projected(live.get(k), v) for k, v in declared.items() if k in live}
    if isinstance(declared, list) and isinstance(live, list) and len(declared) == len(live):
        return [_projected(x, d) for x, d in zip(live, declared, strict=True)]
    return live


def _judge(reader: Any, run: _DryRun) -> Rejection | str | None:
    """A :class:`Rejection`, the reason the check could not be done (a line), or None."""
    from pmem_components.patches import changed_paths

    manager = _provider_manager(run.live)
    if _unchanged(run, manager):
        return None
    status, body = _answer(reader, run.path, run.patched, manager)
    if 200 <= status <= 299 or status == 404:
        return None  # accepted; 404: gone since it was read, so nothing to replace
    if status != 422:
        return _not_checked(run, status, body)
    if _taken_over_first(run):
        return None
    secret = run.patched.get("kind") == "Secret"
    fields, reason = _refusal(body if isinstance(body, dict) else {}, secret=secret)
    if run.labels and run.patched is not run.declared:
        plain_status, plain_body = _answer(reader, run.path, run.declared, manager)
        if 200 <= plain_status <= 299:  # refused only with the patches: theirs
            changed = changed_paths(run.declared, run.patched)
            named = [c for c in changed if any(_same_field(c, f) for f in fields)]
            return Rejection(run.index, run.labels, run.ref, tuple(named or fields or changed),
                             reason)
        if plain_status != 422:
            return _not_checked(run, plain_status, plain_body)
    changed = _changed_fields(run, manager)
    named = [c for c in changed if any(_same_field(c, f) for f in fields)]
    return Rejection(run.index, (), run.ref, tuple(named or fields or changed), reason)


def _taken_over_first(run: _DryRun) -> bool:
    """Whether the update takes the object's fields over from other managers before the
    provider applies (``takeOverFields`` and a foreign entry on it): then the dry run, which
    applies beside those managers (a list entry they added stays, half owned, as in the
    refused ``spec.ports[2].name: Required value`` of a Service edited by hand), is no
    verdict on what the provider will apply, which owns every field. Not refused: what the
    API server refuses then fails the update with its own message, and nothing is replaced
    (the replacements are judged from the state, :func:`_replacements`)."""
    from pmem_components.fieldowners import is_foreign

    entries = (run.live.get("metadata") or {}).get("managedFields") or []
    return run.take_over and any(
        isinstance(e, Mapping) and not e.get("subresource") and is_foreign(e) for e in entries
    )


def _not_checked(run: _DryRun, status: int, body: Any) -> str:
    """The line for a dry run the API server did not answer with a verdict on the fields."""
    if isinstance(body, str):
        got = f"no answer ({body})"
    else:
        secret = run.patched.get("kind") == "Secret"
        words = body.get("reason") if secret else (body.get("message") or body.get("reason"))
        got = f"HTTP {status}" + (f" ({str(words)[:200]})" if words else "")
    key = ", ".join(run.labels) or key_path(("deployments", run.index))
    return (
        f"{key}: the server-side dry run of {run.ref} (which tells whether the update would "
        f"change a field Kubernetes cannot change in place) got {got}, so that is not checked"
    )


# The fields whose change makes the pinned Kubernetes provider replace an object (delete it
# and create it anew) instead of updating it: pulumi-kubernetes v4.25.0 (requirements.txt),
# provider/pkg/provider/diff.go, ``forceNew`` and ``forceNewProperties``, at tag v4.25.0 =
# commit f47bc2d6f1996444d11c12b4ef083b82585f7c07. Its ``Diff`` (provider.go) never asks the
# API server: it prunes the object recorded at the last update to the shape of the inputs
# recorded then (``__inputs``), makes a JSON merge patch from that to the new inputs, and
# replaces when the patch touches one of these paths (a path holds everything below it: the
# ``.spec.selector.matchLabels`` entries there are in ``.spec.selector``). ``.metadata.name``
# and ``.metadata.namespace`` are on every kind's list; here another name is another object.
# Per (apiVersion, kind) of what the bundle builds (tests/unit/test_tail15b_review.py checks
# that every kind the bundle builds is here or in :data:`PROVIDER_NEVER_REPLACES`).
PROVIDER_FORCE_NEW: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("apps/v1", "StatefulSet"): (
        "spec.podManagementPolicy",
        "spec.revisionHistoryLimit",
        "spec.selector",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
    ),
    ("apps/v1", "DaemonSet"): ("spec.selector",),
    ("apps/v1", "Deployment"): ("spec.selector",),
    # With ``enableSecretMutable`` (the program requires it where it generates certificates,
    # :mod:`pmem_components.secretmutable`) only ``.type``; without it ``.data`` and
    # ``.stringData`` too, which the preflight cannot compare (it builds placeholders).
    ("v1", "Secret"): ("type",),
    ("v1", "Service"): ("spec.clusterIP",),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("roleRef",),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("roleRef",),
    ("storage.k8s.io/v1", "StorageClass"): ("parameters", "provisioner"),
}
# Kinds the bundle builds that diff.go lists no field of: the provider updates them in place,
# so a field Kubernetes does not let change (a CSIDriver's ``attachRequired``) makes the
# update fail, not replace (the dry run finds those).
PROVIDER_NEVER_REPLACES: frozenset[tuple[str, str]] = frozenset(
    {
        ("v1", "Namespace"),
        ("v1", "ServiceAccount"),
        ("storage.k8s.io/v1", "CSIDriver"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        (f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}", names.CRD_KIND),
    }
)

_MISSING = object()


def _pruned(live: Any, inputs: Any) -> Any:
    """``live`` cut to the keys ``inputs`` has, as the provider's ``pruneMap`` and
    ``pruneSlice`` (provider/pkg/provider/util.go) do before it diffs: values of another
    type than the input's are kept whole, lists item by item up to the inputs' length."""
    if isinstance(live, Mapping) and isinstance(inputs, Mapping):
        return {k: _pruned(v, inputs[k]) for k, v in live.items() if k in inputs}
    if isinstance(live, list) and isinstance(inputs, list):
        if live and inputs and type(live[0]) is not type(inputs[0]):
            return list(live)
        return [_pruned(v, t) for v, t in zip(live, inputs, strict=False)]
    return live


def _at(obj: Any, path: str) -> Any:
    """The value at a dotted ``path``, or :data:`_MISSING` (a null is missing: the provider
    unmarshals inputs with ``SkipNulls``)."""
    node = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return _MISSING
        node = node[part]
    return node


def _same(a: Any, b: Any) -> bool:
    """Equal as the provider's diff sees them: numbers by value (the state keeps them as
    floats), maps and lists item by item, a boolean never equal to a number."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = {k for k, v in a.items() if v is not None} | {
            k for k, v in b.items() if v is not None
        }
        return all(_same(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def forced_new(
    api_version: str,
    kind: str,
    new: Mapping[str, Any],
    recorded: tuple[Mapping[str, Any], Mapping[str, Any]],
) -> list[str]:
    """The fields of :data:`PROVIDER_FORCE_NEW` whose value in ``new`` (the inputs this
    update registers) differs from the object ``recorded`` (inputs, outputs) at the last
    update, pruned to those inputs: the provider replaces the object for each."""
    inputs, outputs = recorded
    old = _pruned(outputs, inputs)
    out: list[str] = []
    for path in PROVIDER_FORCE_NEW.get((api_version, kind), ()):
        out += _differing(_at(old, path), _at(new, path), path)
    return out


def _differing(old: Any, new: Any, path: str) -> list[str]:
    """Where ``old`` and ``new`` (the values at ``path``) differ, down to the map entries
    (``roleRef.name``, ``spec.selector.matchLabels.app``): the field named in the refusal."""
    if _same(old, new):
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = dict.fromkeys([*old, *new])
        return [
            p
            for k in keys
            for p in _differing(
                _MISSING if old.get(k) is None else old[k],
                _MISSING if new.get(k) is None else new[k],
                f"{path}.{k}",
            )
        ]
    return [path]


def _replacements(run: _DryRun, state: identity.StackState | None) -> list[Rejection]:
    """What the provider would replace ``run``'s object for, judged from the stack's state
    as the provider judges (no request): the patch's when the patched value differs from
    the built one, else the config change's (a removed patch, another value built)."""
    if state is None:
        return []
    api_version, kind = str(run.patched.get("apiVersion")), str(run.patched.get("kind"))
    meta = run.patched.get("metadata") or {}
    key = identity.object_key(api_version, kind, str(meta.get("namespace") or ""),
                              str(meta.get("name")))
    recorded = state.recorded(key)
    if recorded is None:
        return []  # not in the state: the provider creates (applies) it, nothing to replace
    fields = forced_new(api_version, kind, run.patched, recorded)
    # By the provider's path the field is under (a label key below it may hold dots).
    rules = PROVIDER_FORCE_NEW[(api_version, kind)] if fields else ()
    by_patch = {p for p in rules if not _same(_at(run.declared, p), _at(run.patched, p))}
    patched = tuple(f for f in fields if any(f == p or f.startswith(p + ".") for p in by_patch))
    built = tuple(f for f in fields if f not in patched)
    why = "the Kubernetes provider replaces the object when it changes"
    out = []
    if patched:
        out.append(Rejection(run.index, run.labels, run.ref, patched, why, replace=True))
    if built:
        out.append(Rejection(run.index, (), run.ref, built, why, replace=True))
    return out


def rejection_problem(r: Rejection) -> str:
    """The config error for a replacement or a refusal: the patch's, or the config change's.
    A replacement is the provider's (:data:`PROVIDER_FORCE_NEW`); any other refusal of the
    API server (an immutable field the provider does not list, an invalid value, an
    admission policy) makes the provider's update fail, and is worded so."""
    fields = ", ".join(r.fields)
    if r.replace:
        if r.labels:
            return (
                f"{', '.join(r.labels)}: changes {fields} of {r.ref}, which the Kubernetes "
                "provider does not update in place: it would delete the object and create it "
                "anew. Leave that field out of the patch (to change it anyway, delete the "
                "object first and run pulumi up again)"
            )
        return (
            f"{key_path(('deployments', r.index))}: this update changes {fields} of {r.ref}, "
            "which the Kubernetes provider does not update in place: it would delete the "
            "object and create it anew. This happens when a patch that set the field is "
            "removed or changed, or a config change alters it: put back the value it had at "
            "the last update (for a removed patch, the patch), or, to change it anyway, delete "
            "the object first and run pulumi up again"
        )
    if r.labels:
        return (
            f"{', '.join(r.labels)}: changes {fields} of {r.ref}, and the API server refuses "
            f"this change: {r.reason}; the update would fail. Correct or leave out that part "
            "of the patch"
        )
    return (
        f"{key_path(('deployments', r.index))}: this update changes {fields} of {r.ref}, and "
        f"the API server refuses this change: {r.reason}; the update would fail. This happens "
        "when a patch that set the field is removed or changed, or a config change alters "
        "it: put back the value the object has (for a removed patch, the patch), or delete "
        "the object first and run pulumi up again"
    )


def patch_rejections(
    reader: Any,
    stack: StackConfig,
    lives: Mapping[str, Mapping[str, Any]],
    state: identity.StackState | None = None,
) -> list[Rejection]:
    """What the update would replace or the API server would refuse, of every declared
    object that exists live (see the module doc).

    First the provider's own rule, from the stack's ``state`` (no request): a field of
    :data:`PROVIDER_FORCE_NEW` whose value differs from the inputs recorded at the last
    update is a replacement (:func:`_replacements`); such an object is not dry-run (the
    provider would not update it). The others that the update changes are applied in a
    server-side dry run, patched and, when refused, as built: ``reader.dry_apply(path, obj,
    manager)`` returns (HTTP status, body). A refusal of the patched object that the
    unpatched one does not get is the patch's; one both get (or an object without patches
    gets) is the config change's: the provider's update would fail either way. An answer
    that is neither (403, 409, 500, a timeout) stops the update with :class:`DryRunError`,
    naming the patch or deployment and the object: a check not done is not a check passed.
    """
    runs = _dry_runs(stack, lives)
    replaced = {r.path: _replacements(r, state) for r in runs}
    to_judge = [r for r in runs if not replaced[r.path]]
    with ThreadPoolExecutor(max_workers=_PARALLEL_GETS) as pool:
        verdicts = list(pool.map(lambda r: _judge(reader, r), to_judge))
    unchecked = [v for v in verdicts if isinstance(v, str)]
    if unchecked:
        raise DryRunError(
            "pmem-csi:preflight: "
            + "; ".join(unchecked)
            + ". Nothing was changed. Run pulumi up again (a timeout or a server error passes);"
            " a 403 needs patch permission on the object for the credentials of the "
            "kubeconfig (the provider needs it anyway); or set pmem-csi:preflight: false to "
            "skip the checks (a change of a field Kubernetes does not let change then makes "
            "the update fail)"
        )
    out = [x for r in runs for x in replaced[r.path]]
    return out + [v for v in verdicts if isinstance(v, Rejection)]


def run(
    stack: StackConfig,
    stack_id: str,
    api_client: Any,
    state: identity.StackState | None = None,
) -> Plan:
    """Observe and plan; cluster errors become :class:`PreflightError` with the way out."""
    try:
        observed = observe(api_client, stack, state)
    except DryRunError:
        raise  # names the patch and the object itself
    except Exception as err:  # any failure to read must stop the update, with the reason
        raise PreflightError(
            f"pmem-csi:preflight: cannot read the cluster ({kubetarget.error_text(err)}); "
            "the preflight checks need get/list on Deployment CRs, "
            "namespaces, DaemonSets, PersistentVolumes, VolumeAttachments, StorageClasses, "
            "pods (only when a driver is removed or renamed) and the deployment's objects, "
            "and patch (server-side dry run) on the objects patches select. Set "
            "pmem-csi:preflight: "
            "false to skip them (adoption, rename and migration are then not checked)"
        ) from None
    result = plan(stack, observed, stack_id, state)
    result.kept_metadata = {
        ns: own_metadata(observed.namespaces[ns], state)
        for ns in sorted(result.keep_namespaces)
        if ns in observed.namespaces
    }
    return result


def own_metadata(
    live: ObservedObject, state: identity.StackState | None
) -> dict[str, dict[str, str]]:
    """The labels and annotations of a namespace to keep that this stack's field manager
    applied (a ``kind: Namespace`` patch's, the component's), with their live values.

    Registering the released namespace with them keeps them: not sending them would make
    server-side apply remove them. Registering others' too (a platform stack's
    NamespacePatch, a ``kubectl apply``) would make this stack's manager co-own them, and
    that entry stays after the release: their owner could then neither remove them nor
    change them without a conflict. Those of entries the provider absorbs anyway
    (:data:`ABSORBED_MANAGERS`: ``kubectl label``, client-side apply) are sent as well: the
    provider makes them this stack's before it applies, so leaving them out would remove
    them (a PSA ``enforce: privileged`` set with ``kubectl label``). The manager is the one
    the state records for the namespace (the provider's); without it (library use, an older
    state) the one Pulumi manager that applied it, if exactly one did."""
    manager = state.field_manager(live.key) if state is not None else None
    if manager is None and len(set(live.pulumi_managers)) == 1:
        manager = live.pulumi_managers[0]
    owned = live.applied_metadata.get(manager or "", {})
    # Keys of entries the provider folds into its own manager (kubectl's, client-side apply's)
    # become this stack's in the release's apply: sent too, or that apply would remove them.
    absorbed = live.applied_metadata.get(ABSORBED, {})
    return {
        part: {
            k: v
            for k, v in values.items()
            if k in owned.get(part, frozenset()) | absorbed.get(part, frozenset())
        }
        for part, values in (("labels", live.labels), ("annotations", live.annotations))
    }
