"""A few broken nodes are reported by name: one Warning Event per newly broken node pod.

The CR stays Running (tests/unit/test_status_scale.py); these Events say which node to look
at, once per node going bad, capped so that a rack going down is not a storm.
"""

from __future__ import annotations

from test_reporter_write import NAME, setup

from reporter import status
from reporter.write import MAX_NODE_EVENTS


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
    now_broken[0] = broken(17, 40)  # and broke again: a new Event
    writer.reconcile(NAME)
    assert len(node_events(api)) == 3


def test_many_broken_nodes_at_once_are_capped_with_one_summary(monkeypatch):
    _cache, api, writer, _ = setup()
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(*range(40)))
    writer.reconcile(NAME)
    events = node_events(api)
    assert len(events) == MAX_NODE_EVENTS + 1
    assert events[-1]["reason"] == "NodeDriversNotReady"
    assert f"and {40 - MAX_NODE_EVENTS} more" in events[-1]["message"]


def test_a_non_leader_records_no_node_events(monkeypatch):
    _cache, api, writer, _ = setup(leader=False)
    monkeypatch.setattr(status, "degraded_node_pods", lambda observed: broken(1))
    writer.reconcile(NAME)
    assert node_events(api) == []
