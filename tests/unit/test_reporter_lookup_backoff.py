"""A lookup by name that keeps failing (review of issue 16) was asked, and its CR recomputed,
every ``LOOKUP_RETRY`` seconds for ever: now it backs off per object, doubling to
``LOOKUP_RETRY_CAP``, and starts over once a lookup worked."""

from __future__ import annotations

import itertools

import pytest
from kubernetes.client.exceptions import ApiException
from test_reporter_observe import NoStartInformer, cr
from test_reporter_observe_leaks import LookupApi

from pmem_components import names as n
from reporter import model
from reporter.metrics import Metrics
from reporter.observe import LOOKUP_RETRY, LOOKUP_RETRY_CAP, Observer


class FlakyLookupApi(LookupApi):
    """Every GET by name answers 500 while ``broken``."""

    broken = True

    def get_metadata(self, res, name, namespace=None):
        if self.broken:
            self.gets.append((res.kind, name, namespace))
            raise ApiException(status=500, reason="Internal Server Error")
        return super().get_metadata(res, name, namespace)


def _gaps(observer, api, clock, ds: str, until: float) -> list[float]:
    """Ask for the DaemonSet's labels whenever the last failure says it may be asked again."""
    times = []
    while clock[0] < until:
        n_before = len(api.gets)
        with pytest.raises(model.LookupFailed) as failed:
            observer.lookup_labels("DaemonSet", ds, "drv")
        if len(api.gets) > n_before:
            times.append(clock[0])
        clock[0] += failed.value.retry_in
    return [b - a for a, b in itertools.pairwise(times)]


def test_a_failing_lookup_backs_off_per_object_and_starts_over_after_a_success():
    names = n.DeploymentNames("a")
    clock = [1000.0]
    api = FlakyLookupApi({})
    observer = Observer(
        api, Metrics(), deployments=["a"], informer_factory=NoStartInformer,
        clock=lambda: clock[0],
    )
    observer.start()
    observer.cr_informers[0]._handle({"type": "ADDED", "object": cr("a", "1", ns="drv")})
    gaps = _gaps(observer, api, clock, names.node_driver, clock[0] + 600)
    assert gaps[:4] == [LOOKUP_RETRY, 2 * LOOKUP_RETRY, 4 * LOOKUP_RETRY, 8 * LOOKUP_RETRY]
    assert max(gaps) == LOOKUP_RETRY_CAP
    # It works once (the object is missing), and fails again later: 5 s again.
    api.broken = False
    clock[0] += LOOKUP_RETRY_CAP
    assert observer.lookup_labels("DaemonSet", names.node_driver, "drv") is None
    api.broken = True
    clock[0] += 61.0  # past what a found answer is believed for
    gaps = _gaps(observer, api, clock, names.node_driver, clock[0] + 20)
    assert gaps[0] == LOOKUP_RETRY
