"""The main loop loses no update: failed writes come back, changes survive a leadership gap.

The real ``StatusWriter`` and ``ReconcileLoop`` run against a fake cache, a fake status API and
a fake clock (``take_dirty`` waits by advancing it), so "minutes" of API trouble take no time.
"""

from __future__ import annotations

import itertools
import random
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from reporter.metrics import Metrics
from reporter.retry import Backoff
from reporter.schedule import ReconcileLoop
from reporter.write import StatusWriter

NAME = "pmem-csi.intel.com"
NOW = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeObserver:
    """Cache and dirty queue in one, as ``reporter.observe.Observer`` is."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.crs_by_name = {
            NAME: {
                "metadata": {"name": NAME, "resourceVersion": "1", "generation": 1, "uid": "u"},
                "spec": {},
            }
        }
        self.dirty: dict[str, float | None] = {}

    # --- the loop's side
    def take_dirty(self, timeout):
        if not self.dirty and timeout:
            self.clock.sleep(timeout)
        dirty, self.dirty = self.dirty, {}
        return dirty

    def mark_dirty(self, name, changed_at=None):
        self.dirty.setdefault(name, changed_at)

    def crs(self):
        return list(self.crs_by_name.values())

    # --- the writer's side
    def cr(self, name):
        return self.crs_by_name.get(name)

    def find(self, kind, name, namespace):
        return None  # everything missing: phase Failed, enough to see a write

    def pods(self, namespace):
        return []

    def cr_settled(self, cr):
        return True

    def ensure_for(self, cr):
        pass

    def unreadable_for(self, cr):
        return {}

    def remember_cr(self, cr):
        self.crs_by_name[cr["metadata"]["name"]] = cr

    def lookup_labels(self, kind, name, namespace):
        return None


class FlakyApi:
    """Answers 500 to the first ``failures`` status patches; then applies them."""

    def __init__(self, observer: FakeObserver, failures: int) -> None:
        self.observer = observer
        self.failures = failures
        self.attempts = 0
        self.written: list[dict] = []

    def get_cr(self, name):
        return self.observer.crs_by_name.get(name)

    def patch_status(self, name, patch):
        self.attempts += 1
        cr = self.observer.crs_by_name.get(name)
        if cr is None:
            raise ApiException(status=404, reason="Not Found")
        if self.failures > 0:
            self.failures -= 1
            raise ApiException(status=500, reason="Internal Server Error")
        self.written.append(patch)
        status = {**(cr.get("status") or {}), **patch["status"]}
        rv = str(int(cr["metadata"]["resourceVersion"]) + 1)
        return {**cr, "metadata": {**cr["metadata"], "resourceVersion": rv}, "status": status}

    def create_event(self, namespace, event):
        return event


def build(failures: int = 0, leader: list[bool] | None = None):
    clock = Clock()
    observer = FakeObserver(clock)
    api = FlakyApi(observer, failures)
    leading = leader if leader is not None else [True]
    writer = StatusWriter(
        api,
        observer,
        Metrics(),
        is_leader=lambda: leading[0],
        event_namespace="default",
        backoff=Backoff(rng=random.Random(3)),  # 6 attempts, as in production
        now=lambda: NOW,
        monotonic=clock,
        sleep=clock.sleep,
    )
    loop = ReconcileLoop(
        observer,
        writer,
        lambda: leading[0],
        threading.Event(),
        resync_seconds=3600.0,  # no resync in these tests: nothing may rely on it
        clock=clock,
        sleep=clock.sleep,
    )
    return clock, observer, api, writer, loop, leading


def run_until(loop: ReconcileLoop, clock: Clock, done, seconds: float) -> None:
    end = clock() + seconds
    while clock() < end and not done():
        loop.step()


def test_a_write_failing_longer_than_its_retries_lands_later_without_a_resync():
    # 20 answers of 500 (several minutes: the per-CR backoff doubles to 30 s).
    clock, observer, api, writer, loop, _ = build(failures=20)
    observer.mark_dirty(NAME, clock())
    start = clock()
    run_until(loop, clock, lambda: api.written, seconds=600)
    assert api.written, f"no status after {api.attempts} attempts"
    assert api.written[0]["status"]["phase"] == "Failed"
    assert api.attempts == 21
    # Far sooner than the (hour-long) resync, and backing off between attempts.
    assert clock() - start < 600
    assert writer.metrics.status_write_errors._value.get() == 20


def test_retries_stop_when_the_cr_is_gone():
    clock, observer, api, _writer, loop, _ = build(failures=1000)
    observer.mark_dirty(NAME, clock())
    run_until(loop, clock, lambda: api.attempts >= 12, seconds=600)
    del observer.crs_by_name[NAME]
    attempts = api.attempts
    run_until(loop, clock, lambda: False, seconds=600)
    assert api.attempts <= attempts + 1  # at most the 404 that says it is gone
    assert loop.pending == {}


def test_a_change_seen_while_not_leading_is_written_when_leadership_is_back_without_a_flip():
    # A slow renewal: is_leader() is False for a moment, then True again; the elector never
    # saw the lease lost, so on_started_leading does not fire (nothing marks all dirty).
    clock, observer, api, _writer, loop, leading = build(leader=[False])
    observer.mark_dirty(NAME, clock())
    loop.step()
    loop.step()
    assert api.written == []
    leading[0] = True
    run_until(loop, clock, lambda: api.written, seconds=30)
    assert len(api.written) == 1


def test_leadership_lost_in_the_middle_of_retries_is_written_once_it_is_back():
    clock, observer, api, _writer, loop, leading = build(failures=2)
    observer.mark_dirty(NAME, clock())
    calls = [0]
    real = FlakyApi.patch_status

    def patch_then_lose(name, patch):
        calls[0] += 1
        if calls[0] == 2:
            leading[0] = False  # the renewal deadline passed while we retried
        return real(api, name, patch)

    api.patch_status = patch_then_lose
    run_until(loop, clock, lambda: False, seconds=20)
    assert api.written == []
    leading[0] = True
    run_until(loop, clock, lambda: api.written, seconds=30)
    assert len(api.written) == 1


def test_a_change_held_longer_than_a_resync_is_written_but_not_counted_as_latency():
    clock, observer, api, writer, loop, leading = build(leader=[False])
    observer.mark_dirty(NAME, clock())
    loop.step()
    clock.sleep(3601)  # a follower for over an hour: the leader wrote that change meanwhile
    leading[0] = True
    run_until(loop, clock, lambda: api.written, seconds=30)
    assert len(api.written) == 1
    assert writer.metrics.change_to_write._sum.get() == 0.0


# ------------------------------------------------- review of issue 16: backoff per CR


OTHER = "zz-other"  # reconciled after NAME in one step (sorted)


class TwoCrObserver(FakeObserver):
    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.crs_by_name[OTHER] = {
            "metadata": {"name": OTHER, "resourceVersion": "1", "generation": 1, "uid": "o"},
            "spec": {},
        }


class FailOneApi(FlakyApi):
    """Every status patch of NAME fails with 500; the other CR's land. Records when."""

    def __init__(self, observer: FakeObserver, clock: Clock) -> None:
        super().__init__(observer, 0)
        self.clock = clock
        self.times: dict[str, list[float]] = {}

    def patch_status(self, name, patch):
        self.times.setdefault(name, []).append(self.clock())
        if name == NAME:
            self.attempts += 1
            raise ApiException(status=500, reason="Internal Server Error")
        return super().patch_status(name, patch)


