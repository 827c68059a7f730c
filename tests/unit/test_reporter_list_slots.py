"""The reporter's lists wait for a slot: a bounded number in flight, however many informers.

Why: the benchmark of issue 16 at 100 deployments in 100 namespaces (804 informers) on the
loaded 2-core machine: the informers' first lists went out together, the API server answered
none within the list timeout, and they failed and went out together again, for more than 8
minutes without a status (BENCHMARKS.md section 6).
"""

from __future__ import annotations

import threading

from reporter.metrics import Metrics
from reporter.observe import LIST_CONCURRENCY, POD, Informer

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
