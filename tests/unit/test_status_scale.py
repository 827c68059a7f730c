"""Status in proportion at scale (issue 16): the rules and thresholds of ``reporter.status``.

Following kstatus and a Deployment's ``progressDeadlineSeconds``:
- a few broken node pods after a finished rollout (at most ``node_tolerance(desired)``: 1 %,
  rounded down) leave the driver serving: Node stays ``Ready``, the phase ``Running``, and
  the pods are named (and get a Warning Event each, see test_reporter_write_scale);
- more than that, or any during a rollout, is progress: ``Progressing`` -- ``Failed`` only
  once nothing moved for the progress deadline;
- ``Failed`` at once only when a component does not serve at all: no ready pod and pods
  failing (crash loop, image pull, unschedulable, phase Failed).
"""

from __future__ import annotations

import datetime as dt

import pytest
from test_status import (
    NAMES,
    NOW,
    comp,
    controller_pods,
    daemonset,
    node_pods,
    observed,
    pod,
    statefulset,
    with_changes,
)

from reporter import status as st

HOUR = dt.timedelta(hours=1)
DEADLINE = st.DEFAULT_PROGRESS_DEADLINE


def node_pod(i: int, **kw: object) -> dict:
    return pod(f"{NAMES.hyphened}-node-{i:05d}", f"node-{i:05d}", **kw)  # type: ignore[arg-type]


def cluster(desired: int, broken: dict[int, dict], **ds_kw: int) -> tuple[dict, list[dict]]:
    """A DaemonSet over ``desired`` nodes whose pods ``broken`` (index -> pod() args) fail."""
    pods = [node_pod(i, **broken.get(i, {})) for i in range(desired)]
    ready = desired - len(broken)
    return with_changes(ds=daemonset(desired, ready, **ds_kw)), pods


NODE_DOWN = {"ready": False}  # the kubelet stopped reporting: Ready False, no waiting reason
PULL = {"ready": False, "waiting": "ErrImagePull"}
CRASH = {"ready": False, "waiting": "CrashLoopBackOff"}
UNSCHEDULABLE = {"ready": False, "unschedulable": "0/5000 nodes are available"}


@pytest.mark.parametrize(
    ("desired", "tolerated"),
    [(1, 0), (3, 0), (99, 0), (100, 1), (250, 2), (1000, 10), (5000, 50)],
)
def test_node_tolerance_is_one_percent_rounded_down(desired: int, tolerated: int) -> None:
    assert st.node_tolerance(desired) == tolerated


@pytest.mark.parametrize(
    ("desired", "broken", "phase", "node_status"),
    [
        pytest.param(5000, {17: NODE_DOWN}, "Running", "Ready", id="1-of-5000-node-down"),
        pytest.param(5000, {17: PULL}, "Running", "Ready", id="1-of-5000-err-image-pull"),
        pytest.param(5000, {17: UNSCHEDULABLE}, "Running", "Ready", id="1-of-5000-unschedulable"),
        pytest.param(5000, {17: CRASH}, "Running", "Ready", id="1-of-5000-crash-loop"),
        pytest.param(
            5000, {i: NODE_DOWN for i in range(50)}, "Running", "Ready", id="50-of-5000-down"
        ),
        pytest.param(
            5000,
            {i: NODE_DOWN for i in range(51)},
            "Progressing",
            "NotReady",
            id="51-of-5000-down",
        ),
        pytest.param(3, {2: PULL}, "Progressing", "NotReady", id="1-of-3-err-image-pull"),
        pytest.param(3, {2: UNSCHEDULABLE}, "Progressing", "NotReady", id="1-of-3-unschedulable"),
        pytest.param(3, {2: CRASH}, "Progressing", "NotReady", id="1-of-3-crash-loop"),
        pytest.param(3, {0: CRASH, 1: CRASH, 2: PULL}, "Failed", "NotReady", id="none-serves"),
    ],
)
def test_broken_node_pods_in_proportion(
    desired: int, broken: dict[int, dict], phase: str, node_status: str
) -> None:
    objects, pods = cluster(desired, broken)
    s = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert s["phase"] == phase, s["reason"]
    node = comp(s, "Node")
    assert node["status"] == node_status
    first = min(broken)
    assert f"{NAMES.hyphened}-node-{first:05d} on node-{first:05d}" in node["reason"] or (
        "not scheduled" in node["reason"]
    )


def test_one_node_of_5000_down_for_an_hour_stays_running() -> None:
    """The finding: a constant reason used to run into the progress deadline -> Failed."""
    objects, pods = cluster(5000, {17: NODE_DOWN})
    first = st.compute_status(observed(objects, nodepods=pods), NOW)
    later = st.compute_status(observed(objects, nodepods=pods, status=first), NOW + HOUR)
    assert later["phase"] == "Running"
    assert "4999 of 5000 node driver pod(s) ready" in comp(later, "Node")["reason"]
    assert st.phase_event(first, later) is None  # no Warning Event about the CR


