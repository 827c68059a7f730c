"""Watch caches of the Deployment CRs and every sub-object they describe.

Why list-then-watch rather than polling: at steady state a watch costs the API server nothing
but an idle connection and the occasional bookmark, and a changed pod reaches the reporter in
milliseconds. Nothing is polled, Secrets included: they are watched (by name or by label).

Shape:
- ``Informer``: one list-then-watch loop for one resource (optionally one namespace, with
  server-side label/field selectors), keeping an in-memory cache of *trimmed* objects
  (``reporter.trim``: only the fields the status rules read). It resumes from the last
  resourceVersion (bookmarks keep that fresh), re-lists on 410 Gone and on "too large
  resourceVersion", backs off when the server closes watches at once, and reports each change
  (including deletions noticed only by a re-list) to a callback. After 401/403 it no longer
  counts as synced and records the error, so the status can say "could not be read" instead
  of "missing" -- except just after the API server was away (``AUTH_WARMUP_SECONDS``) and in
  the first ``NEW_GRANT_SECONDS`` of the watches of a namespace added while running (its Role
  may still be on its way): then it is retried, and its CRs wait. A 404 for the whole
  collection means the kind is gone (its CRD deleted): the
  cache is emptied, the kind reported "unserved" once, and lists retried at most every
  ``UNSERVED_RETRY_CAP`` seconds until the CRD is back.
- ``Observer``: owns the informers, maps every change to the CR(s) it affects and queues those
  names as dirty. Two layouts:
  * named CRs (``--deployment``, what the Pulumi program deploys): per CR, its cluster-scoped
    objects and its two Secrets are watched *by name* (``fieldSelector=metadata.name=X``,
    which RBAC ``resourceNames`` authorize), and the namespaced kinds per driver namespace by
    label. The informers of a CR (and of a namespace no CR uses any more) are stopped when the
    CR is deleted or moves, and their caches dropped.
  * every CR (no ``--deployment``): one cluster-wide informer per kind, by label. Threads and
    watches then stay constant however many deployments exist (it needs cluster-wide read
    RBAC, which is the price of watching every deployment with one process).
  * shared (``--deployment`` ... ``--shared-watches``, what the Pulumi program deploys: one
    reporter for all deployments of a stack): one cluster-wide informer for the CRs and one
    per cluster-scoped kind by label (``instance in (<the named deployments>)``), and in each
    driver namespace one informer per namespaced kind by the same label, Secrets included.
    Namespaced kinds are watched per namespace because the reporter's RBAC grants them only
    in its deployments' namespaces (Roles, no cluster-wide read: review of issue 16).
    Watches: 4, plus 8 per driver namespace -- constant in the number of deployments (however
    many share a namespace); a namespace's informers stop with its last CR.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from pmem_components.names import (
    CRD_GROUP,
    CRD_KIND,
    CRD_NAME,
    CRD_PLURAL,
    CRD_STORAGE_VERSION,
    LABEL_INSTANCE,
    LABEL_PART_OF,
    PART_OF,
    DeploymentNames,
)
from reporter import model, trim
from reporter.kubeapi import Api, Obj, Resource, Transform, is_too_large_resource_version
from reporter.metrics import Metrics
from reporter.retry import GONE, TOO_MANY_REQUESTS, Backoff, describe_error, is_transient

log = logging.getLogger(__name__)

CR = Resource(CRD_KIND, f"{CRD_GROUP}/{CRD_STORAGE_VERSION}", CRD_PLURAL, False)
POD = Resource("Pod", "v1", "pods", True)
ALL_NAMESPACES = "*"
# A watch that ends sooner than this without delivering anything counts as a failure (backoff).
MIN_WATCH_SECONDS = 1.0
# A resource the API server does not serve (404 on its collection: the CRD was deleted) is
# asked for again at least this often, so the reporter resumes within seconds of the CRD
# coming back; a 404 costs the server next to nothing.
UNSERVED_RETRY_CAP = 10.0
NOT_FOUND = 404
# A kube-apiserver that was just (re)started answers 401/403 for a moment, before its
# authorizer has loaded the RBAC objects (seen on the local cluster: about a second after a
# restart, for every kind the reporter reads). A 401/403 within this many seconds of the
# server being unreachable or unwell is retried rather than believed, so the status does not
# claim "could not be read" when nobody's permissions changed.
AUTH_WARMUP_SECONDS = 15.0
# A driver namespace the reporter starts watching while it runs (a deployment moved there or
# was added) may not be readable yet: the program creates the reporter's Role there in the
# same ``pulumi up``, after the CR (review of issue 16: a few seconds of 403). The new watches
# retry a 401/403 every NEW_GRANT_RETRY seconds for this long before believing it.
NEW_GRANT_SECONDS = 15.0
NEW_GRANT_RETRY = 1.0
# How long the labels of an object found by name (``Observer.lookup_labels``) are believed.
LOOKUP_TTL = 60.0
# How long a failed lookup (403, 500, a timeout) is remembered: the kind is Unknown meanwhile.
# Doubled for each failure in a row of that lookup, up to LOOKUP_RETRY_CAP, and back to
# LOOKUP_RETRY once it worked: a lookup that keeps failing does not cost a GET and a
# recompute of its CR every 5 s for ever (review of issue 16).
LOOKUP_RETRY = 5.0
LOOKUP_RETRY_CAP = 60.0


def resource_for(kind: str) -> Resource:
    """The API location of a sub-object kind, from the one table in ``reporter.model``."""
    api = model.API_RESOURCES[kind]
    return Resource(kind, api.api_version, api.plural, api.namespaced)


SECRET = resource_for(model.SECRET)
# Watched per driver namespace by label (Secrets are watched by name in the named layout).
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

# Lists in flight at once, per process: each informer's first list, and its relists after an
# error or a 410. Unbounded, the stack reporter at 100 deployments in 100 namespaces sent 800
# lists together; on the loaded 2-core machine the API server answered none of them within
# the list timeout, and they failed and were sent again together, for 8 minutes and more
# (BENCHMARKS.md section 6). Queued behind the slots they are answered one batch after the
# other; watches (resumed from a resourceVersion, served from the watch cache) are not held.
LIST_CONCURRENCY = 8
LIST_SLOTS = threading.BoundedSemaphore(LIST_CONCURRENCY)
# How often a list waiting for a slot looks whether its informer was stopped meanwhile.
LIST_SLOT_POLL = 1.0


def most_watches(deployments: int) -> int:
    """An upper bound of the watches the Observer opens for ``deployments`` named CRs, in any
    layout (the HTTP connection pool is sized by it): the every-CR layout's informers, plus
    per deployment its CR by name, each kind once (per namespace or by name) and its two
    Secrets by name (the named layout without ``--shared-watches``; the shared layout opens
    fewer)."""
    every_cr = 1 + len(CLUSTER_KINDS) + len(NAMESPACED_KINDS) + 1
    return every_cr + deployments * (1 + len(model.API_RESOURCES) + 2)


# (informer, event type, new object or None, old object or None). Event type "SETTLED" (no
# objects) says the informer listed, or failed with 401/403, for the first time since a
# (re)start: CRs depending on it can be computed now. "UNSERVED" (no objects) says the API
# server answered 404 for the whole collection (the kind is gone: its CRD was deleted), after
# every cached object was reported DELETED; "SERVED" says a list works again. "UNREADABLE"
# (no objects) says a synced informer got 401/403: its cache was dropped, its CRs must be
# recomputed with the kind unreadable.
ChangeCallback = Callable[["Informer", str, Obj | None, Obj | None], None]


def obj_key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def obj_rv(obj: Obj | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def rv_older(candidate: str | None, known: str | None) -> bool:
    """True when ``candidate`` is provably older than ``known``.

    resourceVersions are opaque by contract, but every API server backed by etcd uses the
    etcd revision, an integer; only when both parse is a comparison made.
    """
    try:
        return int(candidate or "") < int(known or "")
    except ValueError:
        return False


def label_selector_for(deployments: Iterable[str] | None) -> str:
    """Server-side selector for the sub-objects of the given CRs (None: of every CR)."""
    selector = f"{LABEL_PART_OF}={PART_OF}"
    if deployments:
        instances = sorted({DeploymentNames(name).hyphened for name in deployments})
        selector += f",{LABEL_INSTANCE} in ({','.join(instances)})"
    return selector


def _transform_for(res: Resource) -> Transform:
    if res.kind == CRD_KIND:
        return trim.custom_resource
    return trim.BY_KIND.get(res.kind, trim.existence)


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
        watch_timeout: tuple[int, int] = (240, 300),
        clock: Callable[[], float] = time.monotonic,
        owner: str | None = None,
        new_grant_seconds: float = 0.0,
        list_slots: threading.Semaphore = LIST_SLOTS,
    ) -> None:
        self.api = api
        self.list_slots = list_slots
        self.res = res
        self.on_change = on_change
        self.metrics = metrics
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.backoff = backoff or Backoff(base=0.5, cap=30.0, max_attempts=0)
        self.watch_timeout = watch_timeout
        self.clock = clock
        self.owner = owner  # the CR a by-name informer belongs to (None: shared)
        # A 401/403 within this many seconds of the start is retried, not believed: started
        # for a namespace whose grant may still be on its way (NEW_GRANT_SECONDS).
        self.new_grant_seconds = new_grant_seconds
        self._run_started = float("-inf")
        # The stop event given to run() (the Observer's), seen by a list waiting for a slot.
        self._run_stop: threading.Event | None = None
        # Whether this run sent its first list yet (the grace counts from that one).
        self._sent_in_run = False
        self.transform = _transform_for(res)
        self.resource_version: str | None = None
        self.restarts = 0
        self.relists = 0
        self.error: str | None = None  # last 401/403, until the next successful list
        # The collection answered 404 (CRD deleted), until a list succeeds again.
        self.unserved = False
        self.unserved_backoff = Backoff(base=1.0, cap=UNSERVED_RETRY_CAP, max_attempts=0)
        # When a request last failed without an answer, or with 429/5xx (see AUTH_WARMUP).
        self._server_trouble_at = float("-inf")
        # namespace -> name -> trimmed object: pods of one namespace without a scan.
        self._cache: dict[str, dict[str, Obj]] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._settled_once = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: object | None = None
        self._events_in_session = 0

    @property
    def label(self) -> str:
        """Metric label: the plural, which is what an operator greps for."""
        return self.res.plural

    def __repr__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        which = f" {self.field_selector}" if self.field_selector else ""
        return f"Informer({self.res.plural}{where}{which})"

    # --- cache access -------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def settled(self) -> bool:
        """Listed, or known to be unreadable (401/403): either way the status can be computed."""
        return self._synced.is_set() or self.error is not None

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        with self._lock:
            return self._cache.get(namespace or "", {}).get(name)

    def items(self, namespace: str | None = None) -> list[Obj]:
        """Cached objects, of one namespace when given."""
        with self._lock:
            if namespace is not None:
                return list(self._cache.get(namespace, {}).values())
            return [obj for objs in self._cache.values() for obj in objs.values()]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(objs) for objs in self._cache.values())

    def put(self, obj: Obj) -> None:
        """Store an object we just wrote (the API's answer) before its watch event arrives.

        Without it a change queued in between would be computed against the pre-write status
        and end in a needless 409. The watch event of that write later carries the same
        resourceVersion and is then recognised as nothing new (no self-triggered reconcile);
        an older event can no longer roll the cache back.
        """
        obj = self.transform(obj)
        ns, name = obj_key(obj)
        with self._lock:
            objs = self._cache.get(ns)
            if objs is not None and name in objs and not rv_older(obj_rv(obj), obj_rv(objs[name])):
                objs[name] = obj

    def _store(self, obj: Obj) -> None:
        ns, name = obj_key(obj)
        self._cache.setdefault(ns, {})[name] = obj

    def _drop(self, key: tuple[str, str]) -> Obj | None:
        ns, name = key
        objs = self._cache.get(ns)
        if objs is None:
            return None
        before = objs.pop(name, None)
        if not objs:
            del self._cache[ns]
        return before

    # --- list and watch -----------------------------------------------------------------

    def relist(self) -> None:
        """Replace the cache by a fresh list, reporting the difference as changes.

        The list waits for one of the process's list slots (``LIST_CONCURRENCY``); a stopped
        informer gives up waiting and lists nothing. The wait does not count against a new
        namespace's grace for 401/403 (``new_grant_seconds``): that grace is for the Role to
        arrive, counted from the first request sent.
        """
        waiting_since = self.clock()
        while not self.list_slots.acquire(timeout=LIST_SLOT_POLL):
            if self.stopped(self._run_stop):
                return
        if not self._sent_in_run:
            self._run_started += self.clock() - waiting_since
            self._sent_in_run = True
        try:
            if self.stopped(self._run_stop):
                return
            items, rv = self.api.list(
                self.res,
                self.namespace,
                self.label_selector,
                self.field_selector,
                transform=self.transform,
            )
        finally:
            self.list_slots.release()
        fresh: dict[str, dict[str, Obj]] = {}
        for obj in items:
            ns, name = obj_key(obj)
            fresh.setdefault(ns, {})[name] = obj
        with self._lock:
            if self._stop.is_set():
                # Stopped while the list was on its way (its CR was deleted): ``stop`` has
                # emptied the cache and must find it empty afterwards too.
                return
            old = self._cache
            self._cache = fresh
            self.resource_version = rv
            self.error = None
        self.relists += 1
        if self.unserved:
            self.unserved = False
            log.debug("%r: served again", self)
            self._notify("SERVED", None, None)
        for ns, objs in old.items():
            for name, obj in objs.items():
                if name not in fresh.get(ns, {}):
                    self._notify("DELETED", None, obj)
        for ns, objs in fresh.items():
            for name, obj in objs.items():
                before = old.get(ns, {}).get(name)
                if before is None:
                    self._notify("ADDED", obj, None)
                elif obj_rv(before) != obj_rv(obj):
                    self._notify("MODIFIED", obj, before)
        self._synced.set()
        self._settle()

    def _settle(self) -> None:
        if not self._settled_once:
            self._settled_once = True
            self._notify("SETTLED", None, None)

    def watch_once(self) -> None:
        """One watch session from the current resourceVersion until the server ends it.

        A 410 Gone or a "too large resourceVersion" (as an HTTP error or as an ERROR event)
        forgets the resourceVersion, so the next ``run_once`` re-lists. Other ERROR events
        raise like HTTP errors do.
        """
        assert self.resource_version is not None
        timeout = random.randint(*self.watch_timeout)
        self._events_in_session = 0
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
            if exc.status == GONE or is_too_large_resource_version(exc):
                self._gone(str(exc.status))
                return
            raise
        self._stream = stream
        try:
            for event in stream:
                if self._stop.is_set():
                    return
                self._events_in_session += 1
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
            causes = (obj.get("details") or {}).get("causes") or []
            too_large = code == 504 and (
                any(c.get("reason") == "ResourceVersionTooLarge" for c in causes)
                or "Too large resource version" in str(obj.get("message") or "")
            )
            if code == GONE or too_large:
                self._gone(str(code))
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
        obj = self.transform(obj)
        key = obj_key(obj)
        with self._lock:
            before = self._cache.get(key[0], {}).get(key[1])
            if rv:
                self.resource_version = rv
            if etype == "DELETED":
                self._drop(key)
            elif before is not None and (obj_rv(before) == rv or rv_older(rv, obj_rv(before))):
                # Our own write (already stored by put) or an older copy: nothing new.
                return True
            else:
                self._store(obj)
        if etype == "DELETED":
            self._notify(etype, None, before or obj)
        else:
            self._notify(etype, obj, before)
        return True

    def _gone(self, why: str) -> None:
        log.info(
            "%r: resourceVersion %s unusable (%s), re-listing", self, self.resource_version, why
        )
        self.resource_version = None
        self.metrics.relists.labels(resource=self.label).inc()

    def _gone_kind(self, exc: BaseException) -> None:
        """The API server does not serve this resource (404 on the collection).

        For a custom resource that means its CRD was deleted, and with it every object of the
        kind, whether or not their DELETED events reached us before the watch ended. So the
        cache is emptied (each object reported DELETED: their per-CR watches stop, nothing is
        written for them), the next attempt lists afresh, and the cache no longer counts as
        synced. Only the first 404 of a run is reported ("UNSERVED"); retries stay quiet.
        """
        self.resource_version = None
        self._synced.clear()
        with self._lock:
            old, self._cache = self._cache, {}
        for objs in old.values():
            for obj in objs.values():
                self._notify("DELETED", None, obj)
        if self.unserved:
            log.debug("%r: still not served: %s", self, describe_error(exc))
            return
        self.unserved = True
        self._notify("UNSERVED", None, None)

    def _notify(self, etype: str, obj: Obj | None, before: Obj | None) -> None:
        try:
            self.on_change(self, etype, obj, before)
        except Exception:  # a broken callback must not kill the watch
            log.exception("%r: change callback failed", self)

    def run_once(self) -> None:
        """List if there is no resourceVersion to resume from, then watch once."""
        if self.resource_version is None:
            self.relist()
        if self.stopped(self._run_stop):
            return  # no new watch for a stopped informer
        self.watch_once()

    def run(self, stop: threading.Event | None = None) -> None:
        """Loop until stopped: errors back off and resume from the last resourceVersion."""
        self._run_stop = stop  # for a list waiting for a slot (``relist``)
        try:
            self._run(stop)
        finally:
            self._run_stop = None

    def _run(self, stop: threading.Event | None) -> None:
        failures = 0
        first = True
        self._run_started = self.clock()
        self._sent_in_run = False
        while not self.stopped(stop):
            if not first:
                self.restarts += 1
                self.metrics.watch_restarts.labels(resource=self.label).inc()
            first = False
            started = self.clock()
            try:
                self.run_once()
            except Exception as exc:
                if self.stopped(stop):
                    return
                status = getattr(exc, "status", None)
                if status == NOT_FOUND:
                    # Not an outage: the kind is gone (CRD deleted). The Observer says so
                    # once; retry at a gentle pace until it is back.
                    self._gone_kind(exc)
                    self._stop.wait(self.unserved_backoff.wait_for(min(failures, 8)))
                    failures += 1
                    continue
                if (
                    status in (401, 403)
                    and self.error is None
                    and self.clock() - self._run_started < self.new_grant_seconds
                ):
                    # A namespace just added: its Role may be on its way. Unknown (this
                    # cache has not listed, so its CRs wait), asked again soon, not reported.
                    # Not a failure: counted, the first retry after the grace would wait
                    # 15-30 s instead of the backoff's first delay (review of issue 16).
                    log.info("%r: %s in a namespace just added; retrying", self, status)
                    self._stop.wait(NEW_GRANT_RETRY)
                    continue
                if self.unserved and status == TOO_MANY_REQUESTS:
                    # Seen on the local cluster while a deleted CRD was created again: one
                    # 429 with Retry-After: 1, then the list worked. Part of the wait
                    # already logged, not a new problem.
                    log.debug("%r: not served yet: %s", self, describe_error(exc))
                else:
                    log.warning("%r: list/watch failed (%s): %s", self, status, describe_error(exc))
                if not isinstance(exc, ApiException) or is_transient(exc):
                    self._server_trouble_at = self.clock()
                if status in (401, 403) and self._auth_warming_up():
                    log.info("%r: %s just after the API server was away; retrying", self, status)
                elif status in (401, 403):
                    # Permissions may be granted later (RBAC created after us); the cache
                    # must no longer claim to be complete, and the status says why. What it
                    # holds is no longer known to be true: dropped (no DELETED events: the
                    # objects are unknown, not gone), and the CRs using it are recomputed now.
                    self.resource_version = None
                    self._synced.clear()
                    first = self.error is None
                    self.error = describe_error(exc)
                    with self._lock:
                        self._cache = {}
                    if self._settled_once and first:
                        self._notify("UNREADABLE", None, None)
                    self._settle()
                # Still waiting for a CRD: keep its gentler cap (10 s, not 30 s).
                backoff = self.unserved_backoff if self.unserved else self.backoff
                self._stop.wait(backoff.wait_for(min(failures, 8), exc))
                failures += 1
                continue
            if self._events_in_session == 0 and self.clock() - started < MIN_WATCH_SECONDS:
                # The server closed the watch at once (overload, a proxy, a bad RV): back off
                # like after an error instead of reconnecting in a hot loop.
                self._stop.wait(self.backoff.wait_for(min(failures, 8)))
                failures += 1
            else:
                failures = 0

    def _auth_warming_up(self) -> bool:
        return self.clock() - self._server_trouble_at < AUTH_WARMUP_SECONDS

    def stopped(self, stop: threading.Event | None = None) -> bool:
        return self._stop.is_set() or (stop is not None and stop.is_set())

    def start(self, stop: threading.Event | None = None) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name=repr(self), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop, abort a blocking watch read, and forget the cache."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[attr-defined]
        with self._lock:
            self._cache = {}
        self._synced.clear()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


@dataclass
class _Group:
    """Informers that live and die together: those of one driver namespace, or of one CR."""

    informers: list[Informer] = field(default_factory=list)


class Observer:
    """All caches of the reporter, and the queue of CR names whose status may have changed."""

    def __init__(
        self,
        api: Api,
        metrics: Metrics,
        deployments: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        informer_factory: Callable[..., Informer] = Informer,
        shared_watches: bool = False,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.deployments = sorted(set(deployments or ())) or None
        # The stack layout (module docstring); without deployments it is the every-CR one.
        self.shared_watches = bool(shared_watches and self.deployments)
        self.clock = clock
        self._new_informer = informer_factory
        self.selector = label_selector_for(self.deployments)
        self.stop = threading.Event()
        self._lock = threading.RLock()
        self._dirty: dict[str, float | None] = {}
        self._dirty_cv = threading.Condition(threading.Lock())
        self._groups: dict[str, _Group] = {}
        self._started = False
        self._crd_missing = False  # last state logged and exported by _served_changed
        # (kind, namespace, name) -> (expires, labels or None): see lookup_labels.
        self._lookups: dict[
            tuple[str, str, str], tuple[float, dict[str, str] | model.LookupFailed | None]
        ] = {}
        # (kind, namespace, name) -> failed lookups in a row (LOOKUP_RETRY doubling).
        self._lookup_failures: dict[tuple[str, str, str], int] = {}
        # kind -> {namespace or ALL_NAMESPACES or "" (cluster-scoped) -> informers}
        self._index: dict[str, dict[str, list[Informer]]] = {}
        if self.shared_watches:
            self.cr_informers = [self._informer(CR)]
            # Namespaced kinds: per driver namespace (ensure_for), where RBAC grants them.
            self.shared = [
                self._informer(res, label_selector=self.selector) for res in CLUSTER_KINDS
            ]
            for inf in self.shared:
                self._register(inf, "" if not inf.res.namespaced else ALL_NAMESPACES)
        elif self.deployments:
            # By name, so RBAC may restrict the CR to resourceNames.
            self.cr_informers = [
                self._informer(CR, field_selector=f"metadata.name={name}")
                for name in self.deployments
            ]
            self.shared: list[Informer] = []
        else:
            self.cr_informers = [self._informer(CR)]
            self.shared = [
                self._informer(res, label_selector=self.selector) for res in CLUSTER_KINDS
            ] + [
                self._informer(res, label_selector=self.selector)
                for res in (*NAMESPACED_KINDS, SECRET)
            ]
            for inf in self.shared:
                self._register(inf, "" if not inf.res.namespaced else ALL_NAMESPACES)

    @property
    def named(self) -> bool:
        """Per-CR or per-namespace informers are started and stopped with their CRs."""
        return self.deployments is not None

    def _informer(self, res: Resource, **kwargs: object) -> Informer:
        return self._new_informer(self.api, res, self._on_change, self.metrics, **kwargs)

    def _register(self, inf: Informer, where: str) -> None:
        self._index.setdefault(inf.res.kind, {}).setdefault(where, []).append(inf)

    def _unregister(self, inf: Informer) -> None:
        for where, infs in list(self._index.get(inf.res.kind, {}).items()):
            if inf in infs:
                infs.remove(inf)
                if not infs:
                    del self._index[inf.res.kind][where]

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._started = True
        for inf in self.all_informers():
            inf.start(self.stop)
        self.metrics.watches.set(len(self.all_informers()))

    def shutdown(self) -> None:
        self.stop.set()
        for inf in self.all_informers():
            inf.stop()
        with self._dirty_cv:
            self._dirty_cv.notify_all()

    def all_informers(self) -> list[Informer]:
        with self._lock:
            grouped = [i for g in self._groups.values() for i in g.informers]
        return [*self.cr_informers, *self.shared, *grouped]

    @property
    def synced(self) -> bool:
        """Every cache has listed once, including those of every known CR.

        False while the CRD is missing (``crd_missing``): the CR cache cannot list, and a
        reporter with nothing to report on should show as not ready, not restart.
        """
        if not all(inf.synced for inf in self.cr_informers):
            return False
        return all(self.cr_settled(cr) for cr in self.crs()) and all(
            inf.synced for inf in self.all_informers()
        )

    @property
    def healthy(self) -> bool:
        """Every watch loop is still running (they never end on their own before stop)."""
        if not self._started:
            return False
        return all(inf.alive for inf in self.all_informers())

    # --- lookups (for reporter.write) -----------------------------------------------------

    def _serves(self, cr: Obj) -> bool:
        return not self.shared_watches or _name(cr) in (self.deployments or ())

    def crs(self) -> list[Obj]:
        """The CRs this reporter reports on (the shared layout's CR watch sees all of them)."""
        return [cr for inf in self.cr_informers for cr in inf.items() if self._serves(cr)]

    def cr(self, name: str) -> Obj | None:
        for inf in self.cr_informers:
            obj = inf.get(name)
            if obj is not None and self._serves(obj):
                return obj
        return None

    def remember_cr(self, cr: Obj) -> None:
        for inf in self.cr_informers:
            inf.put(cr)

    def _informers_for(self, kind: str, namespace: str) -> list[Informer]:
        namespaced = kind == POD.kind or model.API_RESOURCES[kind].namespaced
        with self._lock:
            by_where = self._index.get(kind, {})
            return [
                *by_where.get(namespace if namespaced else "", []),
                *by_where.get(ALL_NAMESPACES, []),
            ]

    def _relevant(self, cr: Obj) -> list[Informer]:
        """The informers a CR's status is computed from (besides the CR informer)."""
        namespace = cr_namespace(cr)
        out: list[Informer] = []
        kinds = {e.kind for e in model.expected_objects(DeploymentNames(_name(cr)))} | {POD.kind}
        for kind in kinds:
            out += self._informers_for(kind, namespace)
        name = _name(cr)
        return [i for i in out if i.owner in (None, name)]

    def cr_settled(self, cr: Obj) -> bool:
        """Every cache this CR depends on has listed (or is known to be unreadable)."""
        relevant = self._relevant(cr)
        return bool(relevant) and all(inf.settled for inf in relevant)

    def unreadable_for(self, cr: Obj) -> dict[str, str]:
        """kind -> error, for the kinds this CR depends on that the reporter cannot read."""
        out: dict[str, str] = {}
        for inf in self._relevant(cr):
            if inf.error is not None and not inf.synced:
                out.setdefault(inf.res.kind, inf.error)
        return out

    def find(self, kind: str, name: str, namespace: str) -> Obj | None:
        """A cached sub-object, or None when missing."""
        for inf in self._informers_for(kind, namespace):
            obj = inf.get(name, namespace if inf.res.namespaced else None)
            if obj is not None:
                return obj
        return None

    def lookup_labels(self, kind: str, name: str, namespace: str) -> dict[str, str] | None:
        """The ``part-of``/``instance`` labels of an expected object absent from the caches,
        read by name (None: it does not exist; ``model.LookupFailed`` when the GET failed).

        The label-selected watches drop an object whose labels were removed or changed, as
        if it was deleted; one GET tells the two apart. Remembered until the object shows up
        in a watch again, or for ``LOOKUP_TTL`` seconds, so a relabelled object costs one
        request per minute, not one per reconcile.
        """
        if kind == model.SECRET:
            # Never read by name (least privilege: list/watch only, in driver namespaces); a
            # relabelled Secret is reported missing.
            return None
        informers = self._informers_for(kind, namespace)
        if not any(inf.field_selector is None and inf.label_selector for inf in informers):
            return None  # watched by name, not by label: absent from its cache means missing
        api = model.API_RESOURCES[kind]
        key = (kind, namespace if api.namespaced else "", name)
        now = self.clock()
        with self._lock:
            known = self._lookups.get(key)
        if known is not None and now < known[0]:
            if isinstance(known[1], model.LookupFailed):
                # A new exception each time: re-raising the cached one would grow its
                # traceback on every reconcile.
                raise model.LookupFailed(str(known[1]), known[0] - now)
            return known[1]
        try:
            found = self.api.get_metadata(
                resource_for(kind), name, namespace if api.namespaced else None
            )
        except Exception as exc:
            # Not "missing": the object may well exist (review of issue 16). Unknown, and
            # asked again after LOOKUP_RETRY seconds (doubling while it keeps failing), not
            # believed for LOOKUP_TTL.
            why = f"{kind}/{name} could not be looked up: {describe_error(exc)}"
            with self._lock:
                failures = self._lookup_failures.get(key, 0)
                self._lookup_failures[key] = failures + 1
                retry = min(LOOKUP_RETRY_CAP, LOOKUP_RETRY * 2 ** min(failures, 8))
                self._lookups[key] = (now + retry, model.LookupFailed(why))
            log.info("%s; asked again in %.0f s", why, retry)
            raise model.LookupFailed(why, retry) from None
        labels = None
        if found is not None:
            all_labels = (found.get("metadata") or {}).get("labels") or {}
            labels = {k: all_labels[k] for k in (LABEL_PART_OF, LABEL_INSTANCE) if k in all_labels}
        with self._lock:
            self._lookups[key] = (now + LOOKUP_TTL, labels)
            self._lookup_failures.pop(key, None)
        return labels

    def _forget_lookup(self, inf: Informer, obj: Obj) -> None:
        ns, name = obj_key(obj)
        key = (inf.res.kind, ns if inf.res.namespaced else "", name)
        with self._lock:
            self._lookups.pop(key, None)
            self._lookup_failures.pop(key, None)

    def pods(self, namespace: str) -> list[Obj]:
        return [p for inf in self._informers_for(POD.kind, namespace) for p in inf.items(namespace)]

    # --- named layout: informers per CR and per namespace ---------------------------------

    def ensure_for(self, cr: Obj) -> None:
        """Start the informers a named CR needs (no-op in the every-CR layout)."""
        if not self.named:
            return
        name, namespace = _name(cr), cr_namespace(cr)
        with self._lock:
            # A reconcile holds a copy read a moment ago; if the CR was deleted (or moved)
            # since, its informers were pruned and must not come back: nothing would prune
            # them again. Checked under the lock _prune_groups takes.
            current = self.cr(name)
            if current is None or cr_namespace(current) != namespace:
                return
            if self.shared_watches:
                self._ensure_group(
                    f"ns/{namespace}", lambda: self._namespace_informers(namespace, SECRET)
                )
                return
            self._ensure_group(f"ns/{namespace}", lambda: self._namespace_informers(namespace))
            self._ensure_group(
                f"cr/{name}/{namespace}", lambda: self._cr_informers(name, namespace)
            )

    def _namespace_informers(
        self, namespace: str, *extra: Resource
    ) -> list[tuple[Informer, str]]:
        return [
            (self._informer(res, namespace=namespace, label_selector=self.selector), namespace)
            for res in (*NAMESPACED_KINDS, *extra)
        ]

    def _cr_informers(self, name: str, namespace: str) -> list[tuple[Informer, str]]:
        out: list[tuple[Informer, str]] = []
        for exp in model.expected_objects(DeploymentNames(name)):
            res = resource_for(exp.kind)
            if exp.kind == model.SECRET:
                inf = self._informer(
                    res,
                    namespace=namespace,
                    field_selector=f"metadata.name={exp.name}",
                    owner=name,
                )
                out.append((inf, namespace))
            elif not exp.namespaced:
                inf = self._informer(res, field_selector=f"metadata.name={exp.name}", owner=name)
                out.append((inf, ""))
        return out

    def _ensure_group(self, key: str, build: Callable[[], list[tuple[Informer, str]]]) -> None:
        with self._lock:  # re-entrant: held by ensure_for, so pruning cannot interleave
            if key in self._groups:
                return
            made = build()
            self._groups[key] = _Group([inf for inf, _ in made])
            for inf, where in made:
                self._register(inf, where)
            log.info("watching %s", key)
            if all(i.synced for i in self.cr_informers):
                # Started for a CR seen after the first list (moved or added while running):
                # its grants may still be on their way (NEW_GRANT_SECONDS).
                for inf, _ in made:
                    inf.new_grant_seconds = NEW_GRANT_SECONDS
            if self._started:
                for inf, _ in made:
                    inf.start(self.stop)
                self.metrics.watches.set(len(self.all_informers()))

    def _prune_groups(self) -> None:
        """Stop the informers no current CR needs: deleted CRs, namespaces left behind."""
        if not self.named:
            return
        with self._lock:
            wanted: set[str] = set()
            for cr in self.crs():
                wanted |= {f"ns/{cr_namespace(cr)}", f"cr/{_name(cr)}/{cr_namespace(cr)}"}
            if self.shared_watches:
                wanted = {k for k in wanted if k.startswith("ns/")}
            dead = {k: g for k, g in self._groups.items() if k not in wanted}
            for key, group in dead.items():
                del self._groups[key]
                for inf in group.informers:
                    self._unregister(inf)
        for key, group in dead.items():
            log.info("no longer watching %s", key)
            for inf in group.informers:
                inf.stop()
        if dead and self._started:
            self.metrics.watches.set(len(self.all_informers()))

    # --- change tracking ----------------------------------------------------------------

    def _known_names(self) -> set[str]:
        names = {_name(cr) for cr in self.crs()}
        names.update(self.deployments or ())
        names.discard("")
        return names

    def affected(self, inf: Informer, obj: Obj) -> set[str]:
        """Names of the CRs whose status may depend on this object."""
        if inf.res.kind == CR.kind and inf.res.api_version == CR.api_version:
            return {_name(obj)} if self._serves(obj) else set()
        if inf.owner is not None:
            return {inf.owner}
        instance = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_INSTANCE)
        return {n for n in self._known_names() if DeploymentNames(n).hyphened == instance}

    def _settled_names(self, inf: Informer) -> set[str]:
        """CRs that may become computable because this informer listed or failed."""
        if inf in self.cr_informers:
            return {_name(cr) for cr in inf.items() if self._serves(cr)}
        if inf.owner is not None:
            return {inf.owner}
        return {_name(cr) for cr in self.crs() if inf.namespace in (None, cr_namespace(cr))}

    @property
    def crd_missing(self) -> bool:
        """The CR kind is not served (its CRD was deleted): nothing to report on, yet."""
        return any(inf.unserved for inf in self.cr_informers)

    def _served_changed(self, inf: Informer, etype: str) -> None:
        """Say once, in words an administrator searches for, that the CRD is gone or back.

        Why not crash (and let the pod restart): a restarted reporter finds the CRD just as
        missing, and a crash-looping pod hides the reason among restarts. The reporter keeps
        running, retries with backoff, is not ready (``synced``) and sets a gauge.
        """
        if inf not in self.cr_informers:
            if etype == "UNSERVED":
                log.warning("%r: the API server does not serve %s; waiting", inf, inf.res.plural)
            return
        with self._lock:
            missing = self.crd_missing
            changed = missing != self._crd_missing
            self._crd_missing = missing
        if not changed:
            return
        self.metrics.crd_missing.set(1 if missing else 0)
        if missing:
            log.warning(
                "CRD %s is gone (the API server answers 404 for %s): no Deployment CR to report "
                "on; waiting for the CRD to be created again (retrying at least every %.0f s)",
                CRD_NAME,
                CR.path(),
                UNSERVED_RETRY_CAP,
            )
        else:
            log.info("CRD %s is served again; watching its Deployment CRs", CRD_NAME)

    def _on_change(self, inf: Informer, etype: str, obj: Obj | None, before: Obj | None) -> None:
        now = self.clock()
        if etype in ("UNSERVED", "SERVED"):
            self._served_changed(inf, etype)
            return
        if etype in ("SETTLED", "UNREADABLE"):
            for name in self._settled_names(inf):
                self.mark_dirty(name, now)
            return
        names: set[str] = set()
        for o in (obj, before):
            if o is not None:
                names |= self.affected(inf, o)
                self._forget_lookup(inf, o)
        if inf in self.cr_informers:
            if obj is not None and self._serves(obj):
                self.ensure_for(obj)
            if obj is None or (before is not None and cr_namespace(before) != cr_namespace(obj)):
                self._prune_groups()
        for name in names:
            self.mark_dirty(name, now)

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


def _name(cr: Obj) -> str:
    return str((cr.get("metadata") or {}).get("name") or "")


def cr_namespace(cr: Obj) -> str:
    return str((cr.get("spec") or {}).get("namespace") or model.DEFAULT_NAMESPACE)
