"""The CR or its CRD deleted while the reporter runs (issue 10, item 4), with fake API streams.

What the real API server does, as measured on the local cluster: deleting the CRD sends a
DELETED event for every CR to open watches, then ends those watches; from then on every list
and watch of ``/apis/pmem-csi.intel.com/v1beta1/deployments`` answers ``404 page not found``
until the CRD is created again. The end-to-end test is
``tests/e2e/test_cr_and_crd_deleted.py``; these pin the rules behind it.
"""

from __future__ import annotations

import logging
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.observe import CR, UNSERVED_RETRY_CAP, Informer, Observer
from tests.unit.test_reporter_observe import FakeApi, NoStartInformer, cr
from tests.unit.test_reporter_write import NAME, setup


def not_found() -> ApiException:
    return ApiException(status=404, reason="Not Found")


def cr_informer(api: FakeApi, changes: list) -> Informer:
    def record(_inf: Informer, etype: str, obj: dict | None, before: dict | None) -> None:
        name = (obj or before or {}).get("metadata", {}).get("name")
        changes.append((etype, name))

    return Informer(api, CR, record, Metrics(), field_selector="metadata.name=a")


def run_until(inf: Informer, stop: threading.Event, rounds: int) -> list[float]:
    """Run the informer's loop for ``rounds`` back-off waits; return the waits asked for."""
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) >= rounds:
            stop.set()
        return stop.is_set()

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    return waits


def test_a_404_empties_the_cache_reports_deletions_and_unserved_once():
    """CRD deleted after the watch ended without DELETED events: the CRs are gone all the same."""
    api = FakeApi(
        lists=[([cr("a", "5")], "5"), not_found(), not_found(), not_found()],
        watches=[[], not_found()],
    )
    changes: list = []
    inf = cr_informer(api, changes)
    waits = run_until(inf, threading.Event(), rounds=5)
    assert changes == [("ADDED", "a"), ("SETTLED", None), ("DELETED", "a"), ("UNSERVED", None)]
    assert inf.unserved and not inf.synced and inf.items() == []
    assert inf.resource_version is None  # the first call after a 404 is a fresh list
    assert [c[0] for c in api.calls] == ["list", "watch", "watch", "list", "list", "list"]
    # One request per retry, each counted in pmem_csi_reporter_watch_restarts_total.
    assert len(api.calls) == len(waits) + 1
    assert inf.restarts == len(waits) - 1


def test_retries_of_an_unserved_kind_back_off_to_the_cap_not_a_hot_loop():
    api = FakeApi(lists=[not_found()] * 12, watches=[])
    inf = cr_informer(api, [])
    waits = run_until(inf, threading.Event(), rounds=12)
    assert len(waits) == 12
    assert all(0 < w <= UNSERVED_RETRY_CAP for w in waits)
    assert waits[3] > waits[0]  # grows
    assert min(waits[-4:]) >= UNSERVED_RETRY_CAP / 2  # then stays near the cap, not at zero


def test_a_list_that_works_again_reports_served_then_the_cr():
    api = FakeApi(lists=[not_found(), ([cr("a", "9")], "9")], watches=[])
    changes: list = []
    inf = cr_informer(api, changes)
    with pytest.raises(ApiException):
        inf.relist()  # the 404 (run() hands it to _gone_kind, as here)
    inf._gone_kind(not_found())
    inf.relist()
    assert changes == [("UNSERVED", None), ("SERVED", None), ("ADDED", "a"), ("SETTLED", None)]
    assert inf.synced and not inf.unserved


def named_observer(api: FakeApi) -> Observer:
    observer = Observer(api, Metrics(), deployments=["a"], informer_factory=NoStartInformer)
    observer.start()
    return observer


def test_observer_says_once_that_the_crd_is_gone_stops_the_crs_watches_and_is_not_ready(
    caplog: pytest.LogCaptureFixture,
):
    observer = named_observer(FakeApi([], []))
    (crs,) = observer.cr_informers
    crs.relist = lambda: None  # type: ignore[method-assign]
    crs._synced.set()
    crs._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    grouped = [i for i in observer.all_informers() if i not in observer.cr_informers]
    assert grouped and observer.cr("a") is not None
    observer.take_dirty(0)
    caplog.set_level(logging.DEBUG, logger="reporter.observe")

    for _ in range(3):  # the first 404 and two retries
        crs._gone_kind(not_found())

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "CRD deployments.pmem-csi.intel.com is gone" in warnings[0]
    assert "waiting for the CRD to be created again" in warnings[0]
    assert observer.crd_missing
    assert observer.metrics.crd_missing._value.get() == 1
    assert not observer.synced  # /readyz: 503
    assert observer.cr("a") is None
    assert observer.all_informers() == observer.cr_informers
    assert all(i._stop.is_set() for i in grouped)
    # The CR's name is queued once (its deletion); the writer then finds no CR and writes nothing.
    assert set(observer.take_dirty(0)) == {"a"}


