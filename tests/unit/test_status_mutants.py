"""The reporter's status rules (:mod:`reporter.status`): cases that mutation testing found
open in test_status.py.
"""

from __future__ import annotations

import datetime as dt

import pytest
from test_status import BAD, NAMES, NOW, comp, daemonset, node_pods, observed, pod, with_changes

from reporter import status as st


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- node readiness


def test_only_pods_on_nodes_that_are_not_ready_say_so() -> None:
    ready = {
        "metadata": {"name": "worker-1"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]
        },
    }
    unknown = {"metadata": {"name": "worker-2"}, "status": {}}  # no Ready condition yet
    other = f"{NAMES.hyphened}-node-1"
    pods = [node_pods(1)[0], pod(other, "worker-1", ready=False), pod(BAD, "worker-2", ready=False)]
    s = st.compute_status(
        observed(with_changes(ds=daemonset(3, 1)), nodepods=pods, nodes=[ready, unknown]), NOW
    )
    reason = comp(s, "Node")["reason"]
    assert f"{other} on worker-1: " in reason
    assert f"{other} on worker-1 (node not ready)" not in reason
    assert f"{BAD} on worker-2 (node not ready): " in reason


# --------------------------------------------------------------------------- semantic_key


def test_the_semantic_key_ignores_v1alpha1_update_times_and_key_order() -> None:
    a = {
        "phase": "Running",
        "conditions": [{"type": "A", "status": "True", "lastUpdateTime": "2020-01-01T00:00:00Z"}],
        "driverComponents": [{"component": "Node", "status": "Ready"}],  # no lastUpdated
    }
    b = {
        "driverComponents": [{"status": "Ready", "component": "Node"}],
        "conditions": [{"lastUpdateTime": "2030-01-01T00:00:00Z", "status": "True", "type": "A"}],
        "phase": "Running",
    }
    assert st.semantic_key(a) == st.semantic_key(b)


def test_the_semantic_key_takes_values_json_does_not_know() -> None:
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert st.semantic_key({"x": when}) == st.semantic_key({"x": when})
    assert st.semantic_key({"x": when}) != st.semantic_key({"x": when + dt.timedelta(1)})


# --------------------------------------------------------------------------- impossible times


def test_a_garbage_top_level_time_is_written_over_even_with_good_condition_times() -> None:
    b = {
        "phase": "Running",
        "lastUpdated": _stamp(NOW),
        "conditions": [{"type": "A", "status": "True", "lastTransitionTime": _stamp(NOW)}],
    }
    a = {**b, "lastUpdated": "not a time"}
    assert not st.status_equal_ignoring_time(a, b)


def test_times_up_to_the_clock_skew_ahead_are_plausible() -> None:
    b = {"phase": "Running", "lastUpdated": _stamp(NOW)}
    at_limit = {**b, "lastUpdated": _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS))}
    beyond = {**b, "lastUpdated": _stamp(NOW + dt.timedelta(seconds=st.CLOCK_SKEW_SECONDS + 1))}
    assert st.status_equal_ignoring_time(at_limit, b)
    assert not st.status_equal_ignoring_time(beyond, b)


# --------------------------------------------------------------------------- events


def test_a_failure_without_a_reason_still_says_what_failed() -> None:
    assert st.phase_event({"phase": "Running"}, {"phase": "Failed"}) == (
        "Warning",
        "Failed",
        "Driver deployment failed",
    )


# --------------------------------------------------------------------------- pod_problem


def _pod(phase: str | None = "Running", *, conditions: list | None = None, **status: object):
    st_: dict = {"conditions": conditions or [], **status}
    if phase is not None:
        st_["phase"] = phase
    return {"metadata": {"name": "p"}, "status": st_}


def _cs(name: str, state: dict | None = None, ready: bool = False) -> dict:
    return {"name": name, "ready": ready, "state": state or {"running": {}}}


UNSCHEDULED = {"type": "PodScheduled", "status": "False"}


@pytest.mark.parametrize(
    ("pod", "problem"),
    [
        ({"metadata": {"name": "p", "deletionTimestamp": "2030-01-01T00:00:00Z"}}, "Terminating"),
        (
            _pod(
                "Pending",
                conditions=[
                    {**UNSCHEDULED, "reason": "Unschedulable", "message": "0/3 nodes are available"}
                ],
            ),
            "Unschedulable: 0/3 nodes are available",
        ),
        (
            _pod("Pending", conditions=[{**UNSCHEDULED, "reason": "SchedulingGated"}]),
            "SchedulingGated",
        ),
        (_pod("Pending", conditions=[{**UNSCHEDULED, "message": "why"}]), "Unschedulable: why"),
        (_pod("Failed", reason="Evicted", message="low memory"), "Failed: Evicted"),
        (_pod("Failed", message="low memory"), "Failed: low memory"),
        (_pod("Failed"), "Failed"),
        (
            _pod(
                "Pending",
                initContainerStatuses=[_cs("init", {"waiting": {"reason": "ErrImagePull"}})],
                containerStatuses=[_cs("c", {"waiting": {"reason": "PodInitializing"}})],
            ),
            "ErrImagePull (container init)",
        ),
        (
            _pod(containerStatuses=[_cs("c", {"terminated": {"exitCode": 1, "reason": "Error"}})]),
            "Error (container c)",
        ),
        (
            _pod(containerStatuses=[_cs("c", {"terminated": {"exitCode": 2}})]),
            "exit code 2 (container c)",
        ),
        # A terminated state without an exit code, or exit code 0, is no failure.
        (
            _pod(
                containerStatuses=[
                    _cs("a", {"terminated": {}}),
                    _cs("b", {"terminated": {"exitCode": 0}}),
                ]
            ),
            "container(s) a, b not ready",
        ),
        (_pod(None), "Pending"),
        (_pod("Pending"), "Pending"),
        (
            _pod(
                containerStatuses=[_cs("a", ready=True)],
                conditions=[
                    {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}
                ],
            ),
            "NotReady: ReadinessGatesNotReady",
        ),
        (_pod(containerStatuses=[_cs("a", ready=True)]), "NotReady"),
    ],
)
def test_why_a_pod_is_not_ready(pod: dict, problem: str) -> None:
    assert st.pod_problem(pod) == problem
