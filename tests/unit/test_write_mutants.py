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
    assert conflicts[1]["message"].startswith(
        f"The status of {NAME} is still being replaced by another writer (phase 'Running' at "
    )


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


# --------------------------------------------------------------------------- held-back Events


class Delays:
    """``retry_backoff`` without jitter: ``delay`` s each time; records the attempt numbers."""

    def __init__(self, delay: float = 1.0) -> None:
        self.delay = delay
        self.asked: list[int] = []

    def wait_for(self, attempt: int, exc: BaseException | None = None) -> float:
        self.asked.append(attempt)
        return self.delay


def _event_queue(delay: float = 1.0) -> tuple[Any, Any, Any, list[float], list[Any], Delays]:
    """A writer on a hand-driven clock whose API answers Events from ``answers`` (an exception
    is raised, anything else accepts; empty: accept), logging (time, reason) of each try."""
    cache, api, writer, _ = setup()
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    delays = writer.retry_backoff = Delays(delay)
    answers: list[Any] = []
    tries: list[tuple[float, str]] = []
    original = api.create_event

    def create_event(namespace: str, event: dict[str, Any]) -> Any:
        tries.append((clock[0], event["reason"]))
        answer = answers.pop(0) if answers else None
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer()
        return original(namespace, event)

    api.create_event = create_event  # type: ignore[method-assign]
    api.tries = tries
    return cache, api, writer, clock, answers, delays


def _refused() -> ApiException:
    return ApiException(status=500, reason="Internal Server Error")


def test_a_refused_event_waits_for_its_delay_then_goes_out_unchanged() -> None:
    """One 500: the very Event (name, reason, message, involvedObject) is created at the CR's
    first reconcile once the delay is over, not before, and the CR's queue is then empty."""
    _cache, api, writer, clock, answers, delays = _event_queue(delay=5.0)
    answers.append(_refused())
    assert writer.reconcile(NAME)  # Failed written; its Event refused
    assert api.events == []
    assert writer.deferred[NAME] == 5.0  # the main loop comes back when it is due
    [(held, attempts, since)] = writer._pending_events[NAME]
    assert (held["reason"], attempts, since) == ("Failed", 1, 0.0)
    clock[0] = 4.9
    assert not writer.reconcile(NAME)
    assert api.events == []
    clock[0] = 5.0
    assert not writer.reconcile(NAME)
    assert api.events == [("pmem-csi", held)]
    assert api.tries == [(0.0, "Failed"), (5.0, "Failed")]
    assert delays.asked == [0]
    assert NAME not in writer._pending_events and NAME not in writer._event_backoff
    assert writer.metrics.events._value.get() == 1


@pytest.mark.parametrize("start", [0.0, 1e6])  # the monotonic clock's start is any value
def test_events_refused_again_back_off_further_per_cr_up_to_the_tenth_step(start: float) -> None:
    """Each refusal in a row asks the backoff for the next step (0, 1, 2, ...; the step stops
    growing at 10), so a 500 storm is met with ever rarer attempts, one per delay."""
    _, api, writer, clock, answers, delays = _event_queue(delay=1.0)
    clock[0] = start
    answers.extend(_refused() for _ in range(14))
    assert writer.reconcile(NAME)
    for _ in range(14):
        clock[0] = writer.deferred.pop(NAME)
        writer.reconcile(NAME)
    assert delays.asked == [*range(11), 10, 10, 10]
    assert [t for t, _ in api.tries] == [start + t for t in range(15)]
    assert len(api.events) == 1 and NAME not in writer._event_backoff


def test_an_event_recorded_while_the_crs_events_back_off_waits_behind_the_held_one() -> None:
    """A new Event of a CR whose Events back off is not tried at once (one attempt per delay),
    and the queue goes out oldest first; the first refused again keeps the rest behind it."""
    cache, api, writer, clock, answers, _ = _event_queue(delay=5.0)
    cr = cache.crs[NAME]
    answers.append(_refused())
    writer._record(cr, "Warning", "Failed", "first")
    clock[0] = 1.0
    writer._record(cr, "Normal", "Running", "second")
    writer._record(cr, "Warning", "NodeDriverNotReady", "third")
    assert api.tries == [(0.0, "Failed")]
    assert [(e["message"], n, s) for e, n, s in writer._pending_events[NAME]] == [
        ("first", 1, 0.0),
        ("second", 0, 1.0),
        ("third", 0, 1.0),
    ]
    assert writer._wake == {NAME: 5.0}
    clock[0] = 5.0
    answers.append(_refused())
    writer._flush_events(NAME)
    assert api.tries[1:] == [(5.0, "Failed")]  # the others wait behind it
    assert [e["message"] for e, *_ in writer._pending_events[NAME]] == ["first", "second", "third"]
    clock[0] = writer._event_backoff[NAME][1]
    writer._flush_events(NAME)
    assert [e["message"] for _, e in api.events] == ["first", "second", "third"]
    assert NAME not in writer._pending_events and NAME not in writer._event_backoff


