"""Lease election state machine against a fake Lease API with resourceVersion checks."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from reporter.leader import LeaderElector


class FakeLeases:
    def __init__(self) -> None:
        self.lease: dict | None = None
        self.rv = 0
        self.fail: Exception | None = None

    def get(self, res, name, namespace=None):
        if self.fail:
            raise self.fail
        return copy.deepcopy(self.lease)

    def create(self, res, body, namespace=None):
        if self.lease is not None:
            raise ApiException(status=409)
        return self._store(body)

    def replace(self, res, name, body, namespace=None):
        if self.fail:
            raise self.fail
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        return self._store(body)

    def _store(self, body):
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(api, ident, clock, events=None):
    events = events if events is not None else []
    return LeaderElector(
        api,
        "ns",
        "lease",
        ident,
        clock=clock,
        now=lambda: datetime(2030, 1, 1, tzinfo=UTC),
        on_started_leading=lambda: events.append((ident, "start")),
        on_stopped_leading=lambda: events.append((ident, "stop")),
    )


def test_acquire_renew_and_block_others():
    api, clock, events = FakeLeases(), Clock(), []
    a, b = elector(api, "a", clock, events), elector(api, "b", clock, events)
    assert a.step() and a.is_leader()
    spec = api.lease["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 10
    assert spec["leaseTransitions"] == 0 and spec["acquireTime"].endswith("Z")
    assert not b.step() and not b.is_leader()
    clock.t += 2
    assert a.step()  # renew keeps acquireTime and transitions
    assert api.lease["spec"]["leaseTransitions"] == 0
    clock.t += 9  # b saw the renewal 9 s ago: still held
    assert not b.step()
    assert events == [("a", "start")]


def test_takeover_after_expiry_within_15_seconds():
    api, clock, events = FakeLeases(), Clock(), []
    a, b = elector(api, "a", clock, events), elector(api, "b", clock, events)
    a.step()
    b.step()  # b observes a's last renewal now; then a dies
    died = clock.t
    while not b.step():
        clock.t += b.acquire_period
    assert clock.t - died <= 15
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1
    # a comes back: sees b's lease, stops leading at once.
    assert not a.is_leader()  # its renew deadline passed long ago
    assert not a.step()
    assert events == [("a", "start"), ("b", "start"), ("a", "stop")]


def test_lost_when_another_holder_appears_and_on_renew_deadline():
    api, clock = FakeLeases(), Clock()
    a = elector(api, "a", clock)
    a.step()
    api.lease["spec"]["holderIdentity"] = "intruder"
    api.lease["spec"]["renewTime"] = "later"
    assert not a.step() and not a.is_leader()
    # API outage: leadership survives shortly, then expires by itself.
    api2, clock2 = FakeLeases(), Clock()
    c = elector(api2, "c", clock2)
    c.step()
    api2.fail = ApiException(status=503)
    clock2.t += 3
    assert c.step() and c.is_leader()
    clock2.t += 5  # 8 s since the last renewal > renew_deadline 7 s
    assert not c.is_leader()
    assert not c.step()


def test_race_on_expired_lease_has_one_winner():
    api, clock = FakeLeases(), Clock()
    old = elector(api, "old", clock)
    old.step()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.step(), b.step()
    clock.t += 11
    stale = api.get(None, "lease")
    assert a.step()
    # b computed from the same (now stale) resourceVersion: the PUT conflicts.
    api.get = lambda *args, **kw: copy.deepcopy(stale)
    assert not b.step()
    assert api.lease["spec"]["holderIdentity"] == "a"


def test_release_lets_others_acquire_immediately():
    api, clock = FakeLeases(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.step()
    b.step()
    a.release()
    assert api.lease["spec"]["holderIdentity"] == ""
    assert not a.is_leader()
    assert b.step()


def test_renew_deadline_counts_from_when_the_request_was_sent():
    """A slow renewal answer must not extend leadership past what the Lease guarantees."""
    api, clock = FakeLeases(), Clock()
    a = elector(api, "a", clock)
    assert a.step()
    sent = clock.t + 10.0
    clock.t = sent

    class Slow(FakeLeases):
        def replace(self, res, name, body, namespace=None):
            clock.t += 5.0  # the answer takes 5 s
            return FakeLeases.replace(api, res, name, body, namespace)

        def get(self, res, name, namespace=None):
            return api.get(res, name, namespace)

    a.api = Slow()
    assert a.step()
    assert clock.t == sent + 5.0 and a.is_leader()
    clock.t = sent + a.renew_deadline - 0.1
    assert a.is_leader()
    clock.t = sent + a.renew_deadline + 0.1  # answered at +5, but sent at +0
    assert not a.is_leader()
