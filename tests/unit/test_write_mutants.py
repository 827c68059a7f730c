"""The reporter's write decisions (:mod:`reporter.write`) that mutation testing found open:
the Event's exact shape, what the significant key is made of, the merge patch's corner cases,
where the snapshot is read, re-reads after conflicts, the per-CR bookkeeping, and the log lines
an operator reads when a status is (not) written.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_reporter_write import NAME, NOW, FakeCache, FakeStatusApi, setup

from reporter import write
from reporter.write import build_event, build_observed, merge_patch, significant_key

CR = {
    "metadata": {"name": NAME, "uid": "u1", "resourceVersion": "3"},
    "spec": {"namespace": "drv"},
}


# --------------------------------------------------------------------------- build_event


def test_an_event_is_a_complete_core_v1_event_about_the_cr() -> None:
    event = build_event(CR, "pmem-csi", "Warning", "Failed", "it broke", NOW)
    name = event["metadata"].pop("name")
    prefix, _, suffix = name.rpartition(".")
    assert prefix == NAME and int(suffix, 16) > 0  # client-go style: <object>.<hex time>
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": "pmem-csi"},
        "involvedObject": {
            "apiVersion": "pmem-csi.intel.com/v1beta1",
            "kind": "Deployment",
            "name": NAME,
            "uid": "u1",
            "resourceVersion": "3",
        },
        "reason": "Failed",
        "message": "it broke",
        "type": "Warning",
        "source": {"component": "pmem-csi-reporter"},
        "reportingComponent": "pmem-csi-reporter",
        "firstTimestamp": "2030-01-01T00:00:00Z",
        "lastTimestamp": "2030-01-01T00:00:00Z",
        "count": 1,
    }


def test_an_event_message_is_cut_at_1024_characters() -> None:
    event = build_event(CR, "ns", "Normal", "Running", "x" * 1023 + "yz", NOW)
    assert event["message"] == "x" * 1023 + "y"


# --------------------------------------------------------------------------- significant_key

BASE = {
    "phase": "Running",
    "observedGeneration": 1,
    "conditions": [
        {"type": "A", "status": "True", "reason": "R", "observedGeneration": 1, "message": "m"}
    ],
}


@pytest.mark.parametrize(
    "change",
    [
        {"observedGeneration": 2},
        {"conditions": [{**BASE["conditions"][0], "type": "B"}]},
        {"conditions": [{**BASE["conditions"][0], "reason": "Other"}]},
        {"conditions": [{**BASE["conditions"][0], "observedGeneration": 2}]},
    ],
    ids=["generation", "condition-type", "condition-reason", "condition-generation"],
)
def test_each_part_of_the_significant_key_counts(change: dict[str, Any]) -> None:
    assert significant_key({**BASE, **change}) != significant_key(BASE)


def test_the_significant_key_ignores_condition_order_and_messages() -> None:
    two = [{"type": "A", "status": "True"}, {"type": "B", "status": "False", "message": "x"}]
    swapped = [{"type": "B", "status": "False", "message": "y"}, {"type": "A", "status": "True"}]
    assert significant_key({"conditions": two}) == significant_key({"conditions": swapped})
    assert significant_key(None) == significant_key({})


# --------------------------------------------------------------------------- merge_patch


def test_merge_patch_corner_cases() -> None:
    assert merge_patch({"a": 1}, "new") == "new"  # not a mapping any more: replaced whole
    assert merge_patch("old", {"a": 1}) == {"a": 1}
    assert merge_patch({"a": 1}, {"a": {}}) == {"a": {}}  # a scalar becomes an empty mapping
    assert merge_patch({}, {"a": None}) == {"a": None}  # a new key, even a null one
    assert merge_patch({"a": {"b": 1}}, {"a": {"b": 1}}) == {}  # equal sub-mapping: no entry


# --------------------------------------------------------------------------- build_observed


class RecordingCache(FakeCache):
    """Records the namespaces asked for; serves pods owned by look-alikes."""

    def __init__(self, cr: dict[str, Any]) -> None:
        super().__init__(cr)
        self.namespaces: set[str | None] = set()

    def find(self, kind: str, name: str, namespace: str | None) -> Any:
        self.namespaces.add(namespace)
        return None

    def pods(self, namespace: str | None) -> list[dict[str, Any]]:
        self.namespaces.add(namespace)

        def pod(name: str, kind: str, owner: str) -> dict[str, Any]:
            refs = [{"kind": kind, "name": owner}]
            return {"metadata": {"name": name, "ownerReferences": refs}}

        return [
            pod("other-ds", "DaemonSet", "someone-elses-node"),
            pod("wrong-kind", "StatefulSet", "pmem-csi-intel-com-node"),
            pod("node", "DaemonSet", "pmem-csi-intel-com-node"),
        ]

    def unreadable_for(self, cr: Any) -> dict[str, str]:
        return {"Secret": "forbidden"}


def test_build_observed_reads_the_crs_namespace_and_matches_owner_kind_and_name() -> None:
    cache = RecordingCache(CR)
    observed = build_observed(cache, CR)
    assert cache.namespaces == {"drv"}
    assert [p["metadata"]["name"] for p in observed.node_pods] == ["node"]
    assert observed.controller_pods == []
    assert observed.unreadable == {"Secret": "forbidden"}


class RelabelledCache(RecordingCache):
    """One expected object is missing under its labels but found by name: relabelled."""

    def lookup_labels(self, kind: str, name: str, namespace: str | None) -> Any:
        self.namespaces.add(namespace)
        return {"app": "someone-elses"} if (kind, name) == ("DaemonSet", NODE_DS) else None


NODE_DS = "pmem-csi-intel-com-node"


def test_build_observed_asks_for_the_labels_of_each_missing_object_by_its_name() -> None:
    cache = RelabelledCache(CR)
    observed = build_observed(cache, CR)
    assert cache.namespaces == {"drv"}
    assert observed.relabelled == {("DaemonSet", NODE_DS): {"app": "someone-elses"}}


# --------------------------------------------------------------------------- KubeStatusApi


def test_the_status_api_reads_the_cr_by_name_and_writes_as_the_reporter() -> None:
    calls: list[tuple[Any, ...]] = []

    class Raw:
        def get(self, *args: Any) -> dict[str, Any]:
            calls.append(("get", *args))
            return {"kind": "PmemCSIDeployment"}

        def merge_patch_status(self, *args: Any) -> dict[str, Any]:
            calls.append(("patch", *args))
            return {}

        def create(self, *args: Any) -> dict[str, Any]:
            calls.append(("create", *args))
            return {}

    api = write.KubeStatusApi(Raw())  # type: ignore[arg-type]
    assert api.get_cr(NAME) == {"kind": "PmemCSIDeployment"}
    api.patch_status(NAME, {"status": {}})
    api.create_event("ns", {"kind": "Event"})
    assert calls == [
        ("get", write.CR_RESOURCE, NAME),
        ("patch", write.CR_RESOURCE, NAME, {"status": {}}, "pmem-csi-reporter"),
        ("create", write.EVENTS, {"kind": "Event"}, "ns"),
    ]


# --------------------------------------------------------------------------- reconcile


def test_a_deleted_cr_forgets_its_bookkeeping() -> None:
    cache, _api, writer, _ = setup()
    assert writer.reconcile(NAME)
    writer.deferred[NAME] = 99.0
    writer._recovering.add(NAME)
    del cache.crs[NAME]
    assert not writer.reconcile(NAME)
    assert NAME not in writer.deferred
    assert NAME not in writer._tokens
    assert NAME not in writer._recovering


def test_caches_not_listed_yet_are_asked_for_that_cr() -> None:
    cache, api, writer, _ = setup()
    asked: list[Any] = []
    cache.synced = False
    cache.ensure_for = asked.append  # type: ignore[method-assign]
    assert not writer.reconcile(NAME)
    assert asked == [cache.crs[NAME]]
    assert api.patches == []


def test_a_status_already_up_to_date_clears_a_deferred_write() -> None:
    _cache, _api, writer, _ = setup()
    assert writer.reconcile(NAME)
    writer.deferred[NAME] = 99.0
    assert not writer.reconcile(NAME)
    assert writer.deferred == {}


def test_a_write_clears_a_deferred_write() -> None:
    _cache, _api, writer, _ = setup()
    writer.deferred[NAME] = 99.0
    assert writer.reconcile(NAME)
    assert writer.deferred == {}


class MovingApi(FakeStatusApi):
    """A conflict, then a transient error: the CR read after the conflict stays the base."""

    def get_cr(self, name: str) -> dict[str, Any] | None:
        self.gets += 1
        cr = self.cache.crs[name]
        fresh = {**cr, "metadata": {**cr["metadata"], "resourceVersion": "5"}}
        self.cache.crs[name] = fresh
        return fresh


def test_after_a_conflict_the_fresh_cr_is_read_once_and_used_for_every_retry() -> None:
    cache, _, writer, sleeps = setup()
    api = MovingApi(cache, [ApiException(status=409), ApiException(status=503)])
    writer.api = api
    assert not writer.reconcile(NAME)  # 409: read again; 503: backing off
    due = writer.deferred[NAME]
    writer.monotonic = lambda: due
    assert writer.reconcile(NAME)
    assert api.gets == 1
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["5"]
    assert sleeps == []


def test_a_transient_error_alone_does_not_read_the_cr_again() -> None:
    _, api, writer, _ = setup(failures=[ApiException(status=503)])
    assert not writer.reconcile(NAME)
    due = writer.deferred[NAME]
    writer.monotonic = lambda: due
    assert writer.reconcile(NAME)
    assert api.gets == 0


def test_the_write_latency_starts_at_the_change() -> None:
    _, _api, writer, _ = setup()
    assert writer.reconcile(NAME, changed_at=12.5)  # the writer's clock says 12.5 too
    assert writer.metrics.change_to_write._sum.get() == 0.0


def test_a_written_status_is_logged_with_both_phases(caplog: pytest.LogCaptureFixture) -> None:
    _, _api, writer, _ = setup()
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert writer.reconcile(NAME)
    assert f"{NAME}: status written: phase '' -> 'Failed'" in caplog.messages


def test_a_status_not_written_is_logged_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, _api, writer, _ = setup()
    calls = iter([True, False])  # leading when the reconcile starts, not at the write
    writer.is_leader = lambda: next(calls)
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert not writer.reconcile(NAME)
    assert (
        f"{NAME}: status not written: leadership lost; written once leading again"
        in caplog.messages
    )


def test_a_cr_deleted_while_writing_is_logged_as_such(caplog: pytest.LogCaptureFixture) -> None:
    _, _api, writer, sleeps = setup(failures=[ApiException(status=404)])
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert not writer.reconcile(NAME)
    assert f"{NAME}: status not written: CR deleted" in caplog.messages
    assert sleeps == [] and writer.metrics.status_write_errors._value.get() == 0


def test_a_cr_gone_at_the_reread_is_logged_as_deleted(caplog: pytest.LogCaptureFixture) -> None:
    _cache, api, writer, _ = setup(failures=[ApiException(status=409)])

    def gone(name: str) -> None:
        api.gets += 1
        return None

    api.get_cr = gone  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert not writer.reconcile(NAME)
    assert f"{NAME}: status not written: CR deleted" in caplog.messages
    assert api.gets == 1


def test_a_failed_write_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    _, _api, writer, _ = setup(failures=[ApiException(status=422, reason="Unprocessable")])
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert not writer.reconcile(NAME)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith(f"{NAME}: writing status failed (1 time(s) in a row): ")
    assert "422" in record.getMessage()


def test_an_event_that_cannot_be_created_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    _, api, writer, _ = setup()

    def refuse(namespace: str, event: dict[str, Any]) -> None:
        raise ApiException(status=403, reason="Forbidden")

    api.create_event = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert writer.reconcile(NAME)  # the status is written all the same
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage().startswith(f"event Failed on {NAME} not created: ")
    assert "403" in record.getMessage()
    assert writer.metrics.events._value.get() == 0


def test_no_event_after_leadership_is_lost_between_write_and_event() -> None:
    _, api, writer, _ = setup()
    calls = iter([True, True, False])
    writer.is_leader = lambda: next(calls, False)
    assert writer.reconcile(NAME)
    assert len(api.patches) == 1 and api.events == []


def test_recovery_is_tracked_only_when_the_new_phase_leaves_failed() -> None:
    _, _api, writer, _ = setup()
    writer._track_recovery(NAME, {"phase": "Failed"}, {"phase": "Failed"})
    assert NAME not in writer._recovering
    writer._track_recovery(NAME, {"phase": "Failed"}, {"phase": "Progressing"})
    assert NAME in writer._recovering
    writer._track_recovery(NAME, {"phase": "Progressing"}, {"phase": "Running"})
    assert NAME not in writer._recovering


def test_the_writer_passes_its_progress_deadline_to_the_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []

    def compute(observed: Any, now: datetime, progress_deadline: Any = None) -> dict[str, Any]:
        seen.append(progress_deadline)
        return {"phase": "Running", "conditions": []}

    monkeypatch.setattr("reporter.write.status.compute_status", compute)
    _, _api, writer, _ = setup()
    writer.progress_deadline = timedelta(seconds=42)
    assert writer.reconcile(NAME)
    assert seen == [timedelta(seconds=42)]


# --------------------------------------------------------------------------- second round


def test_the_crs_namespace_defaults_to_the_drivers_default() -> None:
    from reporter import model

    assert write.cr_namespace({"spec": {"namespace": "drv"}}) == "drv"
    assert write.cr_namespace({"spec": {}}) == model.DEFAULT_NAMESPACE
    assert write.cr_namespace({}) == model.DEFAULT_NAMESPACE


def test_a_steady_state_is_no_error() -> None:
    _, _api, writer, _ = setup()
    assert writer.reconcile(NAME)
    assert not writer.reconcile(NAME)  # nothing deferred, nothing to write
    assert writer.metrics.status_write_errors._value.get() == 0


def test_a_later_write_patches_only_what_changed() -> None:
    cache, api, writer, _ = setup()
    assert writer.reconcile(NAME)
    cr = cache.crs[NAME]
    cache.crs[NAME] = {**cr, "metadata": {**cr["metadata"], "generation": 2}}
    assert writer.reconcile(NAME)
    second = api.patches[1]["status"]
    assert second["observedGeneration"] == 2
    assert "phase" not in second  # still Failed: not sent again


def test_a_written_status_without_metadata_is_not_remembered() -> None:
    cache, api, writer, _ = setup()
    remembered: list[Any] = []
    cache.remember_cr = remembered.append  # type: ignore[method-assign]
    api.patch_status = lambda name, patch: {}  # type: ignore[method-assign,assignment]
    assert writer.reconcile(NAME)
    assert remembered == []


def test_a_written_status_that_is_not_an_object_still_gets_its_event() -> None:
    _cache, api, writer, _ = setup()
    api.patch_status = lambda name, patch: None  # type: ignore[method-assign,assignment]
    assert writer.reconcile(NAME)
    ((_, event),) = api.events  # about the CR as the writer read it
    assert event["involvedObject"]["name"] == NAME
    assert event["involvedObject"]["resourceVersion"] == "1"
    assert event["metadata"]["namespace"] == "pmem-csi"


def test_the_log_names_the_phase_it_left(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from test_reporter_write import Phases

    _, _api, writer, _ = setup()
    phases = Phases(monkeypatch)
    phases.set("Failed")
    assert writer.reconcile(NAME)
    phases.set("Running")
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert writer.reconcile(NAME)
    assert f"{NAME}: status written: phase 'Failed' -> 'Running'" in caplog.messages


def test_a_new_failure_reason_is_written_without_a_second_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from test_reporter_write import Phases

    _, api, writer, _ = setup()
    phases = Phases(monkeypatch)
    phases.set("Failed")
    assert writer.reconcile(NAME)
    phases.set("Failed")  # another reason, same phase
    writer.monotonic = lambda: 1000.0  # a token is back
    assert writer.reconcile(NAME)
    assert len(api.patches) == 2
    assert [e["reason"] for _, e in api.events] == ["Failed"]


def test_an_event_is_retried_after_a_transient_error() -> None:
    _, api, writer, sleeps = setup()
    original = api.create_event
    failures = [ApiException(status=503)]

    def flaky(namespace: str, event: dict[str, Any]) -> Any:
        if failures:
            raise failures.pop()
        return original(namespace, event)

    api.create_event = flaky  # type: ignore[method-assign]
    assert writer.reconcile(NAME)
    assert api.events == [] and NAME in writer.deferred  # not slept for: tried again soon
    due = writer.deferred[NAME]
    writer.monotonic = lambda: due
    assert not writer.reconcile(NAME)  # nothing new to write; the Event goes out
    assert len(api.events) == 1 and sleeps == []
    assert writer.metrics.events._value.get() == 1


def test_an_event_after_lost_leadership_is_logged_as_not_created(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, api, writer, _ = setup()
    calls = iter([True, True, False])
    writer.is_leader = lambda: next(calls, False)
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert writer.reconcile(NAME)
    assert api.events == []
    assert f"event Failed on {NAME} not created: NotLeading: leadership lost" in caplog.messages


def test_an_error_without_an_http_status_is_logged_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, _api, writer, sleeps = setup(failures=[ValueError("bad object")])
    with caplog.at_level(logging.INFO, logger=write.log.name):
        assert not writer.reconcile(NAME)
    failed = f"{NAME}: writing status failed (1 time(s) in a row): ValueError: bad object; "
    assert any(m.startswith(failed) for m in caplog.messages), caplog.messages
    assert sleeps == []  # not retried


# --------------------------------------------------------------------------- write conflicts


def _other_writer_replaces_status(cache: FakeCache, phase: str) -> str:
    """Another reporter writes the CR's status; returns the resourceVersion it left."""
    cr = cache.crs[NAME]
    rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
    status = {**(cr.get("status") or {}), "phase": phase, "message": f"theirs: {phase}"}
    cache.crs[NAME] = {**cr, "metadata": {**cr["metadata"], "resourceVersion": rv},
                       "status": status}
    return rv


