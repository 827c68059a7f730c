"""The 403 grace of a namespace added while running (review of issue 16): its 1 s retries
are not failures, so the first retry after the grace waits the backoff's first delay, not
15-30 s."""

from __future__ import annotations

import random
import threading

from kubernetes.client.exceptions import ApiException
from test_reporter_observe import obj

from reporter.metrics import Metrics
from reporter.observe import NEW_GRANT_RETRY, NEW_GRANT_SECONDS, POD, Informer
from reporter.retry import Backoff


def test_retries_in_the_new_namespace_grace_do_not_grow_the_backoff_after_it():
    clock = [0.0]
    stop = threading.Event()
    waits: list[float] = []
    role_at = NEW_GRANT_SECONDS + 2.0  # the Role comes a little after the grace

    class Api:
        def list(self, res, namespace=None, label_selector=None, field_selector=None,
                 transform=None):
            if clock[0] < role_at:
                raise ApiException(status=403, reason="Forbidden")
            return [obj("p1", "5")], "10"

        def watch(self, *a, **kw):
            stop.set()
            return iter([])

    backoff = Backoff(base=0.5, cap=30.0, max_attempts=0, rng=random.Random(2))
    inf = Informer(
        Api(), POD, lambda *_: None, Metrics(), namespace="new-ns", label_selector="a=b",
        clock=lambda: clock[0], backoff=backoff, new_grant_seconds=NEW_GRANT_SECONDS,
    )

    def wait(t):
        waits.append(t)
        clock[0] += t
        return stop.is_set()

    inf._stop.wait = wait  # type: ignore[method-assign]
    inf.run(stop)
    after_grace = [t for t in waits if t != NEW_GRANT_RETRY]
    assert after_grace, waits
    assert after_grace[0] <= backoff.base, waits  # the first delay (jittered: base/2 to base)
    assert clock[0] < role_at + NEW_GRANT_RETRY * 4, waits  # listed soon after the Role came