def test_a_held_back_event_is_retried_at_most_a_minute_after_it_was_first_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A delay longer than the minute left (Retry-After 120) wakes the main loop when the
    Event's minute is up, and it is then given up with a warning naming it, not tried."""
    cache, api, writer, clock, answers, _ = _event_queue(delay=120.0)
    answers.append(_refused())
    assert writer.reconcile(NAME)
    assert writer.deferred[NAME] == write.EVENT_GIVE_UP_SECONDS
    _fill(writer, cache.crs[NAME], ["NodeDriverNotReady", "Failed"])
    clock[0] = write.EVENT_GIVE_UP_SECONDS
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        writer.reconcile(NAME)
    assert api.tries == [(0.0, "Failed")]
    assert caplog.messages == [
        f"3 event(s) on {NAME} given up, 60 s after they were first refused: "
        "Failed, NodeDriverNotReady"
    ]
    assert NAME not in writer._pending_events and NAME not in writer._event_backoff


def test_an_attempt_that_ends_a_minute_after_the_event_was_held_back_gives_it_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The minute counts to the end of the attempt (a request that timed out): refused then,
    the Event is given up with the number of attempts, not queued for a third."""
    cache, _api, writer, clock, answers, _ = _event_queue(delay=1.0)
    cr = cache.crs[NAME]
    answers.append(_refused())
    writer._record(cr, "Warning", "Failed", "it broke")
    clock[0] = 1.0

    def slow_refusal() -> Any:
        clock[0] = write.EVENT_GIVE_UP_SECONDS
        raise _refused()

    answers.append(slow_refusal)
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer._flush_events(NAME)
    assert NAME not in writer._pending_events
    assert caplog.messages == [
        f"event Failed on {NAME} not created: 500 Internal Server Error "
        "(given up after 2 attempts)"
    ]


def test_a_refused_event_is_logged_with_its_attempt_error_and_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What an operator reads while Events are refused: which Event, which CR, which attempt,
    the error, and when it is tried again."""
    cache, _api, writer, clock, answers, _ = _event_queue(delay=2.25)
    answers.extend([_refused(), _refused()])
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer._record(cache.crs[NAME], "Warning", "Failed", "it broke")
        clock[0] = 2.25
        writer._flush_events(NAME)
    assert [m for m in caplog.messages if m.startswith("event ")] == [
        f"event Failed on {NAME} not created yet (attempt 1): 500 Internal Server Error; "
        "trying again in 2.2 s",
        f"event Failed on {NAME} not created yet (attempt 2): 500 Internal Server Error; "
        "trying again in 2.2 s",
    ]


def test_an_event_refused_for_good_is_logged_once_without_an_attempt_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 403 (not transient) is not retried; one attempt is not called "given up after"."""
    cache, _api, writer, _clock, answers, _ = _event_queue()
    answers.append(ApiException(status=403, reason="Forbidden"))
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer._record(cache.crs[NAME], "Warning", "Failed", "it broke")
    assert caplog.messages == [f"event Failed on {NAME} not created: 403 Forbidden"]
    assert NAME not in writer._pending_events and NAME not in writer._event_backoff


def _fill(writer: Any, cr: Any, reasons: list[str]) -> None:
    for i, reason in enumerate(reasons):
        writer._record(cr, "Warning", reason, f"{reason} {i}")


def test_a_queue_of_exactly_max_pending_events_drops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One reconcile's worth of Events (MAX_PENDING_EVENTS) all wait; nothing is dropped."""
    cache, _api, writer, _clock, answers, _ = _event_queue()
    answers.append(_refused())
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        _fill(writer, cache.crs[NAME], ["Failed"] * write.MAX_PENDING_EVENTS)
    assert len(writer._pending_events[NAME]) == write.MAX_PENDING_EVENTS
    assert caplog.messages == []