def test_a_stuck_rollout_fails_after_the_deadline_and_a_moving_one_does_not() -> None:
    objects, pods = cluster(3, {2: PULL})
    first = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert first["phase"] == "Progressing"
    stuck = observed(objects, nodepods=pods, status=first)
    assert st.compute_status(stuck, NOW + DEADLINE)["phase"] == "Progressing"
    late = st.compute_status(stuck, NOW + DEADLINE + dt.timedelta(seconds=1))
    assert late["phase"] == "Failed"
    assert late["reason"].startswith("No progress for more than 10 minute(s)")


@pytest.mark.parametrize(
    "cycle",
    [
        ["ErrImagePull", "ImagePullBackOff"],
        ["CrashLoopBackOff", "Error", "CrashLoopBackOff"],
    ],
    ids=["image-pull", "crash-loop"],
)
def test_a_pod_whose_problem_text_keeps_changing_is_no_progress(cycle: list[str]) -> None:
    """A broken pod's waiting reason alternates by itself (the kubelet's back-off): that is
    not progress, so the deadline still fires (review of issue 16: it stayed Progressing for
    hours, as each new text moved lastUpdated)."""
    objects, _ = cluster(3, {2: PULL})
    status: dict = {}
    now = NOW
    phases = []
    for step in range(8):
        waiting = cycle[step % len(cycle)]
        pods = [node_pod(i) for i in range(2)] + [node_pod(2, ready=False, waiting=waiting)]
        status = st.compute_status(observed(objects, nodepods=pods, status=status), now)
        phases.append(status["phase"])
        now += DEADLINE / 4
    assert phases[:4] == ["Progressing"] * 4
    assert phases[-1] == "Failed", phases
    assert status["reason"].startswith("No progress for more than 10 minute(s)")


