"""Turn the caches into a CR status and write it, only when it means something new.

Why so careful about not writing: every status patch wakes every watcher of the CR (kubectl,
Pulumi refresh, the reporter's own replicas) and bumps resourceVersion. ``compute_status``
carries timestamps over, and ``status_equal_ignoring_time`` compares without them, so at steady
state, after a resync or after a restart, the reporter sends nothing.

The patch is a JSON merge patch on ``/status`` holding the status difference plus
``metadata.resourceVersion`` as a precondition: the status subresource ignores every metadata
change, but the precondition makes the API server refuse (409) a patch computed from a stale
copy, e.g. one whose lastTransitionTime bookkeeping missed another replica's last write. On a
conflict the CR is read again and the status recomputed, so a retry never overwrites newer
information. Spec and metadata are never modified.

Write amplification: a rollout over thousands of nodes changes a count in a message with
every pod, and the DaemonSet controller raises desiredNumberScheduled in steps, so a large
rollout even passes through "all desired pods ready" (Running) many times. Writes are
therefore split in two:
- urgent (``significant_key`` differs): a failure appears or goes away (phase Failed in or
  out), a condition's status or reason changes, the spec generation moves. Written at once.
- everything else (Running <-> Progressing, a component flipping, message text and counts):
  taken from a per-CR token bucket of ``burst`` writes refilled one per ``message_interval``.
  An isolated change (a node joins: Progressing, then Running) is written at once; a storm
  is cut to one write per interval, the newest status winning.
- a pod starting or ceasing to fail (crash loop, image pull, unschedulable, phase Failed:
  ``status.failing_pods``) is urgent too, though it need not change the phase any more (one
  broken pod of many is progress, or tolerated): it is what an administrator waits to see.
  Pods starting on their way (a rollout) are not failing, so rollouts stay in the budget.
- one exception: the way back to Running after a failure. Healing goes Failed -> Progressing
  (urgent) -> Running (not urgent, as the DaemonSet's counters catch up a moment later); a
  user watching a recovery must not wait for a token there, so the first Running after a
  write out of Failed, or after a write in which failing pods healed, is urgent too.
  Rollouts that never failed still go through the budget.
The writer reports when a deferred CR is due (``deferred``) and the main loop comes back then,
so the final state always lands.

No lost update, and no write holding up the others: a conflict (409) is retried at once from
a fresh read; any other failed write (500/429, e.g. an etcd leader change, a timeout) is not
slept for on the main loop, nor dropped until the next resync: the CR goes into ``deferred``
and ``backing_off`` with a growing delay (``retry_backoff``: 0.2 s doubling to 30 s, jittered,
Retry-After honoured) and is tried again until the write lands or the CR is gone (404, or no
longer cached). Watch events, resyncs and leadership changes in between do not shorten that
delay (a struggling API server is not hammered by a busy CR); other CRs are written meanwhile.
An Event that meets a transient error is tried again with the same backoff per CR, at the
CR's first reconcile after its delay (the main loop is asked to come back then), and given up
``EVENT_GIVE_UP_SECONDS`` after it was first held back. A CR
that could not be written because this replica was not leading (at the start, or lost in
the middle of retries) goes into ``awaiting_leader``; the main loop keeps it until
``is_leader()`` is True again, whether or not the elector saw a flip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from pmem_components.names import CRD_GROUP, CRD_KIND, CRD_PLURAL, CRD_STORAGE_VERSION
from reporter import model, status
from reporter.kubeapi import Obj, RawApi, Resource
from reporter.metrics import Metrics
from reporter.retry import (
    CONFLICT,
    Backoff,
    GiveUp,
    call_with_retry,
    describe_error,
    is_transient,
)

log = logging.getLogger(__name__)

EVENTS = Resource("Event", "v1", "events", True)
COMPONENT = "pmem-csi-reporter"
# Node Events of one CR (issue 16's "a few broken nodes named"), bounded: at most
# MAX_NODE_EVENTS Warning Events naming a node pod, plus one summary of the rest, per
# NODE_EVENT_REPEAT_SECONDS window; and one pod on one node is named at most once per window,
# however often it flaps. So a CR costs at most 11 node Events per 10 minutes.
MAX_NODE_EVENTS = 10
NODE_EVENT_REPEAT_SECONDS = 600.0
# Another writer replaced a served CR's status (review of issue 16): this reporter writes the
# CR again only once that writer has been quiet this long (short: while moving to one reporter
# per stack, an old reporter writes until it is deleted), and Events it at most every
# CONFLICT_EVENT_SECONDS.
CONFLICT_QUIET_SECONDS = 60.0
CONFLICT_EVENT_SECONDS = 600.0
# Node Events: the ones ``_node_events`` records, evicted first from a full queue.
NODE_EVENT_REASONS = frozenset({"NodeDriverNotReady", "NodeDriversNotReady"})
# Events of one CR kept for another attempt after a transient error: what one reconcile
# records (its node Events, their summary, a phase Event, a StatusWriteConflict). A full
# queue makes room by dropping its oldest node Event (logged), never a phase Event for one.
MAX_PENDING_EVENTS = MAX_NODE_EVENTS + 3
# An Event held back (it met a transient error, or waited behind one that did) is tried
# with ``retry_backoff`` between the attempts and given up this long after it was first held
# back: under a 500 storm Events are not retried for ever, nor in a hot loop, nor one after
# the other for half an hour (review of issue 16).
EVENT_GIVE_UP_SECONDS = 60.0
_MISSING = object()


class Cache(Protocol):
    """What the writer reads from ``reporter.observe.Observer``."""

    def cr(self, name: str) -> Obj | None: ...

    def find(self, kind: str, name: str, namespace: str) -> Obj | None: ...

    def pods(self, namespace: str) -> list[Obj]: ...

    def cr_settled(self, cr: Obj) -> bool: ...

    def ensure_for(self, cr: Obj) -> None: ...

    def unreadable_for(self, cr: Obj) -> dict[str, str]: ...

    def remember_cr(self, cr: Obj) -> None: ...

    def lookup_labels(self, kind: str, name: str, namespace: str) -> dict[str, str] | None: ...


class StatusApi(Protocol):
    """The three writes and one read the writer makes (fakes implement this in tests)."""

    def get_cr(self, name: str) -> Obj | None: ...

    def patch_status(self, name: str, patch: Obj) -> Obj: ...

    def create_event(self, namespace: str, event: Obj) -> Obj: ...


CR_RESOURCE = Resource(CRD_KIND, f"{CRD_GROUP}/{CRD_STORAGE_VERSION}", CRD_PLURAL, False)


class KubeStatusApi:
    """``StatusApi`` on ``RawApi``: every call has the RawApi's request timeout.

    (The generated CustomObjectsApi calls had none: on a half-open connection a status
    write blocked forever while the Lease kept being renewed by another thread.)
    """

    def __init__(self, raw: RawApi) -> None:
        self.raw = raw

    def get_cr(self, name: str) -> Obj | None:
        return self.raw.get(CR_RESOURCE, name)

    def patch_status(self, name: str, patch: Obj) -> Obj:
        return self.raw.merge_patch_status(CR_RESOURCE, name, patch, COMPONENT)

    def create_event(self, namespace: str, event: Obj) -> Obj:
        return self.raw.create(EVENTS, event, namespace)


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7396 merge patch that turns ``old`` into ``new`` (None keys delete)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if isinstance(before, dict) and isinstance(value, dict):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch


def _owned_by(pod: Obj, kind: str, name: str) -> bool:
    return any(
        ref.get("kind") == kind and ref.get("name") == name
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
    )


def cr_namespace(cr: Obj) -> str:
    return str((cr.get("spec") or {}).get("namespace") or model.DEFAULT_NAMESPACE)


def build_observed(cache: Cache, cr: Obj) -> model.Observed:
    """The snapshot ``compute_status`` needs, from the caches (pods split by owner)."""
    observed = model.Observed(cr=cr)
    names, namespace = observed.names, observed.namespace
    objects: dict[str, dict[str, Obj | None]] = {}
    unreadable = cache.unreadable_for(cr)
    relabelled: dict[tuple[str, str], dict[str, str]] = {}
    recheck: list[float] = []
    for exp in model.expected_objects(names):
        found = cache.find(exp.kind, exp.name, namespace)
        objects.setdefault(exp.kind, {})[exp.name] = found
        if found is None and exp.kind not in unreadable:
            try:
                labels = cache.lookup_labels(exp.kind, exp.name, namespace)
            except model.LookupFailed as exc:
                # Present (relabelled) or missing: unknown, so the kind is Unknown.
                unreadable = {**unreadable, exp.kind: str(exc)}
                recheck.append(exc.retry_in)
                continue
            if labels is not None:
                relabelled[(exp.kind, exp.name)] = labels
    controller_pods: list[Obj] = []
    node_pods: list[Obj] = []
    for pod in cache.pods(namespace):
        if _owned_by(pod, "DaemonSet", names.node_driver):
            node_pods.append(pod)
        elif _owned_by(pod, "StatefulSet", names.controller_driver):
            controller_pods.append(pod)
    return model.Observed(
        cr=cr,
        objects=objects,
        controller_pods=controller_pods,
        node_pods=node_pods,
        nodes=None,
        unreadable=unreadable,
        relabelled=relabelled,
        recheck_in=min(recheck) if recheck else None,
    )


def significant_key(st: Obj | None) -> str:
    """What must reach the CR at once: failed or not, each condition's status and reason, and
    the generation. Statuses with the same key are written through the per-CR rate limit.
    """
    s = st or {}
    return repr(
        (
            s.get("phase") == status.PHASE_FAILED,
            s.get("observedGeneration"),
            sorted(
                (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
                for c in s.get("conditions") or []
            ),
        )
    )


def build_event(
    cr: Obj, namespace: str, etype: str, reason: str, message: str, now: datetime
) -> Obj:
    """A core/v1 Event about the (cluster-scoped) CR, named like client-go names them."""
    meta = cr.get("metadata") or {}
    stamp = status.format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": f"{CRD_GROUP}/{CRD_STORAGE_VERSION}",
            "kind": CRD_KIND,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": etype,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class NotLeading(GiveUp):
    """Retrying stopped because this replica does not hold the Lease (now)."""


class CrGone(GiveUp):
    """Retrying stopped because the CR was deleted."""


@dataclass
class StatusWriter:
    """Reconciles one CR at a time: compute, compare, patch if different, record an Event.

    ``is_leader`` is asked before every write attempt, so a replica that lost its Lease stops
    writing at once, even in the middle of retrying.
    """

    api: StatusApi
    cache: Cache
    metrics: Metrics
    is_leader: Callable[[], bool]
    event_namespace: str
    backoff: Backoff = field(default_factory=Backoff)
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # Non-urgent writes of one CR: ``burst`` at once, then one per ``message_interval`` s.
    message_interval: float = 10.0
    burst: int = 3
    progress_deadline: timedelta = status.DEFAULT_PROGRESS_DEADLINE
    # How long another writer of a served CR's status must have been quiet before this
    # reporter writes that CR again (``--conflict-quiet-seconds``).
    conflict_quiet: float = CONFLICT_QUIET_SECONDS
    # CR name -> monotonic time when its deferred write (rate limit, or retry after a failed
    # write) is due.
    deferred: dict[str, float] = field(default_factory=dict)
    # Between attempts of a write that keeps failing (per CR, through ``deferred``: the main
    # loop goes on with the other CRs meanwhile, and events do not pull it forward).
    retry_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.2, cap=30.0, max_attempts=0)
    )
    # CR name -> monotonic time before which its failed write is not tried again.
    backing_off: dict[str, float] = field(default_factory=dict)
    # CRs not written because this replica was not leading: written once it leads again.
    awaiting_leader: set[str] = field(default_factory=set)
    # CR name -> failed write rounds in a row.
    _failures: dict[str, int] = field(default_factory=dict, init=False)
    # CR name -> (tokens, monotonic time they were counted)
    _tokens: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    # CRs whose last written phase change left Failed and has not reached Running yet.
    _recovering: set[str] = field(default_factory=set, init=False)
    # CR name -> the failing pods (status.failing_pods) as of its last write.
    _failing: dict[str, frozenset[str]] = field(default_factory=dict, init=False)
    # CR name -> (pod, node) of the broken node pods already announced by an Event. Kept in
    # memory only: a restarted or new leader announces the currently broken ones once more.
    _broken: dict[str, set[tuple[str, str | None]]] = field(default_factory=dict, init=False)
    # CR name -> (pod, node) -> monotonic time it was last named in an Event.
    _announced: dict[str, dict[tuple[str, str | None], float]] = field(
        default_factory=dict, init=False
    )
    # CR name -> (start of its node Event window, Events sent in it, summary sent in it).
    _node_window: dict[str, tuple[float, int, bool]] = field(default_factory=dict, init=False)
    # CR name -> (resourceVersion, status) of this reporter's last accepted write.
    _written: dict[str, tuple[str | None, Obj]] = field(default_factory=dict, init=False)
    # CR name -> (monotonic time until which it yields to another writer, the status it saw).
    _yielding: dict[str, tuple[float, Obj]] = field(default_factory=dict, init=False)
    # CR name -> monotonic time of its last StatusWriteConflict Event.
    _conflict_event_at: dict[str, float] = field(default_factory=dict, init=False)
    # CR name -> [Event, attempts so far, monotonic time it was first held back] that met a
    # transient error (or waits behind one), tried again at the CR's first reconcile after
    # the delay in ``_event_backoff``.
    _pending_events: dict[str, list[list[Any]]] = field(default_factory=dict, init=False)
    # CR name -> (failed Event attempts in a row, monotonic time of the next attempt).
    _event_backoff: dict[str, tuple[int, float]] = field(default_factory=dict, init=False)
    # CR name -> the uid of the CR the per-CR records above are about: a CR deleted and
    # created again under its name (pulumi replace) is another CR, not another writer's.
    _uids: dict[str, str] = field(default_factory=dict, init=False)
    # CR name -> monotonic time the main loop must come back for it at the latest, whatever
    # the reconcile decided (a pending Event, a failed lookup that may be asked again).
    _wake: dict[str, float] = field(default_factory=dict, init=False)

    def _urgent(self, name: str, old: Obj, new: Obj, failing: frozenset[str]) -> bool:
        if significant_key(old) != significant_key(new):
            return True
        if failing != self._failing.get(name, frozenset()):
            return True
        return name in self._recovering and new.get("phase") == status.PHASE_RUNNING

    def _track_recovery(self, name: str, old: Obj, new: Obj) -> None:
        if old.get("phase") == status.PHASE_FAILED and new.get("phase") != status.PHASE_FAILED:
            self._recovering.add(name)
        if new.get("phase") in (status.PHASE_RUNNING, status.PHASE_FAILED):
            self._recovering.discard(name)

    def _available(self, name: str) -> float:
        tokens, at = self._tokens.get(name, (float(self.burst), self.monotonic()))
        now = self.monotonic()
        return min(float(self.burst), tokens + (now - at) / self.message_interval)

    def _take(self, name: str) -> None:
        self._tokens[name] = (max(0.0, self._available(name) - 1.0), self.monotonic())

    def reconcile(self, name: str, changed_at: float | None = None) -> bool:
        """Bring one CR's status up to date; True when a patch was written."""
        try:
            return self._reconcile(name, changed_at)
        finally:
            wake = self._wake.pop(name, None)
            if wake is not None:
                self.deferred[name] = min(self.deferred.get(name, wake), wake)

    def _wake_at(self, name: str, at: float) -> None:
        """Have the main loop reconcile ``name`` again by ``at`` (``deferred``, at the end of
        this reconcile: the status comparison clears a deferral it does not need itself)."""
        self._wake[name] = min(self._wake.get(name, at), at)

    def _reconcile(self, name: str, changed_at: float | None) -> bool:
        cr = self.cache.cr(name)
        if cr is None:
            self._forget(name)
            return False  # deleted (or not created yet): nothing to report on
        uid = str((cr.get("metadata") or {}).get("uid") or "")
        if self._uids.get(name, uid) != uid:
            # Deleted and created again before a reconcile saw it gone: what was kept about
            # the old one (its last write above all) says nothing about the new one.
            log.info("%s: created again (uid %s); what was known of the old one forgotten",
                     name, uid)
            self._forget(name)
        self._uids[name] = uid
        if not self.cache.cr_settled(cr):
            # Its caches mark the CR dirty again once they have listed.
            self.cache.ensure_for(cr)
            return False
        if not self.is_leader():
            self.not_leading()
            self.awaiting_leader.add(name)
            return False
        self.awaiting_leader.discard(name)
        due = self.backing_off.get(name)
        if due is not None and self.monotonic() < due:
            # A change, a resync or a leadership flip does not shorten the backoff of a
            # write the API server keeps refusing (review of issue 16).
            self.deferred[name] = due
            return False
        self._flush_events(name)
        if self._yields_to_another_writer(name, cr):
            return False
        self.metrics.reconciles.inc()
        state: dict[str, Any] = {"cr": cr, "written": None}

        def attempt(n: int) -> None:
            if not self.is_leader():
                raise NotLeading("leadership lost")
            current = state["cr"]
            if n > 0 and state.get("conflict"):
                fresh = self.api.get_cr(name)
                if fresh is None:
                    raise CrGone("CR deleted")
                current = state["cr"] = fresh
                state["conflict"] = False
            old = dict(current.get("status") or {})
            observed = state["observed"] = build_observed(self.cache, current)
            if observed.recheck_in is not None:
                # Unknown until then (a failed lookup): computed again as soon as it may be
                # asked again, not at the next resync (review of issue 16).
                self._wake_at(name, self.monotonic() + observed.recheck_in)
            new = status.compute_status(
                observed, self.now(), progress_deadline=self.progress_deadline
            )
            if status.status_equal_ignoring_time(old, new):
                self.deferred.pop(name, None)
                return
            available = self._available(name)
            # Tolerated broken nodes (a few of many) go through the budget: their flaps change
            # the message only (review of issue 16).
            failing = state["failing"] = status.failing_pods(
                observed
            ) - status.tolerated_node_pods(observed)
            if not self._urgent(name, old, new, failing) and available < 1.0 - 1e-6:
                wait = (1.0 - available) * self.message_interval
                self.deferred[name] = self.monotonic() + wait
                return
            self.deferred.pop(name, None)
            patch = {
                "metadata": {
                    "resourceVersion": (current.get("metadata") or {}).get("resourceVersion")
                },
                "status": merge_patch(old, new),
            }
            try:
                result = self.api.patch_status(name, patch)
            except ApiException as exc:
                if exc.status == CONFLICT:
                    state["conflict"] = True
                elif exc.status == 404:
                    raise CrGone("CR deleted") from exc
                raise
            state["written"] = (current, old, new, result)

        try:
            # Only a conflict is retried here, at once, from a fresh read; every other error
            # waits in ``backing_off`` (nothing sleeps on the main loop).
            call_with_retry(
                attempt,
                self.backoff,
                lambda _s: None,
                retryable=lambda e: getattr(e, "status", None) == CONFLICT,
            )
        except NotLeading as why:
            self.not_leading()
            log.info("%s: status not written: %s; written once leading again", name, why)
            self.awaiting_leader.add(name)
            return False
        except GiveUp as why:  # CrGone
            log.info("%s: status not written: %s", name, why)
            self._forget(name)
            return False
        except Exception as exc:
            # The patch may have been applied with the reply lost (a timeout, a 504): what was
            # written last is unknown, so the next status seen is not taken for another's.
            self._written.pop(name, None)
            self.metrics.status_write_errors.inc()
            failures = self._failures.get(name, 0)
            self._failures[name] = failures + 1
            delay = self.retry_backoff.wait_for(min(failures, 10), exc)
            self.deferred[name] = self.backing_off[name] = self.monotonic() + delay
            log.error(
                "%s: writing status failed (%d time(s) in a row): %s; trying again in %.1f s",
                name,
                failures + 1,
                describe_error(exc),
                delay,
            )
            return False
        self._failures.pop(name, None)
        self.backing_off.pop(name, None)
        self._node_events(name, state["cr"], state["observed"])
        if state["written"] is None:
            return False
        current, old, new, result = state["written"]
        self._take(name)
        self._track_recovery(name, old, new)
        failing = state["failing"]
        if self._failing.get(name, frozenset()) - failing:
            self._recovering.add(name)  # pods healed: their Running is awaited too
            if new.get("phase") == status.PHASE_RUNNING:
                self._recovering.discard(name)
        self._failing[name] = failing
        self.metrics.status_writes.inc()
        if changed_at is not None:
            self.metrics.change_to_write.observe(max(0.0, self.monotonic() - changed_at))
        if isinstance(result, dict) and result.get("metadata"):
            self.cache.remember_cr(result)
            self._written[name] = (
                (result.get("metadata") or {}).get("resourceVersion"),
                dict(result.get("status") or new),
            )
        log.info("%s: status written: phase %r -> %r", name, old.get("phase", ""), new.get("phase"))
        # About the CR as read unless the reply names it: an empty body reads as {}, and an
        # Event built from that named no object (no name, no uid) and was refused.
        reply = result if isinstance(result, dict) else {}
        self._event(reply if (reply.get("metadata") or {}).get("name") else current, old, new)
        return True

    def not_leading(self) -> None:
        """Leadership is lost (or was never held): what this replica wrote last says nothing
        about the next writes, which are the new leader's, not another writer's. Events held
        back are dropped with their backoff: the new leader Events what it writes, and an
        Event created once this replica leads again, maybe hours later, would be stale
        (review of issue 16)."""
        self._written.clear()
        self._yielding.clear()
        dropped = sum(len(p) for p in self._pending_events.values())
        if dropped:
            log.info("%d held back event(s) dropped: not leading", dropped)
        self._pending_events.clear()
        self._event_backoff.clear()

    def _yields_to_another_writer(self, name: str, cr: Obj) -> bool:
        """True while another writer owns the CR's status (see ``CONFLICT_QUIET_SECONDS``;
        ``conflict_quiet`` here).

        Who owns a CR: the reporter of the stack whose ``--deployment`` names it. Two
        reporters naming one CR (two stacks, or an old-layout reporter left running) is a
        mistake only a person can undo; each recomputing on the other's write and writing
        back would be a write war. So the one that finds its last write replaced (a newer
        resourceVersion with a different status: only status writers change it) says so and
        yields: no write until the CR's status has stayed as the other left it for the
        quiet period. A spec change (newer resourceVersion, our status) is no conflict.
        """
        now = self.monotonic()
        rv = (cr.get("metadata") or {}).get("resourceVersion")
        current = dict(cr.get("status") or {})
        yielding = self._yielding.get(name)
        if yielding is not None:
            until, seen = yielding
            # Still at it: the status changed since the last look. Plain equality, so that a
            # status the rules would call garbage (no timestamps) is not "changing" forever.
            if seen != current:
                until = now + self.conflict_quiet
                # Still a write war: said again at a bounded rate, or an hour later (the
                # Events' TTL) nothing would show it (review of issue 16).
                self._conflict(name, cr, current, "is still being replaced", again=True)
            if now < until:
                self._yielding[name] = (until, current)
                self.deferred[name] = until
                return True
            del self._yielding[name]
            self._written.pop(name, None)
            return False
        mine = self._written.get(name)
        if mine is None or mine[0] == rv or status.status_equal_ignoring_time(mine[1], current):
            return False
        self._written.pop(name, None)
        self._yielding[name] = (now + self.conflict_quiet, current)
        self.deferred[name] = now + self.conflict_quiet
        self._conflict(name, cr, current, "was replaced", again=False)
        return True

    def _conflict(self, name: str, cr: Obj, current: Obj, what: str, *, again: bool) -> None:
        """Log and count a conflict, and Event it at most once per ``CONFLICT_EVENT_SECONDS``
        per CR. A new one (``again`` False) is always logged and counted; one that goes on
        while this reporter yields (``again``) only when its Event is due, so a write war
        stays visible however long it lasts, at a bounded rate."""
        now = self.monotonic()
        last = self._conflict_event_at.get(name)
        event_due = last is None or now - last >= CONFLICT_EVENT_SECONDS
        if again and not event_due:
            return
        self.metrics.status_conflicts.inc()
        rv = (cr.get("metadata") or {}).get("resourceVersion")
        message = (
            f"the status of {name} {what} by another writer (phase "
            f"{current.get('phase')!r} at resourceVersion {rv}): another stack's reporter, or "
            "a per-deployment reporter of the layout before, serves this CR too; this reporter "
            f"writes it again only after {self.conflict_quiet:g} s without such changes"
        )
        log.warning("%s: %s", name, message)
        if event_due:
            self._conflict_event_at[name] = now
            self._record(cr, "Warning", "StatusWriteConflict", message[0].upper() + message[1:])

    def _node_events(self, name: str, cr: Obj, observed: model.Observed) -> None:
        """A Warning Event for each node pod that broke since the last look (issue 16: a few
        broken nodes are named without failing the CR), at most ``MAX_NODE_EVENTS`` plus one
        summary per reconcile."""
        broken = status.degraded_node_pods(observed)
        now_broken = {(b.pod, b.node) for b in broken}
        known = self._broken.get(name, set())
        self._broken[name] = now_broken
        now = self.monotonic()
        announced = self._announced.setdefault(name, {})
        for key, at in list(announced.items()):
            if now - at >= NODE_EVENT_REPEAT_SECONDS:
                del announced[key]
        skip = known | announced.keys()  # once: per pod it was quadratic at 5,000 pods
        new = [b for b in broken if (b.pod, b.node) not in skip]
        if not new:
            return
        start, sent, summarized = self._node_window.get(name, (now, 0, False))
        if now - start >= NODE_EVENT_REPEAT_SECONDS:
            start, sent, summarized = now, 0, False
        named = new[: max(0, MAX_NODE_EVENTS - sent)]
        for b in named:
            announced[(b.pod, b.node)] = now
            where = f"on node {b.node}" if b.node else "(not scheduled)"
            self._record(
                cr,
                "Warning",
                "NodeDriverNotReady",
                f"Node driver pod {b.pod} {where}: {b.problem}; the driver serves on the "
                "other nodes",
            )
        rest = len(new) - len(named)
        if rest and not summarized:
            summarized = True
            self._record(
                cr,
                "Warning",
                "NodeDriversNotReady",
                f"and {rest} more node driver pod(s) are not ready; "
                "see the Node component of the status",
            )
        self._node_window[name] = (start, sent + len(named), summarized)

    def _forget(self, name: str) -> None:
        """Drop every per-CR record of a CR that is gone."""
        self._tokens.pop(name, None)
        self.deferred.pop(name, None)
        self._recovering.discard(name)
        self._failing.pop(name, None)
        self._failures.pop(name, None)
        self.backing_off.pop(name, None)
        self._pending_events.pop(name, None)
        self._event_backoff.pop(name, None)
        self._wake.pop(name, None)
        self.awaiting_leader.discard(name)
        self._broken.pop(name, None)
        self._announced.pop(name, None)
        self._node_window.pop(name, None)
        self._written.pop(name, None)
        self._yielding.pop(name, None)
        self._conflict_event_at.pop(name, None)
        self._uids.pop(name, None)

    def _event(self, cr: Obj, old: Obj, new: Obj) -> None:
        spec = status.phase_event(old, new)
        if spec is None:
            return
        etype, reason, message = spec
        self._record(cr, etype, reason, message)

    def _record(self, cr: Obj, etype: str, reason: str, message: str) -> None:
        event = build_event(cr, self.event_namespace, etype, reason, message, self.now())
        self._create_event(event)

    def _create_event(self, event: Obj, attempts: int = 0, since: float | None = None) -> None:
        """One attempt, unless the CR's Events are backing off; after a transient error the
        Event waits (``_pending_events``, at most ``MAX_PENDING_EVENTS`` per CR) for the CR's
        first reconcile after a growing delay (``retry_backoff``, per CR), and is given up
        ``EVENT_GIVE_UP_SECONDS`` after it was first held back. No sleep holds up the main
        loop, and a 500 storm is met with one attempt per delay, not one per reconcile."""
        name = str(event["involvedObject"]["name"])
        pending = self._pending_events.setdefault(name, [])
        failures, due = self._event_backoff.get(name, (0, 0.0))
        now = self.monotonic()
        # Each entry goes to the tail, so the queue stays oldest first: a new Event is the
        # newest; a retried one comes from ``_flush_events``, which emptied the queue and
        # retries it oldest first, so whatever is queued again already is older. (Put at the
        # head, two Events refused again in one flush with no delay went back newest first.)
        since = now if since is None else since
        if now < due:
            self._enqueue(name, pending, [event, attempts, since])
            self._wake_at(name, min(due, since + EVENT_GIVE_UP_SECONDS))
            return
        try:
            if not self.is_leader():
                raise NotLeading("leadership lost")
            self.api.create_event(self.event_namespace, event)
            self.metrics.events.inc()
            self._event_backoff.pop(name, None)
        except Exception as exc:  # an Event is a courtesy; the status is already written
            attempts += 1
            if is_transient(exc) and self.monotonic() - since < EVENT_GIVE_UP_SECONDS:
                delay = self.retry_backoff.wait_for(min(failures, 10), exc)
                due = self.monotonic() + delay
                self._event_backoff[name] = (failures + 1, due)
                if self._enqueue(name, pending, [event, attempts, since]):
                    self._wake_at(name, min(due, since + EVENT_GIVE_UP_SECONDS))
                    log.info(
                        "event %s on %s not created yet (attempt %d): %s; trying again in "
                        "%.1f s",
                        event["reason"],
                        name,
                        attempts,
                        describe_error(exc),
                        delay,
                    )
                return  # queued, or its drop logged
            log.warning(
                "event %s on %s not created: %s%s",
                event["reason"],
                name,
                describe_error(exc),
                f" (given up after {attempts} attempts)" if attempts > 1 else "",
            )
        finally:
            if not pending:
                self._pending_events.pop(name, None)

    def _flush_events(self, name: str) -> None:
        """Try the CR's pending Events again, oldest first, once their delay is over; the
        first that fails again puts the rest back behind it. Those held back for
        ``EVENT_GIVE_UP_SECONDS`` are given up first, with one warning for all of them."""
        pending = self._pending_events.pop(name, [])
        now = self.monotonic()
        expired = [e for e in pending if now - e[2] >= EVENT_GIVE_UP_SECONDS]
        if expired:
            log.warning(
                "%d event(s) on %s given up, %.0f s after they were first refused: %s",
                len(expired),
                name,
                EVENT_GIVE_UP_SECONDS,
                ", ".join(sorted({str(e[0]["reason"]) for e in expired})),
            )
            pending = [e for e in pending if e not in expired]
            if not pending:
                self._event_backoff.pop(name, None)
        for i, (event, attempts, since) in enumerate(pending):
            self._create_event(event, attempts, since)
            if name in self._event_backoff and self._event_backoff[name][1] > self.monotonic():
                queued = self._pending_events.setdefault(name, [])
                for entry in pending[i + 1 :]:
                    self._enqueue(name, queued, entry)
                return

    def _enqueue(self, name: str, pending: list[list[Any]], entry: list[Any]) -> bool:
        """Queue ``entry`` at the tail (the queue is oldest first: see ``_create_event``);
        a full queue drops its oldest node Event, or else its oldest Event, to make room, so
        that a phase or StatusWriteConflict Event never waits behind node Events it lost to.
        Every drop is logged. False when ``entry`` itself was dropped."""
        pending.append(entry)
        if len(pending) <= MAX_PENDING_EVENTS:
            return True
        victim = next(
            (e for e in pending if e[0]["reason"] in NODE_EVENT_REASONS), pending[0]
        )
        pending.remove(victim)
        log.warning(
            "event %s on %s dropped: %d Events of this CR wait already (the API server "
            "refuses Events): %s",
            victim[0]["reason"],
            name,
            MAX_PENDING_EVENTS,
            victim[0]["message"],
        )
        return victim is not entry
