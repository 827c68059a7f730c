"""Preflight: read the cluster before registering anything, and refuse unsafe day-2 changes.

Why the cluster and not the previous stack outputs: an inline or CLI program cannot read its
own last checkpoint synchronously (a ``StackReference`` to itself resolves only as an Output,
after registration has begun, and needs a backend that serves it), and the state can be lost
or belong to another stack. The cluster is what the change would act on: the ``Deployment``
CRs record, per driver, its namespace and device mode, and carry ``names.STACK_ANNOTATION``
naming the stack that owns them; objects show who created them (labels, ownerReferences).
So this module answers, before anything changes:

* Is a namespace the stack would create already there and not ours? Adoption is explicit
  (``adoptNamespace``), or the administrator uses it as it is (``createNamespace: false``).
* Does a configured deployment move namespace, change its device mode, or replace another
  deployment of this stack (a rename)? Each is refused with the reason and the flag that
  allows it (``allowReinstall``, ``allowDeviceModeChange``, ``renamedFrom``); an allowed move
  is returned as :class:`~pmem_components.components.PreviousDeployment` so the component
  replaces the objects (old workloads deleted first) instead of running two drivers.
* Are there objects with the deployment's names that this program did not create, above all
  the PMEM-CSI operator's (ownerReferences to a ``deployments.pmem-csi.intel.com`` CR), or a
  node driver of the same CSI driver name in another namespace? The message says what to do.

:func:`plan` is pure (observations in, problems and moves out) and unit tested;
:func:`observe` does the reads with the Kubernetes client (``get``/``list`` only), which the
program makes for the default provider's cluster (:mod:`pmem_components.kubetarget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pmem_components import kubecall, names
from pmem_components.config import StackConfig, key_path
from pmem_components.manifests import bundle

OPERATOR_GROUP = names.CRD_GROUP
RUNBOOK = "see README, Day-2 operations: migrate from the operator"


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


@dataclass
class Observed:
    """The cluster as far as the preflight looks at it."""

    crs: dict[str, ObservedObject] = field(default_factory=dict)
    namespaces: dict[str, ObservedObject] = field(default_factory=dict)
    # Per deployment index: live objects with the names the deployment would use.
    same_named: dict[int, list[ObservedObject]] = field(default_factory=dict)
    # DaemonSets anywhere in the cluster (node drivers are what must never run twice).
    daemon_sets: list[ObservedObject] = field(default_factory=list)


@dataclass
class Plan:
    problems: list[str] = field(default_factory=list)
    previous: dict[int, Previous] = field(default_factory=dict)


def _driver_name_of(ds: ObservedObject) -> str | None:
    """The CSI driver name a DaemonSet's pods run with (``PMEM_CSI_DRIVER_NAME``)."""
    pod = ((ds.spec.get("template") or {}).get("spec")) or {}
    for container in pod.get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "PMEM_CSI_DRIVER_NAME" and env.get("value"):
                return str(env["value"])
    return None


_WORKLOADS_FIRST = {"DaemonSet": 0, "StatefulSet": 1, "Deployment": 2}


def _listing(objs: list[ObservedObject], most: int = 5) -> str:
    """The objects for a message: workloads first, then the rest, at most ``most`` by name."""
    ordered = sorted(objs, key=lambda o: _WORKLOADS_FIRST.get(o.kind, 9))
    text = ", ".join(o.ref for o in ordered[:most])
    return text + (f" and {len(ordered) - most} more" if len(ordered) > most else "")