def test_the_conflict_event_and_log_name_the_cr_the_other_phase_and_its_resource_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An administrator finds the second writer from this text: which CR, what the other
    wrote, at which resourceVersion, and how long this reporter stays quiet."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    rv = _other_writer_replaces_status(cache, "Progressing")
    clock[0] += 1
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        assert not writer.reconcile(NAME)
    text = (
        f"the status of {NAME} was replaced by another writer (phase 'Progressing' at "
        f"resourceVersion {rv}): another stack's reporter, or a per-deployment reporter of the "
        "layout before, serves this CR too; this reporter writes it again only after 60 s "
        "without such changes"
    )
    assert caplog.messages == [f"{NAME}: {text}"]
    (event,) = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    assert event["type"] == "Warning"
    assert event["message"] == text[0].upper() + text[1:]


def test_a_lasting_conflict_is_evented_again_exactly_when_the_event_interval_has_passed() -> None:
    """A write war that goes on is shown again as soon as the interval is up, not one
    conflict later: the interval documented for the Event is the one kept."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    clock[0] += 1
    _other_writer_replaces_status(cache, "Progressing")
    writer.reconcile(NAME)  # the first conflict: its Event
    clock[0] += write.CONFLICT_EVENT_SECONDS
    _other_writer_replaces_status(cache, "Running")  # still at it, exactly 600 s later
    writer.reconcile(NAME)
    conflicts = [e for _, e in api.events if e["reason"] == "StatusWriteConflict"]
    assert len(conflicts) == 2
    assert "is still being replaced" in conflicts[1]["message"]


def test_while_yielding_the_writer_asks_to_be_woken_when_the_quiet_period_ends() -> None:
    """Without a wake-up at the end of the quiet period, the reporter's own status would
    only come back at the next resync or change, leaving the other writer's in place."""
    cache, _api, writer, _ = setup()
    writer.conflict_quiet = 30.0
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    clock[0] = 110.0
    _other_writer_replaces_status(cache, "Progressing")
    assert not writer.reconcile(NAME)
    assert writer.deferred[NAME] == 140.0  # 30 s after the replacement was seen
    clock[0] = 120.0
    _other_writer_replaces_status(cache, "Running")  # still writing: the period restarts
    assert not writer.reconcile(NAME)
    assert writer.deferred[NAME] == 150.0
    clock[0] = 130.0  # quiet since: still yielding, the wake-up stays where it was
    assert not writer.reconcile(NAME)
    assert writer.deferred[NAME] == 150.0


def test_the_quiet_period_ends_exactly_at_its_configured_length() -> None:
    """At the end of the quiet period the reporter writes again; a status left as the
    other writer left it is not waited on for one more round."""
    cache, api, writer, _ = setup()
    writer.conflict_quiet = 30.0
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    written = len(api.patches)
    _other_writer_replaces_status(cache, "Progressing")
    assert not writer.reconcile(NAME)
    clock[0] = 130.0
    assert writer.reconcile(NAME)
    assert len(api.patches) == written + 1


def test_losing_leadership_logs_how_many_held_back_events_it_drops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An Event that was never created leaves a trace in the log when leadership moves."""
    _, api, writer, _ = setup()

    def unavailable(namespace: str, event: dict[str, Any]) -> Any:
        raise ApiException(status=503)

    api.create_event = unavailable  # type: ignore[method-assign]
    assert writer.reconcile(NAME)
    assert sum(len(p) for p in writer._pending_events.values()) == 1
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer.not_leading()
    assert "1 held back event(s) dropped: not leading" in caplog.messages
    assert writer._pending_events == {}