def test_a_full_queue_without_node_events_drops_its_oldest_event_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No node Event to give up: the oldest Event makes room for the newest, logged with its
    reason, its CR, the queue's size and its message."""
    cache, _api, writer, _clock, answers, _ = _event_queue()
    answers.append(_refused())
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        _fill(writer, cache.crs[NAME], ["Failed"] * (write.MAX_PENDING_EVENTS + 1))
    queued = [e["message"] for e, *_ in writer._pending_events[NAME]]
    assert queued == [f"Failed {i}" for i in range(1, write.MAX_PENDING_EVENTS + 1)]
    assert caplog.messages == [
        f"event Failed on {NAME} dropped: 13 Events of this CR wait already (the API server "
        "refuses Events): Failed 0"
    ]


def test_a_full_queue_drops_its_oldest_node_event_wherever_it_waits() -> None:
    """A node Event gives way before any phase Event, even one queued earlier."""
    cache, _api, writer, _clock, answers, _ = _event_queue()
    answers.append(_refused())
    reasons = ["Failed", "Running", "NodeDriverNotReady", "NodeDriversNotReady"]
    reasons += ["Failed"] * (write.MAX_PENDING_EVENTS - 4)
    _fill(writer, cache.crs[NAME], [*reasons, "Running", "Running"])
    queued = [e["message"] for e, *_ in writer._pending_events[NAME]]
    assert "NodeDriverNotReady 2" not in queued and "NodeDriversNotReady 3" not in queued
    assert queued[:2] == ["Failed 0", "Running 1"]
    assert queued[-2:] == [f"Running {len(reasons)}", f"Running {len(reasons) + 1}"]