def test_observer_resumes_when_the_crd_and_cr_come_back(caplog: pytest.LogCaptureFixture):
    api = FakeApi(lists=[([cr("a", "20", ns="drv")], "20")], watches=[])
    observer = named_observer(api)
    (crs,) = observer.cr_informers
    crs._gone_kind(not_found())
    observer.take_dirty(0)
    caplog.set_level(logging.INFO, logger="reporter.observe")
    crs.relist()
    assert not observer.crd_missing
    assert observer.metrics.crd_missing._value.get() == 0
    assert any("is served again" in r.getMessage() for r in caplog.records)
    assert observer.cr("a") is not None
    assert {i.namespace for i in observer.all_informers() if i.res.namespaced} == {"drv"}
    assert "a" in observer.take_dirty(0)


def test_two_named_crs_give_one_line_while_either_informer_still_gets_404(
    caplog: pytest.LogCaptureFixture,
):
    observer = Observer(
        FakeApi([([], "3")], []),
        Metrics(),
        deployments=["a", "b"],
        informer_factory=NoStartInformer,
    )
    observer.start()
    caplog.set_level(logging.INFO, logger="reporter.observe")
    first, second = observer.cr_informers
    first._gone_kind(not_found())
    second._gone_kind(not_found())
    first.relist()  # one is back, the other not yet: still waiting
    assert observer.crd_missing
    lines = [r.getMessage() for r in caplog.records if "CRD deployments" in r.getMessage()]
    assert len(lines) == 1 and "is gone" in lines[0], lines


def test_other_errors_still_use_the_normal_backoff_and_keep_the_cache():
    api = FakeApi(lists=[([cr("a", "5")], "5")], watches=[[], ApiException(status=503)])
    changes: list = []
    inf = cr_informer(api, changes)
    run_until(inf, threading.Event(), rounds=2)
    assert [c[0] for c in api.calls] == ["list", "watch", "watch"]
    assert not inf.unserved and inf.synced and inf.get("a") is not None
    assert ("UNSERVED", None) not in changes


# ------------------------------------------------------------------------ the writer


def test_writer_sends_nothing_for_a_cr_that_is_gone_from_the_cache():
    cache, api, writer, _ = setup()
    del cache.crs[NAME]
    assert not writer.reconcile(NAME)
    assert api.patches == [] and api.events == [] and api.gets == 0
    assert writer.metrics.reconciles._value.get() == 0


def test_writer_gives_up_at_once_when_the_cr_is_deleted_during_the_write():
    """A 404 on /status: no retry, no read to re-create it from, no error counted, no Event."""
    _cache, api, writer, sleeps = setup(failures=[not_found()])
    assert not writer.reconcile(NAME)
    assert api.patches == [] and api.events == [] and api.gets == 0
    assert sleeps == []
    assert writer.metrics.status_write_errors._value.get() == 0


def test_unserved_informer_is_still_alive_for_healthz():
    """Liveness stays green: restarting the pod would not bring the CRD back."""
    observer = named_observer(FakeApi([], []))
    (crs,) = observer.cr_informers
    stop = threading.Event()
    crs._thread = threading.Thread(target=stop.wait, daemon=True)
    crs._thread.start()
    try:
        crs._gone_kind(not_found())
        assert observer.healthy
    finally:
        stop.set()


def test_a_429_while_the_crd_comes_back_is_part_of_the_wait_not_a_warning(
    caplog: pytest.LogCaptureFixture,
):
    """Seen once per run on the local cluster: a 429 (Retry-After: 1) as the CRD comes back."""
    initializing = ApiException(status=429, reason="Too Many Requests")
    api = FakeApi(lists=[not_found(), initializing, ([cr("a", "9")], "9")], watches=[])
    changes: list = []
    inf = cr_informer(api, changes)
    caplog.set_level(logging.DEBUG, logger="reporter.observe")
    inf.backoff.base = 1000.0  # the normal backoff would wait its 30 s cap here
    waits = run_until(inf, threading.Event(), rounds=2)
    assert max(waits) <= UNSERVED_RETRY_CAP
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    assert any("not served yet" in r.getMessage() for r in caplog.records)
    inf.relist()
    assert ("SERVED", None) in changes and inf.synced


def test_a_429_in_normal_operation_is_still_a_warning(caplog: pytest.LogCaptureFixture):
    api = FakeApi(lists=[([], "1")], watches=[[], ApiException(status=429, reason="Too Many")])
    inf = cr_informer(api, [])
    caplog.set_level(logging.INFO, logger="reporter.observe")
    run_until(inf, threading.Event(), rounds=2)
    assert any("list/watch failed (429)" in r.getMessage() for r in caplog.records)