def build_two():
    clock, _, _, writer, loop, _ = build()
    observer = TwoCrObserver(clock)
    api = FailOneApi(observer, clock)
    writer.api, writer.cache, loop.observer = api, observer, observer
    return clock, observer, api, writer, loop


def test_a_failing_write_does_not_block_the_loop_for_other_crs():
    """The quick retries of a failing write slept inside reconcile (3-6 s of 500s): every
    other CR's change waited behind them."""
    clock, observer, api, _writer, loop = build_two()
    t = clock()
    observer.mark_dirty(NAME, t)
    observer.mark_dirty(OTHER, t)
    loop.step()  # NAME's write fails, then OTHER's is written
    assert api.attempts >= 1
    assert api.times.get(OTHER), "the other CR was not written"
    # Written within the loop's debounce, not after NAME's retries.
    assert api.times[OTHER][0] - t < 0.5, api.times


def test_events_do_not_pull_a_failed_writes_backoff_forward():
    """Every watch event restarted a failed write at once (0.5 s), defeating the backoff
    against a struggling API server."""
    clock, observer, api, _writer, loop = build_two()
    observer.mark_dirty(NAME, clock())
    end = clock() + 120
    while clock() < end:
        observer.mark_dirty(NAME, clock())  # a pod of NAME changes every 100 ms
        loop.step()
        clock.sleep(0.1)
    times = api.times[NAME]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Backing off (1, 2, 4 ... up to 30 s between attempts), whatever the events say.
    assert len(times) < 20, times
    assert max(gaps) >= 15, gaps
    # Equal jitter: a wait is never under half its nominal delay, which never shrinks.
    assert all(gap >= 0.25 * max(gaps[:i]) for i, gap in enumerate(gaps) if i), gaps


def build_with_a_raising_reconcile() -> tuple[Any, Any, Any, list[float]]:
    """(clock, observer, loop, the times reconcile was called): every reconcile raises."""
    clock, observer, _api, writer, loop, _ = build()
    calls: list[float] = []

    def broken(name: str, changed_at: float | None = None) -> None:
        calls.append(clock())
        raise RuntimeError("a bug")

    writer.reconcile = broken  # type: ignore[method-assign]
    return clock, observer, loop, calls


def test_a_reconcile_that_keeps_raising_backs_off_instead_of_a_traceback_every_second():
    """Found re-reading issue 16 (like an Event's retries): a reconcile that raised (a bug, a
    cache in a state nothing expected) came back every second for ever, each time with a
    full traceback in the log. Now it backs off per CR, up to a minute."""
    clock, observer, loop, calls = build_with_a_raising_reconcile()
    observer.mark_dirty(NAME, clock())
    run_until(loop, clock, lambda: False, 600)
    assert 3 <= len(calls) <= 20, len(calls)  # every second: 600
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert max(gaps) <= 61 and gaps[-1] > 4 * gaps[0], gaps


def test_watch_events_do_not_pull_a_raising_reconciles_backoff_forward():
    clock, observer, loop, calls = build_with_a_raising_reconcile()
    end = clock() + 600
    while clock() < end:
        observer.mark_dirty(NAME, clock())  # a rollout: an event every step
        loop.step()
        clock.sleep(0.5)
    assert len(calls) <= 20, len(calls)
