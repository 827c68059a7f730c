"""Another writer of a CR's status this reporter serves (review of issue 16).

A second stack's reporter naming the same CR, or a per-deployment reporter of the layout
before, left running: each recomputes when it sees the other's write, and writes back. It was
silent (no log, metric or Event) and unbounded. Now the reporter that sees its status
replaced by someone else's says so (Warning log, ``pmem_csi_reporter_status_conflicts``, a
Warning Event ``StatusWriteConflict`` at most once per ``CONFLICT_EVENT_SECONDS``) and yields:
it does not write the CR again until the other writer has been quiet that long.
"""

from __future__ import annotations

import logging

from test_reporter_write import NAME, setup

from reporter import write
from reporter.write import CONFLICT_QUIET_SECONDS


def other_reporter_writes(cache, phase: str) -> None:
    cr = cache.crs[NAME]
    rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
    status = {**(cr.get("status") or {}), "phase": phase, "message": f"theirs: {phase}"}
    cache.crs[NAME] = {
        **cr,
        "metadata": {**cr["metadata"], "resourceVersion": rv},
        "status": status,
    }


def test_a_status_replaced_by_another_writer_is_reported_and_not_fought_over(caplog):
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)  # ours
    written = len(api.patches)
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        for i in range(100):  # the other one rewrites it every 2 s
            clock[0] += 2
            other_reporter_writes(cache, "Running" if i % 2 else "Progressing")
            writer.reconcile(NAME)
    assert len(api.patches) == written, "a write war"
    assert writer.metrics.status_conflicts._value.get() >= 1
    conflicts = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    assert len(conflicts) == 1 and conflicts[0]["type"] == "Warning"
    assert any("another writer" in m for m in caplog.messages), caplog.messages
    # Quiet for long enough: this reporter writes its status again (once).
    clock[0] += CONFLICT_QUIET_SECONDS + 1
    assert writer.reconcile(NAME)
    assert len(api.patches) == written + 1


def test_a_spec_change_is_no_conflict():
    cache, api, writer, _ = setup()
    assert writer.reconcile(NAME)
    cr = cache.crs[NAME]
    rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
    cache.crs[NAME] = {
        **cr,
        "metadata": {**cr["metadata"], "resourceVersion": rv, "generation": 2},
    }
    writer.reconcile(NAME)
    assert writer.metrics.status_conflicts._value.get() == 0
    assert [e for _, e in api.events if e["reason"] == "StatusWriteConflict"] == []


def test_the_other_replicas_writes_after_a_leadership_change_are_no_conflict():
    cache, _api, writer, _ = setup()
    assert writer.reconcile(NAME)
    writer.is_leader = lambda: False
    assert not writer.reconcile(NAME)  # the other replica leads now, and writes
    other_reporter_writes(cache, "Running")
    writer.is_leader = lambda: True  # back
    writer.reconcile(NAME)
    assert writer.metrics.status_conflicts._value.get() == 0


