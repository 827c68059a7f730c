"""Watch caches of the Deployment CRs and every sub-object they describe.

Why list-then-watch rather than polling: at steady state a watch costs the API server nothing
but an idle connection and the occasional bookmark, and a changed pod reaches the reporter in
milliseconds, which is what the change-to-write histogram measures.

Shape:
- ``Informer``: one list-then-watch loop for one resource (optionally one namespace, with
  server-side label/field selectors), keeping an in-memory cache. It resumes from the last
  resourceVersion (bookmarks keep that fresh), re-lists on 410 Gone, and reports each change
  (including deletions noticed only by a re-list) to a callback.
- ``Observer``: owns the informers, maps every change to the CR(s) it affects and queues those
  names as dirty. Namespaced informers are started per driver namespace (the CR's
  ``spec.namespace``) when the first CR naming that namespace shows up, so the reporter's
  RBAC can stay a Role in the driver's namespace. Objects are cached whether or not their CR
  exists yet, so sub-objects that appear before their CR are already known when it arrives.
- Secrets are not watched: the reporter may only ``get`` the deployment's two Secrets by name
  (issue 4: "get on the deployment's two Secrets by name only"). ``Observer`` fetches them on
  every reconcile of a dirty CR, at resync, and in a short poll loop (default 10 s) whose
  resourceVersion comparison marks the CR dirty when a Secret changed. A watch with
  ``fieldSelector=metadata.name=X`` would be authorized by resourceNames too, but only with
  the extra ``list``/``watch`` verbs on Secrets, which is more than the issue grants.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from pmem_components.names import (
    CRD_GROUP,
    CRD_KIND,
    CRD_PLURAL,
    CRD_STORAGE_VERSION,
    LABEL_INSTANCE,
    LABEL_PART_OF,
    PART_OF,
    DeploymentNames,
)
from reporter import model
from reporter.kubeapi import Api, Obj, Resource
from reporter.metrics import Metrics
from reporter.retry import GONE, Backoff, describe_error

log = logging.getLogger(__name__)

CR = Resource(CRD_KIND, f"{CRD_GROUP}/{CRD_STORAGE_VERSION}", CRD_PLURAL, False)
POD = Resource("Pod", "v1", "pods", True)


def resource_for(kind: str) -> Resource:
    """The API location of a sub-object kind, from the one table in ``reporter.model``."""
    api = model.API_RESOURCES[kind]
    return Resource(kind, api.api_version, api.plural, api.namespaced)


SECRET = resource_for(model.SECRET)
# Watched per driver namespace (Secrets are fetched by name instead, see module docstring).
NAMESPACED_KINDS: tuple[Resource, ...] = (
    *(
        resource_for(kind)
        for kind, api in model.API_RESOURCES.items()
        if api.namespaced and kind != model.SECRET
    ),
    POD,
)
CLUSTER_KINDS: tuple[Resource, ...] = tuple(
    resource_for(kind) for kind, api in model.API_RESOURCES.items() if not api.namespaced
)

# (event type, new object or None, old object or None)
ChangeCallback = Callable[["Informer", str, Obj | None, Obj | None], None]


def obj_key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def obj_rv(obj: Obj | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def label_selector_for(deployments: Iterable[str] | None) -> str:
    """Server-side selector for the sub-objects of the given CRs (None: of every CR)."""
    selector = f"{LABEL_PART_OF}={PART_OF}"
    if deployments:
        instances = sorted({DeploymentNames(name).hyphened for name in deployments})
        selector += f",{LABEL_INSTANCE} in ({','.join(instances)})"
    return selector


class Informer:
    """List-then-watch one resource into a cache; see the module docstring."""

    def __init__(
        self,
        api: Api,
        res: Resource,
        on_change: ChangeCallback,
        metrics: Metrics,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        backoff: Backoff | None = None,
        watch_timeout: tuple[int, int] = (300, 600),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.res = res
        self.on_change = on_change
        self.metrics = metrics
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.backoff = backoff or Backoff(base=0.5, cap=30.0, max_attempts=0)
        self.watch_timeout = watch_timeout
        self.sleep = sleep
        self.resource_version: str | None = None
        self.restarts = 0
        self.relists = 0
        self._cache: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: object | None = None

    @property
    def label(self) -> str:
        """Metric label: the plural, which is what an operator greps for."""
        return self.res.plural

    def __repr__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"Informer({self.res.plural}{where})"

    # --- cache access -------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        with self._lock:
            return self._cache.get((namespace or "", name))

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._cache.values())

    def put(self, obj: Obj) -> None:
        """Store an object we just wrote (the API's answer) before its watch event arrives.

        Without it a change queued in between would be computed against the pre-write status
        and end in a needless 409. The watch event later replaces it with the same or newer.
        """
        with self._lock:
            key = obj_key(obj)
            if key in self._cache:
                self._cache[key] = obj

    # --- list and watch -----------------------------------------------------------------

    def relist(self) -> None:
        """Replace the cache by a fresh list, reporting the difference as changes."""
        items, rv = self.api.list(
            self.res, self.namespace, self.label_selector, self.field_selector
        )
        fresh = {obj_key(obj): obj for obj in items}
        with self._lock:
            old = self._cache
            self._cache = fresh
            self.resource_version = rv
        self.relists += 1
        for key, obj in old.items():
            if key not in fresh:
                self._notify("DELETED", None, obj)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._notify("ADDED", obj, None)
            elif obj_rv(before) != obj_rv(obj):
                self._notify("MODIFIED", obj, before)
        self._synced.set()

    def watch_once(self) -> None:
        """One watch session from the current resourceVersion until the server ends it.

        A 410 Gone (as an HTTP error or as an ERROR event) forgets the resourceVersion, so the
        next ``run_once`` re-lists. Other ERROR events raise like HTTP errors do.
        """
        assert self.resource_version is not None
        timeout = random.randint(*self.watch_timeout)
        try:
            stream = self.api.watch(
                self.res,
                self.resource_version,
                self.namespace,
                self.label_selector,
                self.field_selector,
                timeout_seconds=timeout,
            )
        except ApiException as exc:
            if exc.status == GONE:
                self._gone()
                return
            raise
        self._stream = stream
        try:
            for event in stream:
                if not self._handle(event):
                    return
        finally:
            self._stream = None
            with contextlib.suppress(Exception):
                stream.close()

    def _handle(self, event: Obj) -> bool:
        """Apply one watch event; False ends the watch session."""
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == GONE:
                self._gone()
                return False
            raise ApiException(status=code or 500, reason=f"{obj.get('reason')}: watch error")
        rv = obj_rv(obj)
        if etype == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return True
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("%r: unknown watch event type %r ignored", self, etype)
            return True
        obj.setdefault("kind", self.res.kind)
        obj.setdefault("apiVersion", self.res.api_version)
        key = obj_key(obj)
        with self._lock:
            before = self._cache.get(key)
            if etype == "DELETED":
                self._cache.pop(key, None)
            else:
                self._cache[key] = obj
            if rv:
                self.resource_version = rv
        if etype == "DELETED":
            self._notify(etype, None, before or obj)
        else:
            self._notify(etype, obj, before)
        return True

    def _gone(self) -> None:
        log.info("%r: resourceVersion %s is gone (410), re-listing", self, self.resource_version)
        self.resource_version = None
        self.metrics.relists.labels(resource=self.label).inc()

    def _notify(self, etype: str, obj: Obj | None, before: Obj | None) -> None:
        try:
            self.on_change(self, etype, obj, before)
        except Exception:  # a broken callback must not kill the watch
            log.exception("%r: change callback failed", self)

    def run_once(self) -> None:
        """List if there is no resourceVersion to resume from, then watch once."""
        if self.resource_version is None:
            self.relist()
        self.watch_once()

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop``: errors back off and resume from the last resourceVersion."""
        failures = 0
        first = True
        while not stop.is_set():
            if not first:
                self.restarts += 1
                self.metrics.watch_restarts.labels(resource=self.label).inc()
            first = False
            try:
                self.run_once()
                failures = 0
            except Exception as exc:
                if stop.is_set():
                    return
                status = getattr(exc, "status", None)
                log.warning("%r: list/watch failed (%s): %s", self, status, describe_error(exc))
                if status in (401, 403):
                    # Permissions may be granted later (RBAC created after us); the cache
                    # stays as it was, but it must not claim to be complete.
                    self.resource_version = None
                stop.wait(self.backoff.wait_for(min(failures, 8), exc))
                failures += 1

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name=repr(self), daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


@dataclass
class _Namespace:
    informers: dict[str, Informer]

    @property
    def synced(self) -> bool:
        return all(inf.synced for inf in self.informers.values())


class Observer:
    """All caches of the reporter, and the queue of CR names whose status may have changed."""

    def __init__(
        self,
        api: Api,
        metrics: Metrics,
        deployments: Iterable[str] | None = None,
        secret_poll_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        informer_factory: Callable[..., Informer] = Informer,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.deployments = sorted(set(deployments or ())) or None
        self.secret_poll_seconds = secret_poll_seconds
        self.clock = clock
        self._new_informer = informer_factory
        self.selector = label_selector_for(self.deployments)
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._dirty: dict[str, float | None] = {}
        self._dirty_cv = threading.Condition(self._lock)
        self._namespaces: dict[str, _Namespace] = {}
        self._secrets: dict[tuple[str, str], Obj | None] = {}
        self._secrets_lock = threading.Lock()
        self._started = False
        self._threads: list[threading.Thread] = []
        # CR informers: one per configured name (a field selector, so RBAC may restrict the
        # CR to resourceNames), or one for all CRs.
        if self.deployments:
            self.cr_informers = [
                self._informer(CR, field_selector=f"metadata.name={name}")
                for name in self.deployments
            ]
        else:
            self.cr_informers = [self._informer(CR)]
        self.cluster_informers = {
            res.kind: self._informer(res, label_selector=self.selector) for res in CLUSTER_KINDS
        }

    def _informer(self, res: Resource, **kwargs: object) -> Informer:
        return self._new_informer(self.api, res, self._on_change, self.metrics, **kwargs)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        for inf in self.all_informers():
            inf.start(self.stop)
        if self.secret_poll_seconds > 0:
            thread = threading.Thread(target=self._poll_secrets, name="secret-poll", daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self) -> None:
        self.stop.set()
        with self._dirty_cv:
            self._dirty_cv.notify_all()

    def all_informers(self) -> list[Informer]:
        with self._lock:
            namespaced = [i for ns in self._namespaces.values() for i in ns.informers.values()]
        return [*self.cr_informers, *self.cluster_informers.values(), *namespaced]

    @property
    def synced(self) -> bool:
        """Every cache has listed once, including those of every known CR's namespace."""
        if not all(inf.synced for inf in self.all_informers()):
            return False
        with self._lock:
            return all(
                ns in self._namespaces and self._namespaces[ns].synced
                for ns in self._cr_namespaces()
            )

    @property
    def healthy(self) -> bool:
        """Every watch loop is still running (they never end on their own before stop)."""
        if not self._started:
            return False
        return all(inf.alive for inf in self.all_informers()) and all(
            t.is_alive() for t in self._threads
        )

    # --- lookups (for reporter.write) -----------------------------------------------------

    def crs(self) -> list[Obj]:
        return [cr for inf in self.cr_informers for cr in inf.items()]

    def cr(self, name: str) -> Obj | None:
        for inf in self.cr_informers:
            obj = inf.get(name)
            if obj is not None:
                return obj
        return None

    def remember_cr(self, cr: Obj) -> None:
        for inf in self.cr_informers:
            inf.put(cr)

    def namespace_synced(self, namespace: str) -> bool:
        """The caches a CR in this namespace depends on (its own and the cluster-wide) listed."""
        if not all(inf.synced for inf in self.cluster_informers.values()):
            return False
        with self._lock:
            ns = self._namespaces.get(namespace)
            return ns is not None and ns.synced

    def find(self, kind: str, name: str, namespace: str) -> Obj | None:
        """A cached sub-object (Secrets: the last fetched copy), or None when missing."""
        if kind == model.SECRET:
            with self._secrets_lock:
                return self._secrets.get((namespace, name))
        if kind in self.cluster_informers:
            return self.cluster_informers[kind].get(name)
        with self._lock:
            ns = self._namespaces.get(namespace)
        if ns is None:
            return None
        inf = ns.informers.get(kind)
        return inf.get(name, namespace) if inf else None

    def pods(self, namespace: str) -> list[Obj]:
        with self._lock:
            ns = self._namespaces.get(namespace)
        return ns.informers[POD.kind].items() if ns else []

    # --- secrets ------------------------------------------------------------------------

    def refresh_secrets(self, cr: Obj, changed_at: float | None = None) -> bool:
        """GET the CR's two Secrets by name; True (and the CR marked dirty) if one changed.

        A forbidden Secret counts as missing: the status then says so, which is the most
        useful thing a reporter without access can say. The Secret's data is kept for the
        certificate checks and never logged.
        """
        name = (cr.get("metadata") or {}).get("name") or ""
        names = DeploymentNames(name)
        namespace = _cr_namespace(cr)
        changed = False
        for secret in (names.registry_secret, names.node_secret):
            try:
                obj = self.api.get(SECRET, secret, namespace)
            except ApiException as exc:
                if exc.status not in (401, 403):
                    raise
                log.warning("no access to Secret %s/%s: %s", namespace, secret, describe_error(exc))
                obj = None
            key = (namespace, secret)
            with self._secrets_lock:
                before = self._secrets.get(key)
                self._secrets[key] = obj
            if obj_rv(before) != obj_rv(obj) or (before is None) != (obj is None):
                changed = True
        if changed:
            self.mark_dirty(name, changed_at if changed_at is not None else self.clock())
        return changed

    def _poll_secrets(self) -> None:
        while not self.stop.wait(self.secret_poll_seconds):
            for cr in self.crs():
                try:
                    self.refresh_secrets(cr)
                except Exception as exc:
                    log.warning("polling Secrets failed: %s", describe_error(exc))

    # --- change tracking ----------------------------------------------------------------

    def _cr_namespaces(self) -> set[str]:
        return {_cr_namespace(cr) for cr in self.crs()}

    def _known_names(self) -> set[str]:
        names = {(cr.get("metadata") or {}).get("name") or "" for cr in self.crs()}
        names.update(self.deployments or ())
        names.discard("")
        return names

    def affected(self, res: Resource, obj: Obj) -> set[str]:
        """Names of the CRs whose status may depend on this object."""
        meta = obj.get("metadata") or {}
        if res.kind == CR.kind and res.api_version == CR.api_version:
            return {meta.get("name") or ""}
        instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
        return {n for n in self._known_names() if DeploymentNames(n).hyphened == instance}

    def _on_change(self, inf: Informer, etype: str, obj: Obj | None, before: Obj | None) -> None:
        now = self.clock()
        names: set[str] = set()
        for o in (obj, before):
            if o is not None:
                names |= self.affected(inf.res, o)
        if inf.res is CR and obj is not None:
            self.ensure_namespace(_cr_namespace(obj))
        for name in names:
            self.mark_dirty(name, now)

    def ensure_namespace(self, namespace: str) -> None:
        """Start the namespaced informers of a driver namespace, once."""
        with self._lock:
            if namespace in self._namespaces:
                return
            informers = {
                res.kind: self._informer(res, namespace=namespace, label_selector=self.selector)
                for res in NAMESPACED_KINDS
            }
            self._namespaces[namespace] = _Namespace(informers)
        log.info("watching driver namespace %s", namespace)
        if self._started:
            for inf in informers.values():
                inf.start(self.stop)
            thread = threading.Thread(target=self._mark_when_synced, args=(namespace,), daemon=True)
            thread.start()

    def _mark_when_synced(self, namespace: str) -> None:
        """Once a namespace's caches are complete, its CRs need a (possibly first) status.

        Individual ADDED events already mark CRs dirty, but a namespace where every
        sub-object is missing produces none, and its CRs still need DriverDeployed=False.
        """
        while not self.stop.is_set():
            if self.namespace_synced(namespace):
                now = self.clock()
                for cr in self.crs():
                    if _cr_namespace(cr) == namespace:
                        self.mark_dirty((cr.get("metadata") or {}).get("name") or "", now)
                return
            self.stop.wait(0.1)

    def mark_dirty(self, name: str, changed_at: float | None = None) -> None:
        """Queue a CR for reconcile; keep the earliest unprocessed change time."""
        if not name:
            return
        with self._dirty_cv:
            if name in self._dirty:
                old = self._dirty[name]
                if changed_at is not None and (old is None or changed_at < old):
                    self._dirty[name] = changed_at
            else:
                self._dirty[name] = changed_at
            self._dirty_cv.notify_all()

    def mark_all_dirty(self) -> None:
        """Resync: every known CR is recomputed (and written only if something changed)."""
        for name in self._known_names():
            self.mark_dirty(name, None)

    def take_dirty(self, timeout: float | None) -> dict[str, float | None]:
        """Wait up to ``timeout`` for dirty CRs; return and clear them (name -> change time)."""
        with self._dirty_cv:
            if not self._dirty and not self.stop.is_set():
                self._dirty_cv.wait(timeout)
            dirty, self._dirty = self._dirty, {}
            return dirty


def _cr_namespace(cr: Obj) -> str:
    return str((cr.get("spec") or {}).get("namespace") or model.DEFAULT_NAMESPACE)
