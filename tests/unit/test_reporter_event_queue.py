"""Events held back after a transient error (review of issue 16): what one reconcile records
is never dropped silently, phase Events are never dropped for node Events, the wait has an
end, and losing leadership drops them."""

from __future__ import annotations

import logging
import random

from kubernetes.client.exceptions import ApiException
from test_reporter_write import NAME, FakeStatusApi, setup

from reporter import write
from reporter.retry import Backoff


def _flaky_events(api: FakeStatusApi, failures: list[int], clock: list[float]) -> list[float]:
    """Refuse the next ``failures[0]`` Events with a 500 (for ever if negative)."""
    attempts: list[float] = []
    create = FakeStatusApi.create_event

    def create_event(namespace, event):
        attempts.append(clock[0])
        if failures[0]:
            failures[0] -= 1
            raise ApiException(status=500, reason="Internal Server Error")
        return create(api, namespace, event)

    api.create_event = create_event  # type: ignore[method-assign]
    return attempts


def _run_main_loop(writer, clock: list[float], until: float) -> None:
    """Come back for the CR whenever the writer asks (``deferred``), as the main loop does."""
    while NAME in writer.deferred and clock[0] < until:
        clock[0] = max(clock[0], writer.deferred.pop(NAME))
        writer.reconcile(NAME)


def _fail_with_broken_nodes(writer) -> None:
    """The reconcile that turns Failed also names MAX_NODE_EVENTS broken pods and a summary."""
    fired = [False]

    def node_events(name, cr, observed):
        if fired[0]:
            return
        fired[0] = True
        for i in range(write.MAX_NODE_EVENTS):
            writer._record(cr, "Warning", "NodeDriverNotReady", f"Node driver pod node-{i}")
        writer._record(cr, "Warning", "NodeDriversNotReady", "and 2 more node driver pod(s)")

    writer._node_events = node_events


def test_one_500_on_the_first_node_event_loses_neither_the_summary_nor_the_phase_event():
    """One 500 on the first of 10 node Events put the CR's Events in backoff; the summary and
    the phase ``Failed`` Event found 10 waiting and were dropped without a word."""
    _cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    writer.retry_backoff = Backoff(base=0.2, cap=30.0, max_attempts=0, rng=random.Random(1))
    _flaky_events(api, [1], clock)
    _fail_with_broken_nodes(writer)
    assert writer.reconcile(NAME)
    _run_main_loop(writer, clock, 600)
    reasons = [e["reason"] for _, e in api.events]
    assert reasons.count("NodeDriverNotReady") == write.MAX_NODE_EVENTS
    assert "NodeDriversNotReady" in reasons
    assert "Failed" in reasons


def test_a_full_queue_evicts_the_oldest_node_event_not_a_phase_event_and_logs_it(caplog):
    """Under a lasting 500 storm more Events than the queue holds: a node Event makes room,
    the phase Event stays, and each drop is logged."""
    cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    _flaky_events(api, [-1], clock)
    cr = cache.crs[NAME]
    caplog.set_level(logging.INFO, logger="reporter.write")
    writer._record(cr, "Warning", "Failed", "phase")
    for i in range(write.MAX_PENDING_EVENTS + 2):
        writer._record(cr, "Warning", "NodeDriverNotReady", f"Node driver pod node-{i}")
    queued = [e["message"] for e, *_ in writer._pending_events[NAME]]
    assert len(queued) == write.MAX_PENDING_EVENTS
    assert "phase" in queued
    assert "Node driver pod node-0" not in queued  # the oldest node Event made room
    assert f"Node driver pod node-{write.MAX_PENDING_EVENTS + 1}" in queued
    drops = [r for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.message]
    assert len(drops) == 3, [r.message for r in caplog.records]



def test_under_a_lasting_500_storm_held_back_events_are_given_up_after_a_minute(caplog):
    """Each Event had its own MAX_EVENT_ATTEMPTS, one after another (FIFO per CR): a dozen
    Events under a lasting 500 storm were tried for about half an hour. Now they are all given
    up ``EVENT_GIVE_UP_SECONDS`` after they were first held back, with one warning."""
    _cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    writer.retry_backoff = Backoff(base=0.2, cap=30.0, max_attempts=0, rng=random.Random(1))
    attempts = _flaky_events(api, [-1], clock)
    _fail_with_broken_nodes(writer)
    caplog.set_level(logging.WARNING, logger="reporter.write")
    assert writer.reconcile(NAME)
    _run_main_loop(writer, clock, 3600)
    assert writer._pending_events.get(NAME) in (None, [])
    assert max(attempts) <= write.EVENT_GIVE_UP_SECONDS, attempts
    given_up = [r for r in caplog.records if "given up" in r.message]
    assert len(given_up) == 1, [r.message for r in caplog.records]


def test_events_held_back_are_dropped_when_leadership_is_lost():
    """``not_leading`` kept the pending Events and their backoff: a ``Failed`` Event refused
    just before leadership moved was created hours later, once this replica led again (the
    status may have changed many times meanwhile)."""
    _cache, api, writer, _ = setup()
    clock = [0.0]
    leader = [True]
    writer.monotonic = lambda: clock[0]
    writer.is_leader = lambda: leader[0]
    _flaky_events(api, [1], clock)
    assert writer.reconcile(NAME)  # Failed written, its Event refused
    assert writer._pending_events.get(NAME)
    leader[0] = False
    clock[0] = 30.0
    writer.reconcile(NAME)
    assert writer._pending_events.get(NAME) in (None, [])
    assert NAME not in writer._event_backoff
    leader[0] = True
    clock[0] = 7200.0
    writer.reconcile(NAME)  # nothing changed meanwhile: nothing to write, no stale Event
    assert api.events == []
