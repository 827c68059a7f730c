"""The reporter's main loop: which CR is reconciled when, on one thread.

The main thread only waits for dirty CRs (or the resync timer, or a deferred write falling
due) and reconciles them one at a time: a single writer means no two patches for one CR race
inside one process, and the work per change (dict lookups and a status computation over the
cached, trimmed objects; no API read) is far below what one thread can do for many CRs.

Kept apart from ``reporter.__main__`` (which wires the real API client) so that the loop's
promises can be tested with fakes and a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from reporter.model import Obj

log = logging.getLogger("reporter")

# Coalesce a burst of watch events (a rollout touches many pods) into one reconcile.
DEBOUNCE_SECONDS = 0.05
# A CR whose message-only write is pending is recomputed at most this often while events keep
# coming (a rollout over thousands of nodes): each computation walks all of its pods.
RECOMPUTE_SECONDS = 0.5
# The main loop looks at the stop flag (set by SIGTERM) at least this often.
STOP_CHECK = 1.0
# A reconcile that raised is tried again after STOP_CHECK seconds, doubling up to this: a
# bug that keeps raising must not log a traceback every second for ever.
RECONCILE_RETRY_CAP = 60.0


class DirtySource(Protocol):
    """What the loop needs from ``reporter.observe.Observer``."""

    def take_dirty(self, timeout: float | None) -> dict[str, float | None]: ...

    def mark_dirty(self, name: str, changed_at: float | None = None) -> None: ...

    def crs(self) -> list[Obj]: ...


class Writer(Protocol):
    """What the loop needs from ``reporter.write.StatusWriter``."""

    deferred: dict[str, float]
    awaiting_leader: set[str]
    backing_off: dict[str, float]

    def reconcile(self, name: str, changed_at: float | None = None) -> bool: ...

    def not_leading(self) -> None: ...


def merge_dirty(into: dict[str, float | None], more: dict[str, float | None]) -> None:
    """Union of two dirty sets, keeping each CR's earliest known change time."""
    for name, changed_at in more.items():
        known = [t for t in (into.get(name), changed_at) if t is not None]
        into[name] = min(known) if known else None


class ReconcileLoop:
    """One ``step`` = wait for work, then reconcile every CR that is due."""

    def __init__(
        self,
        observer: DirtySource,
        writer: Writer,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        resync_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.observer = observer
        self.writer = writer
        self.is_leader = is_leader
        self.stop = stop
        self.resync = max(resync_seconds, 1.0)
        self.clock = clock
        self.sleep = sleep
        self.next_resync = clock() + self.resync
        # CR -> (due, earliest change time): writes the writer put off.
        self.pending: dict[str, tuple[float, float | None]] = {}
        self.last_run: dict[str, float] = {}
        # CRs that changed while this replica was not leading: reconciled once it leads, even
        # when leadership comes back without a flip (a slow renewal only made is_leader()
        # False for a moment, so on_started_leading never fires).
        self.held: dict[str, float | None] = {}
        # The main loop's last sign of life (``Reporter.healthy``).
        self.beat = clock()
        # CR -> reconciles in a row that raised (their retry backs off).
        self.raised: dict[str, int] = {}

    def step(self) -> None:
        wake = min([self.next_resync, *(due for due, _ in self.pending.values())])
        dirty = self.observer.take_dirty(min(STOP_CHECK, max(0.0, wake - self.clock())))
        self.beat = self.clock()
        if self.stop.is_set():
            return
        now = self.clock()
        for name, (due, changed_at) in list(self.pending.items()):
            if name in dirty:
                # Fold new changes into the pending entry; look again soon, not at once.
                later = dirty.pop(name)
                known = [t for t in (changed_at, later) if t is not None]
                changed_at = min(known) if known else None
                if name not in self.writer.backing_off and name not in self.raised:
                    # A failed write's backoff is not pulled forward (review of issue 16).
                    due = min(due, self.last_run.get(name, 0.0) + RECOMPUTE_SECONDS)
                self.pending[name] = (due, changed_at)
            if due <= now:
                del self.pending[name]
                merge_dirty(dirty, {name: changed_at})
        if self.clock() >= self.next_resync:
            self.next_resync = self.clock() + self.resync
            for cr in self.observer.crs():
                name = (cr.get("metadata") or {}).get("name")
                if name:
                    dirty.setdefault(name, None)
        if not self.is_leader():
            self.writer.not_leading()  # another replica's writes are no conflict
            merge_dirty(self.held, dirty)  # non-leaders keep caches warm, and their changes
            return
        if self.held:
            # A change held longer than a resync was most likely written by the replica that
            # led meanwhile: reconciled, but not counted as this change's latency.
            now = self.clock()
            merge_dirty(
                dirty,
                {
                    name: t if t is not None and now - t <= self.resync else None
                    for name, t in self.held.items()
                },
            )
            self.held = {}
        if not dirty:
            return
        self.sleep(DEBOUNCE_SECONDS)
        merge_dirty(dirty, self.observer.take_dirty(0))
        for name, changed_at in sorted(dirty.items()):
            if self.stop.is_set():
                break
            self.last_run[name] = self.clock()
            try:
                self.writer.reconcile(name, changed_at)
                self.raised.pop(name, None)
            except Exception:
                times = self.raised.get(name, 0)
                self.raised[name] = times + 1
                delay = min(RECONCILE_RETRY_CAP, STOP_CHECK * 2 ** min(times, 10))
                log.exception(
                    "%s: reconcile failed (%d time(s) in a row); trying again in %.0f s",
                    name,
                    times + 1,
                    delay,
                )
                # Back again, with backoff: not in a hot loop, not flooding the log.
                due = self.clock() + delay
                self.writer.deferred[name] = max(self.writer.deferred.get(name, due), due)
            self.beat = self.clock()
            due = self.writer.deferred.pop(name, None)
            if due is not None:
                self.pending[name] = (due, changed_at)
            if name in self.writer.awaiting_leader:
                self.writer.awaiting_leader.discard(name)
                merge_dirty(self.held, {name: changed_at})

    def run(self) -> None:
        while not self.stop.is_set():
            self.step()
