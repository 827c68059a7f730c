"""The reporter's lists wait for a slot: a bounded number in flight, however many informers.

Why: the benchmark of issue 16 at 100 deployments in 100 namespaces (804 informers) on the
loaded 2-core machine: the informers' first lists went out together, the API server answered
none within the list timeout, and they failed and went out together again, for more than 8
minutes without a status (BENCHMARKS.md section 6).
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.observe import (
    LIST_CONCURRENCY,
    NEW_GRANT_RETRY,
    NEW_GRANT_SECONDS,
    POD,
    Informer,
)

# A hang guard only: every wait below ends as soon as the condition holds.
GUARD = 60.0


class _CountingApi:
    """Counts the lists in flight; each waits until as many are in flight as may be (the
    slots full, or every remaining list inside), so the highest count seen is the bound."""

    def __init__(self, total: int, bound: int) -> None:
        self.total, self.bound = total, bound
        self.in_flight = self.done = self.most = 0
        self.cv = threading.Condition()

    def list(self, res, namespace=None, label_selector=None, field_selector=None, transform=None):
        with self.cv:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.cv.notify_all()
            full = lambda: self.in_flight >= min(self.bound, self.total - self.done)  # noqa: E731
            assert self.cv.wait_for(full, GUARD), "the slots never filled"
            self.in_flight -= 1
            self.done += 1
            self.cv.notify_all()
        return [], "1"


def test_no_more_lists_than_the_slots_are_in_flight_at_once() -> None:
    """50 informers listing at once: at most LIST_CONCURRENCY lists reach the API server at a
    time, and every informer lists."""
    total = 50
    api = _CountingApi(total, LIST_CONCURRENCY)
    slots = threading.BoundedSemaphore(LIST_CONCURRENCY)
    informers = [
        Informer(api, POD, lambda *a: None, Metrics(), namespace=f"ns{i}", list_slots=slots)
        for i in range(total)
    ]
    threads = [threading.Thread(target=inf.relist) for inf in informers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    assert api.done == total
    assert api.most == LIST_CONCURRENCY
    assert all(inf.synced for inf in informers)


def test_a_stopped_informer_gives_up_waiting_for_a_slot() -> None:
    """An informer stopped while every slot is taken (its CR deleted) lists nothing."""
    slots = threading.BoundedSemaphore(1)
    slots.acquire()  # every slot taken

    class _NoList:
        def list(self, *a, **k):
            raise AssertionError("a stopped informer listed")

    inf = Informer(_NoList(), POD, lambda *a: None, Metrics(), namespace="ns", list_slots=slots)
    inf.stop()
    inf.relist()
    assert not inf.synced
    slots.release()
    assert slots.acquire(blocking=False)  # the slot was not kept


def test_an_informer_whose_observer_stops_gives_up_waiting_for_a_slot() -> None:
    """The Observer's stop event (given to ``run``, as at shutdown) ends a wait for a slot as
    the informer's own stop does: no list, no watch after the shutdown (review of e9b1739)."""
    slots = threading.BoundedSemaphore(1)
    slots.acquire()  # every slot taken
    stop = threading.Event()

    class _StopWhileWaiting:
        """A slot set that is full; the Observer stops while the informer waits for it."""

        calls = 0

        def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
            stop.set()
            self.calls += 1
            if self.calls > 3:  # the slot frees up: a wait that ignored the stop lists now
                slots.release()
            return slots.acquire(blocking=False)

        def release(self) -> None:
            slots.release()

    lists: list[str | None] = []

    class _RecordingApi:
        def list(self, res, namespace=None, *a, **k):
            lists.append(namespace)  # run() would swallow a raise here
            return [], "1"

        def watch(self, *a, **k):
            return iter(())

    inf = Informer(
        _RecordingApi(),
        POD,
        lambda *a: None,
        Metrics(),
        namespace="ns",
        list_slots=_StopWhileWaiting(),
    )
    inf.run(stop)
    assert lists == [] and not inf.synced


# How long every list of the informers below waits for a slot: longer than the grace.
SLOT_WAIT = NEW_GRANT_SECONDS + 5