def plan(stack: StackConfig, observed: Observed, stack_id: str) -> Plan:
    """Problems (by config key) and allowed moves for applying ``stack`` to the cluster."""
    out = Plan()
    deps = stack.deployments
    configured = {d.name for d in deps}

    # Namespaces the stack would create.
    for ns in dict.fromkeys(d.namespace for d in deps if d.create_namespace):
        live = observed.namespaces.get(ns)
        if live is None:
            continue
        owner = live.annotations.get(names.STACK_ANNOTATION)
        i = next(i for i, d in enumerate(deps) if d.namespace == ns and d.create_namespace)
        if owner == stack_id or (owner is None and live.ours):
            continue  # created by this stack (or by this program before stack annotations)
        if owner is not None:
            out.problems.append(
                f"{key_path(('deployments', i, 'createNamespace'))}: namespace {ns!r} is "
                f"managed by stack {owner!r}; set createNamespace: false to deploy into it "
                "without managing it"
            )
        elif not any(d.adopt_namespace for d in deps if d.namespace == ns):
            out.problems.append(
                f"{key_path(('deployments', i, 'createNamespace'))}: namespace {ns!r} "
                "already exists and was not created by this stack; set "
                f"{key_path(('deployments', i, 'adoptNamespace'))}: true to manage it from now "
                "on (it is kept on destroy unless pmem-csi:retainNamespaces is false), or "
                "createNamespace: false to use it as it is"
            )

    # This stack's deployments as the cluster records them.
    # CRs made by this program before it annotated them count as this stack's.
    mine = {
        name: cr
        for name, cr in observed.crs.items()
        if cr.annotations.get(names.STACK_ANNOTATION, stack_id if cr.ours else None) == stack_id
    }
    renamed = {d.renamed_from for d in deps if d.renamed_from}
    for i, d in enumerate(deps):
        cr = observed.crs.get(d.name)
        if cr is not None and d.name not in mine:
            owner = cr.annotations.get(names.STACK_ANNOTATION)
            if owner is not None:
                out.problems.append(
                    f"{key_path(('deployments', i, 'name'))}: the Deployment CR {d.name!r} "
                    f"belongs to stack {owner!r}; one driver name is managed by one stack"
                )
            elif not d.adopt_existing:
                out.problems.append(
                    f"{key_path(('deployments', i, 'name'))}: a Deployment CR {d.name!r} exists "
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
            old_mode = cr.spec.get("deviceMode")
            if old_mode and old_mode != d.device_mode and not d.allow_device_mode_change:
                out.problems.append(
                    f"{key_path(('deployments', i, 'deviceMode'))}: changing it from "
                    f"{old_mode!r} to {d.device_mode!r} makes the existing volumes unusable "
                    "(their PMEM is managed the other way); delete or back up the volumes "
                    "first, then set "
                    f"{key_path(('deployments', i, 'allowDeviceModeChange'))}: true"
                )
        if d.renamed_from and d.renamed_from in mine and d.name not in mine:
            old = mine[d.renamed_from]
            out.previous[i] = Previous(d.renamed_from, str(old.spec.get("namespace") or ""))

    gone = sorted(n for n in mine if n not in configured and n not in renamed)
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
    return out


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
    )


class _Reader:
    def __init__(self, api_client: Any) -> None:
        self.api = api_client

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


def observe(api_client: Any, stack: StackConfig) -> Observed:
    """Read what :func:`plan` needs: CRs, the namespaces, same-named objects, DaemonSets."""
    reader = _Reader(api_client)
    out = Observed()
    cr_api = f"{names.CRD_GROUP}/{names.CRD_STORAGE_VERSION}"
    crs = reader.get(_path(cr_api, names.CRD_KIND, None)) or {}
    for item in crs.get("items") or []:
        o = _observed(item, names.CRD_KIND)
        out.crs[o.name] = o
    for ns in dict.fromkeys(d.namespace for d in stack.deployments):
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
    for (i, kind, _), live in zip(wanted, lives, strict=True):
        if live is not None:
            out.same_named[i].append(_observed(live, kind))
    daemon_sets = reader.get(_path("apps/v1", "DaemonSet", None)) or {}
    out.daemon_sets = [_observed(d, "DaemonSet") for d in daemon_sets.get("items") or []]
    return out


def run(stack: StackConfig, stack_id: str, api_client: Any) -> Plan:
    """Observe and plan; cluster errors become :class:`PreflightError` with the way out."""
    try:
        observed = observe(api_client, stack)
    except Exception as err:  # any failure to read must stop the update, with the reason
        raise PreflightError(
            f"pmem-csi:preflight: cannot read the cluster ({type(err).__name__}: "
            f"{str(err)[:200]}); the preflight checks need get/list on Deployment CRs, "
            "namespaces, DaemonSets and the deployment's objects. Set pmem-csi:preflight: "
            "false to skip them (adoption, rename and migration are then not checked)"
        ) from None
    return plan(stack, observed, stack_id)