def test_a_pod_that_becomes_ready_is_progress() -> None:
    objects, pods = cluster(3, {1: PULL, 2: PULL})
    first = st.compute_status(observed(objects, nodepods=pods), NOW)
    healed_one = [node_pod(0), node_pod(1), node_pod(2, **PULL)]
    later = NOW + DEADLINE
    s = st.compute_status(
        observed(with_changes(ds=daemonset(3, 2)), nodepods=healed_one, status=first), later
    )
    assert s["phase"] == "Progressing"
    assert comp(s, "Node")["lastUpdated"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_beyond_the_tolerance_an_unchanged_outage_fails_after_the_deadline() -> None:
    objects, pods = cluster(5000, {i: NODE_DOWN for i in range(60)})
    first = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert first["phase"] == "Progressing"
    later = st.compute_status(observed(objects, nodepods=pods, status=first), NOW + HOUR)
    assert later["phase"] == "Failed"


def test_a_large_rollout_is_progressing_not_degraded() -> None:
    """During a rollout every pod restarts once: that is progress, never 'tolerated'."""
    objects, pods = cluster(5000, {i: {"ready": False} for i in range(10)}, updated=4000)
    s = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert s["phase"] == "Progressing"
    assert "Rollout in progress: 4000 of 5000" in comp(s, "Node")["reason"]


def test_a_controller_that_does_not_serve_fails_at_once() -> None:
    ctrl = [pod(f"{NAMES.controller_driver}-0", "node-1", ready=False, waiting="ErrImagePull")]
    s = st.compute_status(
        observed(with_changes(ss=statefulset(1, 0)), ctrl_pods=ctrl, nodepods=node_pods()), NOW
    )
    assert s["phase"] == "Failed"
    assert "ErrImagePull" in s["reason"]


def test_degraded_node_pods_are_listed_for_events() -> None:
    objects, pods = cluster(5000, {17: NODE_DOWN, 40: PULL})
    found = st.degraded_node_pods(observed(objects, nodepods=pods))
    assert [(p.pod, p.node) for p in found] == [
        (f"{NAMES.hyphened}-node-00017", "node-00017"),
        (f"{NAMES.hyphened}-node-00040", "node-00040"),
    ]
    assert "ErrImagePull" in found[1].problem
    # None during a rollout: pods restarting on the way are not broken nodes.
    objects, pods = cluster(5000, {17: NODE_DOWN}, updated=10)
    assert st.degraded_node_pods(observed(objects, nodepods=pods)) == []
    # Controller pods are not node pods.
    assert st.degraded_node_pods(observed(ctrl_pods=controller_pods())) == []


def test_tolerated_node_pods_are_the_broken_ones_within_the_tolerance() -> None:
    """The writer takes their failing in or out through its budget (review of issue 16)."""
    objects, pods = cluster(5000, {17: CRASH, 40: PULL})
    assert st.tolerated_node_pods(observed(objects, nodepods=pods)) == {
        f"{NAMES.hyphened}-node-00017",
        f"{NAMES.hyphened}-node-00040",
    }
    # Beyond the tolerance (2 of 100): nothing is tolerated, every change is urgent.
    objects, pods = cluster(100, {1: CRASH, 2: CRASH})
    assert st.tolerated_node_pods(observed(objects, nodepods=pods)) == frozenset()
    # During a rollout, neither.
    objects, pods = cluster(5000, {17: CRASH}, updated=10)
    assert st.tolerated_node_pods(observed(objects, nodepods=pods)) == frozenset()


def lagging(desired: int, broken: dict[int, dict]) -> tuple[dict, list[dict]]:
    """As ``cluster``, but the DaemonSet's counters still say every pod is ready: the
    controller has not recounted its pods since they broke (at 5,000 nodes that took it about
    half a second in the scale benchmark)."""
    pods = [node_pod(i, **broken.get(i, {})) for i in range(desired)]
    return with_changes(ds=daemonset(desired, desired)), pods


def test_a_pod_seen_broken_is_named_before_the_daemonsets_counters_catch_up() -> None:
    """The benchmark's slow direction (issue 16): a pod that began to crash-loop was named
    only once the DaemonSet's numberReady fell, the reporter's own computation waiting for the
    controller's."""
    objects, pods = lagging(5000, {17: CRASH})
    s = st.compute_status(observed(objects, nodepods=pods), NOW)
    node = comp(s, "Node")
    assert (s["phase"], node["status"]) == ("Running", "Ready"), node["reason"]
    assert "4999 of 5000 node driver pod(s) ready, 1 not" in node["reason"]
    assert f"{NAMES.hyphened}-node-00017 on node-00017" in node["reason"]
    # The same broken pod, once the counters caught up: the same status (no second write).
    caught_up = st.compute_status(observed(*cluster(5000, {17: CRASH})[:1], nodepods=pods), NOW)
    assert caught_up == s


def test_pods_seen_broken_beyond_the_tolerance_are_progress_before_the_counters_say_so() -> None:
    objects, pods = lagging(100, {1: CRASH, 2: CRASH})
    seen = observed(objects, nodepods=pods)
    assert st.tolerated_node_pods(seen) == frozenset()  # every change urgent
    s = st.compute_status(seen, NOW)
    assert s["phase"] == "Progressing"
    assert "98 out of 100 driver pods are ready" in comp(s, "Node")["reason"]


def test_failed_at_once_waits_for_the_counters_to_say_no_pod_serves() -> None:
    """Failed at once (a Warning Event) is decided by the counters alone: the cache cannot
    tell a pod they do not count (an orphan, a surge pod) from a broken one (review)."""
    objects, pods = lagging(3, {0: CRASH, 1: CRASH, 2: PULL})
    s = st.compute_status(observed(objects, nodepods=pods), NOW)
    assert s["phase"] == "Progressing", s["reason"]
    assert "0 out of 3 driver pods are ready" in comp(s, "Node")["reason"]
    objects, pods = cluster(3, {0: CRASH, 1: CRASH, 2: PULL})
    assert st.compute_status(observed(objects, nodepods=pods), NOW)["phase"] == "Failed"


# Review of the above (issue 16): the DaemonSet controller counts one pod per node it should
# run on; pods it does not count (a surge pod beside a serving one, an orphan on a deleted
# node, a new node's pod before desiredNumberScheduled rises) must not lower the count.


def _surge(i: int, **kw: object) -> dict:
    return pod(f"{NAMES.hyphened}-node-surge-{i:05d}", f"node-{i:05d}", **kw)  # type: ignore[arg-type]


def test_a_broken_surge_pod_beside_a_serving_one_is_progress_not_failed() -> None:
    """maxSurge (a strategy patch): the old pod still serves its node."""
    objects = with_changes(ds=daemonset(1, 1, updated=0))
    s = st.compute_status(observed(objects, nodepods=[node_pod(0), _surge(0, **PULL)]), NOW)
    assert s["phase"] == "Progressing", s["reason"]


def test_surge_pods_crash_looping_on_every_node_while_the_old_ones_serve_is_progress() -> None:
    pods = [node_pod(i) for i in range(3)] + [_surge(i, **CRASH) for i in range(3)]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 3, updated=0)), nodepods=pods), NOW)
    assert s["phase"] == "Progressing", s["reason"]
    assert "3 out of 3" not in comp(s, "Node")["reason"] and "0 out of 3" not in s["reason"]


def test_an_orphan_pod_on_a_deleted_node_does_not_keep_the_cr_off_running() -> None:
    """Two nodes, one deleted: desired 1, its pod not ready until PodGC removes it."""
    pods = [node_pod(0), node_pod(1, **NODE_DOWN)]
    s = st.compute_status(observed(with_changes(ds=daemonset(1, 1)), nodepods=pods), NOW)
    assert s["phase"] == "Running", s["reason"]
    failed_orphan = [node_pod(0), node_pod(1, ready=False, phase="Failed")]
    s = st.compute_status(observed(with_changes(ds=daemonset(1, 1)), nodepods=failed_orphan), NOW)
    assert s["phase"] == "Running", s["reason"]


def test_a_joining_nodes_pending_pod_is_no_false_count() -> None:
    """Its pod is there before desiredNumberScheduled rises: still all N of N."""
    pods = [node_pod(i) for i in range(3)] + [node_pod(3, ready=False, phase="Pending")]
    s = st.compute_status(observed(with_changes(ds=daemonset(3, 3)), nodepods=pods), NOW)
    assert comp(s, "Node")["reason"] == "All 3 node driver pod(s) running successfully"