def test_a_foreign_status_without_timestamps_is_yielded_to_for_the_quiet_period_only():
    """Review: an admin's `kubectl edit --subresource=status` that drops a condition's
    lastTransitionTime, once: the reporter yields for the quiet period, then writes again
    (the comparison "still writing?" must be true for an unchanged status)."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    written = len(api.patches)
    cr = cache.crs[NAME]
    rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
    status = {
        "phase": "Failed",
        "lastUpdated": "2026-12-01T10:00:00Z",
        "conditions": [{"type": "DriverDeployed", "status": "False", "reason": "ByHand"}],
    }
    cache.crs[NAME] = {
        **cr,
        "metadata": {**cr["metadata"], "resourceVersion": rv},
        "status": status,
    }
    for _ in range(20):  # resyncs every 10 s: 200 s, nobody writes after the admin
        clock[0] += 10
        writer.reconcile(NAME)
    assert len(api.patches) == written + 1, "still yielding to a writer that went quiet"


class _LostReplyApi:
    """The API server applies the patch, the reply is lost (a timeout)."""

    def __init__(self, api) -> None:
        self.api = api
        self.lose = False

    def __getattr__(self, name):
        return getattr(self.api, name)

    def patch_status(self, name, patch):
        result = self.api.patch_status(name, patch)
        if self.lose:
            self.lose = False
            self.api.cache.crs[name] = result  # the informer sees it
            raise TimeoutError("read timed out")
        return result


def test_its_own_write_whose_reply_was_lost_is_no_conflict():
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    cache.crs[NAME] = {**cache.crs[NAME], **api.cache.crs[NAME]}
    lossy = _LostReplyApi(api)
    writer.api = lossy
    # A change to write: the CR's generation moves; the write lands, the reply is lost.
    cr = cache.crs[NAME]
    cache.crs[NAME] = {**cr, "metadata": {**cr["metadata"], "generation": 2}}
    lossy.lose = True
    assert not writer.reconcile(NAME)
    clock[0] += 60
    writer.reconcile(NAME)
    assert writer.metrics.status_conflicts._value.get() == 0
    assert [e for _, e in api.events if e["reason"] == "StatusWriteConflict"] == []


def test_the_conflict_event_repeats_at_a_bounded_rate_while_the_other_writer_goes_on():
    """Review of issue 16: the StatusWriteConflict Event was sent once and never again while
    the reporter yielded; after an hour (the Event's TTL) nothing showed the write war.
    Now it is repeated once per ``CONFLICT_EVENT_SECONDS`` while the other writer keeps
    writing, and each repeat is counted in the metric."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    minutes = 70
    for i in range(minutes * 30):  # the other one rewrites it every 2 s for 70 minutes
        clock[0] += 2
        other_reporter_writes(cache, "Running" if i % 2 else "Progressing")
        writer.reconcile(NAME)
    conflicts = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    # The first 2 s in, then one per CONFLICT_EVENT_SECONDS: 7 in 70 minutes.
    expected = (minutes * 60 - 2) // int(write.CONFLICT_EVENT_SECONDS) + 1
    assert expected == 7
    assert len(conflicts) == expected, len(conflicts)
    assert writer.metrics.status_conflicts._value.get() == expected
    assert all(e["type"] == "Warning" for e in conflicts)


def test_each_new_conflict_is_logged_and_counted_its_event_at_most_every_ten_minutes(caplog):
    """What docs/reporter.md says (review of issue 16: it said the log and the metric repeat
    every 10 minutes, never more often): against a writer that answers each of our writes at
    once, every write replaced is a new conflict, logged and counted (about once a minute),
    while the Event is created once per ``CONFLICT_EVENT_SECONDS``."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    caplog.set_level(logging.WARNING, logger="reporter.write")
    writer.reconcile(NAME)
    other_reporter_writes(cache, "Progressing")
    for _ in range(int(write.CONFLICT_EVENT_SECONDS)):
        clock[0] += 1
        n = len(api.patches)
        writer.reconcile(NAME)
        if len(api.patches) > n:  # we wrote: the other one writes back at once
            other_reporter_writes(cache, "Progressing")
    ours = len(api.patches)
    logged = [r for r in caplog.records if "another writer" in r.message]
    events = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    assert ours > 2
    assert len(logged) == ours == writer.metrics.status_conflicts._value.get()
    assert len(events) == 1


def test_a_cr_deleted_and_created_again_under_its_name_is_no_conflict(caplog):
    """Review of issue 16: per-CR state was keyed by name, so a CR deleted and created again
    (a new uid, no status) before a reconcile saw it gone was taken for another writer's:
    a false StatusWriteConflict and 60 s without a status."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    caplog.set_level(logging.WARNING, logger="reporter.write")
    assert writer.reconcile(NAME)
    cache.crs[NAME] = {
        "metadata": {"name": NAME, "resourceVersion": "50", "generation": 1, "uid": "u2"},
        "spec": {},
    }
    clock[0] += 1
    assert writer.reconcile(NAME)  # the new CR gets its status at once
    assert writer.metrics.status_conflicts._value.get() == 0
    assert "StatusWriteConflict" not in [e["reason"] for _, e in api.events]
    assert not [r for r in caplog.records if "another writer" in r.message]


def test_the_quiet_period_is_the_one_configured():
    """``--conflict-quiet-seconds`` (``StatusWriter.conflict_quiet``): no write before it has
    passed since the other writer's last change, one write once it has."""
    cache, api, writer, _ = setup()
    writer.conflict_quiet = 5.0
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    written = len(api.patches)
    other_reporter_writes(cache, "Progressing")
    writer.reconcile(NAME)  # sees the conflict, yields
    clock[0] += 4.0
    writer.reconcile(NAME)
    assert len(api.patches) == written, "written inside the quiet period"
    clock[0] += 1.5
    assert writer.reconcile(NAME)
    assert len(api.patches) == written + 1
    conflicts = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    assert "only after 5 s without such changes" in conflicts[0]["message"], conflicts