def _new_namespace_informer_behind_busy_slots(clock: list[float], sent: list[float]) -> Informer:
    """An informer for a namespace added while running (``new_grant_seconds``) whose Role is
    not there (every list: 403, its time appended to ``sent``), each list waiting SLOT_WAIT
    of ``clock`` for a slot (all taken by other informers' lists)."""

    class BusySlots:
        def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
            clock[0] += SLOT_WAIT
            return True

        def release(self) -> None:
            pass

    class Api:
        def list(self, *a: Any, **kw: Any) -> Any:
            sent.append(clock[0])
            raise ApiException(status=403, reason="Forbidden")

        def watch(self, *a: Any, **kw: Any) -> Any:
            raise AssertionError("no watch expected")

    return Informer(
        Api(),
        POD,
        lambda *_: None,
        Metrics(),
        namespace="new-ns",
        label_selector="a=b",
        clock=lambda: clock[0],
        new_grant_seconds=NEW_GRANT_SECONDS,
        list_slots=BusySlots(),  # type: ignore[arg-type]
    )


def test_a_new_namespace_grace_is_not_spent_waiting_for_a_list_slot() -> None:
    """An informer started for a namespace added while running (new_grant_seconds) whose
    first list waits for a slot longer than NEW_GRANT_SECONDS (hundreds of lists queued when
    many deployments are added or moved at once): its first 403 -- the Role still on its way
    -- is believed at once (error set, "could not be read"), the grace never applied."""
    clock = [100.0]
    stop = threading.Event()
    inf = _new_namespace_informer_behind_busy_slots(clock, [])
    seen: list = []

    def wait(t: float) -> bool:
        seen.append((t, inf.error))
        stop.set()
        return True

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    assert seen == [(NEW_GRANT_RETRY, None)]  # retried within the grace, not reported


def test_the_new_namespace_grace_is_not_renewed_by_every_later_wait_for_a_list_slot() -> None:
    """Informer.relist: the 401/403 grace of a new namespace "is for the Role to arrive,
    counted from the first request sent". Every list waits 20 s for a slot (the slots busy
    with other informers' lists, as when many deployments are added at once) and the Role
    never comes (a real 403): the second request goes out 21 s after the first, past the 15 s
    grace, so its 403 must be believed. On main every retry's slot wait is added to
    ``_run_started`` again, so the 403 stays hidden for about 15 retries, ~5 minutes of wall
    clock here (and 15 x the slot wait in general: unbounded by NEW_GRANT_SECONDS)."""
    clock = [100.0]
    stop = threading.Event()
    sent: list[float] = []
    inf = _new_namespace_informer_behind_busy_slots(clock, sent)
    graced: list[float] = []

    def wait(t: float) -> bool:
        if inf.error is None and t == NEW_GRANT_RETRY:
            graced.append(clock[0])
        clock[0] += t
        if inf.error is not None or len(sent) > 40:
            stop.set()
        return stop.is_set()

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    assert inf.error is not None
    # Believed at the first 403 that came more than the grace after the first request.
    believed_after = sent[-1] - sent[0]
    assert believed_after <= NEW_GRANT_SECONDS + SLOT_WAIT + NEW_GRANT_RETRY, (
        len(graced),
        believed_after,
    )


def test_a_list_given_up_for_the_observers_stop_opens_no_watch() -> None:
    """Informer.run_once checks only the informer's own stop after ``relist``: when relist
    gives up waiting for a slot because the Observer's stop (``_run_stop``) is set, run_once
    goes on to ``watch_once``, whose ``assert self.resource_version is not None`` is all that
    keeps it from opening a watch without a resourceVersion (run() then swallows the
    AssertionError because it is stopped). Under ``python -O`` the watch is opened after
    the shutdown. test_reporter_list_slots.py::
    test_an_informer_whose_observer_stops_gives_up_waiting_for_a_slot passes through that
    AssertionError."""
    slots = threading.BoundedSemaphore(1)
    slots.acquire()  # every slot taken
    stop = threading.Event()
    stop.set()  # the Observer shut down
    watches: list[Any] = []

    class Api:
        def list(self, *a: Any, **kw: Any) -> Any:
            raise AssertionError("a stopped informer listed")

        def watch(self, *a: Any, **kw: Any) -> Any:
            watches.append(a)
            return iter(())

    inf = Informer(Api(), POD, lambda *_: None, Metrics(), namespace="ns", list_slots=slots)
    inf._run_stop = stop  # as run(stop) sets it
    inf.run_once()  # AssertionError on main: it went on to watch_once
    assert watches == []
