"""Write-only-on-change, conflict/transient retries and phase Events, with a fake API."""

from __future__ import annotations

import copy
import itertools
import random
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.retry import Backoff
from reporter.write import StatusWriter, build_observed, merge_patch

NAME = "pmem-csi.intel.com"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


class FakeCache:
    def __init__(self, cr: dict) -> None:
        self.crs = {NAME: cr}
        self.synced = True

    def cr(self, name):
        return self.crs.get(name)

    objects: dict = {}  # noqa: RUF012 - tests replace it per instance

    def find(self, kind, name, namespace):
        # Everything missing unless a test adds it: a Failed status is enough to test writing.
        return self.objects.get((kind, name))

    def pods(self, namespace):
        return []

    def cr_settled(self, cr):
        return self.synced

    def ensure_for(self, cr):
        pass

    def unreadable_for(self, cr):
        return {}

    def remember_cr(self, cr):
        self.crs[cr["metadata"]["name"]] = cr

    def lookup_labels(self, kind, name, namespace):
        return None  # absent objects really are missing


class FakeStatusApi:
    def __init__(self, cache: FakeCache, failures: list | None = None) -> None:
        self.cache = cache
        self.failures = list(failures or [])
        self.patches: list[dict] = []
        self.events: list[tuple[str, dict]] = []
        self.gets = 0

    def get_cr(self, name):
        self.gets += 1
        return self.cache.crs.get(name)

    def patch_status(self, name, patch):
        if self.failures:
            raise self.failures.pop(0)
        self.patches.append(patch)
        cr = self.cache.crs[name]
        if patch["metadata"]["resourceVersion"] != cr["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        status = dict(cr.get("status") or {})
        for key, value in patch["status"].items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
        return {**cr, "metadata": {**cr["metadata"], "resourceVersion": rv}, "status": status}

    def create_event(self, namespace, event):
        self.events.append((namespace, event))
        return event


def setup(failures=None, leader=True):
    cache = FakeCache(
        {
            "metadata": {"name": NAME, "resourceVersion": "1", "generation": 1, "uid": "u1"},
            "spec": {},
        }
    )
    api = FakeStatusApi(cache, failures)
    sleeps: list[float] = []
    writer = StatusWriter(
        api,
        cache,
        Metrics(),
        is_leader=lambda: leader,
        event_namespace="pmem-csi",
        backoff=Backoff(rng=random.Random(1)),
        now=lambda: NOW,
        monotonic=lambda: 12.5,
        sleep=sleeps.append,
    )
    return cache, api, writer, sleeps


def test_first_reconcile_writes_status_and_event_then_nothing():
    _cache, api, writer, _ = setup()
    assert writer.reconcile(NAME, changed_at=10.0)
    assert len(api.patches) == 1
    patch = api.patches[0]
    assert set(patch) == {"metadata", "status"}
    assert patch["metadata"] == {"resourceVersion": "1"}  # a precondition only
    assert patch["status"]["phase"] == "Failed"
    ns, event = api.events[0]
    assert ns == "pmem-csi"
    assert event["involvedObject"] == {
        "apiVersion": "pmem-csi.intel.com/v1beta1",
        "kind": "Deployment",
        "name": NAME,
        "uid": "u1",
        "resourceVersion": "2",
    }
    assert (event["type"], event["reason"]) == ("Warning", "Failed")
    m = writer.metrics
    assert m.status_writes._value.get() == 1
    assert m.change_to_write._sum.get() == 2.5
    # Steady state: same inputs, later time -> no write, no event.
    writer.now = lambda: datetime(2030, 1, 2, tzinfo=UTC)
    assert not writer.reconcile(NAME)
    assert len(api.patches) == 1 and len(api.events) == 1


def test_non_leader_and_unsynced_caches_write_nothing():
    cache, api, writer, _ = setup(leader=False)
    assert not writer.reconcile(NAME)
    cache.synced = False
    writer.is_leader = lambda: True
    assert not writer.reconcile(NAME)
    assert not writer.reconcile("no-such-cr")
    assert api.patches == []


def test_conflict_rereads_the_cr_and_retries():
    cache, api, writer, sleeps = setup()
    stale = cache.crs[NAME]
    cache.crs[NAME] = {**stale, "metadata": {**stale["metadata"], "resourceVersion": "7"}}
    writer.cache = type("C", (FakeCache,), {})(stale)  # the writer's cache is behind
    writer.cache.crs = {NAME: stale}
    assert writer.reconcile(NAME)
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["1", "7"]
    # Retried at once from the fresh copy: nothing sleeps on the main loop.
    assert api.gets == 1 and sleeps == []


def test_transient_errors_back_off_per_cr_then_succeed():
    """Review of issue 16: the retries slept inside reconcile (the main loop, every other CR
    waiting); now each failure puts the CR off by a growing delay, and a reconcile before
    that (a watch event, a resync) does not try again."""
    errors = [ApiException(status=503), ApiException(status=429), ConnectionError("reset")]
    _, api, writer, sleeps = setup(failures=list(errors))
    clock = [12.5]
    writer.monotonic = lambda: clock[0]
    delays = []
    for _ in errors:
        assert not writer.reconcile(NAME)
        due = writer.deferred[NAME]
        assert writer.backing_off[NAME] == due
        delays.append(due - clock[0])
        assert not writer.reconcile(NAME)  # before it is due: no attempt
        assert len(api.failures) == len(errors) - len(delays)  # one attempt each time
        clock[0] = due
    assert len(api.failures) == 0 and delays[0] < delays[2]
    assert writer.reconcile(NAME)
    assert len(api.patches) == 1 and sleeps == [] and writer.backing_off == {}


def test_permanent_error_gives_up_without_retry():
    _, _api, writer, sleeps = setup(failures=[ApiException(status=422)])
    assert not writer.reconcile(NAME)
    assert sleeps == [] and writer.metrics.status_write_errors._value.get() == 1


def test_losing_leadership_stops_retries():
    _, api, writer, sleeps = setup(failures=[ApiException(status=503)])
    assert not writer.reconcile(NAME)
    writer.is_leader = lambda: False
    due = writer.deferred[NAME]
    writer.monotonic = lambda: due
    assert not writer.reconcile(NAME)
    assert api.patches == [] and sleeps == [] and NAME in writer.awaiting_leader


def test_merge_patch_deletes_removed_keys_and_keeps_equal_ones():
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": True}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [1, 2]}
    assert merge_patch(old, new) == {"gone": None, "b": {"y": 3}, "c": [1, 2]}


def test_build_observed_splits_pods_by_owner():
    def pod(name, kind, owner):
        return {"metadata": {"name": name, "ownerReferences": [{"kind": kind, "name": owner}]}}

    class Cache(FakeCache):
        def pods(self, namespace):
            return [
                pod("c-0", "StatefulSet", "pmem-csi-intel-com-controller"),
                pod("n-1", "DaemonSet", "pmem-csi-intel-com-node"),
                pod("r-1", "ReplicaSet", "pmem-csi-intel-com-reporter-abc"),
            ]

    cr = {"metadata": {"name": NAME}, "spec": {"namespace": "drv"}}
    observed = build_observed(Cache(cr), cr)
    assert [p["metadata"]["name"] for p in observed.controller_pods] == ["c-0"]
    assert [p["metadata"]["name"] for p in observed.node_pods] == ["n-1"]
    assert observed.objects["Secret"] == {
        "pmem-csi-intel-com-registry-secrets": None,
        "pmem-csi-intel-com-node-secrets": None,
    }


def test_non_urgent_changes_use_a_per_cr_token_bucket_and_land_later():
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    cache.objects = {}
    assert writer.reconcile(NAME)  # first status: one token
    # Objects appear one by one: only message text changes (the list of missing objects).
    extra = [
        ("ServiceAccount", "pmem-csi-intel-com-controller"),
        ("Service", "pmem-csi-intel-com-controller"),
        ("Service", "pmem-csi-intel-com-metrics"),
    ]
    for i, key in enumerate(extra):
        cache.objects = {**cache.objects, key: {"metadata": {}}}
        clock[0] += 0.1
        written = writer.reconcile(NAME)
        assert written == (i < writer.burst - 1), i  # the burst is used up after 3 writes
    assert len(api.patches) == writer.burst
    due = writer.deferred[NAME]
    assert 0 < due - clock[0] <= writer.message_interval
    clock[0] = due
    assert writer.reconcile(NAME)  # the newest text lands when a token is back
    assert len(api.patches) == writer.burst + 1 and writer.deferred == {}


def test_a_change_of_meaning_is_written_at_once_within_the_interval():
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    assert writer.reconcile(NAME)
    clock[0] = 100.5
    cr = cache.crs[NAME]
    cache.crs[NAME] = {**cr, "metadata": {**cr["metadata"], "generation": 2}}
    assert writer.reconcile(NAME)  # observedGeneration moved: not a message-only change
    assert len(api.patches) == 2 and writer.deferred == {}


class Phases:
    """Stands in for compute_status: the phase a test sets, with its own message each time."""

    def __init__(self, monkeypatch) -> None:
        self.phase, self.changes = "", 0
        monkeypatch.setattr("reporter.write.status.compute_status", self.compute)

    def set(self, phase: str) -> None:
        self.phase, self.changes = phase, self.changes + 1

    def compute(self, observed, now, progress_deadline=None):
        return {"phase": self.phase, "reason": f"change {self.changes}", "conditions": []}


def test_running_after_a_failure_is_written_at_once_but_a_rollout_waits(monkeypatch):
    _cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    phases = Phases(monkeypatch)
    # Break and heal twice in a row, faster than the budget refills.
    sequence = ["Running", "Failed", "Progressing", "Running", "Failed", "Progressing", "Running"]
    for phase in sequence:
        phases.set(phase)
        clock[0] += 0.1
        assert writer.reconcile(NAME), phase
    assert [p["status"]["phase"] for p in api.patches] == sequence
    assert writer.deferred == {}
    # A rollout that never failed: Progressing and Running go through the empty budget.
    phases.set("Progressing")
    clock[0] += 0.1
    assert not writer.reconcile(NAME)
    clock[0] = writer.deferred[NAME]
    assert writer.reconcile(NAME)  # with the token that came back
    phases.set("Running")
    clock[0] += 0.1
    assert not writer.reconcile(NAME)  # waits for the next token
    assert NAME in writer.deferred
    assert api.patches[-1]["status"]["phase"] == "Progressing"


def test_significant_key_is_failure_conditions_and_generation_only():
    from reporter.write import significant_key

    a = {
        "phase": "Progressing",
        "conditions": [{"type": "X", "status": "True", "reason": "R", "message": "1 of 9"}],
        "driverComponents": [{"component": "Node", "status": "NotReady", "reason": "1 of 9"}],
    }
    b = copy.deepcopy(a)
    b["conditions"][0]["message"] = "2 of 9"
    b["driverComponents"][0] = {"component": "Node", "status": "Ready", "reason": "all"}
    b["phase"] = "Running"  # Running <-> Progressing goes through the rate limit
    assert significant_key(a) == significant_key(b)
    b["phase"] = "Failed"  # a failure is written at once
    assert significant_key(a) != significant_key(b)
    c = copy.deepcopy(a)
    c["conditions"][0]["status"] = "False"
    assert significant_key(a) != significant_key(c)


def test_status_api_calls_carry_a_request_timeout():
    """Every status call goes through RawApi, whose requests always pass a timeout."""
    from reporter.kubeapi import RawApi
    from reporter.write import KubeStatusApi

    seen: list = []

    class Client:
        def param_serialize(self, **kw):
            return (kw["method"], kw["resource_path"])

        def call_api(self, *req, _request_timeout=None):
            seen.append((req[0], _request_timeout))

            class R:
                status = 200

                def read(self):
                    return b"{}"

            return R()

    api = KubeStatusApi(RawApi(Client()))
    api.get_cr(NAME)
    api.patch_status(NAME, {"status": {}})
    api.create_event("default", {})
    assert [m for m, _ in seen] == ["GET", "PATCH", "POST"]
    assert all(t is not None and t[1] <= 10.0 for _, t in seen)


class _BrokenEventsApi(FakeStatusApi):
    """The Events API answers 500 for ever (an Event storm, an overloaded API server)."""

    def __init__(self, cache) -> None:
        super().__init__(cache)
        self.event_attempts: list[float] = []
        self.clock = [0.0]

    def create_event(self, namespace, event):
        self.event_attempts.append(self.clock[0])
        raise ApiException(status=500, reason="Internal Server Error")


def test_a_failing_event_write_backs_off_and_is_given_up_not_retried_in_a_hot_loop():
    """Review of issue 16: an Event that met a transient error was retried at every
    reconcile of its CR, each 0.1-0.2 s after the last (no growing delay, no end): under a
    500 storm a hot loop and a log line each time. Now: backoff growing to the cap, and an
    Event is given up ``EVENT_GIVE_UP_SECONDS`` after it was first refused."""
    from reporter import write as w

    cache, _api, writer, _ = setup()
    api = _BrokenEventsApi(cache)
    writer.api = api
    writer.retry_backoff = Backoff(base=0.2, cap=30.0, max_attempts=0, rng=random.Random(3))
    writer.monotonic = lambda: api.clock[0]
    assert writer.reconcile(NAME)  # status written (Failed); its Event fails
    remembered = cache.crs[NAME]
    # Watch events every 0.1 s for 10 minutes, plus whatever the writer asks to come back for.
    while api.clock[0] < 600:
        api.clock[0] = round(api.clock[0] + 0.1, 6)
        cache.crs[NAME] = remembered
        writer.reconcile(NAME)
    attempts = api.event_attempts
    assert 1 < len(attempts) <= 10, len(attempts)  # in 10 minutes of a 500 storm
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[-1] > gaps[0] * 4, gaps  # it backs off
    assert max(attempts) <= w.EVENT_GIVE_UP_SECONDS, attempts
    assert writer._pending_events.get(NAME) in (None, [])  # given up, not kept for ever


def test_a_failed_event_is_tried_again_when_due_without_waiting_for_a_watch_event():
    """The main loop comes back for a pending Event by itself (``deferred``): with no watch
    event and no resync, an Event refused twice lands after its backoff, not 60 s later."""
    cache, _api, writer, _ = setup()
    api = _BrokenEventsApi(cache)
    refusals = [2]
    create = FakeStatusApi.create_event

    def flaky(namespace, event):
        if refusals[0]:
            refusals[0] -= 1
            return api.__class__.create_event(api, namespace, event)
        return create(api, namespace, event)

    api.create_event = flaky  # type: ignore[method-assign]
    writer.api = api
    writer.monotonic = lambda: api.clock[0]
    assert writer.reconcile(NAME)
    while not api.events and api.clock[0] < 60:
        due = writer.deferred.pop(NAME, None)
        assert due is not None, f"nothing brings the CR back at {api.clock[0]} s"
        api.clock[0] = due
        writer.reconcile(NAME)
    assert [e["reason"] for _, e in api.events] == ["Failed"]
    assert api.clock[0] < 5
