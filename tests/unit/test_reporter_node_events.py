"""A few broken nodes are reported by name: one Warning Event per newly broken node pod.

The CR stays Running (tests/unit/test_status_scale.py); these Events say which node to look
at, once per node going bad (and at most once per NODE_EVENT_REPEAT_SECONDS however often it
flaps), capped per CR and window so that a rack going down is not a storm.
"""

from __future__ import annotations

import pytest
from test_reporter_write import NAME, setup

from reporter import status
from reporter.write import MAX_NODE_EVENTS, NODE_EVENT_REPEAT_SECONDS


def broken(*indexes: int) -> list[status.BrokenPod]:
    return [status.BrokenPod(f"node-pod-{i}", f"node-{i}", "NotReady") for i in indexes]


def node_events(api) -> list[dict]:
    return [e for _, e in api.events if e["reason"].startswith("NodeDriver")]


def test_each_newly_broken_node_pod_gets_one_warning_event(monkeypatch):
    _cache, api, writer, _ = setup()
    now_broken = [broken(17)]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: now_broken[0])
    writer.reconcile(NAME)
    (event,) = node_events(api)
    assert (event["type"], event["reason"]) == ("Warning", "NodeDriverNotReady")
    assert event["message"] == (
        "Node driver pod node-pod-17 on node node-17: NotReady; the driver serves on the other "
        "nodes"
    )
    writer.reconcile(NAME)  # still broken: nothing new
    assert len(node_events(api)) == 1
    now_broken[0] = broken(17, 40)
    writer.reconcile(NAME)
    assert [e["message"].split(":")[0] for e in node_events(api)][-1].endswith("node-40")
    assert len(node_events(api)) == 2
    now_broken[0] = broken(40)  # 17 healed
    writer.reconcile(NAME)
    now_broken[0] = broken(17, 40)  # and broke again at once: named already, no new Event
    writer.reconcile(NAME)
    assert len(node_events(api)) == 2


def test_many_broken_nodes_at_once_are_capped_with_one_summary(monkeypatch):
    _cache, api, writer, _ = setup()
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(*range(40)))
    writer.reconcile(NAME)
    events = node_events(api)
    assert len(events) == MAX_NODE_EVENTS + 1
    assert (events[-1]["type"], events[-1]["reason"], events[-1]["message"]) == (
        "Warning",
        "NodeDriversNotReady",
        f"and {40 - MAX_NODE_EVENTS} more node driver pod(s) are not ready; see the Node "
        "component of the status",
    )


def test_a_broken_pod_not_scheduled_on_any_node_says_so(monkeypatch):
    """A node pod without a node (unschedulable) is named as not scheduled, not "on node "."""
    _cache, api, writer, _ = setup()
    pods = [status.BrokenPod("node-pod-1", "", "Unschedulable")]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: pods)
    writer.reconcile(NAME)
    assert [e["message"] for e in node_events(api)] == [
        "Node driver pod node-pod-1 (not scheduled): Unschedulable; the driver serves on the "
        "other nodes"
    ]


def test_a_pod_broken_for_longer_than_the_window_is_named_once(monkeypatch):
    """The repeat window is for flapping pods: one that stays broken is not named again every
    ``NODE_EVENT_REPEAT_SECONDS``."""
    _cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(17))
    for _ in range(4):
        writer.reconcile(NAME)
        clock[0] += NODE_EVENT_REPEAT_SECONDS
    assert len(node_events(api)) == 1


def test_a_cr_created_again_names_its_broken_nodes_again(monkeypatch):
    """A CR deleted and created again (pulumi replace) is a new object: its broken node pods
    are named on it, though the old CR named them a minute ago."""
    cache, api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(17))
    writer.reconcile(NAME)
    clock[0] += 60
    cache.crs[NAME] = {**cache.crs[NAME], "metadata": {**cache.crs[NAME]["metadata"], "uid": "u2"}}
    writer.reconcile(NAME)
    assert [e["involvedObject"]["uid"] for e in node_events(api)] == ["u1", "u2"]


def test_a_non_leader_records_no_node_events(monkeypatch):
    _cache, api, writer, _ = setup(leader=False)
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(1))
    writer.reconcile(NAME)
    assert node_events(api) == []


# ------------------------------------------------ review of issue 16: bounded, not urgent


@pytest.mark.parametrize("start", [100.0, 1e6])  # the monotonic clock's start is any value
def test_a_flapping_node_gets_one_event_per_repeat_interval(monkeypatch, start):
    """One broken node flapping made an Event per flap."""
    _cache, api, writer, _ = setup()
    clock = [start]
    writer.monotonic = lambda: clock[0]
    now_broken = [broken(17)]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: now_broken[0])
    writer.reconcile(NAME)
    assert len(node_events(api)) == 1
    for _ in range(20):  # flaps every 10 s
        clock[0] += 5
        now_broken[0] = []
        writer.reconcile(NAME)
        clock[0] += 5
        now_broken[0] = broken(17)
        writer.reconcile(NAME)
    assert len(node_events(api)) == 1
    clock[0] = start + NODE_EVENT_REPEAT_SECONDS
    now_broken[0] = []
    writer.reconcile(NAME)
    now_broken[0] = broken(17)
    writer.reconcile(NAME)
    assert len(node_events(api)) == 2  # still flapping, named again after the interval


@pytest.mark.parametrize("start", [100.0, 1e6])
def test_node_events_of_one_cr_are_bounded_per_window(monkeypatch, start):
    """50 broken nodes coming and going (pods replaced: new names) made 50 Events a time."""
    _cache, api, writer, _ = setup()
    clock = [start]
    writer.monotonic = lambda: clock[0]
    now_broken = [broken(*range(50))]
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: now_broken[0])
    writer.reconcile(NAME)
    assert len(node_events(api)) == MAX_NODE_EVENTS + 1
    for batch in range(1, 6):
        clock[0] += 60
        now_broken[0] = broken(*range(batch * 100, batch * 100 + 50))
        writer.reconcile(NAME)
    assert len(node_events(api)) == MAX_NODE_EVENTS + 1  # the window's budget is spent
    clock[0] = start + NODE_EVENT_REPEAT_SECONDS
    now_broken[0] = broken(*range(900, 950))
    writer.reconcile(NAME)
    assert len(node_events(api)) == 2 * (MAX_NODE_EVENTS + 1)


def test_a_tolerated_node_pod_starting_or_ceasing_to_fail_is_not_an_urgent_write(monkeypatch):
    """A crash-looping pod on one of 200 nodes is tolerated (the CR stays Running): its flaps
    wrote the status at once, past the rate limit, every time."""
    _cache, _api, writer, _ = setup()
    clock = [100.0]
    writer.monotonic = lambda: clock[0]
    seq = [0]
    failing = [frozenset()]

    def compute(observed, now, progress_deadline=None):
        seq[0] += 1
        return {"phase": "Running", "observedGeneration": 1, "message": f"m{seq[0]}"}

    monkeypatch.setattr(status, "compute_status", compute)
    monkeypatch.setattr(status, "failing_pods", lambda observed: failing[0])
    monkeypatch.setattr(status, "tolerated_node_pods", lambda observed: frozenset({"p"}))
    for _ in range(writer.burst):
        assert writer.reconcile(NAME)  # the burst is spent
    failing[0] = frozenset({"p"})
    assert not writer.reconcile(NAME)  # waits for a token like any message change
    assert NAME in writer.deferred
    # Not tolerated (the same pod, on a CR where it counts): at once.
    monkeypatch.setattr(status, "tolerated_node_pods", lambda observed: frozenset())
    assert writer.reconcile(NAME)