def test_a_new_event_refused_while_a_full_queue_waits_joins_its_end_and_the_oldest_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tried at once (its CR's delay is over) and refused while a full queue of older phase
    Events waits, the new Event goes to the end of the queue, and the oldest Event is the one
    dropped (the queue's rule), never the newest."""
    cache, _api, writer, clock, answers, _ = _event_queue(delay=1.0)
    answers.append(_refused())
    cr = cache.crs[NAME]
    _fill(writer, cr, ["Failed"] * write.MAX_PENDING_EVENTS)
    clock[0] = 1.0
    answers.append(_refused())
    with caplog.at_level(logging.WARNING, logger=write.log.name):
        writer._record(cr, "Normal", "Running", "newest")
    assert caplog.messages == [
        f"event Failed on {NAME} dropped: {write.MAX_PENDING_EVENTS} Events of this CR wait "
        "already (the API server refuses Events): Failed 0"
    ]
    queued = [entry[0]["message"] for entry in writer._pending_events[NAME]]
    assert queued == [f"Failed {i}" for i in range(1, write.MAX_PENDING_EVENTS)] + ["newest"]


PER_CR_RECORDS = [
    "_tokens", "deferred", "_recovering", "_failing", "_failures", "backing_off",
    "_pending_events", "_event_backoff", "_wake", "awaiting_leader", "_broken", "_announced",
    "_node_window", "_written", "_yielding", "_conflict_event_at", "_uids",
]


@pytest.mark.parametrize("gone", ["deleted", "created-again"])
def test_a_cr_gone_leaves_no_per_cr_record_behind(gone: str) -> None:
    """Every per-CR record of a deleted CR is dropped (CRs created and deleted for months do
    not grow the reporter), and a CR created again under the name starts from nothing."""
    cache, _api, writer, _ = setup()
    other = "other.example.com"
    for attr in PER_CR_RECORDS:
        record = getattr(writer, attr)
        for key in (NAME, other):
            if isinstance(record, set):
                record.add(key)
            else:
                record[key] = {"u1": 1} if attr == "_announced" else ("1", {})
    writer._uids[NAME] = "u1"
    if gone == "deleted":
        del cache.crs[NAME]
    else:
        cache.crs[NAME]["metadata"]["uid"] = "u2"
        cache.synced = False  # stop after the forgetting
    writer.reconcile(NAME)
    kept = {attr: NAME in getattr(writer, attr) for attr in PER_CR_RECORDS}
    expected = dict.fromkeys(PER_CR_RECORDS, False)
    if gone == "created-again":
        expected.update(_uids=True)
    assert kept == expected
    assert writer._uids.get(NAME) in (None, "u2")
    assert all(other in getattr(writer, attr) for attr in PER_CR_RECORDS)


@pytest.mark.parametrize(
    ("old", "new", "before", "after"),
    [
        ("Failed", "Progressing", False, True),
        ("Failed", "Failed", False, False),
        ("Failed", "Running", False, False),
        ("Progressing", "Progressing", False, False),
        ("Running", "Progressing", False, False),
        ("Progressing", "Progressing", True, True),
        ("Progressing", "Running", True, False),
        ("Progressing", "Failed", True, False),
    ],
)
def test_a_recovery_is_awaited_from_leaving_failed_until_running_or_failed_again(
    old: str, new: str, before: bool, after: bool
) -> None:
    """Only a write out of Failed makes the next Running urgent, and that wait ends with the
    Running (or a new failure); rollouts that never failed stay in the budget."""
    _, _api, writer, _ = setup()
    if before:
        writer._recovering.add(NAME)
    writer._track_recovery(NAME, {"phase": old}, {"phase": new})
    assert (NAME in writer._recovering) == after


def test_the_main_loop_comes_back_at_the_earliest_time_any_part_of_a_reconcile_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A held-back Event due in 5 s and a failed lookup asked again in 2 s: the CR is
    reconciled again in 2 s, whichever asked first; the later request does not push it."""
    cache, _api, writer, clock, answers, _ = _event_queue(delay=5.0)
    answers.append(_refused())
    assert writer.reconcile(NAME)  # its Event is due at 5
    assert writer.deferred == {NAME: 5.0}
    retry_in = [2.0]

    def lookup_labels(kind: str, name: str, namespace: str) -> None:
        raise write.model.LookupFailed("503", retry_in=retry_in[0])

    cache.lookup_labels = lookup_labels  # type: ignore[method-assign]
    clock[0] = 1.0
    writer.reconcile(NAME)
    assert writer.deferred[NAME] == 3.0
    writer._wake_at(NAME, 4.0)
    writer._wake_at(NAME, 2.5)
    writer._wake_at(NAME, 9.0)
    assert writer._wake == {NAME: 2.5}


def test_a_refused_event_waits_as_long_as_the_api_servers_retry_after_says() -> None:
    """A 429/503 with Retry-After: the held-back Event is tried again when the API server
    asked, not after the (shorter) backoff of its own."""
    _cache, _api, writer, _clock, answers, _ = _event_queue()
    writer.retry_backoff = write.Backoff(base=0.2, cap=30.0, max_attempts=0)
    busy = ApiException(status=429, reason="Too Many Requests")
    busy.headers = {"Retry-After": "7"}
    answers.append(busy)
    assert writer.reconcile(NAME)
    assert writer.deferred[NAME] == 7.0


def test_an_event_refused_with_retry_after_zero_does_not_hold_back_the_ones_behind_it() -> None:
    """Held back only while its delay runs: with none (Retry-After: 0) the Events queued
    behind the refused one go out in the same pass."""
    cache, api, writer, clock, answers, _ = _event_queue(delay=1.0)
    cr = cache.crs[NAME]
    answers.append(_refused())
    writer._record(cr, "Warning", "Failed", "first")
    clock[0] = 0.5
    writer._record(cr, "Normal", "Running", "second")
    clock[0] = 1.0
    writer.retry_backoff = write.Backoff(base=0.2, cap=30.0, max_attempts=0)
    now_busy = ApiException(status=503, reason="Service Unavailable")
    now_busy.headers = {"Retry-After": "0"}
    answers.append(now_busy)
    writer._flush_events(NAME)
    assert [e["message"] for _, e in api.events] == ["second"]
    assert [e["message"] for e, *_ in writer._pending_events[NAME]] == ["first"]
    clock[0] = write.EVENT_GIVE_UP_SECONDS  # its minute is up: given up like any other
    writer._flush_events(NAME)
    assert NAME not in writer._pending_events and NAME not in writer._event_backoff


def test_a_failed_status_write_is_retried_at_its_own_time_not_at_a_held_back_events() -> None:
    """The main loop comes back at the earliest time asked: a status write refused at 1 s is
    tried again at 2 s, though the CR's held-back Event is only due at 10 s."""
    cache, api, writer, clock, answers, delays = _event_queue(delay=10.0)
    answers.append(_refused())
    assert writer.reconcile(NAME)  # Failed written; its Event refused, due at 10
    assert writer.deferred == {NAME: 10.0}
    clock[0] = 1.0
    delays.delay = 1.0
    cache.crs[NAME] = {**cache.crs[NAME], "status": {}}  # the status must be written again
    api.failures.append(_refused())
    assert not writer.reconcile(NAME)
    assert writer.backing_off == {NAME: 2.0}
    assert writer.deferred == {NAME: 2.0}


class FailingLookupCache(FakeCache):
    """Label look-ups of Secrets fail (a 403 or 500), each with its own retry time; the
    caches list nothing; records the look-ups and the CR whose unreadable kinds are asked."""

    def __init__(self, cr: dict[str, Any]) -> None:
        super().__init__(cr)
        self.looked_up: list[tuple[str, str]] = []
        self.asked_for: list[Any] = []
        self.retry = iter([7.0, 3.0, 5.0])

    def unreadable_for(self, cr: Any) -> dict[str, str]:
        self.asked_for.append(cr)
        return {}

    def lookup_labels(self, kind: str, name: str, namespace: str) -> Any:
        self.looked_up.append((kind, name))
        if kind == "Secret":
            raise write.model.LookupFailed(f"reading {name}: 500", retry_in=next(self.retry))
        return None


def test_a_failed_label_lookup_makes_its_kind_unknown_and_asks_to_come_back() -> None:
    """A Secret that cannot be read by name: the Secret kind is unreadable with the error,
    no further Secret is looked up (its kind is unknown already), the other kinds still are,
    and the CR is computed again when the look-up may be asked again."""
    cache = FailingLookupCache(CR)
    observed = build_observed(cache, CR)
    assert cache.asked_for == [CR]
    secrets = [n for k, n in cache.looked_up if k == "Secret"]
    assert len(secrets) == 1
    assert observed.unreadable == {"Secret": f"reading {secrets[0]}: 500"}
    assert observed.recheck_in == 7.0
    expected = {(e.kind, e.name) for e in write.model.expected_objects(observed.names)}
    assert {(k, n) for k, names in observed.objects.items() for n in names} == expected
    assert len(cache.looked_up) == len(expected) - sum(
        1 for k, _ in expected if k == "Secret"
    ) + 1


def test_a_cr_created_again_is_logged_with_its_new_uid(caplog: pytest.LogCaptureFixture) -> None:
    """Why the writer forgot what it knew of a CR: deleted and created again (new uid)."""
    cache, _api, writer, _ = setup()
    assert writer.reconcile(NAME)
    cache.crs[NAME] = {**cache.crs[NAME], "metadata": {**cache.crs[NAME]["metadata"], "uid": "u2"}}
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer.reconcile(NAME)
    assert f"{NAME}: created again (uid u2); what was known of the old one forgotten" in (
        caplog.messages
    )


def test_node_events_after_a_conflict_are_about_the_cr_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 409, then the write from the fresh read: the node Events of that reconcile name the
    CR as read again (its resourceVersion), not the stale copy the conflict refused."""
    cache, _, writer, _ = setup()
    api = MovingApi(cache, [ApiException(status=409)])
    writer.api = api
    pods = [write.status.BrokenPod("node-pod-1", "node-1", "NotReady")]
    monkeypatch.setattr(write.status, "degraded_node_pods", lambda observed: pods)
    assert writer.reconcile(NAME)
    [node_event] = [e for _, e in api.events if e["reason"] == "NodeDriverNotReady"]
    assert node_event["involvedObject"]["resourceVersion"] == "5"


# ------------------------------------------------------------------- failed writes, leadership


class PerNamespaceCache(FakeCache):
    """Caches listed per CR: settled only for a CR whose namespace has been listed."""

    def __init__(self, cr: dict[str, Any], listed: set[str]) -> None:
        super().__init__(cr)
        self.listed = listed
        self.ensured: list[Any] = []

    def cr_settled(self, cr: Any) -> bool:
        return write.cr_namespace(cr) in self.listed

    def ensure_for(self, cr: Any) -> None:
        self.ensured.append(cr)


def test_whether_a_crs_caches_have_listed_is_asked_about_that_cr() -> None:
    """The caches settle per CR (its namespace): the CR itself is what the writer asks
    about, so a CR whose namespace has listed is written and one whose has not waits."""
    cache, api, writer, _ = setup()
    cr = cache.crs[NAME]
    waiting = PerNamespaceCache(cr, listed=set())
    writer.cache = waiting
    assert not writer.reconcile(NAME)
    assert waiting.ensured == [cr] and api.patches == []
    writer.cache = PerNamespaceCache(cr, listed={write.cr_namespace(cr)})
    writer.api = FakeStatusApi(writer.cache)
    assert writer.reconcile(NAME)


def test_a_cr_awaiting_the_lease_stops_waiting_once_written_as_leader() -> None:
    """Not leading: the CR waits in ``awaiting_leader``; leading again, its reconcile takes
    it out, so the main loop does not keep it as still waiting for the Lease."""
    _, api, writer, _ = setup(leader=False)
    assert not writer.reconcile(NAME)
    assert writer.awaiting_leader == {NAME}
    writer.is_leader = lambda: True
    assert writer.reconcile(NAME)
    assert writer.awaiting_leader == set() and len(api.patches) == 1


def test_leadership_lost_between_the_start_and_the_write_leaves_the_cr_awaiting_the_lease() -> None:
    """The Lease is lost after the reconcile began: no write, and this CR (by name) is the
    one written once leading again."""
    _, api, writer, _ = setup()
    answers = iter([True, False])
    writer.is_leader = lambda: next(answers)
    assert not writer.reconcile(NAME)
    assert writer.awaiting_leader == {NAME} and api.patches == []


def test_a_reconcile_during_the_backoff_puts_the_cr_back_at_its_due_time() -> None:
    """A watch event reconciles a CR whose failed write backs off (the main loop had taken
    it out of ``deferred``): no attempt, and the CR is due again at the backoff's end."""
    _, api, writer, _ = setup(failures=[ApiException(status=503)])
    clock = [10.0]
    writer.monotonic = lambda: clock[0]
    assert not writer.reconcile(NAME)
    due = writer.backing_off[NAME]
    writer.deferred.pop(NAME)
    clock[0] = (10.0 + due) / 2
    assert not writer.reconcile(NAME)
    assert writer.deferred == {NAME: due} and api.patches == []


def test_a_cr_gone_at_the_reread_after_a_conflict_is_forgotten() -> None:
    """A 409, and the CR is gone when read again: every per-CR record of it is dropped, as
    for any deleted CR (its tokens from the write before, its uid)."""
    cache, api, writer, _ = setup()
    assert writer.reconcile(NAME)
    cache.crs[NAME] = {**cache.crs[NAME], "status": {}}  # to be written again
    api.failures.append(ApiException(status=409))
    api.get_cr = lambda name: None  # type: ignore[method-assign]
    assert not writer.reconcile(NAME)
    assert [attr for attr in PER_CR_RECORDS if NAME in getattr(writer, attr)] == []


def _failing_writes(count: int) -> tuple[Any, Any, Any, list[float], Delays]:
    """A writer whose next ``count`` status writes fail with a 500, on a hand clock, with a
    recording backoff of 1 s."""
    cache, api, writer, _ = setup(failures=[_refused() for _ in range(count)])
    clock = [0.0]
    writer.monotonic = lambda: clock[0]
    delays = writer.retry_backoff = Delays(1.0)
    return cache, api, writer, clock, delays


def test_failed_writes_in_a_row_are_counted_and_start_again_after_a_write_lands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two failures in a row say "1 time(s)", "2 time(s)" and back off at steps 0 and 1; a
    write that lands ends the row, so the next failure is the first again, at step 0."""
    cache, api, writer, clock, delays = _failing_writes(2)
    with caplog.at_level(logging.ERROR, logger=write.log.name):
        for _ in range(2):
            assert not writer.reconcile(NAME)
            clock[0] = writer.deferred.pop(NAME)
        assert writer.reconcile(NAME)
        cache.crs[NAME] = {**cache.crs[NAME], "status": {}}  # to be written again
        api.failures.append(_refused())
        assert not writer.reconcile(NAME)
    counts = [m.split(": writing status failed (", 1)[1].split(" ", 1)[0] for m in caplog.messages]
    assert counts == ["1", "2", "1"]
    assert delays.asked == [0, 1, 0]


def test_a_status_write_that_keeps_failing_backs_off_up_to_the_tenth_step() -> None:
    """Each failure in a row asks the backoff for the next step, and the step stops growing
    at 10 (the cap of the delay is the backoff's own)."""
    _, api, writer, clock, delays = _failing_writes(12)
    for _ in range(12):
        assert not writer.reconcile(NAME)
        clock[0] = writer.deferred.pop(NAME)
    assert delays.asked == [*range(11), 10]
    assert writer.reconcile(NAME) and len(api.patches) == 1


def test_a_refused_status_write_waits_as_long_as_the_api_servers_retry_after_says() -> None:
    """A 503 with Retry-After: 7 puts the CR off for those 7 s, not for the (much shorter)
    backoff of the first failure."""
    busy = ApiException(status=503, reason="Service Unavailable")
    busy.headers = {"Retry-After": "7"}
    _, _api, writer, _ = setup(failures=[busy])
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    writer.retry_backoff = write.Backoff(base=0.2, cap=30.0, max_attempts=0)
    assert not writer.reconcile(NAME)
    assert writer.backing_off == {NAME: 107.0} and writer.deferred == {NAME: 107.0}


def test_pods_healing_with_the_write_that_reaches_running_end_the_recovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failing pods healed since the last write: their Running is awaited (urgent) -- unless
    this very write is the Running, which ends that wait; one that is not Running yet keeps
    it."""
    for phase, recovering in (("Running", False), ("Progressing", True)):
        _, _api, writer, _ = setup()
        monkeypatch.setattr(
            write.status,
            "compute_status",
            lambda observed, now, progress_deadline, phase=phase: {"phase": phase},
        )
        monkeypatch.setattr(write.status, "failing_pods", lambda observed: frozenset())
        writer._failing[NAME] = frozenset({"pmem-csi-intel-com-node-x"})
        assert writer.reconcile(NAME)
        assert (NAME in writer._recovering) == recovering, phase


class PruningApi(FakeStatusApi):
    """An API server whose CRD schema (an older one) has no ``status.reason``: it stores the
    status without it (structural pruning), so its reply, not the status sent, is what the
    CR holds."""

    def patch_status(self, name: str, patch: dict[str, Any]) -> Any:
        result = super().patch_status(name, patch)
        result["status"] = {k: v for k, v in result["status"].items() if k != "reason"}
        self.cache.crs[name] = result
        return result


def test_the_status_the_api_server_stored_is_what_a_later_spec_change_is_compared_with() -> None:
    """After a write the API server stored pruned, a spec change (newer resourceVersion, the
    status as stored) is no other writer's: the writer writes on, with no conflict Event."""
    cache, _, writer, _ = setup()
    writer.api = api = PruningApi(cache)
    assert writer.reconcile(NAME)
    stored = cache.crs[NAME]
    assert "reason" in api.patches[0]["status"] and "reason" not in stored["status"]
    rv = str(int(stored["metadata"]["resourceVersion"]) + 1)
    cache.crs[NAME] = {**stored, "metadata": {**stored["metadata"], "resourceVersion": rv}}
    writer.reconcile(NAME)
    assert writer._yielding == {}
    assert [e["reason"] for _, e in api.events if e["reason"] == "StatusWriteConflict"] == []


def test_a_new_event_kept_in_a_full_queue_is_logged_as_held_and_asks_to_come_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused while a full queue waits, the new Event stays (an older one made room): it is
    logged as not created yet, and the main loop is asked back when its delay is over."""
    cache, _api, writer, clock, answers, _ = _event_queue(delay=1.0)
    answers.append(_refused())
    cr = cache.crs[NAME]
    _fill(writer, cr, ["Failed"] * write.MAX_PENDING_EVENTS)
    clock[0] = 1.0
    writer._wake.clear()
    answers.append(_refused())
    with caplog.at_level(logging.INFO, logger=write.log.name):
        writer._record(cr, "Normal", "Running", "newest")
    assert (
        f"event Running on {NAME} not created yet (attempt 1): 500 Internal Server Error; "
        "trying again in 1.0 s"
    ) in caplog.messages
    assert writer._wake == {NAME: 2.0}
